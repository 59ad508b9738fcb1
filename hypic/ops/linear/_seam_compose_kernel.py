"""The Triton kernel composing each seam with the cached body after it, before the chain walk
(imported lazily by :mod:`hypic.ops.linear.triton_scan`; module-level for the interpreter).

A cached request's chain alternates seams (a few live tokens, given by their WY factors) and
bodies (a stored summary ``(T, S)``). The state after a seam and its body is an affine map of
the state ``h`` entering the seam:

    T (gamma h + Kd^T (u - W h)) + S = M h + c,   M = gamma T - (T Kd^T) W,   c = (T Kd^T) u + S,

with ``Kd = diag(exp2(g_last - g)) K``. M and c depend on the seam's tokens and the body alone,
not on ``h``: every pair of every head is composed here at once, in parallel, and the walk's
step for the pair is then one dense product ``M h + c`` (plus the seam's ``v_new = u - W h``,
which no later state needs), where applying the seam and then the body took the seam's
latency-bound products followed by T's.
"""

import triton
import triton.language as tl

from hypic.ops.linear._triton_scan_kernel import element_meta, fp32_dot, split_bf16, split_dot


@triton.jit
def fusable_pair(table, source, cu_spans, cu_chains, i, num_elements, num_chains, i_h, num_table, t_base, s_base,
                 HV: tl.constexpr, T_SIZE: tl.constexpr, S_SIZE: tl.constexpr, BS: tl.constexpr,
                 T_UNIT: tl.constexpr, S_UNIT: tl.constexpr):
    """Whether chain element i is a seam of at most BS tokens followed, in its chain, by a body
    (the walk's own test), and the seam's bounds and the body's T and S offsets."""
    end = i * 0 + num_elements  # int64 like the chain bounds it is replaced by
    for b in range(0, num_chains):
        lo = tl.load(cu_chains + b)
        hi = tl.load(cu_chains + b + 1)
        end = tl.where((lo <= i) & (i < hi), hi, end)
    src0, _, _, bos, length = element_meta(table, source, cu_spans, i, end, i_h, num_table, t_base, s_base,
                                           HV, T_SIZE, S_SIZE, T_UNIT, S_UNIT)
    src1, t_off, s_off, _, _ = element_meta(table, source, cu_spans, i + 1, end, i_h, num_table, t_base, s_base,
                                            HV, T_SIZE, S_SIZE, T_UNIT, S_UNIT)
    pair = (src0 >= 0) & (i + 1 < end) & (src1 < 0) & (length <= BS)
    return pair, bos, length, t_off, s_off


@triton.jit
def compose_seams_kernel(
    trans,        # fp32 base the table's T addresses are taken from (t_base)
    state,        # fp32 base of the S addresses (s_base)
    pair_trans,   # [ceil(M / 2), HV, K, K] fp32 out: M of the pair starting at element i, in row i // 2
    pair_state,   # [ceil(M / 2), HV, K, V] fp32 out: c of that pair
    cu_chains,    # [B + 1] int64
    table,        # [2, num_table] int64 byte addresses of the bodies' one-span T and S
    source,       # [M] int64: >= 0 live span, else -(table entry) - 1
    k, w, u, g,   # the live spans' WY factors: [T, H, K], [T, HV, K], [T, HV, V], [T, HV] (USE_G)
    cu_spans,     # [N + 1] live span bounds
    num_elements,
    num_chains,
    num_table,
    t_base,
    s_base,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BS: tl.constexpr,
    USE_G: tl.constexpr,
    PRECISION: tl.constexpr,
    SPLIT: tl.constexpr,
    T_UNIT: tl.constexpr,
    S_UNIT: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    pair, bos, length, t_off, s_off = fusable_pair(table, source, cu_spans, cu_chains, i, num_elements, num_chains,
                                                   i_h, num_table, t_base, s_base, HV, K * K, K * V, BS,
                                                   T_UNIT, S_UNIT)
    if pair:
        o_k = tl.arange(0, BK)
        m_k = o_k < K
        o_s = tl.arange(0, BS)
        m_t = o_s < length
        rows = bos + o_s
        m_tk = m_t[:, None] & m_k[None, :]
        b_t = tl.load(trans + t_off + o_k[:, None] * K + o_k[None, :], mask=m_k[:, None] & m_k[None, :], other=0.0)
        b_k = tl.load(k + (rows * H + i_h // (HV // H))[:, None] * K + o_k[None, :], mask=m_tk,
                      other=0.0).to(tl.float32)
        b_w = tl.load(w + (rows * HV + i_h)[:, None] * K + o_k[None, :], mask=m_tk, other=0.0).to(tl.float32)
        if USE_G:
            g_last = tl.load(g + (bos + length - 1) * HV + i_h, mask=length > 0, other=0.0).to(tl.float32)
            gamma = tl.where(length > 0, tl.exp2(g_last), 1.0)
            b_g = tl.load(g + rows * HV + i_h, mask=m_t, other=0.0).to(tl.float32)
            decay = tl.where(m_t, tl.exp2(g_last - b_g), 0.0)
        else:
            gamma = 1.0
            decay = tl.where(m_t, 1.0, 0.0)
        if SPLIT == 0:
            t_hi = b_t
            t_lo = b_t
        else:
            t_hi, t_lo = split_bf16(b_t)
        b_p = split_dot(t_hi, t_lo, b_t, tl.trans(b_k * decay[:, None]), PRECISION, SPLIT)  # T Kd^T, [K, BS]
        slot = i // 2  # pairs never overlap, so the pairs starting at i and i' >= i + 2 get distinct rows
        b_m = gamma * b_t - fp32_dot(b_p, b_w, PRECISION, SPLIT)
        tl.store(pair_trans + (slot * HV + i_h) * K * K + o_k[:, None] * K + o_k[None, :], b_m,
                 mask=m_k[:, None] & m_k[None, :])
        for v0 in range(0, V, BV):
            o_v = v0 + tl.arange(0, BV)
            m_v = o_v < V
            m_kv = m_k[:, None] & m_v[None, :]
            kv_off = o_k[:, None] * V + o_v[None, :]
            b_u = tl.load(u + (rows * HV + i_h)[:, None] * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :],
                          other=0.0).to(tl.float32)
            b_s = tl.load(state + s_off + kv_off, mask=m_kv, other=0.0)
            tl.store(pair_state + (slot * HV + i_h) * K * V + kv_off, fp32_dot(b_p, b_u, PRECISION, SPLIT) + b_s,
                     mask=m_kv)
