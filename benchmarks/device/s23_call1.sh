#!/usr/bin/env bash
# Session 23, call 1 (nvidia-h200; carry .whl and .snap): where the fused chain walk's step time
# goes (benchmarks/scan_ablation_h200.py: kernel variants with one stage left out, or an L2
# prefetch of the next body added), and, where the machine's runtime lets ncu read counters,
# ncu's warp-state and memory sections of one default launch at the all-hit 32k shape.
set -u
source benchmarks/device/_setup.sh s23c1
(uname -r; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv) > $R/machine.txt 2>&1
(cd benchmarks && timeout 330 python3 scan_ablation_h200.py --out $R > $R/ablation_stdout.txt 2>&1
 echo "ablation rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ablation_stdout.txt); pack
if which ncu >/dev/null 2>&1; then
  (cd benchmarks && timeout $(left 520) ncu --clock-control none -k regex:scan_chain_kernel -c 1 \
     --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
     --section LaunchStats python3 scan_ablation_h200.py --ncu-once > $R/ncu.txt 2>&1
   echo "ncu rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ncu.txt); pack
fi
cat $R/machine.txt
tail -8 $R/ablation_stdout.txt | cut -c1-600
grep -E "Stall|Warp Cycles|Duration|Registers|Achieved Occupancy|Throughput|rc=|Error|LibraryNotLoaded" $R/ncu.txt 2>/dev/null | head -40
echo "call done after $(( $(date +%s) - T0 )) s"
