"""GPU path of :func:`hypic.ops.linear.gated_delta.gated_delta_chain_forward` and
:func:`~hypic.ops.linear.gated_delta.gated_delta_chain_forward_and_summarize` (re-exported by
:mod:`hypic.ops.linear.fla_paths`; the references call it when :func:`fla_chain_takes` says so).

One Triton launch walks each chain: a live span is applied from its WY factors while its
``v_new`` and entering chunk states are written for fla's output kernel, and a cached body from
its dense summary read where the store holds it. No summary of a live span is formed for the
chain and fla's state pass does not run.

* Every live span fits in one chunk (the seams and question of a request whose segments are all
  cached): one step per span, ``gamma h + Kd^T (U - W h)`` with h split for an fp32-accurate
  ``W h``. Measured on the H200: in a whole all-hit 32k request the three kernels' 21.3 ms of
  GPU time (summaries, scan, state pass) became 18.0.
* Longer spans (a cold prefill's segments, a cached request's missed documents): each span is
  walked chunk by chunk in fla's state-pass precision, the state carried across spans and
  bodies. Forming every span's summary, scanning them for the spans' entering states and running
  fla's state pass from those instead spent, on the H200, 1.03 ms per linear layer of a cold 32k
  request in 512-token segments on the summaries, 0.58 on the scan and 1.15 on fla's state pass
  of 129 spans from initial states (0.69 for one 32k run); the cold 32k request took 776.08 ms
  that way against 757.83 walked (benchmarks/results/README.md).

A store write asks for the written spans' zero-start summaries as well; they come from the same
WY factors, beside the chain: fla's summary kernel over every span (or over the written spans'
rows alone), then the written spans' rows (views when they are a run). A cold prefill's writes
(nothing cached, no checkpoint records) take S from the states the walk records around each
written span (:mod:`hypic.ops.linear.state_summary`) and T from one launch over the written spans
alone, on a side stream beside the walk (:mod:`hypic.ops.linear.transition`): the cold 32k
request took 727.51 ms so against 757.15 with fla's one-run forward for the summaries, one
layer's write 3.37-3.43 ms against 4.13-4.16 with fla's summary kernel for T and S."""

from __future__ import annotations

from typing import Tuple

import torch

from hypic.ops.linear._fla_common import CHUNK_SIZE, _check_fla_inputs, _state_or_none, fla_takes, span_chunk_rows
from hypic.ops.linear._fla_wy import _span_output, _transitions_beside, _wy_prepare, _zero_start_summary
from hypic.ops.linear._layout_tables import LayoutTables
from hypic.ops.linear.scan import recorded_rows
from hypic.ops.linear.short_span import short_span_rows, triton_supported
from hypic.ops.linear.state_summary import written_span_rows, zero_start_from_states, zero_start_from_states_into
from hypic.ops.linear.summary import DenseSummary, select_spans, write_summaries_into
from hypic.ops.linear.triton_scan import scan_chain_wy_triton


def fla_chain_takes(q, k, v, g, beta, initial_states=None, bodies=None) -> bool:
    """Whether the chain walk takes these inputs: :func:`fla_takes` (CUDA, no float64), bodies
    not float64, and head dims the walk's Triton kernels take (power-of-two K in [16, 256])."""
    return (fla_takes(q, k, v, g, beta, initial_states, key_dim=k.shape[-1])
            and (bodies is None or bodies.dtype != torch.float64)
            and triton_supported(k.shape[-1], v.shape[-1], CHUNK_SIZE))


def gated_delta_chain_forward(q, k, v, g, beta, *, cu_seqlens, cu_chains, source=None, bodies=None,
                              initial_states=None, scale=None, cu_seqlens_cpu=None):
    """Same contract as the reference in :mod:`hypic.ops.linear.gated_delta`."""
    o, final, _, _ = _chain(q, k, v, g, beta, cu_seqlens, cu_chains, source, bodies, initial_states, scale,
                            cu_seqlens_cpu, False, None, None, None, None, None)
    return o, final


def gated_delta_chain_forward_and_summarize(q, k, v, g, beta, *, cu_seqlens, cu_chains, source=None, bodies=None,
                                            initial_states=None, scale=None, cu_seqlens_cpu=None, summarize=True,
                                            summary_spans=None, record_rows=None, num_records=None,
                                            summary_spans_host=None, summary_out=None):
    """Same contract as the reference in :mod:`hypic.ops.linear.gated_delta`."""
    o, final, summary, records = _chain(q, k, v, g, beta, cu_seqlens, cu_chains, source, bodies, initial_states,
                                        scale, cu_seqlens_cpu, summarize, summary_spans, record_rows, num_records,
                                        summary_spans_host, summary_out)
    return o, final, _written_into(summary_out, summary), records


def _written_into(targets, summary):
    """``summary``, or None once it is in ``targets`` (copied there unless a kernel wrote it)."""
    if targets is None or summary is None:
        return summary
    write_summaries_into(targets, summary)
    return None


def _chain(q, k, v, g, beta, cu_seqlens, cu_chains, source, bodies, initial_states, scale, cu_seqlens_cpu,
           summarize, summary_spans, record_rows, num_records, summary_spans_host, summary_out):
    """``(o, final, summary or None, incoming or None)`` of the chains (see the module doc); the
    summary is None too when the kernels wrote it into ``summary_out``."""
    _check_fla_inputs("gated_delta_chain_forward", k.shape[-1], q, k, v, g, beta)
    if not triton_supported(k.shape[-1], v.shape[-1], CHUNK_SIZE):
        raise ValueError(f"the chain walk needs a power-of-two key dim in [16, 256], got {k.shape[-1]}")
    if cu_seqlens_cpu is None:
        # the walk's span tables are laid out on the host: without a host copy of the bounds
        # (every PIC forward passes one) they are read back once, a device sync
        cu_seqlens_cpu = cu_seqlens.to("cpu", torch.int64)
    table = short_span_rows(cu_seqlens, cu_seqlens_cpu, CHUNK_SIZE, classes=False)
    long_spans = table is None  # a span longer than a chunk: every span walked chunk by chunk
    with torch.no_grad():
        scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
        cu, ci, k4, gc, w, u = _wy_prepare(k, v, g, beta, cu_seqlens, cu_seqlens_cpu)
        if long_spans:
            span_chunk, num_chunks = span_chunk_rows(cu, cu_seqlens_cpu)
        else:
            span_chunk, num_chunks = table.span_chunk, table.chunk_spans.shape[0]
        # A cold prefill's writes (every element live, no checkpoint records): the walk records
        # the states around them and their S comes from those (hypic/ops/linear/state_summary.py);
        # T is composed for the written spans alone (hypic/ops/linear/transition.py).
        from_states = summarize and long_spans and source is None and summary_spans is not None
        # the caller's records (a cold prefill's prefix-cache checkpoints) are among the states
        # the walk then records anyway (every element's entering state): picked from them after
        caller_rows, caller_num = record_rows, num_records
        if from_states:
            record_rows, num_records, rows = written_span_rows(cu_chains, summary_spans,
                                                               cu_seqlens_cpu.numel() - 1)
        # T needs only the WY factors: set up here, launched once the walk is queued (which then
        # holds its SMs first) and read back before S is derived from it
        beside = None
        if from_states:
            # with targets whose addresses are on this device (the store entries a cold prefill
            # writes), T and then S are written there: no [NW] rows to copy after the forward
            into = summary_out if (summary_out is not None and summary_out.addresses is not None
                                   and summary_out.addresses.device == w.device) else None
            beside = _transitions_beside(k4, w, u, gc, cu, cu_seqlens_cpu, summary_spans, into=into)
        try:
            out = scan_chain_wy_triton(
                k4[0], w[0], u[0], gc[0], cu, span_chunk, num_chunks, cu_chains, _state_or_none(initial_states),
                second=bodies, source=source, long_spans=long_spans, record_rows=record_rows,
                num_records=num_records)
            v_new, h, final = out[:3]
            incoming = out[3] if record_rows is not None else None
            if beside is not None:
                beside.launch()
            # short_wy's output kernel when every span fits in a chunk, else fla's
            o = _span_output(q, k4, v_new, h, gc, cu, ci, cu_seqlens_cpu, scale)
        except BaseException:
            if beside is not None:
                beside.join()  # the side stream must be done with the inputs before they are freed
            raise
        summary = None
        if from_states:
            trans = beside.result()
            if beside.written_into is not None:
                zero_start_from_states_into(beside.written_into, incoming, final, rows)
            else:
                state = zero_start_from_states(trans, incoming, final, rows)
                summary = DenseSummary(transition=trans, state=state)
            # the walk's records were for the derivation; the caller's rows are among them
            incoming = None if caller_rows is None else recorded_rows(incoming, caller_rows, caller_num)
        elif summarize:
            summary = _span_summaries(k4, w, u, gc, cu, cu_seqlens, cu_seqlens_cpu, summary_spans, summary_spans_host)
    return o[0].to(v.dtype), final, summary, incoming


_WRITTEN_ROWS = LayoutTables()  # the written spans' token rows and bounds, per forward's layout tensors


def written_rows_host(cu_cpu: torch.Tensor, spans: Tuple[int, ...]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(rows, cu)`` of the spans ``spans`` (in that order) of bounds ``cu_cpu``: the token rows
    they cover, concatenated, and their bounds in that packing (both int64, as fla's ``cu``)."""
    bounds = cu_cpu.tolist()
    lengths = [int(bounds[s + 1]) - int(bounds[s]) for s in spans]
    rows = torch.cat([torch.arange(int(bounds[s]), int(bounds[s + 1]), dtype=torch.int64) for s in spans]) \
        if spans else torch.zeros(0, dtype=torch.int64)
    cu = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)
    return rows, cu


def _span_summaries(k4, w, u, gc, cu, cu_seqlens, cu_cpu, spans, spans_host):
    """Zero-start summaries of the live spans ``spans`` (what the written segments store), from
    the chain's own WY factors: fla's summary kernel (or the one-chunk closed forms). With the
    spans on the host (``spans_host``, ``cu_cpu``) and fewer than all, over the written spans'
    gathered rows alone: a cached request with one missed document among 64 seams would
    otherwise form 130 spans' summaries (4 MiB each per layer at Qwen3.5-35B-A3B widths) to
    keep one. A span's WY factors and chunks start at its first token, so its rows alone give
    the same summary."""
    num_spans = cu.numel() - 1
    if spans is None or spans_host is None or cu_cpu is None or len(spans_host) >= num_spans:
        return select_spans(_zero_start_summary(k4, w, u, gc, cu, cu_cpu), spans)
    rows, sub_cu, sub_cu_cpu = _WRITTEN_ROWS.get(cu_seqlens, cu_cpu, ("written", spans_host),
                                                 lambda: _written_rows_device(cu_cpu, spans_host, cu.device))
    pick = lambda t: None if t is None else t.index_select(1, rows)  # noqa: E731 - [1, T, ...] tensors
    return _zero_start_summary(pick(k4), pick(w), pick(u), pick(gc), sub_cu, sub_cu_cpu)


def _written_rows_device(cu_cpu, spans_host, device):
    rows, sub_cu = written_rows_host(cu_cpu, spans_host)
    both = torch.cat([rows, sub_cu]).pin_memory().to(device, non_blocking=True)
    return both[:rows.numel()], both[rows.numel():], sub_cu
