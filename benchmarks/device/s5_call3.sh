#!/usr/bin/env bash
# Session 5, call 3 (.whl and .ab_old carried; .ab_old = `git archive 169d38f hypic`, session 4's
# final code). Two GPUs when lent:
#   GPU 0: GPU tests of the new paths, then (once GPU 1 is done, so no other process shares the
#          host) the all-hit A/B: session 4's package, then this one;
#   GPU 1: the prefill profile with every cold PIC run profiled (GPU and host tables; attention
#          on its automatic choice), then a cold 128k prompt (2048-token segments) in
#          full_recompute and hypic (inline + standalone).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
tests() {
  PYTHONPATH=/tmp/site:$PWD timeout 300 python3 -m pytest -q -p no:cacheprovider tests/ops/test_attention_cudnn.py \
    tests/ops/test_norms.py tests/ops/test_fused.py tests/ops/test_attention_flash.py \
    tests/ops/linear/test_fla_paths.py -k "not (delta and not gated) and not kda and not gla and not mamba2" > $R/pytest_gpu.txt 2>&1
  echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_gpu.txt
}
ab() {
  PYTHONPATH=/tmp/site:$PWD/.ab_old timeout 130 python3 benchmarks/allhit_ab_h200.py --tag old --out $R > $R/ab_old.txt 2>&1
  echo "ab old rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_old.txt
  PYTHONPATH=/tmp/site:$PWD timeout 130 python3 benchmarks/allhit_ab_h200.py --tag new --out $R > $R/ab_new.txt 2>&1
  echo "ab new rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_new.txt
}
profile_and_128k() {
  export PYTHONPATH=/tmp/site:$PWD
  PROFILE_COLD=1 PROFILE_IMPL_PAIRS=grouped+auto+glue timeout 230 python3 benchmarks/prefill_profile_h200.py --out $R \
    --max-seconds 200 > $R/profile_stdout.txt 2>&1
  echo "profile rc=$? after $(( $(date +%s) - T0 )) s" >> $R/profile_stdout.txt
  timeout 170 python3 -m hypic bench ttft --dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy \
    --device cuda --dtype bfloat16 --seed 0 --seam 8 --modes full_recompute,hypic --cases cold \
    --prompt-tokens 131072 --segment-tokens 2048 --query-tokens 64 --cold-requests 1 --store-bytes 20GiB --no-progress \
    --json $R/ttft_h200_cold128k.json > $R/cold128k_stdout.txt 2>&1
  echo "cold128k rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold128k_stdout.txt
}
if (( NGPU >= 2 )); then
  ( CUDA_VISIBLE_DEVICES=1 profile_and_128k ) & P=$!
  ( CUDA_VISIBLE_DEVICES=0 tests )
  wait $P
  CUDA_VISIBLE_DEVICES=0 ab
else
  tests; profile_and_128k; ab
fi
tail -5 $R/pytest_gpu.txt; grep -E "prompt_tokens|rc=|Error" $R/ab_old.txt $R/ab_new.txt
grep -E "ms .*tok/s|rc=|Error|cold_s" $R/profile_stdout.txt | cut -c1-300 | head -12
grep -E "^(cold|all_hit|rag) |rc=|Error" $R/cold128k_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
tar czf $OUT/results.tgz -C $OUT r && rm -rf $R
