#!/usr/bin/env bash
# Session 14, call 1 (nvidia-h200, .whl carried): 128k-token prompts in every mode with the
# session-13 cold-write fixes (d8b0005, 6853feb) that were never run on the device:
# 256 x 512 + 64, cold and all_hit, every store mode and the standalone cold policy.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT; T0=$(date +%s)
timeout 480 python3 -m hypic bench ttft --dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy \
  --device cuda --dtype bfloat16 --seed 0 --seam 8 \
  --modes full_recompute,prefix_cache,hypic,addition,transition,transition_rope --cases cold,all_hit \
  --prompt-tokens 131072 --segment-tokens 512 --query-tokens 64 --num-requests 2 --cold-requests 1 \
  --store-bytes 60GiB --no-progress --json $R/ttft_h200_128k.json > $R/ttft128k_stdout.txt 2>&1
echo "ttft128k rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft128k_stdout.txt
grep -E "^(all_hit|rag|cold) |rc=|Error|error|stored|budget" $R/ttft128k_stdout.txt | cut -c1-240
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
echo "call done after $(( $(date +%s) - T0 )) s"
