#!/usr/bin/env bash
# Session 25, call 3 (nvidia-h200; carry .whl and .snap): the projections that share an input fused
# into one GEMM each (HYPIC_FUSE_PROJECTIONS, read at load: one process per value) and the short
# conv's 16-token tiles. CUDA tests of the runner (graphs over the fused projections' views), then
# the all-hit 32k request fused (with the kernel table) and unfused, one process each.
set -u
source benchmarks/device/_setup.sh s25c3
timeout 170 python3 -m pytest -x -q -p no:warnings tests/engine/test_pic_runner_cuda.py tests/ops/test_conv_short.py \
  > $R/pytest_cuda.txt 2>&1; echo "pytest rc=$?" >> $R/pytest_cuda.txt; tail -4 $R/pytest_cuda.txt
for v in 1 0; do
  (cd benchmarks && HYPIC_FUSE_PROJECTIONS=$v timeout $(left 560) python3 allhit_ab_h200.py --tag s25c3_fuse$v --out $R \
     --prompts 32768 --repeats 10 $([ $v = 1 ] || echo --no-profile) > $R/ab_fuse$v.txt 2>&1; echo "ab rc=$? after $(( $(date +%s) - T0 )) s" >> $R/ab_fuse$v.txt)
  grep -E "^\{|rc=" $R/ab_fuse$v.txt | cut -c1-330; pack
done
python3 - <<'PY'
import json, glob
for f in sorted(glob.glob("/tmp/r_s25c3/allhit_ab_*.json")):
    for row in json.load(open(f))["rows"]:
        print(f.split("/")[-1], "p50", round(row["ttft_p50_ms"], 2), [round(x, 1) for x in row["ttft_ms"]])
        ks = row.get("kernels", [])
        for k in ks[:28]:
            print(f'{k["ms"]:8.3f} {k["calls"]:5d}  {k["name"][:100]}')
PY
# the fused walk at 16 warps (never in its autotune list), against today's pick (BV 32, 8 warps, 2 stages)
(cd benchmarks && timeout $(left 585) python3 scan_ablation_h200.py --out $R --rounds 3 --bodies 64 --variants base \
   --config-variants base --configs "32,8,2;32,16,1;32,16,2;64,16,1;16,8,1;64,16,2" > $R/scan_stdout.txt 2>&1; echo "scan rc=$?" >> $R/scan_stdout.txt)
tail -4 $R/scan_stdout.txt | cut -c1-300; pack
echo "call done after $(( $(date +%s) - T0 )) s"
