#!/usr/bin/env bash
# Every test file with CUDA cases (their CPU cases run too: they are quick), on the device
# (nvidia-h200, .whl carried), the GPU-path ones first. Usage (inside a device call, from the
# repository root):
#
#   bash benchmarks/device/cuda_tests.sh OUT_DIR [SECONDS]
#
# Writes OUT_DIR/pytest_cuda.txt; SECONDS (default 300) bounds the whole run. The first call of a
# session spends most of it compiling Triton kernels (autotuned scan variants, fla kernels).
set -u
R="${1:?usage: cuda_tests.sh OUT_DIR [SECONDS]}"
LIMIT="${2:-300}"
mkdir -p "$R"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
timeout "$LIMIT" python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 240 \
  tests/engine/test_engine_cuda.py tests/engine/test_pic_runner_cuda.py tests/engine/test_cuda_graphs.py \
  tests/ops/linear/test_chain_forward.py tests/ops/test_attention_split.py tests/ops/linear/test_fla_paths.py \
  tests/ops/linear/test_short_span.py tests/ops/linear/test_dispatch.py tests/engine/test_pic_runner.py \
  tests/ops/test_attention_cudnn.py tests/ops/test_attention_flash.py tests/ops/test_attention_flex.py \
  tests/ops/test_fused.py tests/ops/test_moe_grouped.py tests/ops/test_norms.py tests/pic/test_store.py \
  tests/bench/test_fast_paths.py \
  > "$R/pytest_cuda.txt" 2>&1
echo "pytest rc=$?" >> "$R/pytest_cuda.txt"
grep -E "PASSED|FAILED|ERROR|rc=" "$R/pytest_cuda.txt" | cut -c1-200 | tail -60
