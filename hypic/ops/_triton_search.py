"""A Triton helper of the varlen kernels (imported only by kernel modules, which are themselves
imported lazily, so a CPU-only machine never imports Triton)."""

import triton
import triton.language as tl


@triton.jit
def run_of(cu, x, num_runs, mask, LOG_N: tl.constexpr):
    """For each x, the largest run r with ``cu[r] <= x`` (the run holding x, empty runs skipped),
    found in LOG_N halvings of ``[0, num_runs - 1]`` (LOG_N at least num_runs' bit length). Rows
    outside ``mask`` read nothing and get an unspecified run."""
    lo = tl.zeros_like(x).to(tl.int64)
    hi = lo + (num_runs - 1)
    for _ in tl.static_range(LOG_N):
        mid = (lo + hi + 1) // 2
        go = tl.load(cu + mid, mask=mask, other=0) <= x
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid - 1)
    return lo
