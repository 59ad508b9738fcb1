#!/usr/bin/env bash
# Session 24, call 1 (nvidia-h200; carry .whl and .snap): the fused walk with the bodies' T read
# pre-split (bf16 high and low planes) against the default and no T, round-robin, and both at
# several fixed configurations (BV 64 / 128: fewer CTAs read each head's T).
set -u
source benchmarks/device/_setup.sh s24c1
(cd benchmarks && timeout 420 python3 scan_ablation_h200.py --out $R --rounds 7 --bodies 64,16 \
   --variants base,presplit,no_t --config-variants base,presplit \
   --configs "32,8,2;32,8,1;64,8,1;64,8,2;64,4,1;128,8,1" > $R/ablation_stdout.txt 2>&1
 echo "ablation rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ablation_stdout.txt); pack
tail -5 $R/ablation_stdout.txt | cut -c1-1500
python3 -c "
import json; rows=json.load(open('$R/scan_ablation.json'))
for r in rows:
    print(r['bodies'], {k: [round(x,3) for x in v['samples_ms']] for k,v in r['variants'].items()})
    print(r['bodies'], {k: v.get('max_abs_diff_vs_default') for k,v in r['variants'].items() if 'max_abs_diff_vs_default' in v})
    print(r['bodies'], {k: round(v,3) for k,v in r['configs'].items()})
"
echo "call done after $(( $(date +%s) - T0 )) s"
