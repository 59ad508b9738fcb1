"""Registers and spills of the chain-scan kernel's configs, compiled for sm_90 on this CPU.

Triton compiles for the H200 anywhere (tests/ops/linear/test_kernels_compile.py); ptxas ``-v``
then reports each config's registers per thread and spill bytes. That is what this script
prints, for the two uses of ``scan_chain_kernel`` that matter to issue 6:

* ``fused``: a cached request's walk (FUSE = 1: a seam and its body in one step);
* ``walk``: a cold prefill's walk (live spans alone, LONG_WY, the entering states recorded).

The local Triton may differ from the device's (3.9 here in session 18, 3.6 on the H200), so the
numbers are a guide to register pressure, not the device's own.

    python3 benchmarks/kernel_registers_cpu.py [--out FILE]
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ops", "linear"))

import triton  # noqa: E402

from test_kernels_compile import DIMS, compile_sm90  # noqa: E402  (the compile tests' helper)

from hypic.ops.linear._triton_scan_kernel import scan_chain_kernel  # noqa: E402

USES = {
    "fused": dict(HAS_SOURCE=True, HAS_RECORD=False, LONG_WY=False, FUSE=1),
    "walk": dict(HAS_SOURCE=False, HAS_RECORD=True, LONG_WY=True, FUSE=0),
}
CONFIGS = [(16, 4, 2), (32, 4, 2), (32, 8, 2), (64, 8, 1), (32, 4, 3), (64, 8, 3)]  # (BV, warps, stages)


def ptxas_candidates():
    bundled = sorted(glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas*")))
    return bundled + [p for p in (shutil.which("ptxas"),) if p]


def registers(ptx: str):
    """(registers, spill-store bytes) from the first ptxas that accepts this PTX."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    errors = []
    try:
        for ptxas in ptxas_candidates():
            run = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
            regs = re.search(r"Used (\d+) registers", run.stderr)
            if run.returncode == 0 and regs:
                spills = re.search(r"(\d+) bytes spill stores", run.stderr)
                return int(regs.group(1)), int(spills.group(1)) if spills else 0, os.path.basename(ptxas)
            errors.append(f"{ptxas}: {run.stderr.strip()[-200:]}")
    finally:
        os.unlink(f.name)
    raise RuntimeError("no ptxas accepted the PTX:\n" + "\n".join(errors))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args()
    lines = [f"triton {triton.__version__}, sm_90a; scan_chain_kernel (K = V = 128, 32 value heads)",
             f"{'use':6s} {'BV':>3s} {'warps':>5s} {'stages':>6s} {'regs':>5s} {'spill B':>8s} {'smem B':>7s}  ptxas"]
    for use, flags in USES.items():
        for bv, warps, stages in CONFIGS:
            constexprs = dict(DIMS, BV=bv, MODE=0, HAS_INIT=False, WHILE_LOOP=False, HAS_WY=True, BT=64, **flags)
            kernel = compile_sm90(scan_chain_kernel, constexprs, num_warps=warps, num_stages=stages)
            regs, spills, ptxas = registers(kernel.asm["ptx"])
            lines.append(f"{use:6s} {bv:3d} {warps:5d} {stages:6d} {regs:5d} {spills:8d} {kernel.metadata.shared:7d}  {ptxas}")
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
