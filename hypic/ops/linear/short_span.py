"""Zero-start summaries of spans that fit in one chunk, from the WY factors (pure PyTorch).

A PIC forward of a request whose segments are all cached recomputes only short spans: the seam
window (w = 8 tokens) of every segment and the question. Within one chunk the delta rule's WY
factors give the span's summary in closed form. With ``gc`` the chunk-local cumulative log2
gate, ``gamma = exp2(gc[last])`` and ``d_t = exp2(gc[last] - gc[t])``, fla's state pass reads
``S_end = gamma S_0 + sum_t d_t k_t (u_t - w_t S_0)^T``, so

    T = gamma I - Kd^T W,    S(C|0) = Kd^T U,    Kd = diag(d) K.

That is two batched products of rank at most the span length (64), against fla's general
summary kernel, which composes a dense K x K transform per chunk with three-pass TF32 dots and
spent 10.3 of the 117 GPU milliseconds of an all-hit 32k request on 65 such spans (session 5).
Here the products run in fp32 on bf16 inputs converted exactly, so T is at least as accurate.

The row tables are built on the host from ``cu_seqlens_cpu`` (no device sync) and cached by the
identity of the two ``cu`` tensors, like the chunk table.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import numpy as np
import torch


class SpanRows(NamedTuple):
    """Padded gather table of spans that each fit in one chunk."""

    rows: torch.Tensor  # [N, R] int64 token row of each span position (padding repeats a valid row)
    valid: torch.Tensor  # [N, R] bool: position < span length
    last: torch.Tensor  # [N] int64 last token row of each span (0 for an empty span)
    nonempty: torch.Tensor  # [N] bool
    token_slots: torch.Tensor  # [T] int64: token t sits at flat slot span * R + position
    chunk_spans: torch.Tensor  # [num_chunks] int64: the span of each chunk (the non-empty spans)


def short_span_rows_host(cu_cpu: torch.Tensor, chunk_size: int) -> Optional[Tuple[np.ndarray, ...]]:
    """Host tables for ``cu_cpu`` when every span has at most ``chunk_size`` tokens, else None."""
    bounds = np.asarray(cu_cpu.tolist(), dtype=np.int64)
    lengths = np.diff(bounds)
    if lengths.size == 0 or int(lengths.max()) > chunk_size:
        return None
    width = max(int(lengths.max()), 1)
    pos = np.arange(width, dtype=np.int64)[None, :]
    valid = pos < lengths[:, None]
    # padding points at the span's own first row (masked out), or row 0 for an empty span
    rows = np.where(valid, bounds[:-1, None] + pos, np.where(lengths[:, None] > 0, bounds[:-1, None], 0))
    last = np.where(lengths > 0, bounds[1:] - 1, 0)
    token_slots = np.flatnonzero(valid.reshape(-1))  # row-major (span, position) = token order
    chunk_spans = np.flatnonzero(lengths > 0)
    return rows, valid, last, lengths > 0, token_slots, chunk_spans


_ROW_TABLES: list = []  # (cu, cu_cpu, SpanRows or None), most recent first
_MAX_ROW_TABLES = 8


def short_span_rows(cu: torch.Tensor, cu_cpu: Optional[torch.Tensor], chunk_size: int) -> Optional[SpanRows]:
    """Device tables for the spans of ``cu`` (None when a span is longer than a chunk, or when no
    host copy of ``cu`` is given: reading it back would cost a device sync)."""
    if cu_cpu is None:
        return None
    for held_cu, held_cpu, table in _ROW_TABLES:
        if held_cu is cu and held_cpu is cu_cpu:
            return table
    host = short_span_rows_host(cu_cpu, chunk_size)
    table = None
    if host is not None:
        tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in host]
        if cu.is_cuda:
            tensors = [t.pin_memory().to(cu.device, non_blocking=True) for t in tensors]
        table = SpanRows(*tensors)
    _ROW_TABLES.insert(0, (cu, cu_cpu, table))
    del _ROW_TABLES[_MAX_ROW_TABLES:]
    return table


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
    num_spans, width = table.rows.shape
    num_heads, key_dim = w.shape[1], w.shape[2]
    ratio = num_heads // k.shape[1]
    flat = table.rows.reshape(-1)
    mask = table.valid.to(torch.float32)[:, :, None]  # [N, R, 1]
    if gc is not None:
        gc = gc.to(torch.float32)
        g_rows = gc.index_select(0, flat).view(num_spans, width, num_heads)
        g_last = gc.index_select(0, table.last)  # [N, HV]
        decay = torch.exp2(g_last[:, None, :] - g_rows) * mask
        gamma = torch.where(table.nonempty[:, None], torch.exp2(g_last), torch.ones_like(g_last))
    else:
        decay = mask.expand(num_spans, width, num_heads)
        gamma = torch.ones(num_spans, num_heads, device=w.device, dtype=torch.float32)
    k_rows = k.index_select(0, flat).view(num_spans, width, k.shape[1], key_dim)
    if ratio > 1:
        k_rows = k_rows.repeat_interleave(ratio, dim=2)
    # Kd^T laid out [N, HV, K, R] for the batched products
    kd_t = (k_rows.to(torch.float32) * decay[..., None]).permute(0, 2, 3, 1)
    w_rows = w.index_select(0, flat).view(num_spans, width, num_heads, key_dim).to(torch.float32).transpose(1, 2)
    eye = torch.eye(key_dim, device=w.device, dtype=torch.float32)
    transition = torch.baddbmm(
        (gamma[:, :, None, None] * eye).reshape(-1, key_dim, key_dim),
        kd_t.reshape(-1, key_dim, width), w_rows.reshape(-1, width, key_dim), alpha=-1.0,
    ).view(num_spans, num_heads, key_dim, key_dim)
    if transition_only:
        return None, transition
    value_dim = u.shape[-1]
    u_rows = u.index_select(0, flat).view(num_spans, width, num_heads, value_dim).to(torch.float32).transpose(1, 2)
    state = torch.matmul(kd_t, u_rows)
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
    num_spans, width = table.rows.shape
    num_heads, key_dim = w.shape[1], w.shape[2]
    value_dim = u.shape[-1]
    h0 = initial_states.to(u.dtype)
    w_rows = w.index_select(0, table.rows.reshape(-1)).view(num_spans, width, num_heads, key_dim).transpose(1, 2)
    wh = torch.matmul(w_rows, h0)  # [N, HV, R, V]
    wh = wh.transpose(1, 2).reshape(num_spans * width, num_heads, value_dim).index_select(0, table.token_slots)
    v_new = (u.to(torch.float32) - wh.to(torch.float32)).to(u.dtype)
    return v_new, h0.index_select(0, table.chunk_spans)


__all__ = ["SpanRows", "short_span_rows", "short_span_rows_host", "short_span_state_pass", "short_span_summary"]
