#!/usr/bin/env bash
# Session 26, call 3 (nvidia-h200; carry .whl and .snap): the all-hit 32k acceptance point at this
# session's head (the host-side layout templates merged) and at the commit before that merge
# (.snap/base.tgz), one process each, the TTFT command as sessions 24-25 ran it; between them the
# runner's CUDA test (graphs vs eager vs CPU) and the routing kernels' CUDA tests at the head.
set -u
ROOT=$PWD  # the carried .snap/base.tgz is here; _setup.sh changes into /tmp/tree
source benchmarks/device/_setup.sh s26c3
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
ARGS=(--modes hypic --cases all_hit --query-tokens 64 --no-progress --prompt-tokens 32768 --segment-tokens 512
      --num-requests 16 --cold-requests 1 --store-bytes 36GiB)
timeout 200 python3 -m hypic bench ttft "${MODEL[@]}" "${ARGS[@]}" --json $R/ttft_allhit_32k.json > $R/ttft_stdout.txt 2>&1
echo "ttft rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_stdout.txt; pack
grep -hE "^(all_hit|cold) |rc=|Error" $R/ttft_stdout.txt | cut -c1-220
timeout 150 python3 -m pytest -q -s -p no:warnings tests/engine/test_pic_runner_cuda.py tests/ops/test_moe_route.py \
  -k "cached_request_on_cuda or cuda_bf16 or launch_configs_cuda" \
  > $R/pytest_cuda.txt 2>&1; echo "pytest runner rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
grep -E "passed|failed|rc=|Error|worst" $R/pytest_cuda.txt | cut -c1-600 | tail -8; pack
rm -rf /tmp/treeB && mkdir -p /tmp/treeB && tar xzf $ROOT/.snap/base.tgz -C /tmp/treeB
(cd /tmp/treeB && PYTHONPATH=/tmp/site:/tmp/treeB timeout $(left 590) python3 -m hypic bench ttft "${MODEL[@]}" "${ARGS[@]}" \
   --json $R/ttft_allhit_32k_base.json > $R/ttft_base_stdout.txt 2>&1; echo "ttft base rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_base_stdout.txt)
pack; grep -hE "^(all_hit|cold) |rc=|Error" $R/ttft_base_stdout.txt | cut -c1-220
echo "call done after $(( $(date +%s) - T0 )) s"
