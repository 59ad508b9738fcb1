#!/usr/bin/env bash
# Session 19, call 3 (nvidia-h200; carry .whl and .snap): the CUDA test of the written spans'
# summaries formed from their rows alone (cut by call 2's time limit), then the RAG trace at 32k
# with one document segment per request forced to miss (discarded before each run, so that both
# values recompute and write it), HYPIC_WRITE_GRAPHS 1 and 0 interleaved in one process, and one
# such request profiled under each value.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r3; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s19c3.tgz -C $R .; }
timeout 230 python3 -m pytest -p no:cacheprovider -v \
  "tests/ops/linear/test_chain_forward.py::test_written_spans_summaries_from_their_rows_alone_on_cuda" > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
LEFT=$(( 540 - ($(date +%s) - T0) ))
(cd benchmarks && timeout $LEFT python3 rag_ab_h200.py --out $R --prompts 32768 --requests 6 \
  --ab-env HYPIC_WRITE_GRAPHS --ab-values 1,0 --force-misses 1 --profile > $R/rag_ab_stdout.txt 2>&1
 echo "rag_ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/rag_ab_stdout.txt); pack
grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $R/pytest_cuda.txt | cut -c1-200
grep -E "^rag |rc=|Error|^==" $R/rag_ab_stdout.txt | cut -c1-300
echo "call done after $(( $(date +%s) - T0 )) s"
