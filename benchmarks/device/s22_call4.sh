#!/usr/bin/env bash
# Session 22, call 4 (nvidia-h200; carry .whl and .snap): where an 8k RAG request's time goes.
# The RAG trace at 8k with HYPIC_SHORT_WY triton against fla, interleaved in one process, each on
# graphs of its own, then per value a per-layer timeline (new layout graphs each time) and one
# request under the profiler (call 2 gave this 170 s, not enough for its first row).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r4; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s22c4.tgz -C $R .; }
(cd benchmarks && timeout 420 python3 rag_ab_h200.py --out $R --prompts 8192 --requests 6 --store-bytes 36GiB \
  --ab-settings "HYPIC_SHORT_WY=triton;HYPIC_SHORT_WY=fla" --ab-capture --timeline --profile > $R/rag_ab_stdout.txt 2>&1
 echo "rag_ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/rag_ab_stdout.txt); pack
grep -hE "^rag |rc=|Error" $R/rag_ab_stdout.txt 2>/dev/null | cut -c1-300
echo "call done after $(( $(date +%s) - T0 )) s"
