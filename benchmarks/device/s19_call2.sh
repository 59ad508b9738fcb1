#!/usr/bin/env bash
# Session 19, call 2 (nvidia-h200; carry .whl and .snap): forwards with writes (a cached request
# with missed documents, most of a RAG trace's) replay core graphs of their own
# (HYPIC_WRITE_GRAPHS) and form the written spans' summaries from their rows alone. The CUDA
# tests of both and of the runner (kept graphs); the RAG trace with HYPIC_WRITE_GRAPHS 1 and 0
# interleaved in one process, each value meeting the same misses; the TTFT command of the cached
# cases (all_hit and rag at 32k and 8k, prefix_cache against hypic) at this commit.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r2; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s19c2.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
timeout 170 python3 -m pytest -p no:cacheprovider -v tests/engine/test_pic_runner_cuda.py \
  "tests/ops/linear/test_chain_forward.py::test_written_spans_summaries_from_their_rows_alone_on_cuda" > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
(cd benchmarks && timeout 150 python3 rag_ab_h200.py --out $R --prompts 32768,8192 --requests 8 --store-bytes 36GiB \
  --ab-env HYPIC_WRITE_GRAPHS --ab-values 1,0 --same-misses > $R/rag_ab_stdout.txt 2>&1
 echo "rag_ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/rag_ab_stdout.txt); pack
LEFT=$(( 540 - ($(date +%s) - T0) ))
timeout $LEFT python3 -m hypic bench ttft "${MODEL[@]}" --modes prefix_cache,hypic --cases all_hit,rag \
  --query-tokens 64 --doc-tokens 256,2048 --system-tokens 256 --rag-query-tokens 32,64 --no-progress \
  --prompt-tokens 32768,8192 --segment-tokens 512 --num-requests 8 --cold-requests 3 --store-bytes 36GiB \
  --warmup-requests 2 --corpus-factor 3 --json $R/ttft_h200_cached.json > $R/ttft_cached_stdout.txt 2>&1
echo "ttft rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ttft_cached_stdout.txt; pack
grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $R/pytest_cuda.txt | cut -c1-200
grep -E "^rag |rc=|Error" $R/rag_ab_stdout.txt | cut -c1-300
grep -hE "^(all_hit|rag) |rc=|Error" $R/ttft_cached_stdout.txt | cut -c1-220
echo "call done after $(( $(date +%s) - T0 )) s"
