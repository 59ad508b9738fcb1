"""GPU path of :func:`hypic.ops.linear.gated_delta.gated_delta_chain_forward` (re-exported by
:mod:`hypic.ops.linear.fla_paths`, where the dispatcher looks it up).

When every live span fits in one chunk (the seams and question of a request whose segments are
all cached), one Triton launch walks each chain: a live span is applied from its WY factors
(``gamma h + Kd^T (U - W h)``, two products of rank at most 64) while its ``v_new`` and entering
chunk state are written for fla's output kernel, and a cached body from its dense summary read
where the store holds it. No summary of a live span is formed and fla's state pass does not run:
per layer three launches (summaries, scan, state pass) become one, and the seam steps no longer
read dense 64 KiB transition tiles per head. Measured on the H200 (session 8): one layer at the
all-hit 32k shape 1.124 ms against 1.127 for the separate path (the dense body steps set the
scan's time), 0.613 against 0.665 ms with 16 bodies; in a whole all-hit 32k request the three
kernels' 21.3 ms of GPU time became 18.0. Longer spans take the general path (summaries, scan,
forward)."""

from __future__ import annotations

import torch

from hypic.ops.linear._fla_common import (
    CHUNK_SIZE,
    _any_fp64,
    _b1,
    _check_fla_inputs,
    _on_cpu_reference,
    _state_or_none,
)
from hypic.ops.linear.short_span import short_span_impl, short_span_rows, triton_supported


def gated_delta_chain_forward(q, k, v, g, beta, *, cu_seqlens, cu_chains, source=None, bodies=None,
                              initial_states=None, scale=None, cu_seqlens_cpu=None):
    """Same contract as the reference in :mod:`hypic.ops.linear.gated_delta`."""
    from hypic.ops.linear import fla_paths
    from hypic.ops.linear.gated_delta import chain_incoming_states
    if _any_fp64(q, k, v, g, beta, initial_states) or (bodies is not None and bodies.dtype == torch.float64):
        return _on_cpu_reference("gated_delta", "gated_delta_chain_forward", (q, k, v, g, beta),
                                 dict(cu_seqlens=cu_seqlens, cu_chains=cu_chains, source=source,
                                      bodies=None if bodies is None else _stacked(bodies).to("cpu"),
                                      initial_states=initial_states, scale=scale))
    _check_fla_inputs("gated_delta_chain_forward", k.shape[-1], q, k, v, g, beta)
    table = None
    if short_span_impl() == "triton" and triton_supported(k.shape[-1], v.shape[-1], CHUNK_SIZE):
        table = short_span_rows(cu_seqlens, cu_seqlens_cpu, CHUNK_SIZE, classes=False)
    if table is None:
        # spans longer than a chunk (or the A/B switch): summaries, scan, then the forward
        scanned = {}

        def incoming_from(live):
            scanned["incoming"], scanned["final"] = chain_incoming_states(live, cu_chains, source, bodies,
                                                                          initial_states)
            return scanned["incoming"]

        o, _, _ = fla_paths.gated_delta_summarize_then_forward(
            q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_states_from=incoming_from, scale=scale,
            cu_seqlens_cpu=cu_seqlens_cpu, output_final_state=False)
        return o, scanned["final"]
    from fla.ops.common.chunk_o import chunk_fwd_o

    from hypic.ops.linear.triton_scan import scan_chain_wy_triton

    with torch.no_grad():
        scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
        cu, ci, k4, gc, w, u = fla_paths._wy_prepare(k, v, g, beta, cu_seqlens, cu_seqlens_cpu)
        v_new, h, final = scan_chain_wy_triton(
            k4[0], w[0], u[0], gc[0], cu, table.span_chunk, table.chunk_spans.shape[0], cu_chains,
            _state_or_none(initial_states), second=bodies, source=source)
        o = chunk_fwd_o(q=_b1(q), k=k4, v=v_new.unsqueeze(0), h=h.unsqueeze(0), g=gc, scale=scale,
                        cu_seqlens=cu, chunk_size=CHUNK_SIZE, chunk_indices=ci)
    return o[0].to(v.dtype), final


def _stacked(bodies):
    from hypic.ops.linear.summary import SummaryTable

    return bodies.stacked() if isinstance(bodies, SummaryTable) else bodies
