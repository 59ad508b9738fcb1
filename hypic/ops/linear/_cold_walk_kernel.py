"""The Triton kernel of :mod:`hypic.ops.linear.cold_walk` (imported lazily, so a CPU-only machine
never imports Triton). Module-level so that the helpers it shares with the chain kernel resolve
as globals both when compiled and under ``TRITON_INTERPRET=1``."""

import triton
import triton.language as tl

from hypic.ops.linear._triton_scan_kernel import state_tile, wy_chunk


@triton.jit
def walk_step(k, w, u, g, v_new, h_chunks, incoming, record, chunks, b_h, r, i_h, o_k, m_k, o_v, m_v, kv_off,
              m_kv, NC, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
              USE_G: tl.constexpr, HAS_RECORD: tl.constexpr, INTERPRET: tl.constexpr):
    """Chunk row r: with ``HAS_RECORD`` the state entering it recorded when it opens a span whose
    entering state is kept (a masked store, no branch in the loop), then fla's chunk step
    (:func:`wy_chunk`)."""
    bos = tl.load(chunks + r)
    eos = tl.load(chunks + NC + r)
    span = tl.load(chunks + 2 * NC + r)  # the span this chunk opens, else -1
    if HAS_RECORD:
        row = tl.load(record + tl.maximum(span, 0), mask=span >= 0, other=-1)
        keep = (kv_off * 0 + row) >= 0  # a tile mask (the interpreter needs one)
        tl.store(incoming + (tl.maximum(row, 0) * HV + i_h) * K * V + kv_off, b_h, mask=m_kv & keep)
    return wy_chunk(k, w, u, g, v_new, h_chunks, b_h, bos, eos - bos, r, bos * 0, i_h, o_k, m_k, o_v, m_v, kv_off, m_kv,
                    H, HV, K, V, BT, USE_G, INTERPRET)


@triton.jit(do_not_specialize=["NC"])
def cold_walk_kernel(
    init,        # [B, HV, K, V] fp32 (read only when HAS_INIT)
    incoming,    # [R, HV, K, V] fp32 out: the state entering each recorded span
    final,       # [B, HV, K, V] fp32 out: the state after each chain
    cu_chains,   # [B + 1] int64: each chain's spans
    chunk_cum,   # [N + 1] int64: chunk rows before each span
    chunks,      # [3, NC] int64: each chunk row's first and end token, and the span it opens (-1)
    record,      # [N] int64 (HAS_RECORD): row of `incoming` per span, -1 = not kept
    k,           # [T, H, K], w [T, HV, K], u [T, HV, V], g [T, HV] (USE_G): fla's WY step outputs
    w,
    u,
    g,
    v_new,       # [T, HV, V] out, in u's dtype
    h_chunks,    # [NC, HV, K, V] out: the state entering each chunk, in h_chunks' dtype
    NC,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    HAS_INIT: tl.constexpr,
    HAS_RECORD: tl.constexpr,
    USE_G: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """One (V block, head, chain): the chain's chunks in one flat loop, as fla's state pass runs
    one sequence, so the pipeline of their loads never drains at a span's end."""
    i_v = tl.program_id(0)
    i_h = tl.program_id(1).to(tl.int64)
    i_b = tl.program_id(2).to(tl.int64)
    o_k, o_v, m_k, m_v, m_kv, kv_off = state_tile(i_v, K, V, BK, BV)
    c0 = tl.load(chunk_cum + tl.load(cu_chains + i_b))
    c1 = tl.load(chunk_cum + tl.load(cu_chains + i_b + 1))
    if HAS_INIT:
        b_h = tl.load(init + (i_b * HV + i_h) * K * V + kv_off, mask=m_kv, other=0.0).to(tl.float32)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if INTERPRET:
        # the interpreter cannot run ``range`` over bounds loaded from memory
        r = c0
        while r < c1:
            b_h = walk_step(k, w, u, g, v_new, h_chunks, incoming, record, chunks, b_h, r, i_h, o_k, m_k, o_v, m_v,
                            kv_off, m_kv, NC, H, HV, K, V, BT, USE_G, HAS_RECORD, INTERPRET)
            r += 1
    else:
        for r in range(c0, c1):
            b_h = walk_step(k, w, u, g, v_new, h_chunks, incoming, record, chunks, b_h, r, i_h, o_k, m_k, o_v, m_v,
                            kv_off, m_kv, NC, H, HV, K, V, BT, USE_G, HAS_RECORD, INTERPRET)
    tl.store(final + (i_b * HV + i_h) * K * V + kv_off, b_h, mask=m_kv)
