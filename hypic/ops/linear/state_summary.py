"""A written span's zero-start state read off the states a forward walked it with.

A cold PIC prefill writes every segment body's summary ``(T_C, S(C|0))`` while its forward walks
the true prefix through the same spans. The walk already has, in fp32, the state entering the
body and the state after it, and ``h_after = T_C h_before + S(C|0)`` holds exactly, so
``S(C|0) = h_after - T_C h_before``: fla's summary kernel then has to compose only T (its
``V = 0`` launch), not T and S, and the S half of that launch is replaced by one product per
span and head. With fp32 boundary states the derivation's own error is 2.9e-7 (float64 study
on the CPU, ``benchmarks/summary_from_states_cpu.py``); what is left is T's error times the
entering state, the same term T's error adds when the entry is reused after another prefix.

The same identity holds for any forward that has the states around the span: fla's one-run
forward of the whole request (what ``full_recompute`` runs) keeps the state entering every
64-token chunk (in the activations' dtype), and :func:`states_at_positions` carries it part-way
into a chunk, to a span bound that is not chunk-aligned (a body starts after its seam). With
bf16 boundary states the derivation's error is at most 1.8e-3 with the Qwen3.5 gate recipe (the
same study), against 3.0e-3-3.7e-3 for fla's summary kernel's own S on the H200.
:func:`cold_summaries_mode` (``HYPIC_COLD_SUMMARIES``) picks the path.

:func:`zero_start_from_states` and :func:`states_at_positions` are Triton kernels on CUDA (and
under the interpreter); the ``*_reference`` functions are the plain torch forms beside them.
"""

from __future__ import annotations

import bisect
import os
from typing import List, Optional, Tuple, Union

import torch

ENV = "HYPIC_COLD_SUMMARIES"
COLD_SUMMARY_MODES = ("one_run", "walk", "fla")
DEFAULT_COLD_SUMMARIES = "walk"
_KERNELS = {}


def cold_summaries_mode() -> str:
    """``HYPIC_COLD_SUMMARIES``: how a cold prefill (no cached bodies, no checkpoint records)
    forms its written spans' summaries. ``one_run``: each request's tokens as fla's one-run
    forward (what ``full_recompute`` runs, so the outputs are the same), T from fla's summary
    kernel over the spans, S from the run's chunk states at the spans' bounds; ``walk``: the chain
    walk over the spans, T from fla's summary kernel, S from the walk's fp32 states; ``fla``: the
    walk, and fla's summary kernel for T and S."""
    value = os.environ.get(ENV, DEFAULT_COLD_SUMMARIES)
    if value not in COLD_SUMMARY_MODES:
        raise ValueError(f"{ENV} must be one of {COLD_SUMMARY_MODES}, got {value!r}")
    return value


def written_span_rows(cu_chains: torch.Tensor, spans: Union[torch.Tensor, Tuple[int, int]],
                      num_spans: int) -> Tuple[torch.Tensor, int, torch.Tensor]:
    """What the walk records for the written spans (an int64 index tensor, or a host ``(a, b)``
    for spans ``a .. b-1``) of chains whose element i is span i (no cached bodies):
    ``(record_rows [num_spans] int64, num_records, rows [2, NW] int64)``, on ``cu_chains``'
    device with no host sync. Every element's entering state is recorded (row i: element i; a
    cold prefill needs nearly all of them, a written body's and the next seam's), so written span
    s enters with row s and leaves with row s + 1, or, as the last element of its chain, with
    that chain's final state (``-chain - 1``)."""
    device = cu_chains.device
    if isinstance(spans, tuple):
        a, b = spans
        if not 0 <= a <= b <= num_spans:
            raise ValueError(f"written spans {a}..{b} must lie within the {num_spans} spans")
        spans = torch.arange(a, b, dtype=torch.int64, device=device)
    elif spans.dim() != 1:
        raise ValueError(f"written spans must be a 1-d index tensor, got shape {tuple(spans.shape)}")
    spans = spans.to(device=device, dtype=torch.int64)
    cu = cu_chains.to(torch.int64)
    chain = torch.searchsorted(cu, spans, right=True) - 1
    chain_end = cu[(chain + 1).clamp(max=cu.numel() - 1)]
    exit_rows = torch.where(spans + 1 < chain_end, spans + 1, -chain - 1)
    record_rows = torch.arange(num_spans, dtype=torch.int64, device=device)
    return record_rows, num_spans, torch.stack([spans, exit_rows])


def _check(trans, incoming, final, rows) -> None:
    if rows.dim() != 2 or rows.shape[0] != 2:
        raise ValueError(f"rows must be [2, NW] (entering and leaving rows), got {tuple(rows.shape)}")
    nw = rows.shape[1]
    if trans.dim() != 4 or trans.shape[0] != nw or trans.shape[-1] != trans.shape[-2]:
        raise ValueError(f"trans must be [NW, HV, K, K] with NW = {nw}, got {tuple(trans.shape)}")
    if incoming.dim() != 4 or incoming.shape[1:3] != trans.shape[1:3]:
        raise ValueError(f"incoming must be [R, HV, K, V] matching trans, got {tuple(incoming.shape)}")
    if final.dim() != 4 or final.shape[1:] != incoming.shape[1:]:
        raise ValueError(f"final must be [B, HV, K, V] like incoming's rows, got {tuple(final.shape)}")


def zero_start_from_states_reference(trans: torch.Tensor, incoming: torch.Tensor, final: torch.Tensor,
                                     rows: torch.Tensor) -> torch.Tensor:
    """``S_i = after_i - T_i incoming[rows[0, i]]``, ``after_i = incoming[rows[1, i]]`` (or
    ``final[-rows[1, i] - 1]`` when negative), in the inputs' dtype (fp32 products exact on the
    CPU; float64 in, float64 out)."""
    _check(trans, incoming, final, rows)
    rows = rows.to(device=incoming.device, dtype=torch.int64)
    stacked = torch.cat([incoming, final])
    after = stacked.index_select(0, torch.where(rows[1] >= 0, rows[1], incoming.shape[0] - rows[1] - 1))
    return after - torch.matmul(trans, incoming.index_select(0, rows[0]))


def zero_start_from_states(trans: torch.Tensor, incoming: torch.Tensor, final: torch.Tensor,
                           rows: torch.Tensor, precision: Optional[str] = None) -> torch.Tensor:
    """:func:`zero_start_from_states_reference` as one Triton launch on CUDA (fp32 in and out;
    the product in the chain scan's dot precision, ``HYPIC_SCAN_PRECISION``, bf16x3 by
    default); the reference elsewhere."""
    from hypic.ops.linear.triton_scan import _interpreting, scan_precision

    if not (trans.is_cuda or _interpreting()) or trans.dtype != torch.float32:
        return zero_start_from_states_reference(trans, incoming, final, rows)
    _check(trans, incoming, final, rows)
    import triton

    precision = scan_precision(precision)
    nw, num_heads, key_dim = trans.shape[:3]
    value_dim = incoming.shape[-1]
    out = torch.empty(nw, num_heads, key_dim, value_dim, device=trans.device, dtype=torch.float32)
    if nw == 0:
        return out
    kernel, fixed = _kernel("zero_start")
    split = 0 if precision != "bf16x3" else (2 if _interpreting() else 1)

    def grid(meta):
        return (triton.cdiv(value_dim, meta["BV"]), num_heads, nw)

    kernel[grid](trans.contiguous(), incoming.contiguous(), final.contiguous(),
                 rows.to(device=trans.device, dtype=torch.int64).contiguous(), out, nw,
                 HV=num_heads, K=key_dim, V=value_dim, BK=max(16, triton.next_power_of_2(key_dim)),
                 BKK=32 if key_dim > 16 else 16, PRECISION="tf32x3" if split else precision, SPLIT=split,
                 **fixed)
    return out


def position_table(cu_seqlens_cpu: torch.Tensor, positions: List[int], chunk_tokens: int) -> List[List[int]]:
    """``[3, NP]`` host rows locating token boundaries ``positions`` (indices into the packed
    tokens, each inside a sequence of ``cu_seqlens_cpu`` or at its start, not at its end) in a
    varlen chunked pass: the chunk row holding the boundary (chunks laid sequence by sequence),
    that chunk's first token, and how many of its tokens come before the boundary."""
    bounds = [int(x) for x in cu_seqlens_cpu.tolist()]
    first_chunk = [0]
    for a, b in zip(bounds[:-1], bounds[1:]):
        first_chunk.append(first_chunk[-1] + -(-(b - a) // chunk_tokens))
    rows: List[List[int]] = [[], [], []]
    for p in positions:
        seq = bisect.bisect_right(bounds, p) - 1
        if not 0 <= seq < len(bounds) - 1 or p >= bounds[seq + 1]:
            raise ValueError(f"position {p} is not inside a sequence of {bounds}")
        c, n = divmod(p - bounds[seq], chunk_tokens)
        rows[0].append(first_chunk[seq] + c)
        rows[1].append(bounds[seq] + c * chunk_tokens)
        rows[2].append(n)
    return rows


def states_at_positions_reference(h: torch.Tensor, v_new: torch.Tensor, k: torch.Tensor, g: Optional[torch.Tensor],
                                  table: torch.Tensor) -> torch.Tensor:
    """The state after the first ``table[2, i]`` tokens of chunk ``table[0, i]`` (first token
    ``table[1, i]``): ``exp2(g_last) h_c + sum_t exp2(g_last - g_t) k_t v_new_t^T`` (plain loop,
    float64 on the CPU; ``g`` None: no gates). Inputs as :func:`states_at_positions`'."""
    f64 = lambda x: None if x is None else x.detach().to("cpu", torch.float64)  # noqa: E731
    h, v_new, k, g = f64(h), f64(v_new), f64(k), f64(g)
    num_heads = v_new.shape[1]
    key_heads = torch.arange(num_heads) // (num_heads // k.shape[1])
    out = []
    for row, first, n in zip(*(table.tolist())):
        state = h[row].clone()
        if n:
            vn = v_new[first:first + n]
            if g is not None:
                g_last = g[first + n - 1]
                vn = vn * torch.exp2(g_last[None, :] - g[first:first + n])[..., None]
                state = torch.exp2(g_last)[:, None, None] * state
            state = state + torch.einsum("thk,thv->hkv", k[first:first + n][:, key_heads], vn)
        out.append(state)
    if not out:
        return torch.empty(0, *h.shape[1:], dtype=torch.float64)
    return torch.stack(out)


def states_at_positions(h: torch.Tensor, v_new: torch.Tensor, k: torch.Tensor, g: Optional[torch.Tensor],
                        table: torch.Tensor, chunk_tokens: int) -> torch.Tensor:
    """fp32 ``[NP, HV, K, V]`` states part-way into chunks (``table`` from :func:`position_table`,
    int64 ``[3, NP]`` on the device): ``h [NC, HV, K, V]`` the states entering each chunk,
    ``v_new [T, HV, V]``, ``k [T, H, K]`` and ``g [T, HV]`` (fp32 chunk-local cumulative log2
    gate, or None) of fla's chunked state pass. One Triton launch on CUDA (and under the
    interpreter); :func:`states_at_positions_reference` elsewhere."""
    from hypic.ops.linear.triton_scan import _interpreting

    if not (h.is_cuda or _interpreting()):
        return states_at_positions_reference(h, v_new, k, g, table).to(torch.float32)
    import triton

    num_positions = table.shape[1]
    num_heads, key_dim, value_dim = h.shape[1:]
    out = torch.empty(num_positions, num_heads, key_dim, value_dim, device=h.device, dtype=torch.float32)
    if num_positions == 0:
        return out
    kernel, fixed = _kernel("positions")

    def grid(meta):
        return (triton.cdiv(value_dim, meta["BV"]), num_heads, num_positions)

    use_g = g is not None
    kernel[grid](h, v_new, k, g.to(torch.float32) if use_g else table, table.contiguous(), out, num_positions,
                 H=k.shape[1], HV=num_heads, K=key_dim, V=value_dim, BK=max(16, triton.next_power_of_2(key_dim)),
                 BT=chunk_tokens, USE_G=use_g, INTERPRET=_interpreting(), **fixed)
    return out


def _kernel(name: str):
    """The kernel ``name`` ("zero_start" or "positions"), autotuned over the V block and warps on
    GPU (outputs are fully rewritten by every launch, so benchmarking runs are harmless); one
    fixed block under the interpreter."""
    if name in _KERNELS:
        return _KERNELS[name]
    import triton

    from hypic.ops.linear import _state_summary_kernel as module
    from hypic.ops.linear.triton_scan import _interpreting

    kernel = (module.zero_start_from_states_kernel if name == "zero_start" else module.states_at_positions_kernel)
    if _interpreting():
        _KERNELS[name] = (kernel, {"BV": 32})
        return _KERNELS[name]
    configs = [
        triton.Config({"BV": 32}, num_warps=4, num_stages=2),
        triton.Config({"BV": 64}, num_warps=4, num_stages=2),
        triton.Config({"BV": 64}, num_warps=8, num_stages=2),
        triton.Config({"BV": 128}, num_warps=8, num_stages=2),
    ]
    key = ["HV", "K", "V", "PRECISION", "SPLIT"] if name == "zero_start" else ["H", "HV", "K", "V", "BT", "USE_G"]
    _KERNELS[name] = (triton.autotune(configs=configs, key=key)(kernel), {})
    return _KERNELS[name]


__all__ = ["COLD_SUMMARY_MODES", "ENV", "cold_summaries_mode", "position_table", "states_at_positions",
           "states_at_positions_reference", "written_span_rows", "zero_start_from_states",
           "zero_start_from_states_reference"]
