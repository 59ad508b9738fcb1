#!/usr/bin/env bash
# Session 20, call 1 (nvidia-h200; carry .whl and .snap): where hypic's RAG requests lost ~13 ms
# since session 13 (83.09 ms at 32k then, 96.41 in session 19). (1) Session 13's code (4d4df49)
# on this machine: the TTFT bench's all_hit and rag rows at 32k (machine drift or code?). (2) At
# HEAD, the RAG trace with switches interleaved in one process, every setting on new layouts
# (HYPIC_KEPT_LAYOUTS=0, as every RAG request is): the default, the two-step seam walk of session
# 13 (HYPIC_CHAIN_FUSE_SEAMS=0), every core eager (HYPIC_LAYER_GRAPHS=0); per-layer timelines;
# recompiles and autotunes logged (the compile stalls of session 19 call 3). (3) HEAD's TTFT
# bench rows as (1), if time is left.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
HERE=$PWD; R=/tmp/r1; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s20c1.tgz -C $R .; }
mkdir -p /tmp/trees_old/.snap /tmp/trees_head/.snap
cp .snap/tree_4d4df49.tgz /tmp/trees_old/.snap/; cp .snap/tree.tgz /tmp/trees_head/.snap/tree_head.tgz
cp -r .whl /tmp/trees_old/; cp -r .whl /tmp/trees_head/
(cd /tmp/trees_old && OUT=$R PROMPT=32768 PER_TREE_S=200 bash $HERE/benchmarks/device/ttft_trees.sh); pack
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
(cd benchmarks && TORCH_LOGS=recompiles TRITON_PRINT_AUTOTUNING=1 timeout 230 python3 rag_ab_h200.py --out $R \
  --prompts 32768 --requests 8 --store-bytes 36GiB --timeline \
  --ab-settings "HYPIC_KEPT_LAYOUTS=0;HYPIC_KEPT_LAYOUTS=0 HYPIC_CHAIN_FUSE_SEAMS=0;HYPIC_KEPT_LAYOUTS=0 HYPIC_LAYER_GRAPHS=0" \
  > $R/rag_ab_stdout.txt 2>&1
 echo "rag_ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/rag_ab_stdout.txt); pack
LEFT=$(( 560 - ($(date +%s) - T0) ))
if [ $LEFT -gt 90 ]; then
  (cd /tmp/trees_head && OUT=$R PROMPT=32768 PER_TREE_S=$LEFT bash $HERE/benchmarks/device/ttft_trees.sh); pack
fi
grep -E "^rag |rc=|Error|Traceback" $R/rag_ab_stdout.txt | cut -c1-400
grep -cE "Autotuning|recompil" $R/rag_ab_stdout.txt
echo "call done after $(( $(date +%s) - T0 )) s"
