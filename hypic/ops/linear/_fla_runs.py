"""GPU path of ``gated_delta_forward_and_span_summaries`` (re-exported by :mod:`fla_paths`, where
the dispatcher looks it up): the varlen forward of whole runs, and zero-start summaries of spans
of them composed from the run's own states (:mod:`hypic.ops.linear.span_summaries`).

One WY step (fla's intra-chunk factors on the runs' chunking) serves the state pass, the output
and the T-only summaries of the pieces (each starts on a run chunk boundary, so its chunks are
the run's); the heads (each span's tokens before its first chunk boundary, less than a chunk)
get their own, small WY step and closed-form summaries. Spans the plan cannot serve (an end
inside a chunk) are summarised apart, after the forward.
"""

from __future__ import annotations

from typing import Optional

import torch

from hypic.ops.linear._fla_common import (
    CHUNK_SIZE,
    _any_fp64,
    _b1,
    _check_fla_inputs,
    _on_cpu_reference,
    _state_or_none,
)
from hypic.ops.linear.span_summaries import compose_span_summaries, plan_span_summaries, plan_tables, span_cuts

# (cu_seqlens_cpu, spans, device, prepared), most recent first: the layers of one forward share
# one layout, so its host plan and index tensors are built once per forward
_PREPARED: list = []


def _prepared(cu_seqlens_cpu: torch.Tensor, spans: torch.Tensor, device: torch.device):
    """``(plan tables, cu_pieces, cu_pieces_cpu, head token index, cu_heads, cu_heads_cpu)`` on
    ``device``, or None when the plan cannot serve these spans."""
    for held_cu, held_spans, held_device, prepared in _PREPARED:
        if held_cu is cu_seqlens_cpu and held_spans is spans and held_device == device:
            return prepared
    plan = plan_span_summaries(cu_seqlens_cpu.tolist(), spans.tolist(), CHUNK_SIZE)
    prepared = None
    if plan is not None:
        def dev(array):
            host = torch.from_numpy(array)
            return (host.pin_memory() if device.type == "cuda" else host).to(device, non_blocking=True)

        cu_pieces_cpu = torch.from_numpy(plan.cu_pieces)
        cu_heads_cpu = torch.from_numpy(plan.cu_heads)
        prepared = (plan_tables(plan, device), dev(plan.cu_pieces), cu_pieces_cpu,
                    dev(plan.head_tokens) if plan.head_tokens.size else None, dev(plan.cu_heads), cu_heads_cpu)
    _PREPARED.insert(0, (cu_seqlens_cpu, spans, device, prepared))
    del _PREPARED[4:]
    return prepared


def _spans_apart(k, v, g, beta, spans: torch.Tensor, num_tokens: int):
    """Zero-start summaries of the spans ``[(a, b), ...]`` by one summary call over boundaries that
    include every span's (the gaps are summarised too, then dropped)."""
    from hypic.ops.linear import fla_paths

    cuts, rows = span_cuts(spans.tolist(), num_tokens)
    cu_cpu = torch.tensor(cuts, dtype=torch.int64)
    summary = fla_paths._wy_summarize(k, v, g, beta, cu_cpu.to(k.device), cu_cpu=cu_cpu)
    return summary.index(torch.tensor(rows, device=k.device))


def gated_delta_forward_and_span_summaries(q, k, v, g, beta, *, cu_seqlens, spans, initial_state=None, scale=None,
                                           cu_seqlens_cpu=None):
    """Forward of the runs of ``cu_seqlens`` and zero-start summaries of ``spans`` (host int64
    ``[N, 2]`` token ranges inside the runs), S derived from the runs' states where the plan
    allows it (needs ``cu_seqlens_cpu``)."""
    from hypic.ops.linear import fla_paths

    if _any_fp64(q, k, v, g, beta, initial_state):
        return _on_cpu_reference("gated_delta", "gated_delta_forward_and_span_summaries", (q, k, v, g, beta),
                                 dict(cu_seqlens=cu_seqlens, spans=spans, initial_state=initial_state, scale=scale))
    _check_fla_inputs("gated_delta_forward_and_span_summaries", k.shape[-1], q, k, v, g, beta)
    scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
    prepared: Optional[tuple] = None if cu_seqlens_cpu is None else _prepared(cu_seqlens_cpu, spans, k.device)
    with torch.no_grad():
        if prepared is None:
            o, final = fla_paths._wy_forward(q, k, v, g, beta, cu_seqlens, initial_state, scale, with_summary=False,
                                             cu_cpu=cu_seqlens_cpu)
            return o, final, _spans_apart(k, v, g, beta, spans, k.shape[0])
        tables, cu_pieces, cu_pieces_cpu, head_index, cu_heads, cu_heads_cpu = prepared
        cu_r, ci_r, k4, gc, w, u = fla_paths._wy_prepare(k, v, g, beta, cu_seqlens, cu_seqlens_cpu)
        h0 = _state_or_none(initial_state)
        o, final, h = fla_paths._wy_state_and_output(_b1(q), k4, w, u, gc, h0, cu_r, ci_r, scale, keep_h=True)
        # T of every piece, from the runs' WY factors (each piece starts on a run chunk boundary)
        _, piece_t = fla_paths._delta_summaries(k4, w, u, gc, cu_pieces, cu_pieces_cpu, transition_only=True)
        heads = None
        if head_index is not None:
            pick = lambda t: t.index_select(0, head_index)  # noqa: E731
            heads = fla_paths._wy_summarize(pick(k), pick(v), pick(g), pick(beta), cu_heads, cu_cpu=cu_heads_cpu)
        summary = compose_span_summaries(tables, piece_t, h[0], h0, final, heads)
    return o[0].to(v.dtype), final, summary
