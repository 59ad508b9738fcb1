"""Gated DeltaNet (Qwen3-Next, Qwen3.5): ``S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``.

``g [T, HV]`` is log alpha (<= 0, fp32), ``beta [T, HV]`` in (0, 1). q and k are L2-normalised by
the caller. GVA: ``HV % H == 0``. T is dense K x K (``DenseSummary``).
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple, Union

import torch

from . import _family, fla_paths
from .checks import check_chain_records, check_cu_seqlens_cpu
from .scan import chain_incoming_states, chain_recorded_states
from .summary import DenseSummary, SummaryTable, check_summary_targets, select_spans, write_summaries_into

SPEC = _family.FamilySpec("gated_delta", gate="scalar", delta=True)


def gated_delta_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    initial_state: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Varlen forward. q, k ``[T, H, K]``; v ``[T, HV, V]``; g, beta ``[T, HV]``;
    initial_state ``[N, HV, K, V]`` or None. Returns ``(o [T, HV, V], final [N, HV, K, V])``.
    ``cu_seqlens_cpu``: optional host copy of ``cu_seqlens`` (spares the GPU path a sync)."""
    scale_f = _family.validate_forward(SPEC, q, k, v, g, beta, cu_seqlens, initial_state, scale)
    check_cu_seqlens_cpu(cu_seqlens_cpu, cu_seqlens, q.shape[0])
    if fla_paths.fla_takes(q, k, v, g, beta, initial_state, key_dim=k.shape[-1]):
        return fla_paths.gated_delta_forward(
            q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=initial_state, scale=scale,
            cu_seqlens_cpu=cu_seqlens_cpu)
    return _family.forward(SPEC, q, k, v, g, beta, cu_seqlens, initial_state, scale_f)


def gated_delta_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    scale: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: q, k ``[N, H, K]``; v ``[N, HV, V]``; g, beta ``[N, HV]``."""
    scale_f = _family.validate_decode(SPEC, q, k, v, g, beta, state, scale)
    if fla_paths.fla_takes(q, k, v, g, beta, state, key_dim=k.shape[-1]):
        return fla_paths.gated_delta_decode(q, k, v, g, beta, state, scale=scale)
    return _family.decode(SPEC, q, k, v, g, beta, state, scale_f)


def gated_delta_summarize(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
) -> DenseSummary:
    """Summaries ``(T, S(C|0))`` of every span of ``cu_seqlens`` in one call."""
    _family.validate_summarize(SPEC, k, v, g, beta, cu_seqlens)
    check_cu_seqlens_cpu(cu_seqlens_cpu, cu_seqlens, k.shape[0])
    if fla_paths.fla_takes(k, v, g, beta, key_dim=k.shape[-1]):
        return fla_paths.gated_delta_summarize(k, v, g, beta, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)
    return _family.summarize(SPEC, k, v, g, beta, cu_seqlens)


def gated_delta_forward_and_summarize(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    initial_state: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, DenseSummary]:
    """``gated_delta_forward`` plus ``gated_delta_summarize`` of the same spans in one pass.

    Returns ``(o, final_state, summary)``; the summary's S is the zero-start state of each span
    whatever ``initial_state`` is."""
    scale_f = _family.validate_forward(SPEC, q, k, v, g, beta, cu_seqlens, initial_state, scale)
    check_cu_seqlens_cpu(cu_seqlens_cpu, cu_seqlens, q.shape[0])
    if fla_paths.fla_takes(q, k, v, g, beta, initial_state, key_dim=k.shape[-1]):
        return fla_paths.gated_delta_forward_and_summarize(
            q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=initial_state, scale=scale,
            cu_seqlens_cpu=cu_seqlens_cpu)
    return _family.forward_and_summarize(SPEC, q, k, v, g, beta, cu_seqlens, initial_state, scale_f)


def gated_delta_summarize_then_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    initial_states_from: Callable[[DenseSummary], torch.Tensor],
    scale: Optional[float] = None,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
    output_final_state: bool = True,
) -> Tuple[torch.Tensor, Optional[torch.Tensor], DenseSummary]:
    """Zero-start summaries of every span, then the forward of the same spans from initial
    states that depend on those summaries (a PIC forward composes them with cached segments'
    summaries first): ``initial_states_from(summary)`` returns ``[N, HV, K, V]``.

    Equal to ``gated_delta_summarize`` followed by ``gated_delta_forward(initial_state=...)``;
    the GPU path computes the intra-chunk WY step once for both (the separate calls do it twice
    per layer). Returns ``(o, final_state, summary)``; ``final_state`` is None when
    ``output_final_state`` is False (a PIC forward gets it from its scan, and the GPU path then
    skips fla's state pass for spans of at most one chunk)."""
    scale_f = _family.validate_forward(SPEC, q, k, v, g, beta, cu_seqlens, None, scale)
    check_cu_seqlens_cpu(cu_seqlens_cpu, cu_seqlens, q.shape[0])
    if not callable(initial_states_from):
        raise ValueError("initial_states_from must be callable: summary -> initial states [N, HV, K, V]")
    if fla_paths.fla_takes(q, k, v, g, beta, key_dim=k.shape[-1]):
        return fla_paths.gated_delta_summarize_then_forward(
            q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_states_from=initial_states_from, scale=scale,
            cu_seqlens_cpu=cu_seqlens_cpu, output_final_state=output_final_state)
    summary = _family.summarize(SPEC, k, v, g, beta, cu_seqlens)
    init = initial_states_from(summary)
    _family.validate_forward(SPEC, q, k, v, g, beta, cu_seqlens, init, scale)
    o, final = _family.forward(SPEC, q, k, v, g, beta, cu_seqlens, init, scale_f)
    return o, final if output_final_state else None, summary


def gated_delta_chain_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    cu_chains: torch.Tensor,
    source: Optional[torch.Tensor] = None,
    bodies: Optional[Union[DenseSummary, SummaryTable]] = None,
    initial_states: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward of live spans that sit in chains between cached bodies (a PIC forward's linear
    layer): each live span starts from the state its chain reaches there.

    The B chains (``cu_chains [B+1]``) list elements in order: element i is live span
    ``source[i]`` of ``cu_seqlens`` when ``source[i] >= 0``, else body ``-source[i] - 1`` of
    ``bodies`` (dense summaries, a :class:`SummaryTable` read where the store holds them, or, on
    the reference path, a list of one-span bodies some of them factored:
    :class:`~hypic.ops.linear.low_rank.LowRankSummary`).
    Without ``source`` the chains are the live spans in order. Every live span is one element of
    exactly one chain (the caller's contract; the GPU path does not read ``source`` back).
    ``initial_states [B, HV, K, V]`` (or None: zeros) start the chains.

    Returns ``(o [T, HV, V], final [B, HV, K, V])``: the live outputs and each chain's final state.
    Equal to the zero-start summaries of the live spans, :func:`~hypic.ops.linear.scan.scan_chain_from` and a forward
    from the recorded incoming states (the reference below); the GPU path fuses the scan with
    the state pass of spans of at most one chunk (the seams and questions of a cached request)
    and never forms their summaries."""
    scale_f = _validate_chains(q, k, v, g, beta, cu_seqlens, cu_chains, source, bodies, scale, cu_seqlens_cpu)
    if fla_paths.fla_chain_takes(q, k, v, g, beta, initial_states, bodies):
        return fla_paths.gated_delta_chain_forward(
            q, k, v, g, beta, cu_seqlens=cu_seqlens, cu_chains=cu_chains, source=source, bodies=bodies,
            initial_states=initial_states, scale=scale, cu_seqlens_cpu=cu_seqlens_cpu)
    o, final, _ = _reference_chains(q, k, v, g, beta, cu_seqlens, cu_chains, source, bodies, initial_states, scale,
                                    scale_f)
    return o, final


def _validate_chains(q, k, v, g, beta, cu_seqlens, cu_chains, source, bodies, scale, cu_seqlens_cpu) -> float:
    """The chain ops' argument checks; returns the scale."""
    scale_f = _family.validate_forward(SPEC, q, k, v, g, beta, cu_seqlens, None, scale)
    check_cu_seqlens_cpu(cu_seqlens_cpu, cu_seqlens, q.shape[0])
    if (source is None) != (bodies is None):
        raise ValueError("source and bodies go together: both or neither")
    num_spans = cu_seqlens.numel() - 1
    # (read only from a host tensor: on the GPU it would cost a device sync per layer)
    if source is None and not cu_chains.is_cuda and int(cu_chains[-1]) != num_spans:
        raise ValueError(f"without source the chains must hold the {num_spans} live spans, got {int(cu_chains[-1])}")
    return scale_f


def _reference_chains(q, k, v, g, beta, cu_seqlens, cu_chains, source, bodies, initial_states, scale, scale_f):
    """``(o, final, live summaries)``: summarize, scan, forward from the scanned states."""
    summary = _family.summarize(SPEC, k, v, g, beta, cu_seqlens)
    incoming, final = chain_incoming_states(summary, cu_chains, source, bodies, initial_states)
    _family.validate_forward(SPEC, q, k, v, g, beta, cu_seqlens, incoming, scale)
    o, _ = _family.forward(SPEC, q, k, v, g, beta, cu_seqlens, incoming, scale_f)
    return o, final, summary


def gated_delta_chain_forward_and_summarize(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    cu_chains: torch.Tensor,
    source: Optional[torch.Tensor] = None,
    bodies: Optional[Union[DenseSummary, SummaryTable]] = None,
    initial_states: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
    summarize: bool = True,
    summary_spans: Optional[Union[torch.Tensor, Tuple[int, int]]] = None,
    record_rows: Optional[torch.Tensor] = None,
    num_records: Optional[int] = None,
    summary_spans_host: Optional[Tuple[int, ...]] = None,
    summary_out: Optional[SummaryTable] = None,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[DenseSummary], Optional[torch.Tensor]]:
    """:func:`gated_delta_chain_forward` for a forward that writes to the store: returns
    ``(o, final, summary, incoming)``. ``summary`` (when ``summarize``) holds the zero-start
    summaries (what a segment entry stores) of the live spans ``summary_spans``: int64 ``[NW]``
    indices, in that order, or a host ``(a, b)`` for spans a..b-1 (then views, no gather);
    default every live span; else None. With ``record_rows``
    (int64 ``[M]`` per chain element, -1: not kept) ``incoming [num_records, HV, K, V]`` holds
    the state entering element i in row ``record_rows[i]`` (what a prefix checkpoint stores as
    the state after the element before it), else None. ``summary_spans_host``: the same spans as
    host ints (optional; with ``cu_seqlens_cpu`` the GPU path then forms those spans' summaries
    alone, from their gathered WY rows, instead of every live span's and then the rows).
    ``summary_out``: where the summaries go instead of being returned (``summary`` is then None):
    a :class:`~hypic.ops.linear.summary.SummaryTable` of one-span fp32 dense summaries, item i for
    span i of ``summary_spans`` (e.g. the store entries the forward writes,
    :func:`~hypic.ops.linear.summary.check_summary_targets`). The GPU path of a cold prefill
    writes T and S there from its kernels, through the table's addresses; the other paths copy.

    The GPU path walks every chain once, live spans of any length chunk by chunk from their WY
    factors (the state pass of a cold prefill, carried across its spans and cached bodies), and
    forms the live summaries beside it from the same WY factors only when asked; the reference
    below summarizes, scans and runs the forward from the scanned states."""
    scale_f = _validate_chains(q, k, v, g, beta, cu_seqlens, cu_chains, source, bodies, scale, cu_seqlens_cpu)
    check_chain_records(record_rows, num_records, cu_seqlens, source)
    num_spans = int(cu_seqlens.numel() - 1)
    _check_summary_spans(summary_spans, num_spans)
    _check_summary_spans_host(summary_spans_host, summary_spans, num_spans)
    if summary_out is not None:
        if not summarize:
            raise ValueError("summary_out needs summarize=True")
        if summary_spans is None:
            num_written = num_spans
        elif isinstance(summary_spans, tuple):
            num_written = summary_spans[1] - summary_spans[0]
        else:
            num_written = summary_spans.numel()
        check_summary_targets(summary_out, num_written, v.shape[1], k.shape[2], v.shape[2], v.device)
    if fla_paths.fla_chain_takes(q, k, v, g, beta, initial_states, bodies):
        return fla_paths.gated_delta_chain_forward_and_summarize(
            q, k, v, g, beta, cu_seqlens=cu_seqlens, cu_chains=cu_chains, source=source, bodies=bodies,
            initial_states=initial_states, scale=scale, cu_seqlens_cpu=cu_seqlens_cpu, summarize=summarize,
            summary_spans=summary_spans, record_rows=record_rows, num_records=num_records,
            summary_spans_host=summary_spans_host, summary_out=summary_out)
    o, final, summary = _reference_chains(q, k, v, g, beta, cu_seqlens, cu_chains, source, bodies, initial_states,
                                          scale, scale_f)
    records = chain_recorded_states(summary, cu_chains, source, bodies, initial_states, record_rows, num_records)
    summary = select_spans(summary, summary_spans) if summarize else None
    if summary_out is not None:
        write_summaries_into(summary_out, summary)
        summary = None
    return o, final, summary, records


def _check_summary_spans(spans, num_spans: int) -> None:
    if spans is None:
        return
    if isinstance(spans, tuple):
        if len(spans) != 2 or not all(isinstance(x, int) for x in spans) or not 0 <= spans[0] <= spans[1] <= num_spans:
            raise ValueError(f"summary_spans as a range must be (a, b) with 0 <= a <= b <= {num_spans}, got {spans!r}")
    elif not isinstance(spans, torch.Tensor) or spans.dim() != 1 or spans.dtype not in (torch.int32, torch.int64):
        raise ValueError("summary_spans must be a 1-D int tensor of live span indices or a host (a, b) range, got "
                         f"{type(spans).__name__} {getattr(spans, 'dtype', '')} {tuple(getattr(spans, 'shape', ()))}")


def _check_summary_spans_host(host, spans, num_spans: int) -> None:
    """``host`` must list ``spans`` (as many, each a span index) when both are given; the
    values of a device ``spans`` are not read (that would be a sync), only its length."""
    if host is None:
        return
    if not isinstance(host, tuple) or not all(isinstance(x, int) and 0 <= x < num_spans for x in host):
        raise ValueError(f"summary_spans_host must be a tuple of span indices in [0, {num_spans}), got {host!r}")
    if spans is None:
        raise ValueError("summary_spans_host without summary_spans")
    count = spans[1] - spans[0] if isinstance(spans, tuple) else int(spans.numel())
    if len(host) != count or (isinstance(spans, tuple) and host != tuple(range(*spans))):
        raise ValueError(f"summary_spans_host {host!r} does not list summary_spans {spans!r}")
