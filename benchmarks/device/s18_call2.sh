#!/usr/bin/env bash
# Session 18, call 2 (nvidia-h200; carry .whl and .snap): the cold write path with (1) store
# entries copied layer by layer on a side stream while the forward runs (hypic/runner/entry_writer.py)
# and (2) the cold walk compiled without the summary step it never takes (a chain of live spans
# alone) and with int32 tile offsets. One layer's cold write (the walk against session 17's);
# the CUDA tests of the walk and the runner; cold 32k TTFT; the kernel diff of cold hypic against
# full_recompute in the time left.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r2; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s18c2.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
(cd benchmarks && timeout 170 python3 cold_write_h200.py --out $R > $R/cold_write_stdout.txt 2>&1
 echo "cold_write rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_write_stdout.txt); pack
timeout 150 python3 -m pytest -p no:cacheprovider -v tests/ops/linear/test_chain_forward.py tests/ops/linear/test_state_summary.py \
  tests/engine/test_pic_runner_cuda.py -k "cuda and (long_span or chain_forward_and_summarize or write or runner or cached_request or signature)" \
  > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
LEFT=$(( 585 - ($(date +%s) - T0) ))
[ $LEFT -gt 100 ] && { timeout $(( LEFT < 230 ? LEFT : 230 )) python3 -m hypic bench ttft "${MODEL[@]}" --modes full_recompute,hypic --cases cold \
  --prompt-tokens 32768 --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB \
  --no-progress --json $R/ttft_cold32k.json > $R/cold32k_stdout.txt 2>&1
  echo "cold rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold32k_stdout.txt; pack; }
LEFT=$(( 585 - ($(date +%s) - T0) ))
[ $LEFT -gt 100 ] && { (cd benchmarks && timeout $LEFT python3 cold_diff_h200.py --out $R --repeats 2 > $R/cold_diff_stdout.txt 2>&1
  echo "cold_diff rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold_diff_stdout.txt); pack; }
grep -A 3 "^ bias" $R/cold_write_stdout.txt | cut -c1-250
tail -n 2 $R/cold_write_stdout.txt | cut -c1-200
grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $R/pytest_cuda.txt | cut -c1-160
grep -hE "^(cold) |rc=|Error" $R/cold32k_stdout.txt 2>/dev/null | cut -c1-220
head -c 3000 $R/cold_diff_stdout.txt 2>/dev/null | grep -v -i "USDT\|warn"
echo "call done after $(( $(date +%s) - T0 )) s"
