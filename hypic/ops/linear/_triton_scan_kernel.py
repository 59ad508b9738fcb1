"""The Triton chain-scan kernel (imported lazily by :mod:`hypic.ops.linear.triton_scan`, so a
CPU-only machine never imports Triton). Module-level so that the step helpers resolve as globals
both when compiled and under ``TRITON_INTERPRET=1``."""

import triton
import triton.language as tl

@triton.jit
def span_offsets(table, source, i, i_h, num_table, t_base, s_base,
                 HV: tl.constexpr, T_SIZE: tl.constexpr, S_SIZE: tl.constexpr, HAS_SOURCE: tl.constexpr,
                 T_UNIT: tl.constexpr, S_UNIT: tl.constexpr):
    """Element offsets of head ``i_h`` of chain element i's T (from ``trans``) and S (from
    ``state``). With ``HAS_SOURCE`` element i is span ``source[i]`` of the dense summaries when
    >= 0, else entry ``-source[i] - 1`` of the address table (``table[0, j]``, ``table[1, j]``:
    byte addresses of a one-span T and S that stay where they live, e.g. in store entries;
    ``t_base``/``s_base`` are the byte addresses of ``trans``/``state``). Table addresses lie a
    multiple of ``T_UNIT`` / ``S_UNIT`` bytes from those bases: counted in such steps, the offsets
    tell Triton that every tile start is that aligned, which keeps the loads vectorised (a
    pointer read from memory as such would lose it)."""
    if HAS_SOURCE:
        src = tl.load(source + i)
        if src >= 0:
            t_off = (src * HV + i_h) * T_SIZE
            s_off = (src * HV + i_h) * S_SIZE
        else:
            j = -src - 1
            t_off = (tl.load(table + j) - t_base) // T_UNIT * (T_UNIT // 4) + i_h * T_SIZE
            s_off = (tl.load(table + num_table + j) - s_base) // S_UNIT * (S_UNIT // 4) + i_h * S_SIZE
    else:
        t_off = (i * HV + i_h) * T_SIZE
        s_off = (i * HV + i_h) * S_SIZE
    return t_off, s_off


@triton.jit
def scan_step(trans, state, record, incoming, b_h, i, i_h, t_off, s_off, kv_off, m_kv, o_k, m_k,
              HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, MODE: tl.constexpr,
              PRECISION: tl.constexpr, HAS_RECORD: tl.constexpr):
    """Record the state entering element i (in row ``record[i]`` when given; -1: not kept),
    return ``T_i @ state + S_i`` with T_i, S_i at the given offsets."""
    if HAS_RECORD:
        row = tl.load(record + i)
        if row >= 0:
            tl.store(incoming + (row * HV + i_h) * K * V + kv_off, b_h, mask=m_kv)
    else:
        tl.store(incoming + (i * HV + i_h) * K * V + kv_off, b_h, mask=m_kv)
    b_s = tl.load(state + s_off + kv_off, mask=m_kv, other=0.0)
    if MODE == 0:
        b_t = tl.load(trans + t_off + o_k[:, None] * K + o_k[None, :], mask=m_k[:, None] & m_k[None, :], other=0.0)
        b_h = tl.dot(b_t, b_h, input_precision=PRECISION) + b_s
    elif MODE == 1:
        b_ld = tl.load(trans + t_off + o_k, mask=m_k, other=0.0)
        b_h = tl.exp(b_ld)[:, None] * b_h + b_s
    else:
        b_h = tl.exp(tl.load(trans + t_off)) * b_h + b_s
    return b_h


# Values that vary per request are not specialised (== 1, % 16), so no new variant compiles.
@triton.jit(do_not_specialize=["num_table", "t_base", "s_base"])
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
    t_base,       # byte addresses of trans and state (table addresses are taken relative to them)
    s_base,
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
    T_UNIT: tl.constexpr,  # bytes dividing every table address's distance from t_base / s_base
    S_UNIT: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_h = tl.program_id(1).to(tl.int64)
    i_b = tl.program_id(2).to(tl.int64)
    start = tl.load(cu_chains + i_b).to(tl.int64)
    end = tl.load(cu_chains + i_b + 1).to(tl.int64)
    T_SIZE: tl.constexpr = K * K if MODE == 0 else (K if MODE == 1 else 1)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_kv = m_k[:, None] & (o_v < V)[None, :]
    kv_off = o_k[:, None] * V + o_v[None, :]

    if HAS_INIT:
        b_h = tl.load(init + (i_b * HV + i_h) * K * V + kv_off, mask=m_kv, other=0.0).to(tl.float32)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)

    # The offsets of element i + 1 are read while element i is applied: the two dependent
    # scalar loads (source, then the table) leave the step's critical path.
    last = tl.maximum(end - 1, start)
    t_off, s_off = span_offsets(table, source, tl.minimum(start, last), i_h, num_table, t_base, s_base,
                                HV, T_SIZE, K * V, HAS_SOURCE, T_UNIT, S_UNIT)
    if WHILE_LOOP:
        # Triton's interpreter cannot run ``range`` over bounds loaded from memory (seen with
        # Triton 3.6: "only 0-dimensional arrays can be converted to Python scalars"); the
        # compiled kernel keeps the ``for`` loop.
        i = start
        while i < end:
            t_next, s_next = span_offsets(table, source, tl.minimum(i + 1, last), i_h, num_table, t_base, s_base,
                                          HV, T_SIZE, K * V, HAS_SOURCE, T_UNIT, S_UNIT)
            b_h = scan_step(trans, state, record, incoming, b_h, i, i_h, t_off, s_off, kv_off, m_kv, o_k, m_k,
                            HV, K, V, MODE, PRECISION, HAS_RECORD)
            t_off, s_off = t_next, s_next
            i += 1
    else:
        for i in range(start, end):
            t_next, s_next = span_offsets(table, source, tl.minimum(i + 1, last), i_h, num_table, t_base, s_base,
                                          HV, T_SIZE, K * V, HAS_SOURCE, T_UNIT, S_UNIT)
            b_h = scan_step(trans, state, record, incoming, b_h, i, i_h, t_off, s_off, kv_off, m_kv, o_k, m_k,
                            HV, K, V, MODE, PRECISION, HAS_RECORD)
            t_off, s_off = t_next, s_next

    tl.store(final + (i_b * HV + i_h) * K * V + kv_off, b_h, mask=m_kv)
