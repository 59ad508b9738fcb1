#!/usr/bin/env bash
# Session 13, calls 6 and 7 (nvidia-h200, .whl carried, warm): 128k-token prompts in every mode
# with the final code (cold and all_hit; 256 x 512 + 64), packed into $OUT/s13c$CALL.tgz.
#   call 6: CALL=6 STORE=60GiB MODES=full_recompute,prefix_cache,hypic,addition,transition,transition_rope
#   call 7: CALL=7 STORE=20GiB MODES=prefix_cache,hypic,addition,transition,transition_rope
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r$CALL; mkdir -p $R; T0=$(date +%s)
timeout 420 python3 -m hypic bench ttft --dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy \
  --device cuda --dtype bfloat16 --seed 0 --seam 8 --modes $MODES --cases cold,all_hit \
  --prompt-tokens 131072 --segment-tokens 512 --query-tokens 64 --num-requests 2 --cold-requests 1 \
  --store-bytes $STORE --no-progress --json $R/ttft_h200_128k.json > $R/ttft128k_stdout.txt 2>&1
echo "ttft128k rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft128k_stdout.txt
tar czf $OUT/s13c$CALL.tgz -C $R .
grep -E "^(all_hit|rag|cold) |rc=|Error|error" $R/ttft128k_stdout.txt | cut -c1-220
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
echo "call done after $(( $(date +%s) - T0 )) s"
