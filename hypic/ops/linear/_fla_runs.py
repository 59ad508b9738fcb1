"""GPU path of ``gated_delta_forward_and_span_summaries`` (re-exported by :mod:`fla_paths`, where
the dispatcher looks it up): the varlen forward of whole runs and the zero-start summaries of the
spans that tile them, sharing fla's intra-chunk WY step when the two chunkings coincide.

Why: a cold PIC prefill needs each request's output and final state (a forward over its run of
live tokens, as ``full_recompute`` does) and each segment's (T, S(C|0)) for the store. Composing
the outputs from the segments' summaries instead (summaries, a chain scan for each segment's
incoming state, then a varlen state pass per segment) cost the cold 32k prefill 17.5 ms of scan
and 13.7 ms of extra state pass on the H200 (benchmarks/results/session9/call2): fla's state pass
of one 32k run beats 65 runs of 512 tokens, and the scan is not needed for the outputs at all.
"""

from __future__ import annotations

from typing import Sequence

import torch

from hypic.ops.linear._fla_common import (
    CHUNK_SIZE,
    _any_fp64,
    _b1,
    _check_fla_inputs,
    _chunk_indices,
    _cu,
    _on_cpu_reference,
    _state_or_none,
    _summary_classes,
)


def spans_chunk_aligned(cu_runs: Sequence[int], cu_spans: Sequence[int], chunk_size: int = CHUNK_SIZE) -> bool:
    """Whether every span starts a multiple of ``chunk_size`` tokens into its run, so that fla's
    chunks of the spans are exactly its chunks of the runs (host lists; the spans tile the runs)."""
    run_ends = set(int(x) for x in cu_runs)
    start = 0
    for a, b in zip(cu_spans[:-1], cu_spans[1:]):
        a, b = int(a), int(b)
        if a in run_ends:
            start = a
        if (a - start) % chunk_size:
            return False
    return True


def gated_delta_forward_and_span_summaries(q, k, v, g, beta, *, cu_seqlens, cu_spans, initial_state=None, scale=None,
                                           cu_seqlens_cpu=None, cu_spans_cpu=None):
    """Forward of the runs of ``cu_seqlens`` and zero-start summaries of the spans of ``cu_spans``.

    With both host copies given and every span chunk-aligned in its run, fla's local gate cumsum
    and WY step run once (over the spans' chunks, which are the runs' chunks), then the runs'
    state pass and output kernels and the spans' summary kernel; the summary's S and T are then
    strided views of that kernel's one output. Otherwise the forward and the summaries are
    computed separately."""
    from hypic.ops.linear import fla_paths

    if _any_fp64(q, k, v, g, beta, initial_state):
        return _on_cpu_reference("gated_delta", "gated_delta_forward_and_span_summaries", (q, k, v, g, beta),
                                 dict(cu_seqlens=cu_seqlens, cu_spans=cu_spans, initial_state=initial_state,
                                      scale=scale))
    _check_fla_inputs("gated_delta_forward_and_span_summaries", k.shape[-1], q, k, v, g, beta)
    scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
    with torch.no_grad():
        if cu_seqlens_cpu is None or cu_spans_cpu is None or \
                not spans_chunk_aligned(cu_seqlens_cpu.tolist(), cu_spans_cpu.tolist()):
            o, final = fla_paths._wy_forward(q, k, v, g, beta, cu_seqlens, initial_state, scale, with_summary=False,
                                             cu_cpu=cu_seqlens_cpu)
            return o, final, fla_paths._wy_summarize(k, v, g, beta, cu_spans, cu_cpu=cu_spans_cpu)
        cu_s, _, k4, gc, w, u = fla_paths._wy_prepare(k, v, g, beta, cu_spans, cu_spans_cpu)
        cu_r = _cu(cu_seqlens, k.device)
        o, final = fla_paths._wy_state_and_output(_b1(q), k4, w, u, gc, _state_or_none(initial_state), cu_r,
                                                  _chunk_indices(cu_r, cu_seqlens_cpu), scale)
        state, trans = fla_paths._delta_summaries(k4, w, u, gc, cu_s, cu_spans_cpu, transition_only=False,
                                                  contiguous=False)
    return o[0].to(v.dtype), final, _summary_classes()[0](transition=trans, state=state)
