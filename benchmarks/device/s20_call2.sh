#!/usr/bin/env bash
# Session 20, call 2 (nvidia-h200; carry .whl and .snap): a cold prefill's segment summaries
# written by the kernels straight into the store entries (HYPIC_ENTRY_IN_PLACE) and fresh
# layouts' core graphs captured only once the GPU keeps up (HYPIC_FRESH_GRAPHS=adaptive). The
# CUDA tests of both; the cold 32k request with HYPIC_ENTRY_IN_PLACE 1 and 0 against
# full_recompute, interleaved in one process (the summaries' share of cold prefill); the TTFT
# command of the cached cases (prefix_cache against hypic, 32k and 8k, one process); the RAG
# trace at 32k with the fresh-graph and seam-walk switches interleaved.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r2; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s20c2.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 150 python3 -m pytest -p no:cacheprovider -v \
  tests/ops/linear/test_state_summary.py::test_kernels_write_into_targets_on_cuda \
  tests/ops/linear/test_state_summary.py::test_cold_write_path_into_targets_on_cuda \
  tests/engine/test_pic_runner_cuda.py > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
(cd benchmarks && timeout 170 python3 cold_diff_h200.py --out $R --ab-env HYPIC_ENTRY_IN_PLACE --ab-values 1,0 \
  --ab-rounds 4 --no-profile > $R/cold_ab_stdout.txt 2>&1
 echo "cold_ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_ab_stdout.txt); pack
timeout 170 python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
  --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
  --prompt-tokens 32768,8192 --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
  --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_cached.json > $R/ttft_cached_stdout.txt 2>&1
echo "ttft rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_cached_stdout.txt; pack
LEFT=$(( 560 - ($(date +%s) - T0) ))
if [ $LEFT -gt 60 ]; then
  (cd benchmarks && timeout $LEFT python3 rag_ab_h200.py --out $R --prompts 32768 --requests 8 --store-bytes 36GiB \
    --ab-settings "HYPIC_KEPT_LAYOUTS=0;HYPIC_KEPT_LAYOUTS=0 HYPIC_FRESH_GRAPHS=always;HYPIC_KEPT_LAYOUTS=0 HYPIC_CHAIN_FUSE_SEAMS=0" \
    > $R/rag_ab_stdout.txt 2>&1
   echo "rag_ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/rag_ab_stdout.txt); pack
fi
grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $R/pytest_cuda.txt | cut -c1-200
grep -E "cold A/B|rc=|Error" $R/cold_ab_stdout.txt | cut -c1-300
grep -hE "^(all_hit|rag) |rc=|Error" $R/ttft_cached_stdout.txt | cut -c1-220
grep -E "^rag |rc=|Error" $R/rag_ab_stdout.txt 2>/dev/null | cut -c1-400
echo "call done after $(( $(date +%s) - T0 )) s"
