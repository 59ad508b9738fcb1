#!/usr/bin/env bash
# Session 6, call 4 (.whl carried): final measurements. A smoke test of the new kernels first (on
# failure the rows fall back to fla's kernels and flex). Phase 1 runs alone on the machine (the
# host-bound TTFT rows share no CPU with anything); phase 2 uses both GPUs:
#   phase 1, GPU 0: TTFT part 3 (all_hit and rag at 32k and 8k, prefix_cache and hypic);
#   phase 2, GPU 0: the all-hit A/B script on this code (timings, syncs, profile tables);
#            GPU 1: GPU tests, verbose, 60 s per test.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
# smoke: the new kernels compile and match their references; if not, the rows run the old paths
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -q -p no:cacheprovider --timeout 60 tests/ops/test_attention_split.py \
  tests/ops/linear/test_short_span.py tests/ops/linear/test_fla_paths.py -k "cuda or triton_scan_matches" > $R/smoke.txt 2>&1
rc=$?; echo "smoke rc=$rc after $(( $(date +%s) - T0 )) s" >> $R/smoke.txt
if (( rc != 0 )); then export HYPIC_SHORT_SPAN=fla HYPIC_ATTENTION_IMPL=flex; fi
CUDA_VISIBLE_DEVICES=0 OUT=$R TTFT_MAX_SECONDS=150 timeout 240 bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
ab() {
  timeout 150 python3 benchmarks/allhit_ab_h200.py --tag s6c4 --out $R > $R/ab_s6c4.txt 2>&1
  echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_s6c4.txt
}
tests() {
  timeout 150 python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 60 tests/ops/test_attention_split.py \
    tests/ops/linear/test_short_span.py tests/ops/linear/test_fla_paths.py \
    -k "not (delta and not gated) and not kda and not gla and not mamba2" > $R/pytest_gpu.txt 2>&1
  echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu.txt
}
if (( NGPU >= 2 )); then
  ( CUDA_VISIBLE_DEVICES=0 ab ) & ( CUDA_VISIBLE_DEVICES=1 tests ) & wait
else
  ab
fi
tail -3 $R/smoke.txt
grep -E "^(all_hit|rag) |rc=|Error" $R/ttft_part3_stdout.txt
grep -E "^\{|rc=|Error" $R/ab_s6c4.txt | cut -c1-400
grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $R/pytest_gpu.txt | cut -c1-150 | tail -60
echo "call done after $(( $(date +%s) - T0 )) s"
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
