#!/usr/bin/env bash
# Session 26, call 2 (nvidia-h200; carry .whl and .snap): CUDA tests of the conv-tails kernel and
# the fixed tests; the runner's graphs-vs-eager test with every layer's state diff; the split-KV
# launch configs timed behind a sleep kernel; then the all-hit 32k request, settings interleaved
# in one process, each on graphs of its own: the defaults, the torch conv tails, split-KV configs,
# taller MoE row blocks.
set -u
source benchmarks/device/_setup.sh s26c2
timeout 100 python3 -m pytest -q -p no:warnings tests/ops/test_conv_short.py tests/engine/test_cuda_graphs.py \
  tests/ops/test_attention_split.py tests/ops/test_moe_route.py -k "tails or recorded_glue or fixed_config or fused_projection or cuda" \
  > $R/pytest_cuda.txt 2>&1; echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
timeout 100 python3 -m pytest -q -p no:warnings tests/engine/test_pic_runner_cuda.py -k cached_request_on_cuda \
  >> $R/pytest_cuda.txt 2>&1; echo "pytest runner rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
grep -E "passed|failed|rc=|Error|assert" $R/pytest_cuda.txt | cut -c1-1500 | tail -12; pack
(cd benchmarks && timeout 100 python3 attention_split_h200.py --out $R --rows 128,64 --min-splits 2048,1024,512 \
   --block-n 64,32 --warps 8,4 --stages 2,3 --budget-s 65 > $R/attn_stdout.txt 2>&1; echo "attn rc=$? after $(( $(date +%s) - T0 )) s" >> $R/attn_stdout.txt)
grep -vE "^\s*$|Warning|warn|OutOfResources" $R/attn_stdout.txt | cut -c1-160 | tail -30; pack
(cd benchmarks && timeout 60 python3 moe_glue_h200.py --out $R --tokens 576 --configs-only --repeats 15 \
   --route-configs "1,1;4,1;4,2;16,4" --bucket-configs "512,8;1024,4;1024,16" > $R/glue_stdout.txt 2>&1; echo "glue rc=$?" >> $R/glue_stdout.txt)
grep -vE "^\s*$|Warning|warn" $R/glue_stdout.txt | cut -c1-160 | tail -16; pack
(cd benchmarks && timeout $(left 585) python3 allhit_ab_h200.py --tag s26c2 --out $R --prompts 32768 --repeats 8 --no-profile \
   --ab-capture --ab-settings "HYPIC_CONV_TAILS=auto;HYPIC_CONV_TAILS=torch;HYPIC_SPLIT_ROWS=64 HYPIC_SPLIT_CONFIG=64,4,3,1024;HYPIC_SPLIT_CONFIG=64,8,2,1024;HYPIC_MOE_ROWS=block_m=64|block_m=64" \
   > $R/ab_stdout.txt 2>&1; echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt); pack
grep -vE "^\s*$" $R/ab_stdout.txt | grep -vi warn | tail -14 | cut -c1-700
echo "call done after $(( $(date +%s) - T0 )) s"
