"""The Triton chain-scan kernel (imported lazily by :mod:`hypic.ops.linear.triton_scan`, so a
CPU-only machine never imports Triton). Module-level so that the step helper resolves as a global
both when compiled and under ``TRITON_INTERPRET=1``."""

import triton
import triton.language as tl


@triton.jit
def scan_step(trans, state, incoming, b_h, i, i_h, kv_off, m_kv, o_k, m_k,
              HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, MODE: tl.constexpr,
              PRECISION: tl.constexpr):
    """Record the state entering span i, return ``T_i @ state + S_i``."""
    base = i * HV + i_h
    tl.store(incoming + base * K * V + kv_off, b_h, mask=m_kv)
    b_s = tl.load(state + base * K * V + kv_off, mask=m_kv, other=0.0)
    if MODE == 0:
        p_t = trans + base * K * K + o_k[:, None] * K + o_k[None, :]
        b_t = tl.load(p_t, mask=m_k[:, None] & m_k[None, :], other=0.0)
        b_h = tl.dot(b_t, b_h, input_precision=PRECISION) + b_s
    elif MODE == 1:
        b_ld = tl.load(trans + base * K + o_k, mask=m_k, other=0.0)
        b_h = tl.exp(b_ld)[:, None] * b_h + b_s
    else:
        b_ld = tl.load(trans + base)
        b_h = tl.exp(b_ld) * b_h + b_s
    return b_h


@triton.jit
def scan_chain_kernel(
    trans,        # dense [M, HV, K, K] / diagonal [M, HV, K] / scalar [M, HV], fp32
    state,        # [M, HV, K, V] fp32: S(C_i | 0)
    init,         # [B, HV, K, V] fp32 (read only when HAS_INIT)
    incoming,     # [M, HV, K, V] fp32 out: state entering span i
    final,        # [B, HV, K, V] fp32 out: state after the chain
    cu_chains,    # [B + 1] int64
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    MODE: tl.constexpr,
    HAS_INIT: tl.constexpr,
    PRECISION: tl.constexpr,
    WHILE_LOOP: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_h = tl.program_id(1).to(tl.int64)
    i_b = tl.program_id(2).to(tl.int64)
    start = tl.load(cu_chains + i_b).to(tl.int64)
    end = tl.load(cu_chains + i_b + 1).to(tl.int64)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_kv = m_k[:, None] & (o_v < V)[None, :]
    kv_off = o_k[:, None] * V + o_v[None, :]

    if HAS_INIT:
        b_h = tl.load(init + (i_b * HV + i_h) * K * V + kv_off, mask=m_kv, other=0.0).to(tl.float32)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)

    if WHILE_LOOP:
        # Triton's interpreter cannot run ``range`` over bounds loaded from memory (seen with
        # Triton 3.6: "only 0-dimensional arrays can be converted to Python scalars"); the
        # compiled kernel keeps the ``for`` loop it was measured with.
        i = start
        while i < end:
            b_h = scan_step(trans, state, incoming, b_h, i, i_h, kv_off, m_kv, o_k, m_k, HV, K, V, MODE, PRECISION)
            i += 1
    else:
        for i in range(start, end):
            b_h = scan_step(trans, state, incoming, b_h, i, i_h, kv_off, m_kv, o_k, m_k, HV, K, V, MODE, PRECISION)

    tl.store(final + (i_b * HV + i_h) * K * V + kv_off, b_h, mask=m_kv)

