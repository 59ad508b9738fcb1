"""A written span's zero-start state read off the states a forward walked it with.

A cold PIC prefill writes every segment body's summary ``(T_C, S(C|0))`` while its forward walks
the true prefix through the same spans. The walk already has, in fp32, the state entering the
body and the state after it, and ``h_after = T_C h_before + S(C|0)`` holds exactly, so
``S(C|0) = h_after - T_C h_before``: only T is left to compose (for the written spans alone,
:mod:`hypic.ops.linear.transition`), and S costs one product per span and head. With fp32
boundary states the derivation's own error is 2.9e-7 (float64 study on the CPU,
``benchmarks/summary_from_states_cpu.py``); what is left is T's error times the entering state,
the same term T's error adds when the entry is reused after another prefix.

Measured on the H200 (``benchmarks/cold_write_h200.py``, one layer of a cold 32k request in
64 x (8 + 504) + 64 spans): with T from hypic's kernel beside the walk, 3.37-3.43 ms against
4.13-4.16 for fla's summary kernel forming T and S; the cold 32k request 727.51 ms against 757.15
with fla's one-run forward per request and S from its bf16 chunk states carried to the spans'
bounds, which was also twice as far from float64 (S 3.1e-3-4.2e-3 against 1.6e-3-2.3e-3;
benchmarks/results/README.md). The other forms were removed (commit 1fd74cc has the one-run form).

:func:`zero_start_from_states` is the Triton kernel on CUDA (and under the interpreter);
:func:`zero_start_from_states_reference` is the plain torch form beside it.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from hypic.envs import triton_interpret
from hypic.ops.linear._layout_tables import ByIdentity, LayoutTables
from hypic.ops.linear.summary import check_summary_targets, write_summaries_into
from hypic.ops.linear.transition import span_ids

_KERNEL = None
_TABLES = LayoutTables()  # the written span rows of a forward's layout tensors, kept while they live


def written_span_rows(cu_chains: torch.Tensor, spans: Union[torch.Tensor, Tuple[int, int]],
                      num_spans: int) -> Tuple[torch.Tensor, int, torch.Tensor]:
    """What the walk records for the written spans (an int64 index tensor, or a host ``(a, b)``
    for spans ``a .. b-1``) of chains whose element i is span i (no cached bodies):
    ``(record_rows [num_spans] int64, num_records, rows [2, NW] int64)``, on ``cu_chains``'
    device with no host sync. Every element's entering state is recorded (row i: element i; a
    cold prefill needs nearly all of them, a written body's and the next seam's), so written span
    s enters with row s and leaves with row s + 1, or, as the last element of its chain, with
    that chain's final state (``-chain - 1``). Every linear layer of a forward asks with the same
    layout tensors: the answer is kept for them while ``cu_chains`` lives (by identity, as the
    chunk tables are: :class:`~hypic.ops.linear._layout_tables.LayoutTables`)."""
    def build():
        device = cu_chains.device
        ids = span_ids(spans, num_spans, device)
        cu = cu_chains.to(torch.int64)
        chain = torch.searchsorted(cu, ids, right=True) - 1
        chain_end = cu[(chain + 1).clamp(max=cu.numel() - 1)]
        exit_rows = torch.where(ids + 1 < chain_end, ids + 1, -chain - 1)
        record_rows = torch.arange(num_spans, dtype=torch.int64, device=device)
        return record_rows, num_spans, torch.stack([ids, exit_rows])

    which = spans if isinstance(spans, tuple) else ByIdentity(spans)
    return _TABLES.get(cu_chains, None, ("written_span_rows", num_spans, which), build)


def _check_states(incoming, final, rows, trans=None) -> None:
    """The shapes :func:`zero_start_from_states` needs (``trans`` None: read from targets)."""
    if rows.dim() != 2 or rows.shape[0] != 2:
        raise ValueError(f"rows must be [2, NW] (entering and leaving rows), got {tuple(rows.shape)}")
    nw = rows.shape[1]
    if trans is not None and (trans.dim() != 4 or trans.shape[0] != nw or trans.shape[-1] != trans.shape[-2]):
        raise ValueError(f"trans must be [NW, HV, K, K] with NW = {nw}, got {tuple(trans.shape)}")
    if incoming.dim() != 4 or (trans is not None and incoming.shape[1:3] != trans.shape[1:3]):
        raise ValueError(f"incoming must be [R, HV, K, V] matching trans, got {tuple(incoming.shape)}")
    if final.dim() != 4 or final.shape[1:] != incoming.shape[1:]:
        raise ValueError(f"final must be [B, HV, K, V] like incoming's rows, got {tuple(final.shape)}")


def zero_start_from_states_reference(trans: torch.Tensor, incoming: torch.Tensor, final: torch.Tensor,
                                     rows: torch.Tensor) -> torch.Tensor:
    """``S_i = after_i - T_i incoming[rows[0, i]]``, ``after_i = incoming[rows[1, i]]`` (or
    ``final[-rows[1, i] - 1]`` when negative), in the inputs' dtype (fp32 products exact on the
    CPU; float64 in, float64 out)."""
    _check_states(incoming, final, rows, trans)
    rows = rows.to(device=incoming.device, dtype=torch.int64)
    stacked = torch.cat([incoming, final])
    after = stacked.index_select(0, torch.where(rows[1] >= 0, rows[1], incoming.shape[0] - rows[1] - 1))
    return after - torch.matmul(trans, incoming.index_select(0, rows[0]))


def zero_start_from_states(trans: torch.Tensor, incoming: torch.Tensor, final: torch.Tensor,
                           rows: torch.Tensor) -> torch.Tensor:
    """:func:`zero_start_from_states_reference` as one Triton launch on CUDA (fp32 in and out;
    the product in bf16x3, as the chain walk's); the reference elsewhere."""
    if not (trans.is_cuda or triton_interpret()) or trans.dtype != torch.float32:
        return zero_start_from_states_reference(trans, incoming, final, rows)
    _check_states(incoming, final, rows, trans)
    nw, num_heads, key_dim = trans.shape[:3]
    out = torch.empty(nw, num_heads, key_dim, incoming.shape[-1], device=trans.device, dtype=torch.float32)
    _launch(trans.contiguous(), incoming, final, rows, out, None)
    return out


def zero_start_from_states_into(into, incoming: torch.Tensor, final: torch.Tensor, rows: torch.Tensor) -> None:
    """:func:`zero_start_from_states` with each span's T read from, and its S written to, the
    items of ``into`` (a :class:`~hypic.ops.linear.summary.SummaryTable` of one-span dense
    summaries, one per span, e.g. the store entries a forward writes, whose T is already there:
    :func:`~hypic.ops.linear.transition.wy_transitions_beside` with ``into``). One Triton launch
    through the table's addresses on CUDA (and under the interpreter); elsewhere the reference
    and a copy into the items."""
    _check_states(incoming, final, rows)
    kernel_path = incoming.is_cuda or triton_interpret()
    check_summary_targets(into, rows.shape[1], incoming.shape[1], incoming.shape[2], incoming.shape[3],
                          incoming.device, need_addresses=kernel_path)
    if not kernel_path:
        trans = torch.cat([item.transition for item in into.items])
        state = zero_start_from_states_reference(trans, incoming, final, rows)
        write_summaries_into(into, type(into.items[0])(transition=trans, state=state))
        return
    # the items' first T and S are the bases the table's addresses are counted from
    _launch(into.items[0].transition, incoming, final, rows, into.items[0].state, into.addresses.contiguous())


def _launch(trans, incoming, final, rows, out, table: Optional[torch.Tensor]) -> None:
    """One launch over ``rows.shape[1]`` spans: T from ``trans`` and S to ``out`` by row, or, with
    ``table`` (``[2, N']`` byte addresses), where it says, counted from those two tensors."""
    import triton

    nw = rows.shape[1]
    if nw == 0:
        return
    num_heads, key_dim, value_dim = incoming.shape[1], incoming.shape[2], incoming.shape[3]
    kernel, fixed = _kernel()

    def grid(meta):
        return (triton.cdiv(value_dim, meta["BV"]), num_heads, nw)

    rows = rows.to(device=incoming.device, dtype=torch.int64).contiguous()
    on_table = table is not None
    kernel[grid](trans, incoming.contiguous(), final.contiguous(), rows, out, table if on_table else rows,
                 table.shape[1] if on_table else 0, trans.data_ptr() if on_table else 0,
                 out.data_ptr() if on_table else 0, nw,
                 HV=num_heads, K=key_dim, V=value_dim, BK=max(16, triton.next_power_of_2(key_dim)),
                 BKK=32 if key_dim > 16 else 16, INTERPRET=triton_interpret(), TABLE=on_table, **fixed)


def _kernel():
    """The kernel, autotuned over the V block and warps on GPU (its output is fully rewritten by
    every launch, so benchmarking runs are harmless); one fixed block under the interpreter."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton

    from hypic.ops.linear._state_summary_kernel import zero_start_from_states_kernel as kernel

    if triton_interpret():
        _KERNEL = (kernel, {"BV": 32})
        return _KERNEL
    configs = [
        triton.Config({"BV": 32}, num_warps=4, num_stages=2),
        triton.Config({"BV": 64}, num_warps=4, num_stages=2),
        triton.Config({"BV": 64}, num_warps=8, num_stages=2),
        triton.Config({"BV": 128}, num_warps=8, num_stages=2),
    ]
    _KERNEL = (triton.autotune(configs=configs, key=["HV", "K", "V"])(kernel), {})
    return _KERNEL


__all__ = ["written_span_rows", "zero_start_from_states", "zero_start_from_states_into",
           "zero_start_from_states_reference"]
