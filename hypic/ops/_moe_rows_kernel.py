"""The Triton kernel of :mod:`hypic.ops.moe_rows` (imported lazily, so a CPU-only machine never
imports Triton). Module-level so that it resolves both compiled and under ``TRITON_INTERPRET=1``.

:func:`moe_rows_gemm_kernel`: one program per (expert, BN-column tile), a pipelined loop over the
contraction (contract: :func:`hypic.ops.moe_rows.rows_gemm`).
"""

import triton
import triton.language as tl


@triton.jit
def moe_rows_gemm_kernel(
    a,              # [*, KD] activations (rows read through ``a_row_of`` with GATHER)
    a_row_of,       # [R] int64: row of ``a`` behind each sorted row (read only with GATHER)
    w,              # [E, N or 2N, KD] expert weights, nn.Linear orientation, unit stride along KD
    out,            # [R, N] out: one row per sorted (token, slot) row
    ends,           # [E] int64: end of each expert's rows among the sorted rows (cumulative counts)
    stride_a,
    stride_we,
    stride_wn,
    stride_out,
    N: tl.constexpr,   # output columns (with SWIGLU: the intermediate size; gate rows [0, N), up [N, 2N))
    KD: tl.constexpr,  # contraction length (both are model sizes: constant per weight, and the
                       # compiler drops the masks where the tiles divide them)
    GATHER: tl.constexpr,
    SWIGLU: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    """``out[rows of e] = a[rows] @ w[e].T`` for expert ``e = program_id(0)`` and one BN-column
    tile, BM rows at a time (the expert's second block finds the weight tile it re-reads in L2);
    with SWIGLU ``silu(a @ w_gate.T) * (a @ w_up.T)`` from fp32 accumulators. An expert without
    rows returns at once, so no block table is needed."""
    expert = tl.program_id(0)
    pid_n = tl.program_id(1)
    end = tl.load(ends + expert)
    start = tl.load(ends + expert - 1, mask=expert > 0, other=0)
    o_n = pid_n * BN + tl.arange(0, BN)
    m_n = o_n < N
    o_k = tl.arange(0, BK)
    w_rows = w + expert.to(tl.int64) * stride_we + o_n.to(tl.int64)[:, None] * stride_wn
    r0 = start
    while r0 < end:  # a while loop: the interpreter cannot run range() over loaded bounds
        rows = r0 + tl.arange(0, BM)
        m_rows = rows < end
        if GATHER:
            src = tl.load(a_row_of + rows, mask=m_rows, other=0)
        else:
            src = rows
        a_rows = a + src[:, None] * stride_a
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        acc_up = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(0, KD, BK):
            m_k = (k0 + o_k) < KD
            b_a = tl.load(a_rows + (k0 + o_k)[None, :], mask=m_rows[:, None] & m_k[None, :], other=0.0)
            b_w = tl.load(w_rows + (k0 + o_k)[None, :], mask=m_n[:, None] & m_k[None, :], other=0.0)
            acc += tl.dot(b_a, tl.trans(b_w))
            if SWIGLU:
                b_u = tl.load(w_rows + N * stride_wn + (k0 + o_k)[None, :], mask=m_n[:, None] & m_k[None, :],
                              other=0.0)
                acc_up += tl.dot(b_a, tl.trans(b_u))
        if SWIGLU:
            acc = acc / (1.0 + tl.exp(-acc)) * acc_up
        tl.store(out + rows[:, None] * stride_out + o_n[None, :], acc.to(out.dtype.element_ty),
                 mask=m_rows[:, None] & m_n[None, :])
        r0 += BM
