#!/usr/bin/env bash
# Session 23, call 2 (nvidia-h200; carry .whl and .snap): the scan ablation again with the
# variant that drops T (no_t) and a plain dense walk of as many steps; then ncu of the fused walk
# at the config autotuning picked (BV 32, 8 warps, 2 stages): every section, and the SASS page
# with its per-instruction stall samples.
set -u
source benchmarks/device/_setup.sh s23c2
(cd benchmarks && timeout 300 python3 scan_ablation_h200.py --out $R > $R/ablation_stdout.txt 2>&1
 echo "ablation rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ablation_stdout.txt); pack
(cd benchmarks && timeout $(left 420) ncu --clock-control none -k regex:scan_chain_kernel -c 1 --set full \
   --print-details all python3 scan_ablation_h200.py --ncu-once --ncu-config 32,8,2 > $R/ncu_full.txt 2>&1
 echo "ncu rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ncu_full.txt); pack
(cd benchmarks && timeout $(left 520) ncu --clock-control none -k regex:scan_chain_kernel -c 1 \
   --section WarpStateStats --section SourceCounters --import-source no --page source --print-source sass --csv \
   python3 scan_ablation_h200.py --ncu-once --ncu-config 32,8,2 > $R/ncu_sass.csv 2>&1
 echo "ncu rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ncu_sass.csv); pack
tail -5 $R/ablation_stdout.txt | cut -c1-700
grep -iE "stall|Warp Cycles|Duration|Spill|rc=" $R/ncu_full.txt | head -40
tail -2 $R/ncu_sass.csv | cut -c1-200; wc -c $R/ncu_sass.csv
echo "call done after $(( $(date +%s) - T0 )) s"
