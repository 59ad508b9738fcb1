"""The Triton kernel of :mod:`hypic.ops.linear.state_summary` (imported lazily, so a CPU-only
machine never imports Triton). Module-level so that the helpers it shares with the chain kernel
resolve as globals both when compiled and under ``TRITON_INTERPRET=1``."""

import triton
import triton.language as tl

from hypic.ops.linear._triton_scan_kernel import fp32_dot, state_tile


@triton.jit(do_not_specialize=["NW", "num_table", "t_base", "s_base"])
def zero_start_from_states_kernel(
    trans,      # [NW, HV, K, K] fp32: T of each written span (with TABLE: any fp32 tensor at t_base)
    incoming,   # [R, HV, K, V] fp32: recorded states
    final,      # [B, HV, K, V] fp32: each chain's final state
    rows,       # [2, NW] int64: per written span the row of `incoming` it enters with, and the row
                #   holding the state after it (or -chain - 1: final[chain])
    out,        # [NW, HV, K, V] fp32 out: S(C_i | 0) (with TABLE: any fp32 tensor at s_base)
    table,      # [2, num_table] int64 (TABLE): byte addresses of each span's T (read) and S (written),
                #   e.g. in store entries, multiples of 64 bytes from t_base / s_base
    num_table,
    t_base,
    s_base,
    NW,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BKK: tl.constexpr,  # K columns of T per product step (a whole [K, K] fp32 tile spills)
    INTERPRET: tl.constexpr,
    TABLE: tl.constexpr,
):
    """``S_i = h_after_i - T_i h_before_i`` for one (V block, head, span): the state a span adds
    from a zero start, read off the states a forward walked in and out of it with. T is read in
    ``[K, BKK]`` column blocks against ``BKK`` rows of the entering state (on the H200 one whole
    tile took 0.27 ms for 64 spans x 32 heads, register-bound)."""
    i_v = tl.program_id(0)
    i_h = tl.program_id(1).to(tl.int64)
    i_w = tl.program_id(2).to(tl.int64)
    o_k, o_v, m_k, m_v, m_kv, kv_off = state_tile(i_v, K, V, BK, BV)
    enter = tl.load(rows + i_w)
    row = tl.load(rows + NW + i_w)
    # the state after the span: a recorded row, or its chain's final state (one of the two loads
    # is fully masked; the mask is a tile, which the interpreter needs)
    in_chain = (kv_off * 0 + row) >= 0
    b_s = tl.load(incoming + (tl.maximum(row, 0) * HV + i_h) * K * V + kv_off, mask=m_kv & in_chain, other=0.0)
    b_s += tl.load(final + (tl.maximum(-row - 1, 0) * HV + i_h) * K * V + kv_off, mask=m_kv & ~in_chain, other=0.0)
    if TABLE:  # counted in 64-byte steps (16 fp32) from the bases, as the chain kernel reads its table
        t_off = (tl.load(table + i_w) - t_base) // 64 * 16 + i_h * K * K
        s_off = (tl.load(table + num_table + i_w) - s_base) // 64 * 16 + i_h * K * V
    else:
        t_off = (i_w * HV + i_h) * K * K
        s_off = (i_w * HV + i_h) * K * V
    t_ptr = trans + t_off
    in_base = incoming + (enter * HV + i_h) * K * V
    o_j = tl.arange(0, BKK)
    for j0 in range(0, BK, BKK):
        m_j = (j0 + o_j) < K
        b_t = tl.load(t_ptr + o_k[:, None] * K + (j0 + o_j)[None, :], mask=m_k[:, None] & m_j[None, :], other=0.0)
        b_in = tl.load(in_base + (j0 + o_j)[:, None] * V + o_v[None, :], mask=m_j[:, None] & m_v[None, :], other=0.0)
        b_s -= fp32_dot(b_t, b_in, INTERPRET)
    tl.store(out + s_off + kv_off, b_s, mask=m_kv)

