"""Triton kernels of :mod:`hypic.ops.linear.short_wy` (imported lazily: a CPU-only machine never
imports Triton). Each program owns one span of at most ``BT`` tokens and one value head; the
spans of a launch are those of one padded width (``span_ids``), so an 8-token seam runs in a
16-row tile instead of fla's 64-row chunk."""

import triton
import triton.language as tl

RCP_LN2 = tl.constexpr(1.4426950408889634)  # 1 / ln 2: fla's gate cumsum is kept in log2 units


@triton.jit
def member_rows(cu, span_ids, i_m, BT: tl.constexpr):
    """Span ``span_ids[i_m]``: ``(span, bos, length, rows [BT], o_t [BT], mask [BT])``."""
    s = tl.load(span_ids + i_m).to(tl.int64)
    bos = tl.load(cu + s).to(tl.int64)
    length = tl.load(cu + s + 1).to(tl.int64) - bos
    o_t = tl.arange(0, BT)
    return s, bos, length, bos + o_t, o_t, o_t < length


@triton.jit
def short_wy_kernel(
    k,         # [T, H, K]
    v,         # [T, HV, V]
    g,         # [T, HV] log gate (natural log; unused without USE_G)
    beta,      # [T, HV]
    cu,        # [N + 1] int64 span bounds
    span_ids,  # [M] int64: the spans of this launch, each at most BT tokens
    gc,        # [T, HV] fp32 out: within-span cumulative gate in log2 units (USE_G)
    w,         # [T, HV, K] out, k's dtype
    u,         # [T, HV, V] out, v's dtype
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,       # V rounded up to a power of two
    BT: tl.constexpr,
    LOG2_BT: tl.constexpr,
    USE_G: tl.constexpr,
    INV_PRECISION: tl.constexpr,  # dots of the inverse (fp32 operands)
    IO_PRECISION: tl.constexpr,   # dots of the factors (read only for fp32 inputs)
    BC: tl.constexpr,             # columns of w and u per product (divides K and BV)
):
    """fla's intra-chunk WY step for one span: the gate cumsum, ``A = strict_lower(beta_i
    exp2(gc_i - gc_j) k_i.k_j)``, ``Ai = (I + A)^-1`` rounded to k's dtype, then ``w = Ai
    diag(beta exp2(gc)) K`` and ``u = Ai diag(beta) V``, with the same rounding points as fla's
    ``chunk_gated_delta_rule_fwd_intra``.

    The inverse is the product form of a nilpotent Neumann series: with ``N = -A`` (``N^BT =
    0``), ``(I + A)^-1 = (I + N)(I + N^2)(I + N^4)...``, i.e. ``log2(BT) - 1`` squarings and as
    many products of ``[BT, BT]`` tiles. That replaces fla's row-by-row forward substitution (a
    serial loop of reductions per row) with a handful of MMAs.

    ``w`` and ``u`` are formed ``BC`` columns at a time, k and v re-read per block (L1/L2 hits):
    a 64-row tile holding whole ``[BT, K]`` and ``[BT, V]`` fp32 products beside the inverse
    spilled at 255 registers (ptxas, sm_90, 4 warps), which block columns avoid."""
    i_m = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    _, bos, length, rows, o_t, m_t = member_rows(cu, span_ids, i_m, BT)
    o_k = tl.arange(0, K)
    b_k = tl.load(k + (rows * H + i_h // (HV // H))[:, None] * K + o_k[None, :], mask=m_t[:, None], other=0.0)
    b_b = tl.load(beta + rows * HV + i_h, mask=m_t, other=0.0).to(tl.float32)
    b_a = tl.dot(b_k, tl.trans(b_k), input_precision=IO_PRECISION)  # fp32 [BT, BT]
    m_low = (o_t[:, None] > o_t[None, :]) & m_t[:, None] & m_t[None, :]
    if USE_G:
        b_g = tl.load(g + rows * HV + i_h, mask=m_t, other=0.0).to(tl.float32)
        b_gc = tl.cumsum(b_g, axis=0) * RCP_LN2
        tl.store(gc + rows * HV + i_h, b_gc, mask=m_t)
        # masked out before the exponent can overflow: where() keeps 0 above the diagonal
        b_a = tl.where(m_low, b_a * tl.exp2(tl.where(m_low, b_gc[:, None] - b_gc[None, :], 0.0)), 0.0)
        b_kscale = b_b * tl.exp2(b_gc)
    else:
        b_a = tl.where(m_low, b_a, 0.0)
        b_kscale = b_b
    b_n = -(b_a * b_b[:, None])
    b_p = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0) + b_n
    for _ in tl.static_range(LOG2_BT - 1):
        b_n = tl.dot(b_n, b_n, input_precision=INV_PRECISION)
        b_p = b_p + tl.dot(b_p, b_n, input_precision=INV_PRECISION)
    b_ai = b_p.to(b_k.dtype)  # fla stores the solved matrix in k's dtype
    p_k = (rows * H + i_h // (HV // H))[:, None] * K
    for c in tl.static_range(K // BC):
        o_c = c * BC + tl.arange(0, BC)
        b_kc = tl.load(k + p_k + o_c[None, :], mask=m_t[:, None], other=0.0)
        b_kb = (b_kc.to(tl.float32) * b_kscale[:, None]).to(b_kc.dtype)
        b_w = tl.dot(b_ai, b_kb, input_precision=IO_PRECISION)
        tl.store(w + (rows * HV + i_h)[:, None] * K + o_c[None, :], b_w.to(w.dtype.element_ty), mask=m_t[:, None])
    for c in tl.static_range(BV // BC):
        o_c = c * BC + tl.arange(0, BC)
        p_v = (rows * HV + i_h)[:, None] * V + o_c[None, :]
        m_tv = m_t[:, None] & (o_c < V)[None, :]
        b_v = tl.load(v + p_v, mask=m_tv, other=0.0)
        b_vb = (b_v.to(tl.float32) * b_b[:, None]).to(b_v.dtype)
        b_u = tl.dot(b_ai.to(b_v.dtype), b_vb, input_precision=IO_PRECISION)
        tl.store(u + p_v, b_u.to(u.dtype.element_ty), mask=m_tv)


@triton.jit
def short_output_kernel(
    q,           # [T, H, K]
    k,           # [T, H, K]
    v_new,       # [T, HV, V]
    h,           # [num_chunks, HV, K, V]: the state entering each span's chunk
    gc,          # [T, HV] fp32 within-span cumulative log2 gate (USE_G)
    cu,          # [N + 1] int64
    span_ids,    # [M] int64: the spans of this launch
    span_chunk,  # [N] int32: chunk row of each span in h (-1: empty span)
    o,           # [T, HV, V] out
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    USE_G: tl.constexpr,
):
    """fla's output kernel for one span of at most BT tokens (program: span, value head, V
    block): ``o = scale (diag(exp2(gc)) Q h + causal(Q K^T exp2(gc_i - gc_j)) v_new)``, the
    causal product's scores rounded to v_new's dtype as fla does."""
    i_m = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    i_v = tl.program_id(2)
    s, _, _, rows, o_t, m_t = member_rows(cu, span_ids, i_m, BT)
    chunk = tl.load(span_chunk + s).to(tl.int64)
    if chunk >= 0:
        o_k = tl.arange(0, K)
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        p_qk = (rows * H + i_h // (HV // H))[:, None] * K + o_k[None, :]
        b_q = tl.load(q + p_qk, mask=m_t[:, None], other=0.0)
        b_k = tl.load(k + p_qk, mask=m_t[:, None], other=0.0)
        b_h = tl.load(h + ((chunk * HV + i_h) * K + o_k)[:, None] * V + o_v[None, :], mask=m_v[None, :], other=0.0)
        b_o = tl.dot(b_q, b_h)
        b_a = tl.dot(b_q, tl.trans(b_k))
        m_a = (o_t[:, None] >= o_t[None, :]) & m_t[:, None] & m_t[None, :]
        if USE_G:
            b_g = tl.load(gc + rows * HV + i_h, mask=m_t, other=0.0)
            b_o = b_o * tl.exp2(b_g)[:, None]
            b_a = b_a * tl.exp2(tl.where(m_a, b_g[:, None] - b_g[None, :], 0.0))
        b_a = tl.where(m_a, b_a, 0.0)
        p_v = (rows * HV + i_h)[:, None] * V + o_v[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        b_vn = tl.load(v_new + p_v, mask=m_tv, other=0.0)
        b_o = b_o * scale + tl.dot(b_a.to(b_vn.dtype), b_vn) * scale
        tl.store(o + p_v, b_o.to(o.dtype.element_ty), mask=m_tv)
