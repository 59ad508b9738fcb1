"""Scans along chains of spans: the state entering every span and the state after every chain,
from the spans' affine summaries (:mod:`hypic.ops.linear.summary`).

The functions here are the pure PyTorch reference (a loop over chain depth, batched over chains
and heads; any device, fp64 included) and route CUDA fp32 summaries to the one-launch Triton scan
of :mod:`hypic.ops.linear.triton_scan`, by an explicit check on the tensors.
"""

from __future__ import annotations

from typing import List, Optional, Tuple, Union

import torch

from .checks import STATE_DTYPES, check_same_device, check_tensor, cu_seqlens_to_list
from .low_rank import scan_chain_mixed
from .summary import DenseSummary, Summary, SummaryTable, _apply_t, _check_summary
from .triton_scan import scan_chain_triton


def _triton_takes(state: torch.Tensor, initial_states: Optional[torch.Tensor]) -> bool:
    """The Triton scan takes CUDA summaries in fp32 (float64 ones, which the exactness tests use,
    take the reference)."""
    return (state.is_cuda and state.dtype != torch.float64
            and (initial_states is None or initial_states.dtype != torch.float64))


def _check_chains(cu_chains, initial_states: Optional[torch.Tensor], state: torch.Tensor) -> int:
    """Checks shared by the scans (before any fast path); returns the number of chains."""
    if not isinstance(cu_chains, torch.Tensor) or cu_chains.dim() != 1 or cu_chains.numel() < 1:
        raise ValueError("cu_chains must be a 1-D LongTensor with B+1 entries")
    if cu_chains.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"cu_chains must be int64, got {cu_chains.dtype}")
    num_chains = cu_chains.numel() - 1
    if initial_states is not None:
        check_tensor("initial_states", initial_states, (num_chains, *state.shape[1:]), STATE_DTYPES)
        check_same_device(summaries=state, initial_states=initial_states)
    return num_chains


def _check_record(record_rows: Optional[torch.Tensor], num_records: Optional[int], num_spans: int,
                  state: torch.Tensor) -> None:
    if record_rows is None:
        if num_records is not None:
            raise ValueError("num_records needs record_rows")
        return
    check_tensor("record_rows", record_rows, (num_spans,), (torch.int64,))
    check_same_device(summaries=state, record_rows=record_rows)
    if isinstance(num_records, bool) or not isinstance(num_records, int) or num_records < 0:
        raise ValueError(f"num_records must be an int >= 0 with record_rows, got {num_records!r}")


def recorded_rows(incoming: torch.Tensor, record_rows: Optional[torch.Tensor], num_records: Optional[int]) -> torch.Tensor:
    """The rows a caller asked for: ``out[record_rows[i]] = incoming[i]`` where >= 0."""
    if record_rows is None:
        return incoming
    # Spans not kept all land in one spare last row, dropped after: no boolean indexing, so no
    # device-to-host sync when this runs on a GPU (the float64 fallback does).
    out = incoming.new_zeros(num_records + 1, *incoming.shape[1:])
    rows = torch.where(record_rows >= 0, record_rows, torch.full_like(record_rows, num_records))
    out.index_copy_(0, rows.to(incoming.device), incoming)
    return out[:num_records]


def scan_chain(
    summaries: Summary,
    cu_chains: torch.Tensor,
    initial_states: Optional[torch.Tensor] = None,
    *,
    record_rows: Optional[torch.Tensor] = None,
    num_records: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Incoming state of every span in B chains of spans, and each chain's final state.

    ``summaries`` holds M spans laid out chain after chain (``cu_chains [B+1]``). Returns
    ``incoming [M, HV, K, V]`` and ``final [B, HV, K, V]``. With ``record_rows`` (int64 ``[M]``)
    only some incoming states are kept: span i's goes to row ``record_rows[i]`` of an
    ``incoming [num_records, ...]`` (-1: not kept; rows no span names are zero on this path and
    unspecified on the GPU one). The loop runs over chain depth only; every step is batched over
    all chains still running and all heads.
    """
    _check_summary("summaries", summaries)
    m, hv, k, v = summaries.state.shape
    num_chains = _check_chains(cu_chains, initial_states, summaries.state)
    _check_record(record_rows, num_records, m, summaries.state)
    if _triton_takes(summaries.state, initial_states):
        return scan_chain_triton(summaries, cu_chains, initial_states, record_rows=record_rows,
                                 num_records=num_records)
    if num_chains == 0:
        if m != 0:
            raise ValueError(f"cu_chains describes no chains but summaries hold {m} spans")
        empty = summaries.state.new_zeros(0, hv, k, v)
        return recorded_rows(empty, record_rows, num_records), empty.clone()
    bounds = cu_seqlens_to_list(cu_chains, m, name="cu_chains")
    device = summaries.device
    if initial_states is None:
        current = summaries.state.new_zeros(num_chains, hv, k, v)
    else:
        current = initial_states.to(device=device, dtype=summaries.dtype).clone()
    incoming = summaries.state.new_empty(m, hv, k, v)
    starts = torch.tensor(bounds[:-1], dtype=torch.long, device=device)
    lengths = torch.tensor([b - a for a, b in zip(bounds[:-1], bounds[1:])], dtype=torch.long, device=device)
    depth = max(b - a for a, b in zip(bounds[:-1], bounds[1:]))
    for d in range(depth):
        chains = torch.nonzero(lengths > d).flatten()
        spans = starts[chains] + d
        step = summaries.index(spans)
        entering = current.index_select(0, chains)
        incoming.index_copy_(0, spans, entering)
        current.index_copy_(0, chains, _apply_t(step, entering) + step.state)
    return recorded_rows(incoming, record_rows, num_records), current


def gather_chain(first: Summary, second: Union[Summary, SummaryTable], source: torch.Tensor) -> Summary:
    """The chain whose span i is ``first[source[i]]`` when ``source[i] >= 0``, else
    ``second[-source[i] - 1]`` (a gathered copy: the reference of :func:`scan_chain_from`)."""
    if isinstance(second, SummaryTable):
        second = second.stacked()
    both = type(first).cat([first, second])  # (a packed T and a plain one: both as values)
    idx = torch.where(source >= 0, source, first.num_spans - 1 - source)
    return both.index(idx)


def scan_chain_from(
    first: Summary,
    second: Union[Summary, SummaryTable],
    source: torch.Tensor,
    cu_chains: torch.Tensor,
    initial_states: Optional[torch.Tensor] = None,
    *,
    record_rows: Optional[torch.Tensor] = None,
    num_records: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`scan_chain` over a chain drawn from two sets of summaries without gathering it:
    span i is ``first[source[i]]`` when ``source[i] >= 0``, else ``second[-source[i] - 1]``
    (a PIC forward: its live spans' summaries and its cached bodies', interleaved in prompt
    order). ``second`` may be a :class:`SummaryTable` (the bodies where the store holds them).
    ``source`` is int64 ``[M]`` on the summaries' device; its values are the caller's contract
    (the GPU path does not read them back to check). ``record_rows`` as in :func:`scan_chain`."""
    _check_summary("first", first)
    if isinstance(second, SummaryTable):
        second_type, second_shape = type(second.items[0]), second.state_shape
        second_state = second.items[0].state
    else:
        _check_summary("second", second)
        second_type, second_shape, second_state = type(second), tuple(second.state.shape[1:]), second.state
    if type(first) is not second_type or tuple(first.state.shape[1:]) != second_shape:
        raise ValueError("first and second must be summaries of one structure and state shape, got "
                         f"{type(first).__name__} {tuple(first.state.shape[1:])} and "
                         f"{second_type.__name__} {second_shape}")
    if not isinstance(source, torch.Tensor) or source.dim() != 1 or source.dtype != torch.int64:
        raise ValueError("source must be a 1-D int64 tensor")
    check_same_device(first=first.state, second=second_state, source=source)
    _check_chains(cu_chains, initial_states, first.state)
    _check_record(record_rows, num_records, source.numel(), first.state)
    if _triton_takes(first.state, initial_states) and second_state.dtype != torch.float64:
        return scan_chain_triton(first, cu_chains, initial_states, second=second, source=source,
                                 record_rows=record_rows, num_records=num_records)
    return scan_chain(gather_chain(first, second, source), cu_chains, initial_states, record_rows=record_rows,
                      num_records=num_records)


def chain_recorded_states(live: DenseSummary, cu_chains: torch.Tensor, source: Optional[torch.Tensor], bodies,
                          initial_states: Optional[torch.Tensor], record_rows: Optional[torch.Tensor],
                          num_records: Optional[int]) -> Optional[torch.Tensor]:
    """The states ``record_rows`` asks for (``[num_records, HV, K, V]``, state entering chain
    element i in row ``record_rows[i]``) by a scan of the live spans' summaries ``live``; None
    without ``record_rows``."""
    if record_rows is None:
        return None
    rows = dict(record_rows=record_rows, num_records=num_records)
    if source is None:
        return scan_chain(live, cu_chains, initial_states, **rows)[0]
    if isinstance(bodies, (list, tuple)):  # bodies of either form, some factored
        return scan_chain_mixed(live, bodies, source, cu_chains, initial_states, **rows)[0]
    return scan_chain_from(live, bodies, source, cu_chains, initial_states, **rows)[0]


def chain_incoming_states(live: DenseSummary, cu_chains: torch.Tensor, source: Optional[torch.Tensor],
                          bodies, initial_states: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(state entering each live span [N], final state of each chain [B])`` of the chains of
    :func:`~hypic.ops.linear.gated_delta.gated_delta_chain_forward`, by the scan of the live spans' summaries ``live``."""
    if source is None:
        return scan_chain(live, cu_chains, initial_states)
    # live span s records its incoming state in row s; bodies (negative sources) are not kept
    rows = dict(record_rows=source.clamp(min=-1), num_records=live.num_spans)
    if isinstance(bodies, (list, tuple)):  # bodies of either form, some factored
        return scan_chain_mixed(live, bodies, source, cu_chains, initial_states, **rows)
    return scan_chain_from(live, bodies, source, cu_chains, initial_states, **rows)


__all__: List[str] = [
    "chain_incoming_states", "chain_recorded_states", "gather_chain", "recorded_rows", "scan_chain", "scan_chain_from",
]
