#!/usr/bin/env bash
# Session 25, call 1 (nvidia-h200; carry .whl and .snap): the all-hit 32k request at head, with
# every kernel's GPU time (allhit_ab_h200.py's row "kernels"), the aten op census by hypic line
# and the host/GPU timeline, to split the 3x-floor gap by kernel before changing anything.
set -u
source benchmarks/device/_setup.sh s25c1
(cd benchmarks && timeout $(left 540) python3 allhit_ab_h200.py --tag s25c1 --out $R --prompts 32768 --repeats 6 \
   --timeline --census > $R/ab_stdout.txt 2>&1; echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_stdout.txt); pack
grep -vE "^\s*$" $R/ab_stdout.txt | tail -60 | cut -c1-250
python3 - <<'PY'
import json, glob
for f in glob.glob("/tmp/r_s25c1/allhit_ab_*.json"):
    for row in json.load(open(f))["rows"]:
        ks = row.get("kernels", [])
        print("total GPU ms", round(sum(k["ms"] for k in ks), 2), "kernels", len(ks))
        for k in ks[:70]:
            print(f'{k["ms"]:8.3f} {k["calls"]:5d}  {k["name"][:110]}')
PY
echo "call done after $(( $(date +%s) - T0 )) s"
