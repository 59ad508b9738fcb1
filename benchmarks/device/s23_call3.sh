#!/usr/bin/env bash
# Session 23, call 3 (nvidia-h200; carry .whl and .snap): the fused walk's variants that may
# land (the body's T loaded after the seam's tiles; an L2 prefetch of the next body; both),
# timed round-robin beside the default and two references (hot tiles, no T).
set -u
source benchmarks/device/_setup.sh s23c3
(cd benchmarks && timeout 400 python3 scan_ablation_h200.py --out $R --rounds 7 \
   --variants base,reorder,reorder_prefetch,prefetch,hot_ts,no_t > $R/ablation_stdout.txt 2>&1
 echo "ablation rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ablation_stdout.txt); pack
tail -7 $R/ablation_stdout.txt | cut -c1-700
python3 -c "
import json; rows=json.load(open('$R/scan_ablation.json'))
for r in rows:
    print(r['bodies'], {k: [round(x,3) for x in v['samples_ms']] for k,v in r['variants'].items()})
    print(r['bodies'], {k: v.get('max_abs_diff_vs_default') for k,v in r['variants'].items() if 'max_abs_diff_vs_default' in v})
"
echo "call done after $(( $(date +%s) - T0 )) s"
