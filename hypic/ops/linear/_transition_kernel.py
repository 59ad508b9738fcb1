"""The Triton kernel of :mod:`hypic.ops.linear.transition` (imported lazily, so a CPU-only
machine never imports Triton). Module-level so that the helpers it shares with the chain kernel
resolve as globals both when compiled and under ``TRITON_INTERPRET=1``."""

import triton
import triton.language as tl

from hypic.ops.linear._triton_scan_kernel import bf16_fp32_dot, chunk_decay, fp32_dot


@triton.jit
def transition_chunk(k, w, g, b_t, bos, length, c, i_h, o_k, m_k,
                     H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                     USE_G: tl.constexpr, INTERPRET: tl.constexpr):
    """Chunk ``c`` of a span applied to a column block of its T:
    ``T <- gamma T - Kd^T (W T)`` with ``Kd = diag(exp2(g_last - g)) K``, T kept fp32 and both
    products fp32-accurate (T is split, W and K are exact in their bf16)."""
    o_t = tl.arange(0, BT)
    m_t = (c * BT + o_t) < length
    rows = bos + c * BT + o_t
    m_tk = m_t[:, None] & m_k[None, :]
    b_w = tl.load(w + (rows * HV + i_h)[:, None] * K + o_k[None, :], mask=m_tk, other=0.0)
    if w.dtype.element_ty == tl.bfloat16:
        b_x = bf16_fp32_dot(b_w, b_t, INTERPRET)  # [BT, BC]
    else:
        b_x = fp32_dot(b_w.to(tl.float32), b_t, INTERPRET)
    if USE_G:
        decay, gamma = chunk_decay(g, bos, length, c, rows, m_t, i_h, HV, BT)
        # the key decay goes on the rows of W T (exact bf16 keys stay unsplit)
        b_x = b_x * decay[:, None]
        b_t = b_t * gamma
    b_k = tl.load(k + (rows * H + i_h // (HV // H))[:, None] * K + o_k[None, :], mask=m_tk, other=0.0)
    if k.dtype.element_ty == tl.bfloat16:
        b_t -= bf16_fp32_dot(tl.trans(b_k), b_x, INTERPRET)
    else:
        b_t -= fp32_dot(tl.trans(b_k.to(tl.float32)), b_x, INTERPRET)
    return b_t


@triton.jit(do_not_specialize=["NW", "out_base"])
def wy_transition_kernel(
    k,          # [T, H, K] keys (the WY step's, bf16 or fp32)
    w,          # [T, HV, K] WY factors
    g,          # [T, HV] chunk-local cumulative log2 gate (read only when USE_G)
    cu_spans,   # [N + 1] int64 span bounds
    spans,      # [NW] int64: the spans whose T is formed
    out,        # [NW, HV, K, K] fp32 out: T of each; with OUT_TABLE any fp32 tensor at out_base
    table,      # [NW] int64 (OUT_TABLE): byte address of each span's [HV, K, K] T, e.g. in a store
                #   entry, a multiple of 64 bytes from out_base
    out_base,   # byte address of `out` (OUT_TABLE)
    NW,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    BK: tl.constexpr,
    BC: tl.constexpr,   # columns of T per program
    BT: tl.constexpr,   # fla's chunk size: the WY factors are chunk-local
    USE_G: tl.constexpr,
    INTERPRET: tl.constexpr,
    OUT_TABLE: tl.constexpr,
):
    """One (column block, head, span): T's columns from the identity's, chunk by chunk, written
    to row i of ``out`` or, with ``OUT_TABLE``, where ``table[i]`` says."""
    i_c = tl.program_id(0)
    i_h = tl.program_id(1).to(tl.int64)
    i_w = tl.program_id(2).to(tl.int64)
    s = tl.load(spans + i_w)
    bos = tl.load(cu_spans + s).to(tl.int64)
    length = tl.load(cu_spans + s + 1).to(tl.int64) - bos
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < K
    b_t = tl.where((o_k[:, None] == o_c[None, :]) & m_k[:, None], 1.0, 0.0)
    if INTERPRET:
        # the interpreter cannot run ``range`` over bounds loaded from memory
        c = length * 0
        while c * BT < length:
            b_t = transition_chunk(k, w, g, b_t, bos, length, c, i_h, o_k, m_k, H, HV, K, BT, USE_G, INTERPRET)
            c += 1
    else:
        for c in range(0, tl.cdiv(length, BT)):
            b_t = transition_chunk(k, w, g, b_t, bos, length, c, i_h, o_k, m_k, H, HV, K, BT, USE_G, INTERPRET)
    if OUT_TABLE:
        # counted in 64-byte steps from the base (16 fp32), as the chain kernel reads its table
        o_base = (tl.load(table + i_w) - out_base) // 64 * 16 + i_h * K * K
    else:
        o_base = (i_w * HV + i_h) * K * K
    tl.store(out + o_base + o_k[:, None] * K + o_c[None, :], b_t, mask=m_k[:, None] & m_c[None, :])
