#!/usr/bin/env bash
# Session 21, call 2b (nvidia-h200; carry .whl and .snap): call 2 again after its fix (an
# adopted buffer was tested for truth in _capture): the CUDA tests of the recorded glue and graph
# input adoption first (per-test timeout, failures reported); all-hit 32k and 8k under rows 64 /
# rows 128 / no adoption, interleaved in one process (each setting on graphs of its own), then
# the per-layer timeline; then the CUDA tests of 128-row split-KV blocks and session 20's
# refactors with the time left.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r2; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s21c2b.tgz -C $R .; }
timeout 100 python3 -m pytest -p no:cacheprovider -rfs --tb=short --timeout 60 \
  tests/engine/test_cuda_graphs.py tests/ops/test_fused.py > $R/pytest_cuda_a.txt 2>&1
echo "pytest a rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda_a.txt; pack
(cd benchmarks && timeout 230 python3 allhit_ab_h200.py --tag s21c2b --out $R --prompts 32768,8192 --repeats 5 \
  --ab-settings "HYPIC_SPLIT_ROWS=64;HYPIC_SPLIT_ROWS=128;HYPIC_GRAPH_ADOPT=0" --ab-capture --no-profile \
  --timeline > $R/ab_stdout.txt 2>&1
 echo "allhit_ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt); pack
LEFT=$(( 360 - ($(date +%s) - T0) ))
if [ $LEFT -gt 30 ]; then
timeout $LEFT python3 -m pytest -p no:cacheprovider -rfs --tb=short --timeout 60 \
  "tests/ops/test_attention_split.py::test_kernel_matches_reference_on_cuda" tests/engine/test_pic_runner_cuda.py \
  "tests/ops/linear/test_state_summary.py::test_kernels_write_into_targets_on_cuda" \
  "tests/ops/linear/test_state_summary.py::test_cold_write_path_into_targets_on_cuda" > $R/pytest_cuda_b.txt 2>&1
echo "pytest b rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda_b.txt; pack
fi
grep -hE "passed|failed|rc=|^FAILED|^ERROR" $R/pytest_cuda_a.txt $R/pytest_cuda_b.txt | cut -c1-300
grep -E "^setting|rc=|Error|waiting between" $R/ab_stdout.txt | cut -c1-400
echo "call done after $(( $(date +%s) - T0 )) s"
