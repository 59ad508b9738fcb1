"""The Triton kernels of :mod:`hypic.ops.moe_route` (imported lazily, so a CPU-only machine never
imports Triton). Module-level so that they resolve both compiled and under ``TRITON_INTERPRET=1``."""

import triton
import triton.language as tl


# Token counts change with every request: not specialised, so a new size reuses the binary.
@triton.jit(do_not_specialize=["num_tokens"])
def route_topk_kernel(
    logits,       # [T, E] router logits (any float dtype; softmax in fp32)
    weights,      # [T, K] fp32 out: the top-K softmax probabilities, largest first (renormalised with RENORM)
    ids,          # [T, K] int32 out: their experts
    num_tokens,
    stride_logits,
    E: tl.constexpr,
    EP: tl.constexpr,   # E rounded up to a power of two
    K: tl.constexpr,
    KP: tl.constexpr,   # K rounded up to a power of two
    BT: tl.constexpr,
    RENORM: tl.constexpr,
):
    """Softmax over the experts of BT tokens, then K rounds of arg-max (the lowest expert id
    among equal maxima), each winner masked out for the next round: the same weights and order
    as ``torch.topk`` of the softmax (which sorts largest first), without its sort."""
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    m_t = t < num_tokens
    e = tl.arange(0, EP)
    m_e = e < E
    x = tl.load(logits + t.to(tl.int64)[:, None] * stride_logits + e[None, :],
                mask=m_t[:, None] & m_e[None, :], other=float("-inf")).to(tl.float32)
    x_max = tl.max(x, axis=1)
    x_max = tl.where(m_t, x_max, 0.0)  # padding tokens: no NaN from -inf - -inf
    p = tl.where(m_e[None, :], tl.exp(x - x_max[:, None]), 0.0)
    p = p / tl.where(m_t, tl.sum(p, axis=1), 1.0)[:, None]  # padding tokens: 0 / 1, no NaN
    left = tl.where(m_e[None, :], p, -1.0)  # probabilities are >= 0: -1 is never chosen again
    slot = tl.arange(0, KP)
    top_w = tl.zeros([BT, KP], dtype=tl.float32)
    top_e = tl.zeros([BT, KP], dtype=tl.int32)
    for j in tl.static_range(K):
        best = tl.max(left, axis=1)
        best_e = tl.min(tl.where(left == best[:, None], e[None, :], EP), axis=1)
        top_w = tl.where(slot[None, :] == j, best[:, None], top_w)
        top_e = tl.where(slot[None, :] == j, best_e[:, None], top_e)
        left = tl.where(e[None, :] == best_e[:, None], -1.0, left)
    if RENORM:
        total = tl.sum(top_w, axis=1)  # slots past K hold 0
        top_w = top_w / tl.where(total > 0, total, 1.0)[:, None]
    out = t.to(tl.int64)[:, None] * K + slot[None, :]
    m_out = m_t[:, None] & (slot[None, :] < K)
    tl.store(weights + out, top_w, mask=m_out)
    tl.store(ids + out, top_e, mask=m_out)


@triton.jit(do_not_specialize=["num_rows"])
def bucket_rows_kernel(
    ids,          # [R] int32 expert of each (token, slot) assignment, R = T * K, in [0, E)
    ends,         # [E] int64 out: end of each expert's rows among the sorted rows (cumulative counts)
    row_token,    # [R] int64 out: the token of each sorted row
    inverse,      # [R] int64 out: the sorted row of each assignment
    num_rows,
    K: tl.constexpr,
    BR: tl.constexpr,
):
    """Expert ``e = program_id(0)``: its rows start after every assignment to a smaller expert
    (a count over all ids), and its own assignments take them in assignment order (a running
    cumulative sum): the stable sort by expert, with no sort and no atomics, so the sorted order
    is the same at every run. Each program reads the ids twice (from L2)."""
    expert = tl.program_id(0)
    o_r = tl.arange(0, BR)
    start = tl.sum(tl.zeros([BR], dtype=tl.int64), axis=0)  # int64 scalars, loop-carried
    count = start
    for r0 in range(0, num_rows, BR):
        r = r0 + o_r
        v = tl.load(ids + r, mask=r < num_rows, other=2147483647)
        start += tl.sum((v < expert).to(tl.int64), axis=0)
        count += tl.sum((v == expert).to(tl.int64), axis=0)
    tl.store(ends + expert, start + count)
    taken = start
    for r0 in range(0, num_rows, BR):
        r = r0 + o_r
        v = tl.load(ids + r, mask=r < num_rows, other=2147483647)
        mine = v == expert
        row = taken + tl.cumsum(mine.to(tl.int64), axis=0) - 1
        tl.store(row_token + row, (r // K).to(tl.int64), mask=mine)
        tl.store(inverse + r, row, mask=mine)
        taken += tl.sum(mine.to(tl.int64), axis=0)


@triton.jit
def mix_rows_kernel(
    rows_out,     # [R, H] expert outputs of the sorted rows
    inverse,      # [T * K] int64 sorted row of each (token, slot)
    weights,      # [T, K] fp32 mixing weights
    out,          # [T, H] out
    stride_rows,
    stride_out,
    H: tl.constexpr,
    K: tl.constexpr,
    BH: tl.constexpr,
    ROUND_WEIGHTS: tl.constexpr,  # round each weight to out's dtype first (transformers mixes so)
):
    """``out[t] = sum_j w[t, j] * rows_out[inverse[t, j]]`` for token ``program_id(0)`` and one
    BH-column block, accumulated in fp32 in slot order: the rows are read once, ``out`` written
    once."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    m_h = h < H
    acc = tl.zeros([BH], dtype=tl.float32)
    for j in tl.static_range(K):
        row = tl.load(inverse + t * K + j)
        w = tl.load(weights + t * K + j)
        if ROUND_WEIGHTS:
            w = w.to(out.dtype.element_ty).to(tl.float32)
        acc += tl.load(rows_out + row * stride_rows + h, mask=m_h, other=0.0).to(tl.float32) * w
    tl.store(out + t * stride_out + h, acc.to(out.dtype.element_ty), mask=m_h)
