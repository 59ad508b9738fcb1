"""Zero-start summaries of spans that fit in one chunk, from the WY factors.

A PIC forward of a request whose segments are all cached recomputes only short spans: the seam
window (w = 8 tokens) of every segment and the question. Within one chunk the delta rule's WY
factors give the span's summary in closed form. With ``gc`` the chunk-local cumulative log2
gate, ``gamma = exp2(gc[last])`` and ``d_t = exp2(gc[last] - gc[t])``, fla's state pass reads
``S_end = gamma S_0 + sum_t d_t k_t (u_t - w_t S_0)^T``, so

    T = gamma I - Kd^T W,    S(C|0) = Kd^T U,    Kd = diag(d) K.

That is two products of rank at most the span length (64), against fla's general summary
kernel, which composes a dense K x K transform per chunk and spent 10.3 of the 117 GPU
milliseconds of an all-hit 32k request on 65 such spans. The state pass of such a span is
``v_new = u - W h0``, with no final state to form.

Two formulations: the torch functions (fp32 batched products per width class: the reference,
and the path for head dims the kernels do not take) and one Triton launch each (``*_triton``,
the path on CUDA: TF32 dots with fp32 accumulation; bf16 W and U are exact in TF32, the decayed
keys round at 2^-11). On the H200 at the all-hit 32k shape the kernels take 0.184 and 0.127 ms
per layer, against 0.343 and 0.279 ms for fla's summary kernel and state pass
(benchmarks/results/README.md).

The row tables are built on the host from ``cu_seqlens_cpu`` (no device sync) and cached by the
identity of the two ``cu`` tensors while the device one lives, like the chunk table.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import numpy as np
import torch

from hypic.ops.linear._layout_tables import LayoutTables

MIN_WIDTH = 8  # narrowest padded width of a span class
TILE_MIN_ROWS = 16  # narrowest Triton tile of short_wy's kernels (tl.dot needs 16)


def tile_groups_host(lengths: np.ndarray) -> list:
    """``[(rows, span ids)]`` of the non-empty spans of ``lengths``, grouped by their length
    rounded up to a power of two (at least ``TILE_MIN_ROWS``): one launch per group."""
    lengths = np.asarray(lengths, dtype=np.int64)
    nonempty = np.flatnonzero(lengths > 0)
    if nonempty.size == 0:
        return []
    rows = np.maximum(TILE_MIN_ROWS, 1 << np.ceil(np.log2(lengths[nonempty])).astype(np.int64))
    return [(int(r), nonempty[rows == r]) for r in np.unique(rows)]


class SpanClass(NamedTuple):
    """Spans whose lengths round up to the same power-of-two width, padded to it."""

    span_range: Optional[Tuple[int, int]]  # host: the class is spans [a, b) (results go in place)
    span_ids: torch.Tensor  # [Nc] int64 span index of each member
    rows: torch.Tensor  # [Nc, R] int64 token row of each position (padding repeats a valid row)
    valid: torch.Tensor  # [Nc, R] bool: position < span length
    last: torch.Tensor  # [Nc] int64 last token row of each span (0 for an empty span)
    nonempty: torch.Tensor  # [Nc] bool
    token_slots: torch.Tensor  # [Tc] int64 flat slot (member * R + position) of each member token
    token_rows: torch.Tensor  # [Tc] int64 the token row of each of those slots


class SpanRows(NamedTuple):
    """Gather tables of spans that each fit in one chunk, by width class."""

    num_spans: int
    classes: Optional[Tuple[SpanClass, ...]]  # None: built for the Triton kernels, which need none
    chunk_spans: torch.Tensor  # [num_chunks] int64: the span of each chunk (the non-empty spans)
    all_nonempty: bool  # host: every span is one chunk (chunk i is span i)
    span_chunk: torch.Tensor  # [N] int32: the chunk of each span, -1 for an empty span
    # (tile rows, span ids [M] int64) per Triton tile of :mod:`short_wy` (rows: the span lengths
    # rounded up to a power of two, at least TILE_MIN_ROWS), empty spans left out
    tiles: Tuple[Tuple[int, torch.Tensor], ...] = ()


def short_span_rows_host(cu_cpu: torch.Tensor, chunk_size: int) -> Optional[Tuple[int, list, np.ndarray]]:
    """Host tables for ``cu_cpu`` when every span has at most ``chunk_size`` tokens, else None:
    ``(num_spans, [(span_range, arrays...) per class], chunk_spans)``. Spans are padded to their
    length rounded up to a power of two (at least ``MIN_WIDTH``), so 8-token seams are not padded
    to a 64-token question's width."""
    bounds = np.asarray(cu_cpu.tolist(), dtype=np.int64)
    lengths = np.diff(bounds)
    if lengths.size == 0 or int(lengths.max()) > chunk_size:
        return None
    widths = np.maximum(MIN_WIDTH, 1 << np.ceil(np.log2(np.maximum(lengths, 1))).astype(np.int64))
    classes = []
    for width in np.unique(widths):
        ids = np.flatnonzero(widths == width)
        starts, lens = bounds[ids], lengths[ids]
        pos = np.arange(width, dtype=np.int64)[None, :]
        valid = pos < lens[:, None]
        # padding points at the span's own first row (masked out), or row 0 for an empty span
        rows = np.where(valid, starts[:, None] + pos, np.where(lens[:, None] > 0, starts[:, None], 0))
        last = np.where(lens > 0, starts + lens - 1, 0)
        slots = np.flatnonzero(valid.reshape(-1))
        contiguous = bool(ids.size) and int(ids[-1] - ids[0]) == ids.size - 1
        span_range = (int(ids[0]), int(ids[-1]) + 1) if contiguous else None
        classes.append((span_range, ids, rows, valid, last, lens > 0, slots, rows.reshape(-1)[slots]))
    return int(lengths.size), classes, np.flatnonzero(lengths > 0)


# Tables of a forward's layout tensors, kept while those live (see _layout_tables).
_TABLES = LayoutTables()


def short_span_rows(cu: torch.Tensor, cu_cpu: Optional[torch.Tensor], chunk_size: int,
                    classes: bool = True) -> Optional[SpanRows]:
    """Device tables for the spans of ``cu`` (None when a span is longer than a chunk, or when no
    host copy of ``cu`` is given: reading it back would cost a device sync). ``classes=False``
    skips the per-class gather tables, which only the torch formulation reads."""
    if cu_cpu is None:
        return None

    def build():
        host = short_span_rows_host(cu_cpu, chunk_size)
        if host is None:
            return None

        def dev(a):
            t = torch.from_numpy(np.ascontiguousarray(a))
            return t.pin_memory().to(cu.device, non_blocking=True) if cu.is_cuda else t

        num_spans, host_classes, chunk_spans = host
        span_chunk = np.full(num_spans, -1, dtype=np.int32)
        span_chunk[chunk_spans] = np.arange(len(chunk_spans), dtype=np.int32)
        built = tuple(SpanClass(c[0], *(dev(a) for a in c[1:])) for c in host_classes) if classes else None
        tiles = tuple((rows, dev(ids)) for rows, ids in tile_groups_host(np.diff(np.asarray(cu_cpu.tolist()))))
        return SpanRows(num_spans, built, dev(chunk_spans), len(chunk_spans) == num_spans, dev(span_chunk), tiles)

    return _TABLES.get(cu, cu_cpu, ("short_span_rows", chunk_size, classes), build)


def _need_classes(table: SpanRows) -> None:
    if table.classes is None:
        raise ValueError("the torch formulation needs a table built with classes=True")


def _place(out: torch.Tensor, cls: SpanClass, values: torch.Tensor) -> None:
    if cls.span_range is None:
        out.index_copy_(0, cls.span_ids, values)
    # else: values were computed in place (a view of out)


def short_span_summary(
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    gc: Optional[torch.Tensor],
    table: SpanRows,
    transition_only: bool = False,
) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
    """``(S [N, HV, K, V] or None, T [N, HV, K, K])`` fp32 of spans of at most one chunk.

    ``k [T, H, K]`` (H divides HV: value head j reads key head ``j // (HV // H)``), ``w [T, HV, K]``,
    ``u [T, HV, V]``: the WY factors of the chunked delta rule; ``gc [T, HV]`` the chunk-local
    cumulative gate in log2 units, or None for an ungated rule (DeltaNet)."""
    _need_classes(table)
    num_heads, key_dim, value_dim = w.shape[1], w.shape[2], u.shape[-1]
    ratio = num_heads // k.shape[1]
    device = w.device
    transition = torch.empty(table.num_spans, num_heads, key_dim, key_dim, device=device, dtype=torch.float32)
    state = None if transition_only else torch.empty(table.num_spans, num_heads, key_dim, value_dim,
                                                     device=device, dtype=torch.float32)
    gc = None if gc is None else gc.to(torch.float32)
    for cls in table.classes:
        members, width = cls.rows.shape
        flat = cls.rows.reshape(-1)
        mask = cls.valid.to(torch.float32)[:, :, None]  # [Nc, R, 1]
        if gc is not None:
            g_last = gc.index_select(0, cls.last)  # [Nc, HV]
            decay = torch.exp2(g_last[:, None, :] - gc.index_select(0, flat).view(members, width, num_heads)) * mask
            gamma = torch.where(cls.nonempty[:, None], torch.exp2(g_last), torch.ones_like(g_last))
        else:
            decay = mask.expand(members, width, num_heads)
            gamma = torch.ones(members, num_heads, device=device, dtype=torch.float32)
        k_rows = k.index_select(0, flat).view(members, width, k.shape[1], key_dim)
        if ratio > 1:
            k_rows = k_rows.repeat_interleave(ratio, dim=2)
        # Kd^T laid out [Nc, HV, K, R] (small: R is the class width); T = gamma I - Kd^T W is one
        # product into place plus a diagonal
        kd_t = (k_rows.to(torch.float32) * decay[..., None]).permute(0, 2, 3, 1)
        neg_kd_t = -kd_t
        w_rows = w.index_select(0, flat).view(members, width, num_heads, key_dim).transpose(1, 2).to(torch.float32)
        a, b = cls.span_range if cls.span_range is not None else (None, None)
        t_cls = torch.matmul(neg_kd_t, w_rows, out=transition[a:b]) if a is not None else torch.matmul(neg_kd_t, w_rows)
        t_cls.diagonal(dim1=-2, dim2=-1).add_(gamma[:, :, None])
        _place(transition, cls, t_cls)
        if state is not None:
            u_rows = u.index_select(0, flat).view(members, width, num_heads, value_dim).transpose(1, 2).to(torch.float32)
            s_cls = torch.matmul(kd_t, u_rows, out=state[a:b]) if a is not None else torch.matmul(kd_t, u_rows)
            _place(state, cls, s_cls)
    return state, transition


def short_span_state_pass(
    w: torch.Tensor, u: torch.Tensor, initial_states: torch.Tensor, table: SpanRows
) -> Tuple[torch.Tensor, torch.Tensor]:
    """What fla's state pass hands its output kernel, for spans of at most one chunk.

    Each span is a single chunk, so the state entering its chunk is the span's initial state and
    the pass reduces to ``v_new = u - W h0`` with ``h0`` rounded to the input dtype, as fla's
    kernel rounds it before its dot. Returns ``(v_new [T, HV, V], h [num_chunks, HV, K, V])``,
    both in ``u``'s dtype; the final states, which the kernel also writes, are not formed (a PIC
    forward takes them from its scan)."""
    _need_classes(table)
    num_heads, key_dim, value_dim = w.shape[1], w.shape[2], u.shape[-1]
    h0 = initial_states.to(u.dtype)
    h = h0 if table.all_nonempty else h0.index_select(0, table.chunk_spans)
    wh = torch.empty(u.shape, device=u.device, dtype=torch.float32)
    for cls in table.classes:
        members, width = cls.rows.shape
        if cls.span_range is not None:
            h_cls = h0[cls.span_range[0]:cls.span_range[1]]
        else:
            h_cls = h0.index_select(0, cls.span_ids)
        w_rows = w.index_select(0, cls.rows.reshape(-1)).view(members, width, num_heads, key_dim).transpose(1, 2)
        # fp32 product of the rounded operands, then one rounding of u - W h0 (as fla's kernel)
        wh_cls = torch.matmul(w_rows.to(torch.float32), h_cls.to(torch.float32))
        wh_cls = wh_cls.transpose(1, 2).reshape(members * width, num_heads, value_dim)
        wh.index_copy_(0, cls.token_rows, wh_cls.index_select(0, cls.token_slots))
    v_new = (u.to(torch.float32) - wh).to(u.dtype)
    return v_new, h


# --------------------------------------------------------------------------------------------
# Triton: one launch each (the torch functions above are their reference)
# --------------------------------------------------------------------------------------------

_KERNELS = None


def triton_supported(key_dim: int, value_dim: int, chunk_size: int) -> bool:
    """Power-of-two key dim in [16, 256] and chunk size >= 16 (``tl.arange`` / ``tl.dot`` tiles)."""
    return 16 <= key_dim <= 256 and key_dim & (key_dim - 1) == 0 and chunk_size >= 16 and \
        chunk_size & (chunk_size - 1) == 0 and value_dim > 0


def _kernels():
    global _KERNELS
    if _KERNELS is None:
        from hypic.ops.linear._short_span_kernel import short_span_state_kernel, short_span_summary_kernel

        _KERNELS = (short_span_summary_kernel, short_span_state_kernel)
    return _KERNELS


def short_span_summary_triton(k, w, u, gc, cu, table: SpanRows, chunk_size: int, transition_only: bool = False):
    """:func:`short_span_summary` in one Triton launch (no padding, no intermediate copies)."""
    num_heads, key_dim, value_dim = w.shape[1], w.shape[2], u.shape[-1]
    num_spans = table.num_spans
    device = w.device
    transition = torch.empty(num_spans, num_heads, key_dim, key_dim, device=device, dtype=torch.float32)
    state = None if transition_only else torch.empty(num_spans, num_heads, key_dim, value_dim, device=device,
                                                     dtype=torch.float32)
    block_c = min(64, key_dim)
    blocks = key_dim // block_c + (0 if transition_only else -(-value_dim // block_c))
    _kernels()[0][(num_spans, num_heads, blocks)](
        k, w, u, gc if gc is not None else transition, cu, transition, state if state is not None else transition,
        H=k.shape[1], HV=num_heads, K=key_dim, V=value_dim, BT=chunk_size, BC=block_c,
        USE_G=gc is not None, STATE=state is not None, num_warps=4,
    )
    return state, transition


def short_span_state_pass_triton(w, u, initial_states, cu, table: SpanRows, chunk_size: int):
    """:func:`short_span_state_pass` in one Triton launch."""
    num_heads, key_dim, value_dim = w.shape[1], w.shape[2], u.shape[-1]
    v_new = torch.empty_like(u)
    h = torch.empty(table.chunk_spans.shape[0], num_heads, key_dim, value_dim, device=w.device, dtype=w.dtype)
    block_v = min(64, max(16, 1 << (value_dim - 1).bit_length()))
    _kernels()[1][(table.num_spans, num_heads, -(-value_dim // block_v))](
        w, u, initial_states.to(torch.float32).contiguous(), cu, table.span_chunk, v_new, h,
        HV=num_heads, K=key_dim, V=value_dim, BT=chunk_size, BV=block_v, num_warps=4,
    )
    return v_new, h


__all__ = ["SpanClass", "SpanRows", "short_span_rows", "short_span_rows_host", "short_span_state_pass",
           "short_span_state_pass_triton", "short_span_summary", "short_span_summary_triton", "triton_supported"]
