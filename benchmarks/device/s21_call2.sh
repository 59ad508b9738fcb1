#!/usr/bin/env bash
# Session 21, call 2 (nvidia-h200; carry .whl and .snap): the CUDA tests of the recorded glue,
# graph input adoption (HYPIC_GRAPH_ADOPT) and 128-row split-KV blocks (HYPIC_SPLIT_ROWS), with
# session 20's untested refactors; all-hit 32k and 8k under rows 64 / rows 128 / no adoption,
# interleaved in one process (each setting on graphs of its own), then the per-layer timeline.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r2; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s21c2.tgz -C $R .; }
timeout 170 python3 -m pytest -p no:cacheprovider -v -rs \
  tests/engine/test_cuda_graphs.py tests/ops/test_fused.py tests/ops/test_attention_split.py \
  tests/engine/test_pic_runner_cuda.py tests/ops/linear/test_fla_paths.py \
  "tests/ops/linear/test_state_summary.py::test_kernels_write_into_targets_on_cuda" \
  "tests/ops/linear/test_state_summary.py::test_cold_write_path_into_targets_on_cuda" > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
LEFT=$(( 550 - ($(date +%s) - T0) ))
(cd benchmarks && timeout $LEFT python3 allhit_ab_h200.py --tag s21c2 --out $R --prompts 32768,8192 --repeats 6 \
  --ab-settings "HYPIC_SPLIT_ROWS=64;HYPIC_SPLIT_ROWS=128;HYPIC_GRAPH_ADOPT=0" --ab-capture --no-profile \
  --timeline > $R/ab_stdout.txt 2>&1
 echo "allhit_ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt); pack
grep -E "passed|failed|rc=" $R/pytest_cuda.txt | tail -3 | cut -c1-300
grep -E "FAILED|ERROR" $R/pytest_cuda.txt | head -20 | cut -c1-300
grep -E "^setting|rc=|Error|waiting between" $R/ab_stdout.txt | cut -c1-400
echo "call done after $(( $(date +%s) - T0 )) s"
