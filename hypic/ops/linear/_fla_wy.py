"""The WY machinery the delta-rule fast paths share (:mod:`hypic.ops.linear.fla_paths`, the chain
walk of :mod:`hypic.ops.linear._fla_chain`): fla's intra-chunk WY step or, when every span fits
in one chunk, :mod:`hypic.ops.linear.short_wy`'s tiles; the output; the spans' summaries (closed
forms of :mod:`hypic.ops.linear.short_span` for one-chunk spans, fla's summary kernel otherwise)
and their transitions (:mod:`hypic.ops.linear.transition`). fla is imported inside function
bodies only."""

from __future__ import annotations

import torch

from hypic.ops.linear._fla_common import CHUNK_SIZE, _b1, _chunk_indices, _cu, _local_cumsum
from hypic.ops.linear._fla_summaries import _cp_summaries
from hypic.ops.linear.short_span import (
    short_span_rows,
    short_span_summary,
    short_span_summary_triton,
    triton_supported,
)
from hypic.ops.linear.short_wy import short_span_output_triton, short_span_wy_triton
from hypic.ops.linear.summary import DenseSummary
from hypic.ops.linear.transition import BesideTransitions, wy_transitions_beside


def _wy_intra(k4, v4, gc, beta3, cu, ci):
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra

    w, u, _ = chunk_gated_delta_rule_fwd_intra(
        k=k4, v=v4, g=gc, beta=beta3, cu_seqlens=cu, chunk_size=CHUNK_SIZE, chunk_indices=ci
    )
    return w, u


def _wy_state_and_output(q4, k4, w, u, gc, h0, cu, ci, scale):
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.common.chunk_o import chunk_fwd_o

    h, v_new, final = chunk_gated_delta_rule_fwd_h(
        k=k4, w=w, u=u, g=gc, initial_state=h0, output_final_state=True,
        cu_seqlens=cu, chunk_indices=ci, chunk_size=CHUNK_SIZE,
    )
    o = chunk_fwd_o(q=q4, k=k4, v=v_new, h=h, g=gc, scale=scale, cu_seqlens=cu,
                    chunk_size=CHUNK_SIZE, chunk_indices=ci)
    return o, final


def _short_tiles(key_dim, value_dim, cu, cu_cpu):
    """The span table of :mod:`short_wy`'s kernels when every span fits in one chunk, else None
    (also for head dims the kernels do not take)."""
    if not triton_supported(key_dim, value_dim, CHUNK_SIZE):
        return None
    return short_span_rows(cu, cu_cpu, CHUNK_SIZE, classes=False)


def _wy_prepare(k, v, g, beta, cu_seqlens, cu_cpu):
    """What the state pass, the output and the summaries share: fla layouts, the chunk table, the
    per-chunk gate cumsum and the WY intra step. Returns ``(cu, ci, k4, gc, w, u)``. When every
    span fits in one chunk (a cached request's seams and question) the cumsum and WY step are
    :mod:`short_wy`'s one launch per tile size instead of fla's four kernels over 64-row chunks."""
    cu = _cu(cu_seqlens, k.device)
    ci = _chunk_indices(cu, cu_cpu)
    k4 = _b1(k)
    tiles = _short_tiles(k.shape[-1], v.shape[-1], cu, cu_cpu)
    if tiles is not None:
        gc, w, u = short_span_wy_triton(k, v, g, beta, cu, tiles)
        return cu, ci, k4, _b1(gc), _b1(w), _b1(u)
    gc = _local_cumsum(_b1(g), cu, ci)
    w, u = _wy_intra(k4, _b1(v), gc, _b1(beta), cu, ci)
    return cu, ci, k4, gc, w, u


def _span_output(q, k4, v_new, h, gc, cu, ci, cu_cpu, scale):
    """``[1, T, HV, V]`` output of spans from the state entering each of their chunks
    (``v_new [T, HV, V]``, ``h [num_chunks, HV, K, V]``): :mod:`short_wy`'s kernel when every
    span fits in one chunk, else fla's output kernel."""
    tiles = _short_tiles(k4.shape[-1], v_new.shape[-1], cu, cu_cpu)
    if tiles is not None:
        return short_span_output_triton(q, k4[0], v_new, h, None if gc is None else gc[0], cu, tiles,
                                        scale).unsqueeze(0)
    from fla.ops.common.chunk_o import chunk_fwd_o

    return chunk_fwd_o(q=_b1(q), k=k4, v=v_new.unsqueeze(0), h=h.unsqueeze(0), g=gc, scale=scale,
                       cu_seqlens=cu, chunk_size=CHUNK_SIZE, chunk_indices=ci)


def _short_spans(k4, u, cu, cu_cpu):
    """``(table, use_triton)`` when every span fits in one chunk and the closed forms of
    :mod:`short_span` apply, else ``(None, False)``: their Triton kernels, or the torch
    formulation for head dims the kernels do not take."""
    use_triton = triton_supported(k4.shape[-1], u.shape[-1], CHUNK_SIZE)
    return short_span_rows(cu, cu_cpu, CHUNK_SIZE, classes=not use_triton), use_triton


def _delta_summaries(k4, w, u, gc, cu, cu_cpu, transition_only: bool):
    """(S or None, T) of every span from the WY factors: closed form when every span fits in one
    chunk (the seams and questions of a cached request, :mod:`short_span`), fla's summary kernel
    otherwise."""
    table, use_triton = _short_spans(k4, u, cu, cu_cpu)
    if table is not None:
        g = None if gc is None else gc[0]
        if use_triton:
            return short_span_summary_triton(k4[0], w[0], u[0], g, cu, table, CHUNK_SIZE, transition_only)
        return short_span_summary(k4[0], w[0], u[0], g, table, transition_only)
    return _cp_summaries(k4, w, u, gc, None, cu, cu.numel() - 1, transition_only)


def _transitions_beside(k4, w, u, gc, cu, cu_cpu, spans=None, into=None):
    """T of the given spans (an index tensor or a host ``(a, b)``; every span when None), fp32, as
    a :class:`~hypic.ops.linear.transition.BesideTransitions` to ``launch()`` and then read with
    ``result()``: the one-chunk closed form when every span fits in a chunk, else
    :func:`wy_transitions_beside` over those spans alone (on a side stream from now, beside what
    the caller queues before ``launch()``). Against fla's summary kernel with ``V = 0`` over
    every span, the Triton launch took 0.43 ms a layer of a cold 32k prefill against 0.68 (0.61
    and a 0.07 gather), and its T was 4.1e-6 from float64 against 5.4e-3 (H200,
    benchmarks/results/README.md). ``into``: targets the Triton launch writes T into
    (``written_into`` is then set); the closed form ignores it."""
    num_spans = cu.numel() - 1
    if _short_spans(k4, u, cu, cu_cpu)[0] is None:
        return wy_transitions_beside(k4[0], w[0], None if gc is None else gc[0], cu,
                                     (0, num_spans) if spans is None else spans, into=into)
    _, trans = _delta_summaries(k4, w, u, gc, cu, cu_cpu, transition_only=True)
    if spans is not None:
        if isinstance(spans, tuple):
            trans = trans[spans[0]:spans[1]]  # a run: a view
        else:
            trans = trans.index_select(0, spans.to(device=trans.device, dtype=torch.int64))
    return BesideTransitions(trans)


def _zero_start_summary(k4, w, u, gc, cu, cu_cpu):
    """Dense zero-start summaries (T and S) of every span of a prepared input."""
    zero_start, trans = _delta_summaries(k4, w, u, gc, cu, cu_cpu, transition_only=False)
    return DenseSummary(transition=trans, state=zero_start)
