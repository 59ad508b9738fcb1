#!/usr/bin/env bash
# Session 10, call 2 (nvidia-h200, .whl carried):
#   1. benchmarks/host_time_h200.py: host time of an all-hit request (8k, 32k) by forward-context
#      method, graph replays and Triton launches, without a profiler;
#   2. the CUDA test suites session 9 never reached (chain forward's fla path, fla paths, short spans).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
timeout 200 python3 benchmarks/host_time_h200.py --out $R > $R/host_time_stdout.txt 2>&1
echo "host_time rc=$? after $(( $(date +%s) - T0 )) s" >> $R/host_time_stdout.txt
LEFT=$(( 380 - ($(date +%s) - T0) ))
timeout $LEFT python3 -m pytest -o addopts="" -v -p no:cacheprovider --timeout 240 \
  "tests/ops/linear/test_chain_forward.py::test_fla_path_matches_reference" \
  tests/ops/linear/test_fla_paths.py tests/ops/linear/test_short_span.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
cat $R/host_time_stdout.txt | grep -v Warning | tail -40
grep -E "FAILED|ERROR|rc=|passed|failed" $R/pytest_cuda.txt | cut -c1-250 | tail -20
echo "call done after $(( $(date +%s) - T0 )) s"
