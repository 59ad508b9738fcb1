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
def state_tile(i_v, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Rows (all K), columns (V block ``i_v``), their masks and the element offsets of one
    program's ``[BK, BV]`` tile of a ``[K, V]`` state."""
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    return o_k, o_v, m_k, m_v, m_k[:, None] & m_v[None, :], o_k[:, None] * V + o_v[None, :]


@triton.jit
def split_bf16(x):
    """fp32 ``x`` as ``hi + lo``, both bf16 (16 significant bits between them)."""
    hi = x.to(tl.bfloat16)
    return hi, (x - hi.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def load_t_planes(trans, t_off, o_k, m_k, K: tl.constexpr):
    """``(hi, lo)`` bf16 tiles of a T stored packed (:mod:`hypic.ops.linear.t_planes`): the
    head's ``K * K`` fp32 words from ``trans + t_off`` hold its hi plane then its lo plane, the
    split :func:`split_bf16` would make of it."""
    p_t16 = trans.to(tl.pointer_type(tl.bfloat16)) + 2 * t_off + o_k[:, None] * K + o_k[None, :]
    m_kk = m_k[:, None] & m_k[None, :]
    return tl.load(p_t16, mask=m_kk, other=0.0), tl.load(p_t16 + K * K, mask=m_kk, other=0.0)


@triton.jit
def bf16_dot(a, b, acc, INTERPRET: tl.constexpr):
    """``acc + a @ b`` for bf16 tiles, in fp32. ``INTERPRET``: the same maths for Triton's
    interpreter, whose bf16 ``tl.dot`` returns garbage (Triton 3.6): the operands go to fp32,
    where their products are exact, as in the MMA."""
    if INTERPRET:
        return acc + tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, acc, out_dtype=tl.float32)


@triton.jit
def fp32_dot(a, b, INTERPRET: tl.constexpr):
    """``a @ b`` of fp32 tiles in bf16x3: both operands split into bf16 high and low parts and
    the three products that matter summed, small ones first, in fp32. A bf16 MMA takes 16 of K
    per instruction where TF32 takes 8, so bf16x3 issues half of tf32x3's MMAs; the dropped
    ``lo @ lo`` term and the split leave a relative error near 2^-16 per product (tf32x3: near
    2^-21; one-pass TF32: 2^-11)."""
    a_hi, a_lo = split_bf16(a)
    return split_dot(a_hi, a_lo, b, INTERPRET)


@triton.jit
def bf16_fp32_dot(a, b, INTERPRET: tl.constexpr):
    """``a @ b`` with ``a`` exact in bf16 (loaded from bf16) and ``b`` fp32: only ``b`` is split,
    two products."""
    b_hi, b_lo = split_bf16(b)
    a16 = a.to(tl.bfloat16)
    out = bf16_dot(a16, b_lo, tl.zeros([a.shape[0], b.shape[1]], dtype=tl.float32), INTERPRET)
    return bf16_dot(a16, b_hi, out, INTERPRET)


@triton.jit
def scan_step(trans, state, b_h, t_off, s_off, kv_off, m_kv, o_k, m_k,
              K: tl.constexpr, MODE: tl.constexpr, INTERPRET: tl.constexpr, T_PACKED: tl.constexpr):
    """``T_i @ state + S_i`` with T_i, S_i at the given offsets (``T_PACKED``: a dense T stored
    as bf16 planes, :func:`load_t_planes`)."""
    b_s = tl.load(state + s_off + kv_off, mask=m_kv, other=0.0)
    if T_PACKED:
        t_hi, t_lo = load_t_planes(trans, t_off, o_k, m_k, K)
        b_h = split_dot(t_hi, t_lo, b_h, INTERPRET) + b_s
    elif MODE == 0:
        b_t = tl.load(trans + t_off + o_k[:, None] * K + o_k[None, :], mask=m_k[:, None] & m_k[None, :], other=0.0)
        b_h = fp32_dot(b_t, b_h, INTERPRET) + b_s
    elif MODE == 1:
        b_ld = tl.load(trans + t_off + o_k, mask=m_k, other=0.0)
        b_h = tl.exp(b_ld)[:, None] * b_h + b_s
    else:
        b_h = tl.exp(tl.load(trans + t_off)) * b_h + b_s
    return b_h


@triton.jit
def record_step(record, incoming, b_h, i, i_h, kv_off, m_kv,
                HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, HAS_RECORD: tl.constexpr):
    """Store the state entering element i (in row ``record[i]`` when given; -1: not kept)."""
    if HAS_RECORD:
        row = tl.load(record + i)
        if row >= 0:
            tl.store(incoming + (row * HV + i_h) * K * V + kv_off, b_h, mask=m_kv)
    else:
        tl.store(incoming + (i * HV + i_h) * K * V + kv_off, b_h, mask=m_kv)


@triton.jit
def wy_step(k, w, u, g, cu_spans, span_chunk, v_new, h_chunks, b_h, s, i_h, o_k, m_k, o_v, m_v, kv_off, m_kv,
            H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BS: tl.constexpr,
            USE_G: tl.constexpr, INTERPRET: tl.constexpr, HAS_W: tl.constexpr):
    """Live span ``s`` (at most one chunk) applied from its WY factors, its outputs' inputs written
    on the way: the entering state rounded to ``h_chunks``' dtype in the span's chunk row (what
    fla's output kernel reads), ``v_new = u - W h`` for its tokens, and the state after it,
    ``gamma h + Kd^T v_new`` with ``Kd = diag(exp2(g_last - g)) K`` (fla's one-chunk state pass,
    here with h in fp32). Rows go in blocks of BS; every block reads the same entering h (WY).
    Without ``HAS_W`` (a scalar-decay family: ``W = 0``, ``u = v``) ``v_new`` is ``u`` itself:
    neither ``W`` nor ``v_new`` is read or written."""
    bos = tl.load(cu_spans + s).to(tl.int64)
    length = tl.load(cu_spans + s + 1).to(tl.int64) - bos
    chunk = tl.load(span_chunk + s).to(tl.int64)
    if chunk >= 0:
        tl.store(h_chunks + (chunk * HV + i_h) * K * V + kv_off, b_h.to(h_chunks.dtype.element_ty), mask=m_kv)
    if USE_G:
        g_last = tl.load(g + (bos + length - 1) * HV + i_h, mask=length > 0, other=0.0).to(tl.float32)
        gamma = tl.where(length > 0, tl.exp2(g_last), 1.0)
    else:
        g_last = 0.0
        gamma = 1.0
    b_acc = tl.zeros_like(b_h)
    o_s = tl.arange(0, BS)
    j = length * 0  # int64, loop-carried
    while j < length:  # a while loop: the interpreter cannot run range() over loaded bounds
        m_t = (j + o_s) < length
        rows = bos + j + o_s
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        p_uv = (rows * HV + i_h)[:, None] * V + o_v[None, :]
        if HAS_W:
            b_w = tl.load(w + (rows * HV + i_h)[:, None] * K + o_k[None, :], mask=m_tk, other=0.0)
            if w.dtype.element_ty == tl.bfloat16:
                b_wh = bf16_fp32_dot(b_w, b_h, INTERPRET)
            else:
                b_wh = fp32_dot(b_w.to(tl.float32), b_h, INTERPRET)
            b_v = tl.load(u + p_uv, mask=m_tv, other=0.0).to(tl.float32) - b_wh
            tl.store(v_new + p_uv, b_v.to(v_new.dtype.element_ty), mask=m_tv)
        else:
            b_v = tl.load(u + p_uv, mask=m_tv, other=0.0).to(tl.float32)
        b_k = tl.load(k + (rows * H + i_h // (HV // H))[:, None] * K + o_k[None, :], mask=m_tk,
                      other=0.0).to(tl.float32)
        if USE_G:
            b_g = tl.load(g + rows * HV + i_h, mask=m_t, other=0.0).to(tl.float32)
            decay = tl.where(m_t, tl.exp2(g_last - b_g), 0.0)
        else:
            decay = tl.where(m_t, 1.0, 0.0)
        b_acc += tl.dot(tl.trans(b_k * decay[:, None]), b_v, input_precision="tf32")
        j += BS
    return gamma * b_h + b_acc


@triton.jit
def chunk_decay(g, bos, length, c, rows, m_t, i_h, HV: tl.constexpr, BT: tl.constexpr):
    """Chunk ``c`` of a span (``rows``, ``m_t`` its tokens): each token's decay to the chunk's
    end, ``exp2(g_last - g)`` (0 past the span), and the chunk's whole decay ``exp2(g_last)``,
    from the chunk-local cumulative log2 gate."""
    last = tl.minimum((c + 1) * BT, length) - 1
    g_last = tl.load(g + (bos + last) * HV + i_h).to(tl.float32)
    b_g = tl.load(g + rows * HV + i_h, mask=m_t, other=0.0).to(tl.float32)
    return tl.where(m_t, tl.exp2(g_last - b_g), 0.0), tl.exp2(g_last)


@triton.jit
def wy_chunk(k, w, u, g, v_new, h_chunks, b_h, bos, length, row, c, i_h, o_k, m_k, o_v, m_v, kv_off, m_kv,
             H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
             USE_G: tl.constexpr, INTERPRET: tl.constexpr):
    """Chunk ``c`` of a span (tokens ``bos + c*BT`` on, ``length`` in the span) from its WY
    factors: the entering state to ``h_chunks`` row ``row``, ``v_new = u - W h`` to its tokens,
    and ``gamma h + Kd^T v_new`` returned."""
    tl.store(h_chunks + (row * HV + i_h) * K * V + kv_off, b_h.to(h_chunks.dtype.element_ty), mask=m_kv)
    o_t = tl.arange(0, BT)
    m_t = (c * BT + o_t) < length
    rows = bos + c * BT + o_t
    m_tk = m_t[:, None] & m_k[None, :]
    m_tv = m_t[:, None] & m_v[None, :]
    chunk_start = bos + c * BT  # the chunk's first token: scalar bases, int32 offsets within the tile
    o_tk = o_t[:, None] * (HV * K) + o_k[None, :]
    b_w = tl.load(w + (chunk_start * HV + i_h) * K + o_tk, mask=m_tk, other=0.0)
    b_hw = b_h.to(b_w.dtype)  # fla's state pass: the state in the factors' dtype for W h
    if INTERPRET:
        b_wh = tl.dot(b_w.to(tl.float32), b_hw.to(tl.float32), input_precision="ieee")
    else:
        b_wh = tl.dot(b_w, b_hw, out_dtype=tl.float32)
    o_tv = o_t[:, None] * (HV * V) + o_v[None, :]
    uv_base = (chunk_start * HV + i_h) * V
    b_v = tl.load(u + uv_base + o_tv, mask=m_tv, other=0.0).to(tl.float32) - b_wh
    tl.store(v_new + uv_base + o_tv, b_v.to(v_new.dtype.element_ty), mask=m_tv)
    if USE_G:
        decay, gamma = chunk_decay(g, bos, length, c, rows, m_t, i_h, HV, BT)
        b_v = b_v * decay[:, None]
        b_h = b_h * gamma
    else:
        b_v = tl.where(m_tv, b_v, 0.0)
    b_k = tl.load(k + (chunk_start * H + i_h // (HV // H)) * K + o_t[:, None] * (H * K) + o_k[None, :], mask=m_tk,
                  other=0.0)
    b_vk = b_v.to(b_k.dtype)
    if INTERPRET:
        b_h += tl.dot(tl.trans(b_k).to(tl.float32), b_vk.to(tl.float32), input_precision="ieee")
    else:
        b_h = tl.dot(tl.trans(b_k), b_vk, b_h, out_dtype=tl.float32)
    return b_h


@triton.jit
def wy_chunks(k, w, u, g, cu_spans, span_chunk, v_new, h_chunks, b_h, s, i_h, o_k, m_k, o_v, m_v, kv_off, m_kv,
              H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
              USE_G: tl.constexpr, INTERPRET: tl.constexpr):
    """Live span ``s`` of any length applied chunk by chunk from its WY factors (:func:`wy_chunk`;
    its chunks are ``h_chunks`` rows ``span_chunk[s]`` on): fla's chunked state pass. Both
    products take their operands in the WY factors' dtype with fp32 accumulation (bf16 MMAs for
    a bf16 model: the state rounded to bf16 for ``W h``), as fla's own state pass does, so a
    cold prefill carries its state as ``full_recompute`` does; h stays fp32 between chunks.
    ``INTERPRET``: the same maths in fp32 on the rounded operands (Triton 3.6's interpreter
    returns garbage for bf16 ``tl.dot``), in a while loop (it cannot run ``range`` over loaded
    bounds); compiled, a ``for`` loop that Triton can pipeline."""
    bos = tl.load(cu_spans + s).to(tl.int64)
    length = tl.load(cu_spans + s + 1).to(tl.int64) - bos
    first = tl.load(span_chunk + s).to(tl.int64)
    if INTERPRET:
        c = length * 0  # int64, loop-carried
        while c * BT < length:
            b_h = wy_chunk(k, w, u, g, v_new, h_chunks, b_h, bos, length, first + c, c, i_h, o_k, m_k, o_v, m_v,
                           kv_off, m_kv, H, HV, K, V, BT, USE_G, INTERPRET)
            c += 1
    else:
        for c in range(0, tl.cdiv(length, BT)):
            b_h = wy_chunk(k, w, u, g, v_new, h_chunks, b_h, bos, length, first + c, c, i_h, o_k, m_k, o_v, m_v,
                           kv_off, m_kv, H, HV, K, V, BT, USE_G, INTERPRET)
    return b_h


@triton.jit
def split_dot(a_hi, a_lo, b, INTERPRET: tl.constexpr):
    """:func:`fp32_dot` of ``a = a_hi + a_lo`` (already split, bf16) and fp32 ``b``: a tile that
    takes part in two products is split once."""
    b_hi, b_lo = split_bf16(b)
    out = bf16_dot(a_lo, b_hi, tl.zeros([a_hi.shape[0], b.shape[1]], dtype=tl.float32), INTERPRET)
    out = bf16_dot(a_hi, b_lo, out, INTERPRET)
    return bf16_dot(a_hi, b_hi, out, INTERPRET)


@triton.jit
def element_meta(table, source, cu_spans, j, end, i_h, num_table, t_base, s_base,
                 HV: tl.constexpr, T_SIZE: tl.constexpr, S_SIZE: tl.constexpr,
                 T_UNIT: tl.constexpr, S_UNIT: tl.constexpr):
    """What the fused walk needs of chain element j before applying it: its source, a body's T
    and S offsets (as :func:`span_offsets`) and a live span's token bounds. Every load is masked
    (j past the chain's ``end``, a body's bounds, a live span's table entry), so looking ahead
    past a chain or a list never reads out of bounds."""
    src = tl.load(source + j, mask=j < end, other=-1)
    body = src < 0
    entry = tl.maximum(-src - 1, 0)
    t_addr = tl.load(table + entry, mask=body & (j < end), other=t_base)
    s_addr = tl.load(table + num_table + entry, mask=body & (j < end), other=s_base)
    t_off = (t_addr - t_base) // T_UNIT * (T_UNIT // 4) + i_h * T_SIZE
    s_off = (s_addr - s_base) // S_UNIT * (S_UNIT // 4) + i_h * S_SIZE
    span = tl.maximum(src, 0)
    bos = tl.load(cu_spans + span, mask=~body, other=0).to(tl.int64)
    length = tl.load(cu_spans + span + 1, mask=~body, other=0).to(tl.int64) - bos
    return src, t_off, s_off, bos, length


@triton.jit
def seam_body_step(k, w, u, g, v_new, h_chunks, trans, state, b_h, bos, length, chunk, t_off, s_off,
                   i_h, o_k, m_k, o_v, m_v, kv_off, m_kv,
                   H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BS: tl.constexpr,
                   USE_G: tl.constexpr, INTERPRET: tl.constexpr, T_PACKED: tl.constexpr):
    """A live span of at most BS tokens (a seam) and the cached body after it, in one step:
    ``T (gamma h + Kd^T v) + S`` taken as ``gamma T h + (T Kd^T) v + S`` with ``v = u - W h``.
    ``T Kd^T`` needs only loaded tiles, so the state's own path is ``T h`` beside ``W h -> P v``
    instead of the seam's two products followed by T's, and the seam's and the body's loads are
    in flight together (a cached request's chain alternates seams and bodies: its steps are
    bound by their latency, not by their MMAs). Outputs as :func:`wy_step`'s for the seam.
    ``T_PACKED``: the body's T is stored as its bf16 planes (:func:`load_t_planes`), loaded as
    they are instead of fp32 split here (H200: one layer's all-hit walk -5.7%)."""
    if chunk >= 0:
        tl.store(h_chunks + (chunk * HV + i_h) * K * V + kv_off, b_h.to(h_chunks.dtype.element_ty), mask=m_kv)
    o_s = tl.arange(0, BS)
    m_t = o_s < length
    rows = bos + o_s
    m_tk = m_t[:, None] & m_k[None, :]
    m_tv = m_t[:, None] & m_v[None, :]
    if T_PACKED:
        t_hi, t_lo = load_t_planes(trans, t_off, o_k, m_k, K)
    else:
        b_t = tl.load(trans + t_off + o_k[:, None] * K + o_k[None, :], mask=m_k[:, None] & m_k[None, :], other=0.0)
    b_s = tl.load(state + s_off + kv_off, mask=m_kv, other=0.0)
    b_w = tl.load(w + (rows * HV + i_h)[:, None] * K + o_k[None, :], mask=m_tk, other=0.0)
    p_uv = (rows * HV + i_h)[:, None] * V + o_v[None, :]
    b_u = tl.load(u + p_uv, mask=m_tv, other=0.0).to(tl.float32)
    b_k = tl.load(k + (rows * H + i_h // (HV // H))[:, None] * K + o_k[None, :], mask=m_tk,
                  other=0.0).to(tl.float32)
    if USE_G:
        g_last = tl.load(g + (bos + length - 1) * HV + i_h, mask=length > 0, other=0.0).to(tl.float32)
        gamma = tl.where(length > 0, tl.exp2(g_last), 1.0)
        b_g = tl.load(g + rows * HV + i_h, mask=m_t, other=0.0).to(tl.float32)
        decay = tl.where(m_t, tl.exp2(g_last - b_g), 0.0)
    else:
        gamma = 1.0
        decay = tl.where(m_t, 1.0, 0.0)
    if T_PACKED:
        pass  # split already, by the store's writer
    else:
        t_hi, t_lo = split_bf16(b_t)
    b_p = split_dot(t_hi, t_lo, tl.trans(b_k * decay[:, None]), INTERPRET)  # [K, BS]
    if w.dtype.element_ty == tl.bfloat16:
        b_wh = bf16_fp32_dot(b_w, b_h, INTERPRET)
    else:
        b_wh = fp32_dot(b_w.to(tl.float32), b_h, INTERPRET)
    b_v = b_u - b_wh  # rows past the span are 0 - 0 (masked loads), and their decay is 0
    tl.store(v_new + p_uv, b_v.to(v_new.dtype.element_ty), mask=m_tv)
    b_th = split_dot(t_hi, t_lo, b_h, INTERPRET)
    return gamma * b_th + fp32_dot(b_p, b_v, INTERPRET) + b_s


@triton.jit
def rotated_scalar_body_step(trans, state, rot_cos, rot_sin, j, b_h, t_off, s_off, o_k, m_k, o_v, m_kv,
                             K: tl.constexpr, V: tl.constexpr, RD: tl.constexpr):
    """``exp(log_decay) state + R S`` for body ``j`` of scalar T whose S moves to a new start: the
    key rows of S rotated on load by rotate-half RoPE over the first ``RD`` rows, ``(R S)[r] =
    cos_j[r] S[r] + sin_j[r] S[partner(r)]`` with ``partner`` the row ``RD / 2`` away inside the
    rotated block (itself past it). ``rot_cos`` / ``rot_sin`` ``[N, K]`` fp32 hold each body's
    cosines (1 past ``RD``) and signed sines (``-sin`` in the first half, 0 past ``RD``); a
    scalar T commutes with the rotation, so it is applied as stored."""
    half: tl.constexpr = RD // 2
    partner = tl.where(o_k < half, o_k + half, tl.where(o_k < RD, o_k - half, o_k))
    b_s = tl.load(state + s_off + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
    b_p = tl.load(state + s_off + partner[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
    b_c = tl.load(rot_cos + j * K + o_k, mask=m_k, other=1.0)
    b_n = tl.load(rot_sin + j * K + o_k, mask=m_k, other=0.0)
    return tl.exp(tl.load(trans + t_off)) * b_h + (b_s * b_c[:, None] + b_p * b_n[:, None])


@triton.jit
def live_step(k, w, u, g, cu_spans, span_chunk, v_new, h_chunks, b_h, s, i_h, o_k, m_k, o_v, m_v, kv_off, m_kv,
              H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BS: tl.constexpr,
              USE_G: tl.constexpr, LONG_WY: tl.constexpr, BT: tl.constexpr, INTERPRET: tl.constexpr,
              HAS_W: tl.constexpr):
    """Live span ``s`` applied from its WY factors: chunk by chunk (:func:`wy_chunks`) with
    ``LONG_WY``, else as one short span (:func:`wy_step`; ``HAS_W`` as there)."""
    if LONG_WY:
        return wy_chunks(k, w, u, g, cu_spans, span_chunk, v_new, h_chunks, b_h, s, i_h, o_k, m_k, o_v, m_v, kv_off,
                         m_kv, H, HV, K, V, BT, USE_G, INTERPRET)
    else:
        return wy_step(k, w, u, g, cu_spans, span_chunk, v_new, h_chunks, b_h, s, i_h, o_k, m_k, o_v, m_v, kv_off,
                       m_kv, H, HV, K, V, BS, USE_G, INTERPRET, HAS_W)


@triton.jit
def chain_element(trans, state, record, incoming, k, w, u, g, cu_spans, span_chunk, v_new, h_chunks, source,
                  rot_cos, rot_sin, b_h, i, i_h, t_off, s_off, o_k, m_k, o_v, m_v, kv_off, m_kv,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BS: tl.constexpr,
                  MODE: tl.constexpr, HAS_SOURCE: tl.constexpr,
                  HAS_RECORD: tl.constexpr, HAS_WY: tl.constexpr, USE_G: tl.constexpr, LONG_WY: tl.constexpr,
                  BT: tl.constexpr, INTERPRET: tl.constexpr, T_PACKED: tl.constexpr, HAS_W: tl.constexpr,
                  ROTATE: tl.constexpr, RD: tl.constexpr):
    """Chain element i applied to ``b_h``. With ``HAS_WY`` the live elements (``source[i] >= 0``,
    or every element without a source) are spans of the WY factors (:func:`wy_step`, or with
    ``LONG_WY`` spans of any length, :func:`wy_chunks`); otherwise every element is a summary at
    the given offsets. With ``HAS_RECORD`` the state entering each element is kept in its row.
    ``T_PACKED`` (with ``HAS_WY`` and ``HAS_SOURCE``): the bodies' T are stored as bf16 planes.
    ``ROTATE`` (with ``HAS_WY``, ``HAS_SOURCE`` and scalar T): each body's S is rotated on load
    (:func:`rotated_scalar_body_step`)."""
    if HAS_RECORD or not HAS_WY:
        record_step(record, incoming, b_h, i, i_h, kv_off, m_kv, HV, K, V, HAS_RECORD)
    if HAS_WY and not HAS_SOURCE:
        # every element is a live span (a cold prefill's walk): no summary step is compiled in.
        # With it (a dense T tile, never taken here) the walk took 1.128 ms per layer of the
        # cold 32k prompt on the H200; without it, and with int32 offsets inside the token
        # tiles, 0.932 ms (benchmarks/cold_write_h200.py's kernel table)
        b_h = live_step(k, w, u, g, cu_spans, span_chunk, v_new, h_chunks, b_h, i, i_h, o_k, m_k, o_v, m_v, kv_off,
                        m_kv, H, HV, K, V, BS, USE_G, LONG_WY, BT, INTERPRET, HAS_W)
    elif HAS_WY:
        live = tl.load(source + i)
        if live >= 0:
            b_h = live_step(k, w, u, g, cu_spans, span_chunk, v_new, h_chunks, b_h, live, i_h, o_k, m_k, o_v, m_v,
                            kv_off, m_kv, H, HV, K, V, BS, USE_G, LONG_WY, BT, INTERPRET, HAS_W)
        elif ROTATE:  # a body, from the address table, its S moved to where it now starts
            b_h = rotated_scalar_body_step(trans, state, rot_cos, rot_sin, -live - 1, b_h, t_off, s_off, o_k, m_k,
                                           o_v, m_kv, K, V, RD)
        else:  # a body, from the address table
            b_h = scan_step(trans, state, b_h, t_off, s_off, kv_off, m_kv, o_k, m_k, K, MODE, INTERPRET, T_PACKED)
    else:
        # live summaries and bodies alike: the launch never has packed bodies here
        # (triton_scan._table_of unpacks them into a copy)
        b_h = scan_step(trans, state, b_h, t_off, s_off, kv_off, m_kv, o_k, m_k, K, MODE, INTERPRET, False)
    return b_h


# Values that vary per request are not specialised (== 1, % 16), so no new variant compiles.
@triton.jit(do_not_specialize=["num_table", "t_base", "s_base"])
def scan_chain_kernel(
    trans,        # dense [M, HV, K, K] / diagonal [M, HV, K] / scalar [M, HV], fp32 (any fp32 base with HAS_WY)
    state,        # [M, HV, K, V] fp32: S(C_i | 0)
    init,         # [B, HV, K, V] fp32 (read only when HAS_INIT)
    incoming,     # [R, HV, K, V] fp32 out: state entering each recorded element
    final,        # [B, HV, K, V] fp32 out: state after the chain
    cu_chains,    # [B + 1] int64
    table,        # [2, num_table] int64 byte addresses of one-span (T, S) (read only when HAS_SOURCE)
    source,       # [M] int64 (HAS_SOURCE): >= 0 span of trans/state (live span with HAS_WY), else -(table entry) - 1
    record,       # [M] int64 (HAS_RECORD): row of `incoming` for each element, -1 = not kept
    k,            # HAS_WY: [T, H, K] keys, [T, HV, K] w, [T, HV, V] u of the live spans' WY step,
    w,            #   [T, HV] chunk-local cumulative log2 gate (USE_G), [N + 1] span bounds,
    u,            #   [N] first chunk row of each span (-1: empty); out: [T, HV, V] v_new and
    g,            #   [num_chunks, HV, K, V] state entering each chunk, in h_chunks' dtype
    cu_spans,
    span_chunk,
    v_new,
    h_chunks,
    rot_cos,      # ROTATE: [num_table, K] fp32 per body: cosines (1 past RD) and signed sines (0 past RD)
    rot_sin,
    num_table,
    t_base,       # byte addresses of trans and state (table addresses are taken relative to them)
    s_base,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BS: tl.constexpr,
    MODE: tl.constexpr,
    HAS_INIT: tl.constexpr,
    INTERPRET: tl.constexpr,  # Triton's interpreter: while loops, bf16 products in fp32
    HAS_SOURCE: tl.constexpr,
    HAS_RECORD: tl.constexpr,
    HAS_WY: tl.constexpr,
    USE_G: tl.constexpr,
    LONG_WY: tl.constexpr,  # HAS_WY: live spans of any length, chunk by chunk (fla's state pass)
    BT: tl.constexpr,       # fla's chunk size (LONG_WY)
    T_UNIT: tl.constexpr,  # bytes dividing every table address's distance from t_base / s_base
    S_UNIT: tl.constexpr,
    FUSE: tl.constexpr,    # HAS_WY, HAS_SOURCE, dense, no records: a seam and its body in one step
    T_PACKED: tl.constexpr,  # HAS_WY, HAS_SOURCE: the table's T are stored as bf16 hi/lo planes
    HAS_W: tl.constexpr,     # HAS_WY: the live spans' W is read (without it W = 0 and v_new is u)
    ROTATE: tl.constexpr,    # HAS_WY, HAS_SOURCE, scalar T: the bodies' S rotated on load (rot_cos, rot_sin)
    RD: tl.constexpr,        # ROTATE: rotated key rows (even, at most K)
):
    i_v = tl.program_id(0)
    i_h = tl.program_id(1).to(tl.int64)
    i_b = tl.program_id(2).to(tl.int64)
    start = tl.load(cu_chains + i_b).to(tl.int64)
    end = tl.load(cu_chains + i_b + 1).to(tl.int64)
    T_SIZE: tl.constexpr = K * K if MODE == 0 else (K if MODE == 1 else 1)
    o_k, o_v, m_k, m_v, m_kv, kv_off = state_tile(i_v, K, V, BK, BV)

    if HAS_INIT:
        b_h = tl.load(init + (i_b * HV + i_h) * K * V + kv_off, mask=m_kv, other=0.0).to(tl.float32)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)

    if FUSE:
        # A live span of at most BS tokens followed by a body is applied with it in one step
        # (:func:`seam_body_step`), so the walk advances by one or two elements: what it reads
        # of the two elements after the pair is loaded while the pair is applied, as below.
        last = tl.maximum(end - 1, start)
        src0, t0, s0, bos0, len0 = element_meta(table, source, cu_spans, tl.minimum(start, last), end, i_h,
                                                num_table, t_base, s_base, HV, T_SIZE, K * V, T_UNIT, S_UNIT)
        src1, t1, s1, bos1, len1 = element_meta(table, source, cu_spans, tl.minimum(start + 1, last), end, i_h,
                                                num_table, t_base, s_base, HV, T_SIZE, K * V, T_UNIT, S_UNIT)
        i = start
        while i < end:
            j2 = tl.minimum(i + 2, last)
            j3 = tl.minimum(i + 3, last)
            src2, t2, s2, bos2, len2 = element_meta(table, source, cu_spans, j2, end, i_h, num_table, t_base, s_base,
                                                    HV, T_SIZE, K * V, T_UNIT, S_UNIT)
            src3, t3, s3, bos3, len3 = element_meta(table, source, cu_spans, j3, end, i_h, num_table, t_base, s_base,
                                                    HV, T_SIZE, K * V, T_UNIT, S_UNIT)
            fuse = (src0 >= 0) & (i + 1 < end) & (src1 < 0) & (len0 <= BS)
            if fuse:
                chunk = tl.load(span_chunk + src0).to(tl.int64)
                b_h = seam_body_step(k, w, u, g, v_new, h_chunks, trans, state, b_h, bos0, len0, chunk, t1, s1,
                                     i_h, o_k, m_k, o_v, m_v, kv_off, m_kv, H, HV, K, V, BS, USE_G, INTERPRET,
                                     T_PACKED)
            else:
                b_h = chain_element(trans, state, record, incoming, k, w, u, g, cu_spans, span_chunk, v_new,
                                    h_chunks, source, rot_cos, rot_sin, b_h, i, i_h, t0, s0, o_k, m_k, o_v, m_v,
                                    kv_off, m_kv, H, HV, K, V, BS, MODE, HAS_SOURCE, HAS_RECORD, HAS_WY, USE_G,
                                    LONG_WY, BT, INTERPRET, T_PACKED, HAS_W, ROTATE, RD)
            # the next element is i + 2 after a pair, else i + 1
            src0, t0, s0, bos0, len0 = (tl.where(fuse, src2, src1), tl.where(fuse, t2, t1), tl.where(fuse, s2, s1),
                                        tl.where(fuse, bos2, bos1), tl.where(fuse, len2, len1))
            src1, t1, s1, bos1, len1 = (tl.where(fuse, src3, src2), tl.where(fuse, t3, t2), tl.where(fuse, s3, s2),
                                        tl.where(fuse, bos3, bos2), tl.where(fuse, len3, len2))
            i += tl.where(fuse, 2, 1)
    else:
        # The offsets of element i + 1 are read while element i is applied: the two dependent
        # scalar loads (source, then the table) leave the step's critical path.
        last = tl.maximum(end - 1, start)
        t_off, s_off = span_offsets(table, source, tl.minimum(start, last), i_h, num_table, t_base, s_base,
                                    HV, T_SIZE, K * V, HAS_SOURCE, T_UNIT, S_UNIT)
        if INTERPRET:
            # Triton's interpreter cannot run ``range`` over bounds loaded from memory (seen with
            # Triton 3.6: "only 0-dimensional arrays can be converted to Python scalars"); the
            # compiled kernel keeps the ``for`` loop.
            i = start
            while i < end:
                t_next, s_next = span_offsets(table, source, tl.minimum(i + 1, last), i_h, num_table, t_base, s_base,
                                              HV, T_SIZE, K * V, HAS_SOURCE, T_UNIT, S_UNIT)
                b_h = chain_element(trans, state, record, incoming, k, w, u, g, cu_spans, span_chunk, v_new, h_chunks,
                                    source, rot_cos, rot_sin, b_h, i, i_h, t_off, s_off, o_k, m_k, o_v, m_v, kv_off,
                                    m_kv, H, HV, K, V, BS, MODE, HAS_SOURCE, HAS_RECORD, HAS_WY, USE_G, LONG_WY, BT,
                                    INTERPRET, T_PACKED, HAS_W, ROTATE, RD)
                t_off, s_off = t_next, s_next
                i += 1
        else:
            for i in range(start, end):
                t_next, s_next = span_offsets(table, source, tl.minimum(i + 1, last), i_h, num_table, t_base, s_base,
                                              HV, T_SIZE, K * V, HAS_SOURCE, T_UNIT, S_UNIT)
                b_h = chain_element(trans, state, record, incoming, k, w, u, g, cu_spans, span_chunk, v_new, h_chunks,
                                    source, rot_cos, rot_sin, b_h, i, i_h, t_off, s_off, o_k, m_k, o_v, m_v, kv_off,
                                    m_kv, H, HV, K, V, BS, MODE, HAS_SOURCE, HAS_RECORD, HAS_WY, USE_G, LONG_WY, BT,
                                    INTERPRET, T_PACKED, HAS_W, ROTATE, RD)
                t_off, s_off = t_next, s_next

    tl.store(final + (i_b * HV + i_h) * K * V + kv_off, b_h, mask=m_kv)
