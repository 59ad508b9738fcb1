"""Triton kernels of :mod:`hypic.ops.linear.short_span` (imported lazily: a CPU-only machine never
imports Triton). One launch each for what the torch formulation does in ~15 tensor ops per width
class: the closed-form summaries and the state pass of spans of at most one chunk (``BT``)."""

import triton
import triton.language as tl


@triton.jit
def span_rows(cu, i_n, BT: tl.constexpr):
    """Rows of span ``i_n`` padded to one chunk: ``(bos, length, rows [BT], mask [BT])``."""
    bos = tl.load(cu + i_n).to(tl.int64)
    length = tl.load(cu + i_n + 1).to(tl.int64) - bos
    o_t = tl.arange(0, BT)
    return bos, length, bos + o_t, o_t < length


@triton.jit
def short_span_summary_kernel(
    k,        # [T, H, K]
    w,        # [T, HV, K]
    u,        # [T, HV, V]
    g,        # [T, HV] fp32 chunk-local cumulative log2 gate (unused without USE_G)
    cu,       # [N + 1] int64 span bounds (each span at most BT tokens)
    trans,    # [N, HV, K, K] fp32 out
    state,    # [N, HV, K, V] fp32 out (unused without STATE)
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    USE_G: tl.constexpr,
    STATE: tl.constexpr,
):
    """Program (span, value head, column block): column blocks [0, K/BC) write T = gamma I - Kd^T W,
    the rest write S = Kd^T U, with Kd = diag(exp2(g_last - g)) K over the span's tokens.

    The dots are TF32 MMAs with fp32 accumulation: with bf16 or fp16 inputs W and U are exact in
    TF32 and only the decayed keys round (relative 2^-11, finer than fla's kernel, which rounds
    them to bf16); fp32 inputs round too. An
    ``ieee`` fp32 dot here ran at 9.2 ms per layer on the H200 (all-hit 32k, 65 spans x 32 heads),
    against 0.34 ms for fla's kernel."""
    i_n = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    i_c = tl.program_id(2)
    bos, length, rows, m_t = span_rows(cu, i_n, BT)
    o_k = tl.arange(0, K)
    b_k = tl.load(k + (rows * H + i_h // (HV // H))[:, None] * K + o_k[None, :], mask=m_t[:, None],
                  other=0.0).to(tl.float32)
    if USE_G:
        g_last = tl.load(g + (bos + length - 1) * HV + i_h, mask=length > 0, other=0.0).to(tl.float32)
        b_g = tl.load(g + rows * HV + i_h, mask=m_t, other=0.0).to(tl.float32)
        decay = tl.where(m_t, tl.exp2(g_last - b_g), 0.0)
        gamma = tl.where(length > 0, tl.exp2(g_last), 1.0)
    else:
        decay = tl.where(m_t, 1.0, 0.0)
        gamma = 1.0
    b_kd_t = tl.trans(b_k * decay[:, None])  # [K, BT]
    base = (i_n * HV + i_h) * K
    if i_c < K // BC:
        o_c = i_c * BC + tl.arange(0, BC)
        b_w = tl.load(w + (rows * HV + i_h)[:, None] * K + o_c[None, :], mask=m_t[:, None], other=0.0).to(tl.float32)
        b_t = tl.where(o_k[:, None] == o_c[None, :], gamma, 0.0) - tl.dot(b_kd_t, b_w, input_precision="tf32")
        tl.store(trans + (base + o_k)[:, None] * K + o_c[None, :], b_t)
    elif STATE:
        o_c = (i_c - K // BC) * BC + tl.arange(0, BC)
        m_c = o_c < V
        b_u = tl.load(u + (rows * HV + i_h)[:, None] * V + o_c[None, :], mask=m_t[:, None] & m_c[None, :],
                      other=0.0).to(tl.float32)
        b_s = tl.dot(b_kd_t, b_u, input_precision="tf32")
        tl.store(state + (base + o_k)[:, None] * V + o_c[None, :], b_s, mask=m_c[None, :])


@triton.jit
def short_span_state_kernel(
    w,           # [T, HV, K]
    u,           # [T, HV, V]
    h0,          # [N, HV, K, V] fp32 initial state of each span
    cu,          # [N + 1] int64
    span_chunk,  # [N] int32 chunk index of each span (-1: empty span, no chunk)
    v_new,       # [T, HV, V] out, u's dtype
    h,           # [num_chunks, HV, K, V] out, w's dtype: the state entering each chunk
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
):
    """Program (span, value head, V block): v_new = u - W round(h0), round(h0) also stored as the
    chunk's entering state (what fla's state pass hands its output kernel for a one-chunk span)."""
    i_n = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    i_v = tl.program_id(2)
    _, _, rows, m_t = span_rows(cu, i_n, BT)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    b_h = tl.load(h0 + ((i_n * HV + i_h) * K + o_k)[:, None] * V + o_v[None, :], mask=m_v[None, :], other=0.0)
    b_h = b_h.to(w.dtype.element_ty)  # fla's state pass rounds the state before its dot
    chunk = tl.load(span_chunk + i_n).to(tl.int64)
    if chunk >= 0:
        tl.store(h + ((chunk * HV + i_h) * K + o_k)[:, None] * V + o_v[None, :], b_h, mask=m_v[None, :])
    b_w = tl.load(w + (rows * HV + i_h)[:, None] * K + o_k[None, :], mask=m_t[:, None], other=0.0)
    b_wh = tl.dot(b_w, b_h)
    m_tv = m_t[:, None] & m_v[None, :]
    p_uv = (rows * HV + i_h)[:, None] * V + o_v[None, :]
    b_u = tl.load(u + p_uv, mask=m_tv, other=0.0).to(tl.float32)
    tl.store(v_new + p_uv, (b_u - b_wh).to(v_new.dtype.element_ty), mask=m_tv)
