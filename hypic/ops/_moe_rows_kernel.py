"""The Triton kernels of :mod:`hypic.ops.moe_rows` (imported lazily, so a CPU-only machine never
imports Triton). Module-level so that they resolve both compiled and under ``TRITON_INTERPRET=1``.

Two kernels, same contract (see :func:`hypic.ops.moe_rows.rows_gemm`):

* :func:`moe_rows_gemm_kernel` (``kernel="tiles"``): one program per (expert, BN-column tile), a
  pipelined loop over KD; ``SWAP_AB`` computes the transposed tile ``W @ A.T`` instead of
  ``A @ W.T``: the weight tile becomes the MMA's M operand (BN >= 64: Hopper's wgmma, where
  BM = 16 or 32 token rows alone would fall back to mma.sync) and the few token rows its N operand.
* :func:`moe_rows_stream_kernel` (``kernel="stream"``): one program per (expert, GROUP column
  tiles), one flat loop over the GROUP x KD/BK weight blocks, so the software pipeline keeps its
  loads in flight across the tile boundaries (a tile's epilogue runs inside the loop) instead of
  draining and refilling once per tile; BK may cover the whole KD (the down GEMM's 1 KB weight rows
  as one contiguous block per row, the activation rows then loaded once); the weight blocks can come
  through a host-side TMA descriptor (``TMA``), else through pointers; ``SWAP_AB`` as above.
"""

import triton
import triton.language as tl


@triton.jit
def _store_rows(out, rows, m_rows, o_n, m_n, acc, acc_up, stride_out, SWIGLU: tl.constexpr, SWAP_AB: tl.constexpr):
    """Store one tile's rows: ``acc`` is [BM, BN] (or [BN, BM] with SWAP_AB, stored transposed);
    with SWIGLU ``silu(acc) * acc_up`` on the fp32 accumulators first."""
    if SWIGLU:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if SWAP_AB:
        tl.store(out + rows[None, :] * stride_out + o_n[:, None], acc.to(out.dtype.element_ty),
                 mask=m_rows[None, :] & m_n[:, None])
    else:
        tl.store(out + rows[:, None] * stride_out + o_n[None, :], acc.to(out.dtype.element_ty),
                 mask=m_rows[:, None] & m_n[None, :])


@triton.jit
def _tile_dot(b_a, b_w, SWAP_AB: tl.constexpr):
    """``b_a @ b_w.T`` ([BM, BN]), or with SWAP_AB its transpose ``b_w @ b_a.T`` ([BN, BM])."""
    if SWAP_AB:
        return tl.dot(b_w, tl.trans(b_a))
    else:
        return tl.dot(b_a, tl.trans(b_w))


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
    SWAP_AB: tl.constexpr = False,
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
        if SWAP_AB:
            acc = tl.zeros([BN, BM], dtype=tl.float32)
            acc_up = tl.zeros([BN, BM], dtype=tl.float32)
        else:
            acc = tl.zeros([BM, BN], dtype=tl.float32)
            acc_up = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(0, KD, BK):
            m_k = (k0 + o_k) < KD
            b_a = tl.load(a_rows + (k0 + o_k)[None, :], mask=m_rows[:, None] & m_k[None, :], other=0.0)
            b_w = tl.load(w_rows + (k0 + o_k)[None, :], mask=m_n[:, None] & m_k[None, :], other=0.0)
            acc += _tile_dot(b_a, b_w, SWAP_AB)
            if SWIGLU:
                b_u = tl.load(w_rows + N * stride_wn + (k0 + o_k)[None, :], mask=m_n[:, None] & m_k[None, :],
                              other=0.0)
                acc_up += _tile_dot(b_a, b_u, SWAP_AB)
        _store_rows(out, rows, m_rows, o_n, m_n, acc, acc_up, stride_out, SWIGLU, SWAP_AB)
        r0 += BM


@triton.jit
def _weight_block(w, w_expert, row, n0, k0, o_bn, o_k, stride_wn, N: tl.constexpr, KD: tl.constexpr,
                  TMA: tl.constexpr):
    """The [BN, BK] weight block of output columns ``n0 + arange(BN)`` at contraction column ``k0``.
    TMA: from row ``row`` of the descriptor's [E * rows, KD] view (rows and columns past its end
    read as zeros; a partial tile's rows past N read the next rows, whose columns are never
    stored); else through pointers from ``w_expert`` (the expert's first gate or up row), masked."""
    if TMA:
        return w.load([row, k0])
    else:
        o_n = n0 + o_bn
        return tl.load(w_expert + o_n.to(tl.int64)[:, None] * stride_wn + (k0 + o_k)[None, :],
                       mask=(o_n < N)[:, None] & ((k0 + o_k) < KD)[None, :], other=0.0)


@triton.jit
def moe_rows_stream_kernel(
    a,              # [*, KD] activations (rows read through ``a_row_of`` with GATHER)
    a_row_of,       # [R] int64 (read only with GATHER)
    w,              # [E, N or 2N, KD] expert weights; with TMA a descriptor over their [E * (N or 2N), KD] view
    out,            # [R, N] out
    ends,           # [E] int64 cumulative row counts
    stride_a,
    stride_we,      # (unused with TMA)
    stride_wn,      # (unused with TMA)
    stride_out,
    N: tl.constexpr,
    KD: tl.constexpr,
    GATHER: tl.constexpr,
    SWIGLU: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP: tl.constexpr,    # column tiles per program (divides the tile count: no block streams twice)
    SWAP_AB: tl.constexpr,
    TMA: tl.constexpr,
):
    """As :func:`moe_rows_gemm_kernel` for the GROUP column tiles ``[pid * GROUP, (pid + 1) * GROUP)``
    of expert ``program_id(0)``, in one loop over GROUP * ceil(KD / BK) weight blocks (a constant
    trip count: the compiler pipelines it; a while loop it would not)."""
    expert = tl.program_id(0)
    pid_g = tl.program_id(1)
    end = tl.load(ends + expert)
    start = tl.load(ends + expert - 1, mask=expert > 0, other=0)
    KT: tl.constexpr = (KD + BK - 1) // BK       # weight blocks per tile
    W_ROWS: tl.constexpr = 2 * N if SWIGLU else N
    o_k = tl.arange(0, BK)
    o_bn = tl.arange(0, BN)
    row0 = expert * W_ROWS                       # the expert's first row in the [E * W_ROWS, KD] view
    w_expert = a_row_of                          # (a placeholder pointer; TMA reads through ``w``)
    if not TMA:
        w_expert = w + expert.to(tl.int64) * stride_we
    n_first = pid_g * GROUP * BN
    r0 = start
    while r0 < end:  # almost always one block of rows (BM is taller than an expert's row count)
        rows = r0 + tl.arange(0, BM)
        m_rows = rows < end
        if GATHER:
            src = tl.load(a_row_of + rows, mask=m_rows, other=0)
        else:
            src = rows
        a_rows = a + src[:, None] * stride_a
        if KT == 1:  # the whole contraction in one block: the rows are loaded once, not once per tile
            b_a = tl.load(a_rows + o_k[None, :], mask=m_rows[:, None] & (o_k < KD)[None, :], other=0.0)
        if SWAP_AB:
            acc = tl.zeros([BN, BM], dtype=tl.float32)
            acc_up = tl.zeros([BN, BM], dtype=tl.float32)
        else:
            acc = tl.zeros([BM, BN], dtype=tl.float32)
            acc_up = tl.zeros([BM, BN], dtype=tl.float32)
        for it in range(GROUP * KT):
            n0 = n_first + (it // KT) * BN
            k0 = (it % KT) * BK
            if KT > 1:
                b_a = tl.load(a_rows + (k0 + o_k)[None, :], mask=m_rows[:, None] & ((k0 + o_k) < KD)[None, :],
                              other=0.0)
            b_w = _weight_block(w, w_expert, row0 + n0, n0, k0, o_bn, o_k, stride_wn, N, KD, TMA)
            if SWIGLU:
                b_u = _weight_block(w, w_expert + N * stride_wn, row0 + N + n0, n0, k0, o_bn, o_k, stride_wn,
                                    N, KD, TMA)
            part = _tile_dot(b_a, b_w, SWAP_AB)
            part_up = part  # (unused without SWIGLU)
            if SWIGLU:
                part_up = _tile_dot(b_a, b_u, SWAP_AB)
            o_n = n0 + o_bn
            if KT == 1:  # each block a whole tile: nothing accumulates across iterations
                _store_rows(out, rows, m_rows, o_n, o_n < N, part, part_up, stride_out, SWIGLU, SWAP_AB)
            else:
                acc += part  # (the compiler folds the add into the MMA's accumulator)
                if SWIGLU:
                    acc_up += part_up
                if (it % KT) == KT - 1:  # the tile's last block: its epilogue, then a fresh accumulator
                    _store_rows(out, rows, m_rows, o_n, o_n < N, acc, acc_up, stride_out, SWIGLU, SWAP_AB)
                    acc = tl.zeros_like(acc)
                    acc_up = tl.zeros_like(acc_up)
        r0 += BM
