"""Zero-start summaries of spans of a prefill, composed from the states the prefill already has.

A cold PIC prefill runs every request as one linear-attention run (what ``full_recompute`` does)
and must also store each written segment body's ``(T, S(C|0))``. Rather than a second, zero-start
state pass, each body ``[a, b)`` of a run is cut at the first chunk boundary ``c`` at or after
``a``:

* its **head** ``[a, c)`` (less than one chunk; empty when ``a`` is on a boundary) gets its own
  zero-start summary ``(T_h, S_h)``;
* its **rest** ``[c, b)`` starts on a chunk boundary and ends on one (or at the run's end), so the
  run's states at both ends are known (the state pass keeps the state entering every chunk; the
  run's initial and final states), and ``S_r = h(b) - T_r h(c)`` needs only ``T_r``;
* ``T = T_r T_h`` and ``S = T_r S_h + S_r``.

In float64 on the CPU, with the boundary states rounded to bf16 (fla's chunk-state dtype), ``S`` is
off by at most 1.7e-3 with the Qwen3.5 gate recipe and 3.7e-3 in the hardest cases tried, the
order of S rounded to bf16 (benchmarks/summary_from_states_cpu.py). Planning is host-only
(:func:`plan_span_summaries`); :func:`compose_span_summaries` is device-agnostic torch; the GPU
path that feeds it is :func:`hypic.ops.linear._fla_runs.gated_delta_forward_and_span_summaries`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from hypic.ops.linear.summary import DenseSummary

# where a boundary state of a span's rest comes from
FROM_INITIAL, FROM_FINAL, FROM_CHUNK = 0, 1, 2


@dataclass(frozen=True)
class SpanSummaryPlan:
    """Host tables for :func:`compose_span_summaries` (N spans, all int64 numpy).

    ``cu_pieces``: boundaries tiling every token of the runs into pieces that each start on a
    chunk boundary of their run, among them every span's rest; ``rest_piece [N]``: the piece that
    is span i's rest (-1: empty rest). ``start_kind / start_row / end_kind / end_row [N]``: the
    states at the rest's ends (``FROM_INITIAL`` / ``FROM_FINAL``: row = the run; ``FROM_CHUNK``:
    row = the run's chunk, numbered over all runs in order as fla does). ``head_tokens``: the
    tokens of all non-empty heads in order, ``cu_heads`` their bounds, ``head_of [N]``: span i's
    head (-1: empty head)."""

    cu_pieces: np.ndarray
    rest_piece: np.ndarray
    start_kind: np.ndarray
    start_row: np.ndarray
    end_kind: np.ndarray
    end_row: np.ndarray
    head_tokens: np.ndarray
    cu_heads: np.ndarray
    head_of: np.ndarray

    @property
    def num_spans(self) -> int:
        return int(self.rest_piece.size)


def _run_of(bounds: List[int], a: int, b: int, chunk_size: int) -> Optional[int]:
    """The run holding span ``[a, b)``, or None when it crosses a run boundary or ends inside a
    chunk before its run's end (its end state is then not a state the run keeps)."""
    run = min(max(bisect.bisect_right(bounds, a) - 1, 0), len(bounds) - 2)
    if not bounds[run] <= a <= b <= bounds[run + 1]:
        return None
    if (b - bounds[run]) % chunk_size and b != bounds[run + 1]:
        return None
    return run


def spans_plannable(cu_runs: Sequence[int], spans: Sequence[Sequence[int]], chunk_size: int) -> bool:
    """Whether :func:`plan_span_summaries` has a plan for these spans (host check, no tables)."""
    bounds = [int(x) for x in cu_runs]
    if len(bounds) < 2:
        raise ValueError("need at least one run")
    return all(_run_of(bounds, int(a), int(b), chunk_size) is not None for a, b in spans)


def span_cuts(spans: Sequence[Sequence[int]], num_tokens: int) -> Tuple[List[int], List[int]]:
    """Boundaries over all ``num_tokens`` tokens that include both ends of every span (in order,
    disjoint; the gaps between them become spans of their own), and each span's index among the
    spans they cut: how one summary call over all tokens yields these spans' summaries."""
    cuts = sorted({0, num_tokens, *(int(p) for ab in spans for p in ab)})
    index = {p: j for j, p in enumerate(cuts)}
    return cuts, [index[int(a)] for a, _ in spans]


def plan_span_summaries(cu_runs: Sequence[int], spans: Sequence[Sequence[int]],
                        chunk_size: int) -> Optional[SpanSummaryPlan]:
    """The plan for spans ``[(a, b), ...]`` (token indices) of the runs ``cu_runs``, or None when
    :func:`spans_plannable` says no."""
    bounds = [int(x) for x in cu_runs]
    num_runs = len(bounds) - 1
    if num_runs < 1:
        raise ValueError("need at least one run")
    chunk_offset = np.concatenate([[0], np.cumsum([-(-(bounds[r + 1] - bounds[r]) // chunk_size)
                                                   for r in range(num_runs)])]).astype(np.int64)

    def state_at(run: int, pos: int):
        offset = pos - bounds[run]
        if offset == 0:
            return FROM_INITIAL, run
        if pos == bounds[run + 1]:
            return FROM_FINAL, run
        return FROM_CHUNK, int(chunk_offset[run] + offset // chunk_size)

    num = len(spans)
    rest_bounds: List[tuple] = []
    cols = {name: np.full(num, -1, dtype=np.int64)
            for name in ("rest", "start_kind", "start_row", "end_kind", "end_row", "head")}
    head_tokens: List[np.ndarray] = []
    cu_heads = [0]
    for i, (a, b) in enumerate(spans):
        a, b = int(a), int(b)
        run = _run_of(bounds, a, b, chunk_size)
        if run is None:
            return None
        c = min(bounds[run] + -(-(a - bounds[run]) // chunk_size) * chunk_size, b)
        if c > a:
            cols["head"][i] = len(cu_heads) - 1
            head_tokens.append(np.arange(a, c, dtype=np.int64))
            cu_heads.append(cu_heads[-1] + c - a)
        if b > c:
            cols["rest"][i] = len(rest_bounds)
            rest_bounds.append((c, b))
            cols["start_kind"][i], cols["start_row"][i] = state_at(run, c)
            cols["end_kind"][i], cols["end_row"][i] = state_at(run, b)
    # pieces: every run boundary and every rest's ends (all on chunk boundaries or run ends)
    cuts = sorted(set(bounds) | {p for ab in rest_bounds for p in ab})
    index = {p: j for j, p in enumerate(cuts)}
    rest_piece = np.array([index[rest_bounds[r][0]] if r >= 0 else -1 for r in cols["rest"]], dtype=np.int64)
    return SpanSummaryPlan(
        cu_pieces=np.asarray(cuts, dtype=np.int64), rest_piece=rest_piece,
        start_kind=cols["start_kind"], start_row=cols["start_row"], end_kind=cols["end_kind"],
        end_row=cols["end_row"],
        head_tokens=np.concatenate(head_tokens) if head_tokens else np.zeros(0, dtype=np.int64),
        cu_heads=np.asarray(cu_heads, dtype=np.int64), head_of=cols["head"])


def _rows(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return table.index_select(0, rows.clamp(min=0, max=max(table.shape[0] - 1, 0)))


def _states_at(kind: torch.Tensor, row: torch.Tensor, chunk_states: torch.Tensor,
               initial: Optional[torch.Tensor], final: torch.Tensor) -> torch.Tensor:
    """fp32 ``[N, HV, K, V]``: the state each (kind, row) names (rows of other kinds are clamped
    reads, replaced)."""
    shape = (-1, 1, 1, 1)
    out = _rows(chunk_states, row).to(final.dtype)
    out = torch.where((kind == FROM_FINAL).view(shape), _rows(final, row), out)
    if initial is None:
        return out.masked_fill((kind == FROM_INITIAL).view(shape), 0.0)
    return torch.where((kind == FROM_INITIAL).view(shape), _rows(initial.to(final.dtype), row), out)


def compose_span_summaries(tables: Sequence[torch.Tensor], piece_transitions: torch.Tensor,
                           chunk_states: torch.Tensor, initial: Optional[torch.Tensor], final: torch.Tensor,
                           head_summary: Optional[DenseSummary]) -> DenseSummary:
    """Every span's ``(T, S(C|0))`` from the run's states and the pieces' and heads' summaries.

    ``tables``: the plan's ``rest_piece, start_kind, start_row, end_kind, end_row, head_of`` as
    int64 tensors on the device (:func:`plan_tables`). ``piece_transitions [P, HV, K, K]``: T of
    every piece; ``chunk_states [C, HV, K, V]``: the state entering each chunk of the runs (any
    float dtype); ``initial [R]`` or None (zeros), ``final [R]``: the runs' states (fp32);
    ``head_summary``: zero-start summaries of the heads (None when there is none)."""
    rest_piece, start_kind, start_row, end_kind, end_row, head_of = tables
    shape = (-1, 1, 1, 1)
    key_dim = piece_transitions.shape[-1]
    has_rest = (rest_piece >= 0).view(shape)
    eye = torch.eye(key_dim, dtype=final.dtype, device=final.device)
    t_rest = torch.where(has_rest, _rows(piece_transitions, rest_piece).to(final.dtype), eye)
    start = _states_at(start_kind, start_row, chunk_states, initial, final)
    end = _states_at(end_kind, end_row, chunk_states, initial, final)
    s_rest = torch.where(has_rest, end - t_rest @ start, torch.zeros_like(end))
    if head_summary is None:
        return DenseSummary(t_rest.contiguous(), s_rest.contiguous())
    has_head = (head_of >= 0).view(shape)
    t_head = torch.where(has_head, _rows(head_summary.transition, head_of).to(final.dtype), eye)
    s_head = torch.where(has_head, _rows(head_summary.state, head_of).to(final.dtype), torch.zeros_like(s_rest))
    return DenseSummary((t_rest @ t_head).contiguous(), torch.baddbmm(
        s_rest.flatten(0, 1), t_rest.flatten(0, 1), s_head.flatten(0, 1)).view_as(s_rest))


def plan_tables(plan: SpanSummaryPlan, device: torch.device) -> List[torch.Tensor]:
    """The plan's per-span columns as int64 tensors on ``device`` (one host-to-device copy)."""
    cols = [plan.rest_piece, plan.start_kind, plan.start_row, plan.end_kind, plan.end_row, plan.head_of]
    host = torch.from_numpy(np.concatenate(cols))
    if device.type == "cuda":
        host = host.pin_memory()
    flat = host.to(device, non_blocking=True)
    return list(flat.split(plan.num_spans))
