"""The Triton chain-scan kernel (imported lazily by :mod:`hypic.ops.linear.triton_scan`, so a
CPU-only machine never imports Triton). Module-level so that the step helper resolves as a global
both when compiled and under ``TRITON_INTERPRET=1``."""

import triton
import triton.language as tl


@triton.jit
def _load_either(first, second, offset, src, mask, HAS_SOURCE: tl.constexpr):
    """Load from ``first`` (src >= 0) or ``second``; masked loads, so only one touches memory."""
    if HAS_SOURCE:
        in_first = tl.full(mask.shape, 0, tl.int64) + src >= 0  # the scalar broadcast to the mask
        return tl.load(first + offset, mask=mask & in_first, other=0.0) + \
            tl.load(second + offset, mask=mask & (in_first == 0), other=0.0)
    return tl.load(first + offset, mask=mask, other=0.0)


@triton.jit
def scan_step(trans, state, trans2, state2, source, incoming, b_h, i, i_h, kv_off, m_kv, o_k, m_k,
              HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, MODE: tl.constexpr,
              PRECISION: tl.constexpr, HAS_SOURCE: tl.constexpr):
    """Record the state entering span i, return ``T_i @ state + S_i``. With ``HAS_SOURCE`` span i
    is element ``source[i]`` of the first summaries when >= 0, else ``-source[i] - 1`` of the
    second (no gathered copy of the chain is needed)."""
    tl.store(incoming + (i * HV + i_h) * K * V + kv_off, b_h, mask=m_kv)
    src = i
    if HAS_SOURCE:
        src = tl.load(source + i)
        base = tl.where(src >= 0, src, -src - 1) * HV + i_h
    else:
        base = i * HV + i_h
    b_s = _load_either(state, state2, base * K * V + kv_off, src, m_kv, HAS_SOURCE)
    if MODE == 0:
        t_off = base * K * K + o_k[:, None] * K + o_k[None, :]
        b_t = _load_either(trans, trans2, t_off, src, m_k[:, None] & m_k[None, :], HAS_SOURCE)
        b_h = tl.dot(b_t, b_h, input_precision=PRECISION) + b_s
    elif MODE == 1:
        b_ld = _load_either(trans, trans2, base * K + o_k, src, m_k, HAS_SOURCE)
        b_h = tl.exp(b_ld)[:, None] * b_h + b_s
    else:
        b_ld = _load_either(trans, trans2, base, src, base >= 0, HAS_SOURCE)
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
    trans2,       # second summaries (read only when HAS_SOURCE)
    state2,
    source,       # [M] int64 (HAS_SOURCE): >= 0 element of the first, else -(element of the second) - 1
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    MODE: tl.constexpr,
    HAS_INIT: tl.constexpr,
    PRECISION: tl.constexpr,
    WHILE_LOOP: tl.constexpr,
    HAS_SOURCE: tl.constexpr,
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
            b_h = scan_step(trans, state, trans2, state2, source, incoming, b_h, i, i_h, kv_off, m_kv, o_k, m_k,
                            HV, K, V, MODE, PRECISION, HAS_SOURCE)
            i += 1
    else:
        for i in range(start, end):
            b_h = scan_step(trans, state, trans2, state2, source, incoming, b_h, i, i_h, kv_off, m_kv, o_k, m_k,
                            HV, K, V, MODE, PRECISION, HAS_SOURCE)

    tl.store(final + (i_b * HV + i_h) * K * V + kv_off, b_h, mask=m_kv)

