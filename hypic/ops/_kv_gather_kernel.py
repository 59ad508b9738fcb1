"""The Triton kernel of :mod:`hypic.ops.kv_gather` (imported lazily, so a CPU-only machine never
imports Triton). Module-level so that it resolves both compiled and under ``TRITON_INTERPRET=1``."""

import triton
import triton.language as tl

from hypic.ops._triton_search import run_of


@triton.jit
def _piece_offsets(addresses, piece, cached, base_bytes, row_in_piece, head,
                   H: tl.constexpr, DIM: tl.constexpr, UNIT_BYTES: tl.constexpr, ELEM_BYTES: tl.constexpr):
    """Element offsets, from the output tensor at byte address ``base_bytes``, of ``head`` of row
    ``row_in_piece`` of each row's piece (``addresses[piece]``: the byte address of a contiguous
    ``[n, H, DIM]`` piece). Every address and the base are multiples of ``UNIT_BYTES``: counted in
    such steps, the offset tells Triton that each row starts that aligned, which keeps the loads
    vectorised (a pointer read from memory as such would lose it)."""
    address = tl.load(addresses + piece, mask=cached, other=base_bytes)
    steps = (address - base_bytes) // UNIT_BYTES  # exact: both are multiples of UNIT_BYTES
    return steps * (UNIT_BYTES // ELEM_BYTES) + (row_in_piece * H + head) * DIM


# Row, live and piece counts and the output addresses change with every request: not specialised,
# so a request of a new size reuses the compiled kernel.
@triton.jit(do_not_specialize=["num_table", "key_base_bytes", "value_base_bytes", "num_rows", "num_live",
                               "num_pieces"])
def kv_gather_kernel(
    k,                 # [T, H, DK] live keys (unit stride on the last dim)
    v,                 # [T, H, DV] live values (unit stride on the last dim)
    addresses,         # [2, num_table] int64: byte address of each piece's keys (row 0), values (row 1)
    num_table,
    cu_cached,         # [P + 1] int64: piece p is cached rows [cu_cached[p], cu_cached[p + 1])
    key_index,         # [R] int64: output row r is row key_index[r] of cat(live, cached rows)
    cos,               # [P, RD] fp32 per piece (read only with ROTATE)
    sin,
    out_k,             # [R, H, DK] out, contiguous
    out_v,             # [R, H, DV] out, contiguous
    key_base_bytes,    # out_k's byte address (piece offsets count from it)
    value_base_bytes,  # out_v's
    num_rows,
    num_live,
    num_pieces,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    H: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    DK_PAD: tl.constexpr,  # next powers of two (tile widths)
    DV_PAD: tl.constexpr,
    RD: tl.constexpr,      # rotated dims of a key head (rotate-half over [0, RD))
    ROTATE: tl.constexpr,
    UNIT_BYTES: tl.constexpr,
    ELEM_BYTES: tl.constexpr,
    BR: tl.constexpr,      # output rows per program
    LOG_N: tl.constexpr,   # halvings of [0, P - 1]: at least P's bit length
):
    """One (BR output rows, one kv head) tile of the packed keys and values. Each row's source is
    ``key_index``: a live row, or a cached row whose piece is found by a binary search over
    ``cu_cached`` (no per-row tables) and read where the piece lies. Cached keys are rotated on the
    way by their piece's cos/sin, in fp32 with the reference's operations (``x*cos + rh*sin``,
    each rounded; the launch disables FMA contraction), then rounded to the output dtype once.
    Every byte is read once from HBM and written once (the rotation's partner dims hit L1)."""
    pid_r = tl.program_id(0)
    head = tl.program_id(1)
    r = pid_r * BR + tl.arange(0, BR)
    m_r = r < num_rows
    src = tl.load(key_index + r, mask=m_r, other=0)
    live = m_r & (src < num_live)
    cached = m_r & (src >= num_live)
    c = src - num_live
    piece = run_of(cu_cached, c, num_pieces, cached, LOG_N)  # the piece holding each cached row
    row_in_piece = c - tl.load(cu_cached + piece, mask=cached, other=0)
    r64 = r.to(tl.int64)

    # -- keys ---------------------------------------------------------------------------------
    dk = tl.arange(0, DK_PAD)
    m_dk = dk < DK
    k_off = _piece_offsets(addresses, piece, cached, key_base_bytes, row_in_piece, head,
                           H=H, DIM=DK, UNIT_BYTES=UNIT_BYTES, ELEM_BYTES=ELEM_BYTES)
    m_live = live[:, None] & m_dk[None, :]
    m_cached = cached[:, None] & m_dk[None, :]
    x_live = tl.load(k + src[:, None] * stride_kt + head * stride_kh + dk[None, :], mask=m_live, other=0.0)
    x = tl.load(out_k + k_off[:, None] + dk[None, :], mask=m_cached, other=0.0)
    if ROTATE:
        half = RD // 2
        in_rot = dk < RD
        m_rot = cached[:, None] & in_rot[None, :]
        # rotate-half partner of dim d: d + RD/2 (negated) in the first half, d - RD/2 in the second
        partner = tl.where(dk < half, dk + half, dk - half)
        xp = tl.load(out_k + k_off[:, None] + partner[None, :], mask=m_rot, other=0.0).to(tl.float32)
        cs = tl.load(cos + piece[:, None] * RD + dk[None, :], mask=m_rot, other=1.0)
        sn = tl.load(sin + piece[:, None] * RD + dk[None, :], mask=m_rot, other=0.0)
        rh = tl.where((dk < half)[None, :], -xp, xp)
        rotated = x.to(tl.float32) * cs + rh * sn
        # dims past RD keep their stored bits (no round trip through fp32)
        x = tl.where(in_rot[None, :], rotated.to(out_k.dtype.element_ty), x)
    x = tl.where(live[:, None], x_live, x)
    tl.store(out_k + (r64[:, None] * H + head) * DK + dk[None, :], x, mask=m_r[:, None] & m_dk[None, :])

    # -- values -------------------------------------------------------------------------------
    dv = tl.arange(0, DV_PAD)
    m_dv = dv < DV
    v_off = _piece_offsets(addresses + num_table, piece, cached, value_base_bytes, row_in_piece, head,
                           H=H, DIM=DV, UNIT_BYTES=UNIT_BYTES, ELEM_BYTES=ELEM_BYTES)
    y_live = tl.load(v + src[:, None] * stride_vt + head * stride_vh + dv[None, :],
                     mask=live[:, None] & m_dv[None, :], other=0.0)
    y = tl.load(out_v + v_off[:, None] + dv[None, :], mask=cached[:, None] & m_dv[None, :], other=0.0)
    y = tl.where(live[:, None], y_live, y)
    tl.store(out_v + (r64[:, None] * H + head) * DV + dv[None, :], y, mask=m_r[:, None] & m_dv[None, :])
