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
    BT: tl.constexpr,   # tokens a program
    RENORM: tl.constexpr,
    STRIDE_ALIGN: tl.constexpr,  # a power of two (<= 16) that stride_logits is a multiple of
):
    """Softmax over the experts of BT tokens, then K rounds of arg-max (the lowest expert id
    among equal maxima), each winner masked out for the next round: the same weights and order
    as ``torch.topk`` of the softmax (which sorts largest first), without its sort.

    The rounds run on the probabilities' fp32 bits as int32: a probability is >= +0, and such
    floats order as their bits do, so a round is an integer max and then an integer min over
    the experts holding it (one ``redux.sync`` each within a warp on sm_80+, where a float max
    takes a chain of five shuffles), and the winner's probability comes back from its bits
    exactly."""
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    m_t = t < num_tokens
    e = tl.arange(0, EP)
    m_e = e < E
    # the stride, said to be a multiple of STRIDE_ALIGN (// then * folds to nothing when it is):
    # Triton specialises only multiples of 16, and the router's logits as a column block of the
    # MoE block's fused GEMM output have stride 1,288, a multiple of 8 only; without the hint
    # the loads are not vectorised and the [BT, EP] layout then spreads each row over the warps
    # (every reduction through shared memory, with a barrier)
    stride = (stride_logits // STRIDE_ALIGN) * STRIDE_ALIGN
    x = tl.load(logits + t.to(tl.int64)[:, None] * stride + e[None, :],
                mask=m_t[:, None] & m_e[None, :], other=float("-inf")).to(tl.float32)
    x_max = tl.max(x, axis=1)
    x_max = tl.where(m_t, x_max, 0.0)  # padding tokens: no NaN from -inf - -inf
    p = tl.where(m_e[None, :], tl.exp(x - x_max[:, None]), 0.0)
    p = p / tl.where(m_t, tl.sum(p, axis=1), 1.0)[:, None]  # padding tokens: 0 / 1, no NaN
    # the sign bit cleared: a probability is >= +0, but NaN logits could make a negative NaN;
    # so every real expert's bits are >= 0 and the K winners are always K distinct real experts
    # (bucket_rows relies on it). Padding experts and winners: -1, never chosen (again).
    left = tl.where(m_e[None, :], p.to(tl.int32, bitcast=True) & 0x7FFFFFFF, -1)
    slot = tl.arange(0, KP)
    top_w = tl.zeros([BT, KP], dtype=tl.float32)
    top_e = tl.zeros([BT, KP], dtype=tl.int32)
    total = tl.zeros([BT], dtype=tl.float32)
    for j in tl.static_range(K):
        best = tl.max(left, axis=1)
        best_e = tl.min(tl.where(left == best[:, None], e[None, :], EP), axis=1)
        left = tl.where(e[None, :] == best_e[:, None], -1, left)
        best_w = best.to(tl.float32, bitcast=True)  # p exactly
        total += best_w  # in slot order, the same sum whatever the launch configuration
        top_w = tl.where(slot[None, :] == j, best_w[:, None], top_w)
        top_e = tl.where(slot[None, :] == j, best_e[:, None], top_e)
    if RENORM:
        top_w = top_w / tl.where(total > 0, total, 1.0)[:, None]
    out = t.to(tl.int64)[:, None] * K + slot[None, :]
    m_out = m_t[:, None] & (slot[None, :] < K)
    tl.store(weights + out, top_w, mask=m_out)
    tl.store(ids + out, top_e, mask=m_out)


@triton.jit
def _tile_ids(ids, t, j, num_tokens, K: tl.constexpr):
    """The ``[BT, KP]`` ids of tokens ``t``, slots ``j``; past the tokens or K: int32 max (no expert)."""
    m = (t < num_tokens)[:, None] & (j < K)[None, :]
    return tl.load(ids + t[:, None] * K + j[None, :], mask=m, other=2147483647)


@triton.jit
def _number_tile(v, t, j, expert, taken, row_token, inverse, K: tl.constexpr):
    """Number the tile's assignments to ``expert`` from sorted row ``taken`` on, in token order;
    returns the next free row. A token holds an expert in one slot at most (its K ids are
    distinct), so the numbering is a scan over the tile's tokens, not over its BT * K ids: K
    times shorter, and the stores are per token, in the scan's layout."""
    slot = tl.sum(tl.where(v == expert, j[None, :] + 1, 0), axis=1)  # 1 + the expert's slot; 0: none
    hit = slot > 0
    row = (taken - 1 + tl.cumsum(hit.to(tl.int32), axis=0)).to(tl.int64)
    tl.store(row_token + row, t.to(tl.int64), mask=hit)
    tl.store(inverse + t.to(tl.int64) * K + slot - 1, row, mask=hit)
    return taken + tl.sum(hit.to(tl.int32), axis=0)


@triton.jit(do_not_specialize=["num_tokens"])
def bucket_rows_kernel(
    ids,          # [T, K] int32 experts of each token's K slots, in [0, E), distinct within a token
    ends,         # [E] int64 out: end of each expert's rows among the sorted rows (cumulative counts)
    row_token,    # [T * K] int64 out: the token of each sorted row
    inverse,      # [T * K] int64 out: the sorted row of each assignment (token t, slot j at t * K + j)
    num_tokens,
    K: tl.constexpr,
    KP: tl.constexpr,           # K rounded up to a power of two
    BT: tl.constexpr,           # tokens a tile (a power of two)
    SINGLE_TILE: tl.constexpr,  # num_tokens <= BT (the host's word)
):
    """Expert ``e = program_id(0)``: its rows start after every assignment to a smaller expert
    (a count over all ids), and its own assignments take them in assignment order (a running
    cumulative sum over the tokens): the stable sort by expert, with no sort and no atomics, so
    the sorted order is the same at every run.

    SINGLE_TILE: the ids are loaded once, and both counts come from one reduction (the
    smaller-expert count in the low 16 bits: at most BT * KP < 2**16 ids; the expert's own
    above: at most BT <= 2**12 tokens, one slot each, so the int32 never overflows), so a program
    is one load, one reduction and one scan deep. Otherwise the ids are read twice in tiles of
    BT tokens (from L2), counting and then numbering."""
    expert = tl.program_id(0)
    t0 = tl.arange(0, BT)
    j = tl.arange(0, KP)
    if SINGLE_TILE:
        v = _tile_ids(ids, t0, j, num_tokens, K)
        if BT * KP < 65536:
            both = tl.sum(tl.sum((v < expert).to(tl.int32) + ((v == expert).to(tl.int32) << 16), axis=1), axis=0)
            start = both & 0xFFFF
            count = both >> 16
        else:
            start = tl.sum(tl.sum((v < expert).to(tl.int32), axis=1), axis=0)
            count = tl.sum(tl.sum((v == expert).to(tl.int32), axis=1), axis=0)
        tl.store(ends + expert, (start + count).to(tl.int64))
        _number_tile(v, t0, j, expert, start, row_token, inverse, K)
    else:
        start = tl.sum(tl.zeros([BT], dtype=tl.int32), axis=0)  # int32 scalars, loop-carried
        count = start
        for tile in range(0, num_tokens, BT):
            v = _tile_ids(ids, tile + t0, j, num_tokens, K)
            start += tl.sum(tl.sum((v < expert).to(tl.int32), axis=1), axis=0)
            count += tl.sum(tl.sum((v == expert).to(tl.int32), axis=1), axis=0)
        tl.store(ends + expert, (start + count).to(tl.int64))
        taken = start
        for tile in range(0, num_tokens, BT):
            t = tile + t0
            taken = _number_tile(_tile_ids(ids, t, j, num_tokens, K), t, j, expert, taken, row_token, inverse, K)


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
