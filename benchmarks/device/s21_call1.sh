#!/usr/bin/env bash
# Session 21, call 1 (nvidia-h200; carry .whl and .snap): the row-wise graphs record compiled
# glue (HYPIC_GRAPH_GLUE). The CUDA tests of it and of session 20's last refactors (the S
# kernel's shared launch, the scalar-family fla paths); all-hit 32k and 8k with the glue
# compiled against eager, each value on graphs of its own, interleaved in one process, then a
# profile of the default.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r1; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s21c1.tgz -C $R .; }
timeout 200 python3 -m pytest -p no:cacheprovider -q -rs \
  tests/engine/test_cuda_graphs.py tests/ops/test_fused.py tests/ops/linear/test_fla_paths.py \
  tests/engine/test_pic_runner_cuda.py tests/ops/linear/test_state_summary.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
LEFT=$(( 555 - ($(date +%s) - T0) ))
(cd benchmarks && timeout $LEFT python3 allhit_ab_h200.py --tag s21c1 --out $R --prompts 32768,8192 --repeats 6 \
  --ab-env HYPIC_GRAPH_GLUE --ab-values 1,0 --ab-capture > $R/ab_stdout.txt 2>&1
 echo "allhit_ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt); pack
tail -4 $R/pytest_cuda.txt | cut -c1-300
grep -E "FAILED|ERROR" $R/pytest_cuda.txt | head -20 | cut -c1-300
grep -E "HYPIC_GRAPH_GLUE|rc=|Error|prompt_tokens" $R/ab_stdout.txt | cut -c1-400
echo "call done after $(( $(date +%s) - T0 )) s"
