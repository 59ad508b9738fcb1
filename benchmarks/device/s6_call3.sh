#!/usr/bin/env bash
# Session 6, call 3 (.whl carried): clean measurements of the landed code. Two GPUs, each side
# pinned to its own 16 host cores (taskset) so the host-bound all-hit rows share no CPU:
#   GPU 0, cores 16-31: GPU tests (-v), then the all-hit A/B script on this code (timings,
#          syncs, profile tables);
#   GPU 1, cores 0-15: TTFT part 3 (all_hit and rag at 32k and 8k, prefix_cache and hypic).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
part_a() {
  timeout 150 taskset -c 16-31 python3 -m pytest -v -p no:cacheprovider tests/ops/test_attention_split.py \
    tests/ops/linear/test_short_span.py tests/ops/linear/test_fla_paths.py \
    -k "not (delta and not gated) and not kda and not gla and not mamba2" > $R/pytest_gpu.txt 2>&1
  echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu.txt
  timeout 200 taskset -c 16-31 python3 benchmarks/allhit_ab_h200.py --tag s6c3 --out $R > $R/ab_s6c3.txt 2>&1
  echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_s6c3.txt
}
part_b() {
  OUT=$R TTFT_MAX_SECONDS=150 timeout 260 taskset -c 0-15 bash benchmarks/ttft_h200.sh 3 > $R/ttft_part3_stdout.txt 2>&1
  echo "ttft3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_part3_stdout.txt
}
if (( NGPU >= 2 )); then
  ( CUDA_VISIBLE_DEVICES=0 part_a ) & ( CUDA_VISIBLE_DEVICES=1 part_b ) & wait
else
  part_b
fi
grep -E "PASS|FAIL|ERROR|rc=" $R/pytest_gpu.txt | cut -c1-150 | tail -45
grep -E "^\{|rc=|Error" $R/ab_s6c3.txt | cut -c1-400
grep -E "^(all_hit|rag) |rc=|Error" $R/ttft_part3_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
