#!/usr/bin/env bash
# Session 4, call 2 on one H200 (the two-GPU machine was not available): the same steps as
# s4_call2.sh, one after another: CUDA tests of the conv path and the MoE combine, the glue check,
# the prefill profile, then TTFT part 3 with the time left.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}; export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/ops/linear/test_fla_paths.py -k "conv1d" \
    tests/ops/test_moe_grouped.py > $R/pytest_gpu.txt 2>&1; echo "pytest rc=$?" >> $R/pytest_gpu.txt
timeout 120 python3 benchmarks/glue_check_h200.py --out $R > $R/glue_stdout.txt 2>&1; echo "glue rc=$?" >> $R/glue_stdout.txt
PROFILE_COLD=1 PROFILE_IMPL_PAIRS=grouped+flash,grouped+flash+glue \
  timeout 230 python3 benchmarks/prefill_profile_h200.py --out $R --max-seconds 200 > $R/profile_stdout.txt 2>&1
echo "profile rc=$? after $(( $(date +%s) - T0 )) s" >> $R/profile_stdout.txt
left=$(( 570 - ($(date +%s) - T0) ))
OUT=$R TTFT_MAX_SECONDS=$(( left - 60 )) timeout $left bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
tail -5 $R/pytest_gpu.txt; grep -v "^\s*$" $R/glue_stdout.txt | tail -20
grep -E "ms .*tok/s|rc=|Error" $R/profile_stdout.txt | head; grep -E "^(all_hit|rag) |rc=" $R/ttft_part3_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
