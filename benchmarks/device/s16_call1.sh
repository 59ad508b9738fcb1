#!/usr/bin/env bash
# Session 16, call 1 (nvidia-h200; carry .whl and .snap): the cold write path's summaries
# (HYPIC_COLD_SUMMARIES: one_run / walk / fla). CUDA tests of the new kernels and op paths, the
# engine's CUDA runner test in the walk and one_run modes, one layer's chain at the cold shape
# (benchmarks/chain_long_h200.py: time and accuracy of each mode), then cold 32k TTFT with
# one_run (the first process compiles) and with walk on the same machine.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/tree && mkdir -p /tmp/tree && tar xzf .snap/tree.tgz -C /tmp/tree && cd /tmp/tree
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r1; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s16c1.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
cold() {  # $1 mode, $2 timeout
  HYPIC_COLD_SUMMARIES=$1 timeout $2 python3 -m hypic bench ttft "${MODEL[@]}" --modes full_recompute,hypic --cases cold \
    --prompt-tokens 32768 --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB \
    --no-progress --json $R/ttft_cold32k_$1.json > $R/cold32k_$1_stdout.txt 2>&1
  echo "cold $1 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold32k_$1_stdout.txt; pack
}
timeout 100 python3 -m pytest -p no:cacheprovider -q tests/ops/linear/test_state_summary.py \
  tests/ops/linear/test_chain_forward.py -k "cuda" > $R/pytest_cuda.txt 2>&1
echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt; pack
for m in walk one_run; do
  HYPIC_COLD_SUMMARIES=$m timeout 60 python3 -m pytest -p no:cacheprovider -q -k "not interpreter" \
    tests/engine/test_pic_runner_cuda.py > $R/pytest_runner_$m.txt 2>&1
  echo "runner $m rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_runner_$m.txt; pack
done
(cd benchmarks && timeout 120 python3 chain_long_h200.py --out $R --segments 64 > $R/chain_long_stdout.txt 2>&1
 echo "chain_long rc=$? after $(( $(date +%s) - T0 )) s" >> $R/chain_long_stdout.txt); pack
cold one_run 220
LEFT=$(( 575 - ($(date +%s) - T0) ))
[ $LEFT -gt 60 ] && cold walk $LEFT
tail -3 $R/pytest_cuda.txt $R/pytest_runner_*.txt | cut -c1-300
grep -E "^(cold) |rc=|Error|error" $R/cold32k_*_stdout.txt | cut -c1-250
tail -4 $R/chain_long_stdout.txt | cut -c1-400
echo "call done after $(( $(date +%s) - T0 )) s"
