#!/usr/bin/env bash
# Session 6, call 5 (.whl carried; the last ~5 device minutes): TTFT part 3 again after the
# short-span summary kernel moved from ieee to tf32 dots (call 4: 9.2 ms per layer). GPU 1 runs
# the CUDA tests of the changed kernel meanwhile. No tarball: files stay under $OUT/r so that a
# run cut off by the device budget still returns the JSON written after each sweep point.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
( CUDA_VISIBLE_DEVICES=1 timeout 90 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 60 \
    tests/ops/linear/test_short_span.py -k cuda > $R/pytest_gpu.txt 2>&1;
  echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu.txt ) &
CUDA_VISIBLE_DEVICES=0 OUT=$R TTFT_MAX_SECONDS=80 timeout 190 bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
wait
grep -E "PASSED|FAILED|ERROR|rc=" $R/pytest_gpu.txt | cut -c1-150
grep -E "^(all_hit|rag) |rc=|Error" $R/ttft_part3_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
