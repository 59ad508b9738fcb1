"""The Triton kernel of :mod:`hypic.ops.conv_short` (imported lazily, so a CPU-only machine never
imports Triton). Module-level so that it resolves both compiled and under ``TRITON_INTERPRET=1``."""

import triton
import triton.language as tl

from hypic.ops._triton_search import run_of


# The token and run counts change with every request: not specialised (== 1, % 16), so requests
# of new sizes reuse the compiled kernel instead of compiling a variant on their first call.
@triton.jit(do_not_specialize=["num_tokens", "num_seqs"])
def short_conv_kernel(
    x,            # [T, D] packed inputs of every sequence
    weight,       # [D, W] taps (tap j reads the input W-1-j steps back)
    bias,         # [D] (read only with HAS_BIAS)
    state,        # [N, D, W-1] the W-1 inputs before each sequence (read only with HAS_STATE)
    cu_seqlens,   # [N + 1] int64 sequence bounds
    y,            # [T, D] out
    num_tokens,
    num_seqs,
    stride_x,
    stride_y,
    D: tl.constexpr,
    W: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_STATE: tl.constexpr,
    SILU: tl.constexpr,
    BT: tl.constexpr,
    BD: tl.constexpr,
    LOG_N: tl.constexpr,  # halvings of [0, N - 1]: at least N's bit length
):
    """One (BT tokens, BD channels) tile: each token finds its sequence by a binary search over
    ``cu_seqlens`` (no per-token tables), then sums its W taps in fp32; taps before the sequence
    start read its state. Memory-bound: x is read once from HBM (the taps' re-reads hit L1/L2)."""
    pid_t = tl.program_id(0)
    pid_d = tl.program_id(1)
    t = pid_t * BT + tl.arange(0, BT)
    d = pid_d * BD + tl.arange(0, BD)
    m_t = t < num_tokens
    m_d = d < D
    seq = run_of(cu_seqlens, t, num_seqs, m_t, LOG_N)  # the sequence holding each token
    local = t - tl.load(cu_seqlens + seq, mask=m_t, other=0)
    m_td = m_t[:, None] & m_d[None, :]
    acc = tl.zeros([BT, BD], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias + d, mask=m_d, other=0.0).to(tl.float32)[None, :]
    for j in tl.static_range(W):
        back = W - 1 - j  # a constant: j is unrolled
        inside = local >= back
        b_x = tl.load(x + (t - back).to(tl.int64)[:, None] * stride_x + d[None, :],
                      mask=m_td & inside[:, None], other=0.0).to(tl.float32)
        if HAS_STATE:
            if back > 0:
                col = (W - 1) + local - back  # in [0, W-1) where the tap lies before the start
                b_s = tl.load(state + (seq[:, None] * D + d[None, :]) * (W - 1) + col[:, None],
                              mask=m_td & (~inside)[:, None], other=0.0).to(tl.float32)
                b_x += b_s
        w_j = tl.load(weight + d * W + j, mask=m_d, other=0.0).to(tl.float32)
        acc += w_j[None, :] * b_x
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(y + t.to(tl.int64)[:, None] * stride_y + d[None, :], acc.to(y.dtype.element_ty), mask=m_td)


# Run counts change with every request: not specialised.
@triton.jit(do_not_specialize=["num_tokens", "num_groups"])
def conv_tails_kernel(
    x,            # [T, D] the layer's conv inputs (any row stride, unit channel stride)
    init,         # [N0, D, G] the runs' initial states (any strides)
    index,        # [num_groups * G] int64: row of cat(x, init's rows in (n, j) order) of each tail row
    out,          # [num_groups, D, G] out, contiguous, its own dtype
    num_tokens,
    num_groups,
    stride_xt,
    stride_in,
    stride_id,
    stride_ij,
    D: tl.constexpr,
    G: tl.constexpr,
    GP: tl.constexpr,   # G rounded up to a power of two
    BD: tl.constexpr,
):
    """Group ``program_id(0)``'s G tail rows, channels ``[BD]`` of block ``program_id(1)``: each row
    read from x or from a run's initial state (its row ``n * G + j``, read as ``init[n, :, j]``)
    and stored transposed, in out's dtype: the gather, transpose and cast of the tails in one
    launch, with no concatenation of x and the states."""
    grp = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    j = tl.arange(0, GP)
    m_j = j < G
    m_d = d < D
    row = tl.load(index + grp * G + j, mask=m_j, other=0)
    in_x = row < num_tokens
    e = tl.where(in_x, 0, row - num_tokens)
    m_x = (m_j & in_x)[:, None] & m_d[None, :]
    m_e = (m_j & (in_x == 0))[:, None] & m_d[None, :]
    from_x = tl.load(x + row[:, None] * stride_xt + d[None, :], mask=m_x, other=0.0)
    from_e = tl.load(init + (e // G)[:, None] * stride_in + d[None, :] * stride_id + (e % G)[:, None] * stride_ij,
                     mask=m_e, other=0.0)
    val = tl.where(m_x, from_x.to(tl.float32), from_e.to(tl.float32))
    tl.store(out + grp * D * G + d[None, :] * G + j[:, None], val.to(out.dtype.element_ty),
             mask=m_j[:, None] & m_d[None, :])
