#!/usr/bin/env bash
# Session 6, call 1 (.whl carried). Two GPUs when lent:
#   GPU 0: GPU tests of the closed-form short-span summaries / state pass and the GDN fla paths,
#          then fla's summary kernel per dot precision (tf32x3 vs tf32, fast and slow gate decay);
#   GPU 1: all-hit 32k / 8k with this code (timings + profile), then the cold 32k case with the
#          default summary precision (tf32x3) and with HYPIC_SUMMARY_DOT_PRECISION=tf32.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export TORCHINDUCTOR_COMPILE_THREADS=1
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
COLD="python3 -m hypic bench ttft --dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy \
  --device cuda --dtype bfloat16 --seed 0 --seam 8 --cases cold --prompt-tokens 32768 --segment-tokens 512 \
  --query-tokens 64 --cold-requests 3 --store-bytes 36GiB --no-progress"
part_a() {
  timeout 170 python3 -m pytest -q -p no:cacheprovider tests/ops/linear/test_short_span.py \
    tests/ops/linear/test_fla_paths.py -k "not (delta and not gated) and not kda and not gla and not mamba2" \
    > $R/pytest_gpu.txt 2>&1
  echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu.txt
  for pb in tf32x3:4 tf32:8 tf32x3:8; do
    timeout 100 python3 benchmarks/summary_kernel_h200.py --precision ${pb%%:*} --gate-bias ${pb##*:} --out $R \
      >> $R/summary_kernel_stdout.txt 2>&1
    echo "probe $pb rc=$? after $(( $(date +%s) - T0 )) s" >> $R/summary_kernel_stdout.txt
  done
}
part_b() {
  timeout 140 python3 benchmarks/allhit_ab_h200.py --tag s6 --out $R > $R/ab_s6.txt 2>&1
  echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_s6.txt
  timeout 190 $COLD --modes full_recompute,hypic --json $R/ttft_cold32k_tf32x3.json > $R/cold_tf32x3.txt 2>&1
  echo "cold tf32x3 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_tf32x3.txt
  HYPIC_SUMMARY_DOT_PRECISION=tf32 timeout 170 $COLD --modes hypic --json $R/ttft_cold32k_tf32.json \
    > $R/cold_tf32.txt 2>&1
  echo "cold tf32 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_tf32.txt
}
if (( NGPU >= 2 )); then
  ( CUDA_VISIBLE_DEVICES=0 part_a ) & ( CUDA_VISIBLE_DEVICES=1 part_b ) & wait
else
  part_b
fi
tail -3 $R/pytest_gpu.txt; grep -E "^\{|rc=" $R/summary_kernel_stdout.txt | cut -c1-260
grep -E "ms|rc=|Error" $R/ab_s6.txt | head -20
grep -E "^cold |rc=|Error" $R/cold_tf32x3.txt $R/cold_tf32.txt
echo "call done after $(( $(date +%s) - T0 )) s"
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
