#!/usr/bin/env bash
# Session 14, call 3 (nvidia-h200, .whl carried): call 2's cold 32k run of the fused path ran
# out of its 150 s while compiling on a fresh machine; here with room: cold 32k TTFT with
# HYPIC_CHAIN_LONG=fused (the default), one layer's chain kernels (benchmarks/chain_long_h200.py),
# then the former path (HYPIC_CHAIN_LONG=scan) again on this machine for the A/B.
set -u
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/r3; mkdir -p $R; T0=$(date +%s)
pack() { tar czf $OUT/s14c3.tgz -C $R .; }
MODEL=(--dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy --device cuda --dtype bfloat16 --seed 0 --seam 8)
cold() {  # $1 tag, $2 timeout; env in the caller
  timeout $2 python3 -m hypic bench ttft "${MODEL[@]}" --modes full_recompute,hypic --cases cold \
    --prompt-tokens 32768 --segment-tokens 512 --query-tokens 64 --cold-requests 3 --store-bytes 36GiB \
    --no-progress --json $R/ttft_cold32k_$1.json > $R/cold32k_$1_stdout.txt 2>&1
  echo "cold $1 rc=$? after $(( $(date +%s) - T0 )) s" >> $R/cold32k_$1_stdout.txt; pack
}
HYPIC_CHAIN_LONG=fused cold fused 330
(cd benchmarks && timeout 150 python3 chain_long_h200.py --out $R --segments 64,16 > $R/chain_long_stdout.txt 2>&1
 echo "chain_long rc=$? after $(( $(date +%s) - T0 )) s" >> $R/chain_long_stdout.txt); pack
LEFT=$(( 570 - ($(date +%s) - T0) ))
[ $LEFT -gt 60 ] && HYPIC_CHAIN_LONG=scan cold scan $LEFT
grep -E "^(all_hit|rag|cold) |rc=|Error|error" $R/cold32k_*_stdout.txt | cut -c1-250
tail -8 $R/chain_long_stdout.txt | cut -c1-250
echo "call done after $(( $(date +%s) - T0 )) s"
