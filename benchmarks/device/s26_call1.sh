#!/usr/bin/env bash
# Session 26, call 1 (nvidia-h200; carry .whl and .snap): CUDA tests of this session's changes
# (grouped graph outputs, the split-KV fixed-config switch, the runner's graphs-vs-eager test with
# every layer's diff); the split-KV attention's launch configs at the all-hit 32k shape; the rows
# GEMM variants at 576 tokens; the all-hit 32k request with its kernel table (grouped outputs on).
set -u
source benchmarks/device/_setup.sh s26c1
timeout 80 python3 -m pytest -q -p no:warnings tests/engine/test_cuda_graphs.py tests/ops/test_attention_split.py \
  > $R/pytest_cuda.txt 2>&1; echo "pytest rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
timeout 60 python3 -m pytest -q -p no:warnings tests/engine/test_pic_runner_cuda.py -k cached_request_on_cuda \
  >> $R/pytest_cuda.txt 2>&1; echo "pytest runner rc=$? after $(( $(date +%s) - T0 )) s" >> $R/pytest_cuda.txt
grep -E "passed|failed|rc=|Error|assert" $R/pytest_cuda.txt | cut -c1-600 | tail -12; pack
(cd benchmarks && timeout 125 python3 attention_split_h200.py --out $R --rows 128,64 --min-splits 2048,1024 \
   --block-n 64,128,32 --warps 8,4 --stages 2,3 --budget-s 85 > $R/attn_stdout.txt 2>&1; echo "attn rc=$? after $(( $(date +%s) - T0 )) s" >> $R/attn_stdout.txt)
grep -vE "^\s*$|Warning|warn" $R/attn_stdout.txt | cut -c1-160 | tail -40; pack
timeout 130 python3 benchmarks/moe_rows_h200.py --variants --variant-tokens 576 --out $R --budget-s 95 --repeats 15 \
  > $R/moe_rows_variants_stdout.txt 2>&1; echo "variants rc=$? after $(( $(date +%s) - T0 )) s" >> $R/moe_rows_variants_stdout.txt
grep -E "^ +576 |^best |^whole |error|rc=|Traceback" $R/moe_rows_variants_stdout.txt | cut -c1-200 | head -40; pack
(cd benchmarks && timeout $(left 585) python3 allhit_ab_h200.py --tag s26c1 --out $R --prompts 32768 --repeats 8 \
   > $R/ab_stdout.txt 2>&1; echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt)
grep -E "rc=" $R/ab_stdout.txt; pack
python3 - <<'PY'
import json, glob
for f in sorted(glob.glob("/tmp/r_s26c1/allhit_ab_*.json")):
    for row in json.load(open(f))["rows"]:
        print(f.split("/")[-1], "p50", round(row["ttft_p50_ms"], 2), [round(x, 1) for x in row["ttft_ms"]])
        ks = row.get("kernels", [])
        print("kernels total", round(sum(k["ms"] for k in ks), 3))
        for k in ks[:24]:
            print(f'{k["ms"]:8.3f} {k["calls"]:5d}  {k["name"][:90]}')
PY
echo "call done after $(( $(date +%s) - T0 )) s"
