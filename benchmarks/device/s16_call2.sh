#!/usr/bin/env bash
# Session 16, call 2 (nvidia-h200; carry .whl and .snap): call 1's tests and chain_long ran out of
# their limits while compiling. One layer's cold write forward per HYPIC_COLD_SUMMARIES mode with
# a kernel table (benchmarks/cold_write_h200.py: why one_run was slower than walk in call 1's
# TTFT), the new kernels' and the write op's CUDA tests, the engine's CUDA runner test (walk).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r2; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s16c2.tgz -C $R .; }
(cd benchmarks && timeout 170 python3 cold_write_h200.py --out $R > $R/cold_write_stdout.txt 2>&1
 echo "cold_write rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_write_stdout.txt); pack
timeout 150 python3 -m pytest -p no:cacheprovider -q tests/ops/linear/test_state_summary.py -k cuda \
  > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
LEFT=$(( 420 - ($(date +%s) - T0) ))
[ $LEFT -gt 40 ] && { timeout $LEFT python3 -m pytest -p no:cacheprovider -q -k "not interpreter" \
  tests/engine/test_pic_runner_cuda.py > $R/pytest_runner_walk.txt 2>&1
  echo "runner walk rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_runner_walk.txt; pack; }
head -12 $R/cold_write_stdout.txt | cut -c1-300
tail -n 3 $R/pytest_cuda.txt $R/pytest_runner_walk.txt 2>/dev/null | cut -c1-300
echo "call done after $(( $(date +%s) - T0 )) s"
