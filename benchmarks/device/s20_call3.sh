#!/usr/bin/env bash
# Session 20, call 3 (nvidia-h200; carry .whl and .snap): the runner's CUDA test of a forward
# with writes replaying graphs of its own (cut by call 2's time limit; its graphs now adaptive);
# the cold 32k TTFT command (full_recompute, hypic inline with the summaries written in place,
# standalone); the RAG trace at 32k with the fresh-graph policies and the two-step seam walk
# interleaved, with per-layer timelines (how many cores each setting captured).
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r3; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s20c3.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 110 python3 -m pytest -p no:cacheprovider -v \
  tests/engine/test_pic_runner_cuda.py::test_cached_request_with_missed_segments_replays_graphs_of_its_own_on_cuda \
  > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
timeout 230 python3 -m hypic bench ttft "${MODEL[@]}" --modes full_recompute,hypic --cases cold \
  --prompt-tokens 32768 --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB \
  --no-progress --json $R/ttft_cold32k.json > $R/cold32k_stdout.txt 2>&1
echo "cold rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold32k_stdout.txt; pack
LEFT=$(( 540 - ($(date +%s) - T0) ))
if [ $LEFT -gt 60 ]; then
  (cd benchmarks && timeout $LEFT python3 rag_ab_h200.py --out $R --prompts 32768 --requests 8 --store-bytes 36GiB \
    --timeline --ab-settings "HYPIC_KEPT_LAYOUTS=0;HYPIC_KEPT_LAYOUTS=0 HYPIC_LAYER_GRAPHS=0;HYPIC_KEPT_LAYOUTS=0 HYPIC_CHAIN_FUSE_SEAMS=0" \
    > $R/rag_ab_stdout.txt 2>&1
   echo "rag_ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/rag_ab_stdout.txt); pack
fi
grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $R/pytest_cuda.txt | cut -c1-200
grep -hE "^(cold) |rc=|Error" $R/cold32k_stdout.txt | cut -c1-220
grep -E "^rag |rc=|Error|core graphs" $R/rag_ab_stdout.txt 2>/dev/null | cut -c1-400
echo "call done after $(( $(date +%s) - T0 )) s"
