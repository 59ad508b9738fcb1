"""A cold prefill's write path as one run (GPU; ``HYPIC_COLD_SUMMARIES=one_run``).

When nothing is cached and no checkpoint records its states, every chain of a write forward is
one request's tokens in order: fla's one-run forward of each request (local gate cumsum, WY intra
step, state pass, output: exactly what ``full_recompute`` runs, so the outputs are its outputs)
replaces the chain walk over the request's spans, and the written spans' summaries come beside
it: T from fla's summary kernel on the spans' own chunking (its ``V = 0`` launch, after a second
WY intra step, since the spans' chunks are not the run's), S from the run's chunk states carried
to each written span's bounds (:mod:`hypic.ops.linear.state_summary`). Against the walk this
saves the seams' extra chunks and the walk's slower chunk step (session 14: 2.953 ms per layer
against 2.313 for the one run at 64 x 512 + 64 tokens on the H200); the price is S from bf16
chunk states instead of fp32 ones.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import torch

from hypic.ops.linear._fla_common import CHUNK_SIZE, _b1, _state_or_none


def written_bounds(cu_spans_host: Sequence[int], cu_chains_host: Sequence[int], spans: Sequence[int]
                   ) -> Tuple[List[int], List[List[int]]]:
    """``(positions, rows)`` on the host for written ``spans`` of chains whose element i is span i:
    the packed-token boundaries whose states are needed (each span's start, then its end unless
    that ends its chain) and ``rows [2, NW]``, per span the position index it enters with and the
    one it leaves with, or ``-chain - 1`` for its chain's final state."""
    positions: List[int] = []
    enter, leave = [], []
    index = {}

    def position(p: int) -> int:
        if p not in index:
            index[p] = len(positions)
            positions.append(p)
        return index[p]

    for s in spans:
        if not 0 <= s < len(cu_spans_host) - 1:
            raise ValueError(f"written span {s} is not one of the {len(cu_spans_host) - 1} spans")
        chain = next(c for c in range(len(cu_chains_host) - 1) if cu_chains_host[c] <= s < cu_chains_host[c + 1])
        enter.append(position(cu_spans_host[s]))
        leave.append(-chain - 1 if s + 1 == cu_chains_host[chain + 1] else position(cu_spans_host[s + 1]))
    return positions, [enter, leave]


def cold_one_run(q, k, v, g, beta, cu_spans, cu_spans_cpu: torch.Tensor, cu_chains_cpu: torch.Tensor,
                 initial_states, scale: float, spans: Union[Tuple[int, int], List[int]]):
    """``(o, final, summary)`` of a cold write forward (see the module doc); ``spans`` the written
    spans as a host ``(a, b)`` range or list."""
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.common.chunk_o import chunk_fwd_o

    from hypic.ops.linear import fla_paths
    from hypic.ops.linear._fla_common import _summary_classes
    from hypic.ops.linear.state_summary import position_table, states_at_positions, zero_start_from_states

    device = k.device
    span_list = list(range(*spans)) if isinstance(spans, tuple) else [int(s) for s in spans]
    chains = [int(x) for x in cu_chains_cpu.tolist()]
    bounds_host = [int(x) for x in cu_spans_cpu.tolist()]
    seq_cpu = torch.tensor([bounds_host[c] for c in chains], dtype=torch.int64)
    cu, ci, k4, gc, w, u = fla_paths._wy_prepare(k, v, g, beta, seq_cpu.to(device, non_blocking=True), seq_cpu)
    h, v_new, final = chunk_gated_delta_rule_fwd_h(
        k=k4, w=w, u=u, g=gc, initial_state=_state_or_none(initial_states), output_final_state=True,
        cu_seqlens=cu, chunk_indices=ci, chunk_size=CHUNK_SIZE)
    o = chunk_fwd_o(q=_b1(q), k=k4, v=v_new, h=h, g=gc, scale=scale, cu_seqlens=cu, chunk_size=CHUNK_SIZE,
                    chunk_indices=ci)
    positions, rows = written_bounds(bounds_host, chains, span_list)
    num_positions, num_written = len(positions), len(span_list)
    flat = [x for row in position_table(seq_cpu, positions, CHUNK_SIZE) + rows for x in row] + span_list
    host = torch.tensor(flat, dtype=torch.int64).to(device, non_blocking=True)  # one small copy
    table = host[:3 * num_positions].view(3, num_positions)
    rows_dev = host[3 * num_positions:3 * num_positions + 2 * num_written].view(2, num_written)
    spans_dev = host[3 * num_positions + 2 * num_written:]
    # T on the spans' own chunking (a second WY step: a span's chunks are not the run's)
    cu_s, _, _, gc_s, w_s, u_s = fla_paths._wy_prepare(k, v, g, beta, cu_spans, cu_spans_cpu)
    _, trans = fla_paths._delta_summaries(k4, w_s, u_s, gc_s, cu_s, cu_spans_cpu, transition_only=True)
    trans = trans[spans[0]:spans[1]] if isinstance(spans, tuple) else trans.index_select(0, spans_dev)
    states = states_at_positions(h[0], v_new[0], k4[0], None if gc is None else gc[0], table, CHUNK_SIZE)
    state = zero_start_from_states(trans, states, final, rows_dev)
    return o[0].to(v.dtype), final, _summary_classes()[0](transition=trans, state=state)
