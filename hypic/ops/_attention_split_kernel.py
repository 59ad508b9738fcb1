"""Triton kernel of :mod:`hypic.ops.attention_split` (imported lazily: a CPU-only machine never
imports Triton). Module-level so that it runs both compiled and under ``TRITON_INTERPRET=1``."""

import triton
import triton.language as tl


@triton.jit
def _attend_keys(b_q, k, v, start, k_hi, k_first, i_kvh, row_pos, acc, m_i, l_i, scale_log2,
                 HKV: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr):
    """One online-softmax step over keys [start, start + BLOCK_N) (masked at k_hi and by position)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    offs_dv = tl.arange(0, DV)
    key = start + offs_n
    key_ok = key < k_hi
    key_row = (k_first + key) * HKV + i_kvh
    b_k = tl.load(k + key_row[:, None] * D + offs_d[None, :], mask=key_ok[:, None], other=0.0)
    s = tl.dot(b_q, tl.trans(b_k)) * scale_log2
    visible = (key[None, :] <= row_pos[:, None]) & key_ok[None, :]
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # rows that have seen no key yet keep a finite reference (no inf - inf)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    b_v = tl.load(v + key_row[:, None] * DV + offs_dv[None, :], mask=key_ok[:, None], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(b_v.dtype), b_v)
    return acc, m_new, l_i


@triton.jit
def split_kv_prefix_attention_kernel(
    q,            # [Tq, Hq, D]
    k,            # [Tk, Hkv, D]
    v,            # [Tk, Hkv, DV]
    pos_q,        # [Tq] int64: position of each query = index of its last visible key
    blocks,       # [NB, 4] int32: first query, number of queries, first key, number of keys
    o_part,       # [S, Tq, Hq, DV] out: each split's normalised output (fp32; with one split the result)
    lse_part,     # [S, Tq, Hq] fp32 out: each split's log2-sum-exp (-inf: saw no key)
    scale_log2,   # softmax scale * log2(e)
    split_len,    # keys per split (a multiple of BLOCK_N)
    num_q_tokens,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    DV: tl.constexpr,
    GROUP: tl.constexpr,      # query heads per kv head
    BLOCK_Q: tl.constexpr,    # queries per program (rows = BLOCK_Q * GROUP)
    BLOCK_N: tl.constexpr,    # keys per step
    WHILE_LOOP: tl.constexpr,  # Triton 3.6's interpreter cannot run `range` over loaded bounds
):
    i_blk = tl.program_id(0)
    i_kvh = tl.program_id(1)
    i_split = tl.program_id(2)
    q_first = tl.load(blocks + i_blk * 4).to(tl.int64)
    q_count = tl.load(blocks + i_blk * 4 + 1)
    k_first = tl.load(blocks + i_blk * 4 + 2).to(tl.int64)
    k_count = tl.load(blocks + i_blk * 4 + 3)

    ROWS: tl.constexpr = BLOCK_Q * GROUP
    rows = tl.arange(0, ROWS)
    q_local = rows // GROUP
    head = i_kvh * GROUP + rows % GROUP
    row_ok = q_local < q_count
    q_tok = q_first + q_local
    # a row may see keys 0 .. its position (keys are the sequence's positions in order)
    row_pos = tl.load(pos_q + q_tok, mask=row_ok, other=-1)
    last_key = tl.minimum(tl.max(row_pos, axis=0), k_count - 1)
    k_lo = i_split * split_len
    k_hi = tl.minimum(k_lo + split_len, last_key + 1)

    offs_d = tl.arange(0, D)
    offs_dv = tl.arange(0, DV)
    out_row = (i_split * num_q_tokens + q_tok) * HQ + head  # [ROWS] int64
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, DV], dtype=tl.float32)
    if k_lo < k_hi:
        b_q = tl.load(q + (q_tok * HQ + head)[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        if WHILE_LOOP:
            start = k_lo
            while start < k_hi:
                acc, m_i, l_i = _attend_keys(b_q, k, v, start, k_hi, k_first, i_kvh, row_pos, acc, m_i, l_i,
                                             scale_log2, HKV, D, DV, BLOCK_N)
                start += BLOCK_N
        else:
            for start in range(k_lo, k_hi, BLOCK_N):
                acc, m_i, l_i = _attend_keys(b_q, k, v, start, k_hi, k_first, i_kvh, row_pos, acc, m_i, l_i,
                                             scale_log2, HKV, D, DV, BLOCK_N)
    seen = l_i > 0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    tl.store(o_part + out_row[:, None] * DV + offs_dv[None, :], out, mask=row_ok[:, None])
    tl.store(lse_part + out_row, lse, mask=row_ok)


@triton.jit
def merge_splits_kernel(
    o_part,       # [S, R, DV] fp32: each split's normalised output (R = Tq * Hq rows)
    lse_part,     # [S, R] fp32: each split's log2-sum-exp (-inf: saw no key)
    out,          # [R, DV] out, in its own dtype
    num_rows,
    NUM_SPLITS: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Rows ``[BLOCK_R]`` of ``sum_s 2^(lse_s - top) o_s / sum_s 2^(lse_s - top)``: the partials are
    read once (the torch merge read and wrote them three times). A row no split saw comes out 0."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < num_rows
    offs_dv = tl.arange(0, DV)
    top = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        top = tl.maximum(top, tl.load(lse_part + s * num_rows + rows, mask=row_ok, other=float("-inf")))
    top = tl.where(top == float("-inf"), 0.0, top)
    acc = tl.zeros([BLOCK_R, DV], dtype=tl.float32)
    total = tl.zeros([BLOCK_R], dtype=tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        weight = tl.exp2(tl.load(lse_part + s * num_rows + rows, mask=row_ok, other=float("-inf")) - top)
        b_o = tl.load(o_part + (s * num_rows + rows)[:, None] * DV + offs_dv[None, :], mask=row_ok[:, None],
                      other=0.0)
        acc += weight[:, None] * b_o
        total += weight
    merged = acc / tl.maximum(total, 1e-30)[:, None]
    tl.store(out + rows[:, None] * DV + offs_dv[None, :], merged.to(out.dtype.element_ty), mask=row_ok[:, None])
