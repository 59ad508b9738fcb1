"""The Triton chain-scan kernel (imported lazily by :mod:`hypic.ops.linear.triton_scan`, so a
CPU-only machine never imports Triton). Module-level so that the step helpers resolve as globals
both when compiled and under ``TRITON_INTERPRET=1``."""

import triton
import triton.language as tl


@triton.jit
def span_bases(trans, state, table, source, i, i_h, num_table,
               HV: tl.constexpr, T_SIZE: tl.constexpr, S_SIZE: tl.constexpr, HAS_SOURCE: tl.constexpr):
    """Scalar pointers to head ``i_h`` of chain element i's (T, S). With ``HAS_SOURCE`` element i
    is span ``source[i]`` of the dense summaries when >= 0, else entry ``-source[i] - 1`` of the
    address table (``table[0, j]``, ``table[1, j]``: byte addresses of a one-span T and S that
    stay where they live, e.g. in store entries: nothing is gathered before the scan). The
    branch is on a scalar, so every thread of the program takes the same one and the loads that
    follow touch one source only."""
    if HAS_SOURCE:
        src = tl.load(source + i)
        if src >= 0:
            t_ptr = trans + (src * HV + i_h) * T_SIZE
            s_ptr = state + (src * HV + i_h) * S_SIZE
        else:
            j = -src - 1
            # Allocations are 16-byte aligned at least (the wrapper checks): telling Triton keeps
            # the loads vectorised, which an address read from memory would otherwise lose.
            t_addr = tl.multiple_of(tl.load(table + j), 16)
            s_addr = tl.multiple_of(tl.load(table + num_table + j), 16)
            t_ptr = t_addr.to(tl.pointer_type(tl.float32)) + i_h * T_SIZE
            s_ptr = s_addr.to(tl.pointer_type(tl.float32)) + i_h * S_SIZE
    else:
        t_ptr = trans + (i * HV + i_h) * T_SIZE
        s_ptr = state + (i * HV + i_h) * S_SIZE
    return t_ptr, s_ptr


@triton.jit
def scan_step(trans, state, table, source, record, incoming, b_h, i, i_h, num_table, kv_off, m_kv, o_k, m_k,
              HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, MODE: tl.constexpr,
              PRECISION: tl.constexpr, HAS_SOURCE: tl.constexpr, HAS_RECORD: tl.constexpr):
    """Record the state entering element i (in row ``record[i]`` when given; -1: not kept),
    return ``T_i @ state + S_i``."""
    if HAS_RECORD:
        row = tl.load(record + i)
        if row >= 0:
            tl.store(incoming + (row * HV + i_h) * K * V + kv_off, b_h, mask=m_kv)
    else:
        tl.store(incoming + (i * HV + i_h) * K * V + kv_off, b_h, mask=m_kv)
    if MODE == 0:
        t_ptr, s_ptr = span_bases(trans, state, table, source, i, i_h, num_table, HV, K * K, K * V, HAS_SOURCE)
        b_t = tl.load(t_ptr + o_k[:, None] * K + o_k[None, :], mask=m_k[:, None] & m_k[None, :], other=0.0)
        b_h = tl.dot(b_t, b_h, input_precision=PRECISION) + tl.load(s_ptr + kv_off, mask=m_kv, other=0.0)
    elif MODE == 1:
        t_ptr, s_ptr = span_bases(trans, state, table, source, i, i_h, num_table, HV, K, K * V, HAS_SOURCE)
        b_ld = tl.load(t_ptr + o_k, mask=m_k, other=0.0)
        b_h = tl.exp(b_ld)[:, None] * b_h + tl.load(s_ptr + kv_off, mask=m_kv, other=0.0)
    else:
        t_ptr, s_ptr = span_bases(trans, state, table, source, i, i_h, num_table, HV, 1, K * V, HAS_SOURCE)
        b_h = tl.exp(tl.load(t_ptr)) * b_h + tl.load(s_ptr + kv_off, mask=m_kv, other=0.0)
    return b_h


@triton.jit
def scan_chain_kernel(
    trans,        # dense [M, HV, K, K] / diagonal [M, HV, K] / scalar [M, HV], fp32
    state,        # [M, HV, K, V] fp32: S(C_i | 0)
    init,         # [B, HV, K, V] fp32 (read only when HAS_INIT)
    incoming,     # [R, HV, K, V] fp32 out: state entering each recorded element
    final,        # [B, HV, K, V] fp32 out: state after the chain
    cu_chains,    # [B + 1] int64
    table,        # [2, num_table] int64 byte addresses of one-span (T, S) (read only when HAS_SOURCE)
    source,       # [M] int64 (HAS_SOURCE): >= 0 span of trans/state, else -(table entry) - 1
    record,       # [M] int64 (HAS_RECORD): row of `incoming` for each element, -1 = not kept
    num_table,
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
    HAS_RECORD: tl.constexpr,
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
            b_h = scan_step(trans, state, table, source, record, incoming, b_h, i, i_h, num_table, kv_off, m_kv,
                            o_k, m_k, HV, K, V, MODE, PRECISION, HAS_SOURCE, HAS_RECORD)
            i += 1
    else:
        for i in range(start, end):
            b_h = scan_step(trans, state, table, source, record, incoming, b_h, i, i_h, num_table, kv_off, m_kv,
                            o_k, m_k, HV, K, V, MODE, PRECISION, HAS_SOURCE, HAS_RECORD)

    tl.store(final + (i_b * HV + i_h) * K * V + kv_off, b_h, mask=m_kv)
