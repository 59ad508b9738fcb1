"""Scalar-decay linear attention: RetNet, simple GLA, lightning attention (MiniMax, Ring-linear).

``S_t = exp(g_t) S_{t-1} + k_t v_t^T`` with exactly one of:
- ``g [T, HV]``: data-dependent per-head log decay (simple GLA), fp32, <= 0;
- ``g_gamma [HV]``: constant per-head log decay (RetNet ``log(1 - 2^(-5-h))``, lightning
  ``-rate_h``; lightning models use ``scale=1.0``).
Plain undecayed linear attention is ``g_gamma = zeros(HV)``. T is a scalar per head
(``ScalarSummary``). GVA ``HV % H == 0``.

:func:`simple_gla_chain_forward` runs a PIC forward's live spans between cached bodies: the live
spans' zero-start summaries, the scan along each chain (one Triton launch on CUDA,
:mod:`hypic.ops.linear.triton_scan`, scalar T) and the varlen forward from the scanned states;
on CUDA each of the three takes its fast path. With a constant decay, nothing to summarise or
record and every live span at most one chunk (a cached request's seams and question) the three
are one chain walk and a one-chunk output on CUDA instead
(:mod:`hypic.ops.linear._fla_scalar_chain`), with no device-to-host read.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from . import _family, fla_paths
from .checks import GATE_DTYPES, check_chain_records, check_cu_seqlens_cpu, check_tensor
from .scan import chain_incoming_states, chain_recorded_states
from .summary import ScalarSummary, SummaryTable, select_spans
from ..rope import rotate_summary_keys_cos_sin

SPEC = _family.FamilySpec("simple_gla", gate="scalar", delta=False)


def _per_token_gate(
    g: Optional[torch.Tensor], g_gamma: Optional[torch.Tensor], v: torch.Tensor
) -> torch.Tensor:
    """Validate the xor of g / g_gamma and return a ``[T, HV]`` log decay (T, HV from v)."""
    check_tensor("v", v, (None, None, None))
    lead, num_value_heads = v.shape[:2]
    if (g is None) == (g_gamma is None):
        raise ValueError("pass exactly one of g [T, HV] (data-dependent) or g_gamma [HV] (constant)")
    if g is not None:
        return check_tensor("g", g, (lead, num_value_heads), GATE_DTYPES)
    check_tensor("g_gamma", g_gamma, (num_value_heads,), GATE_DTYPES)
    return g_gamma[None, :].expand(lead, num_value_heads)


def simple_gla_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: Optional[torch.Tensor] = None,
    *,
    g_gamma: Optional[torch.Tensor] = None,
    cu_seqlens: torch.Tensor,
    initial_state: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Varlen forward. q, k ``[T, H, K]``; v ``[T, HV, V]``; g ``[T, HV]`` xor g_gamma ``[HV]``.
    ``cu_seqlens_cpu``: optional host copy of ``cu_seqlens`` (spares the GPU path reading it)."""
    gate = _per_token_gate(g, g_gamma, v)
    scale_f = _family.validate_forward(SPEC, q, k, v, gate, None, cu_seqlens, initial_state, scale)
    check_cu_seqlens_cpu(cu_seqlens_cpu, cu_seqlens, q.shape[0])
    if fla_paths.fla_takes(q, k, v, g, g_gamma, initial_state):
        return fla_paths.simple_gla_forward(
            q, k, v, g, g_gamma=g_gamma, cu_seqlens=cu_seqlens, initial_state=initial_state, scale=scale,
            cu_seqlens_cpu=cu_seqlens_cpu)
    return _family.forward(SPEC, q, k, v, gate, None, cu_seqlens, initial_state, scale_f)


def simple_gla_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: Optional[torch.Tensor],
    state: torch.Tensor,
    *,
    g_gamma: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: q, k ``[N, H, K]``; v ``[N, HV, V]``; g ``[N, HV]`` xor g_gamma."""
    gate = _per_token_gate(g, g_gamma, v)
    scale_f = _family.validate_decode(SPEC, q, k, v, gate, None, state, scale)
    if fla_paths.fla_takes(q, k, v, g, g_gamma, state):
        return fla_paths.simple_gla_decode(q, k, v, g, state, g_gamma=g_gamma, scale=scale)
    return _family.decode(SPEC, q, k, v, gate, None, state, scale_f)


def simple_gla_summarize(
    k: torch.Tensor,
    v: torch.Tensor,
    g: Optional[torch.Tensor] = None,
    *,
    g_gamma: Optional[torch.Tensor] = None,
    cu_seqlens: torch.Tensor,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
) -> ScalarSummary:
    """Summaries of every span: T = exp(sum of g) per head, S = S(C|0)."""
    gate = _per_token_gate(g, g_gamma, v)
    _family.validate_summarize(SPEC, k, v, gate, None, cu_seqlens)
    check_cu_seqlens_cpu(cu_seqlens_cpu, cu_seqlens, k.shape[0])
    if fla_paths.fla_takes(k, v, g, g_gamma):
        return fla_paths.simple_gla_summarize(k, v, g, g_gamma=g_gamma, cu_seqlens=cu_seqlens,
                                              cu_seqlens_cpu=cu_seqlens_cpu)
    return _family.summarize(SPEC, k, v, gate, None, cu_seqlens)


def simple_gla_forward_and_summarize(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: Optional[torch.Tensor] = None,
    *,
    g_gamma: Optional[torch.Tensor] = None,
    cu_seqlens: torch.Tensor,
    initial_state: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor, ScalarSummary]:
    """``simple_gla_forward`` plus ``simple_gla_summarize`` of the same spans in one pass.

    Returns ``(o, final_state, summary)``; the summary's S is the zero-start state of each span."""
    gate = _per_token_gate(g, g_gamma, v)
    scale_f = _family.validate_forward(SPEC, q, k, v, gate, None, cu_seqlens, initial_state, scale)
    return _family.forward_and_summarize(SPEC, q, k, v, gate, None, cu_seqlens, initial_state, scale_f)


def simple_gla_chain_walk_takes(q, k, v, g=None, *, g_gamma=None, cu_seqlens, cu_seqlens_cpu=None,
                                initial_states=None, bodies=None) -> bool:
    """Whether :func:`simple_gla_chain_forward` of these inputs, without summaries or records,
    runs as one chain walk (:mod:`hypic.ops.linear._fla_scalar_chain`): a constant decay, every
    live span at most one chunk, on the kernels' devices. That path reads a :class:`SummaryTable`
    of bodies through its addresses alone and nothing back to the host."""
    return fla_paths.scalar_chain_takes(q, k, v, g, g_gamma, cu_seqlens, cu_seqlens_cpu, initial_states, bodies)


def simple_gla_chain_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: Optional[torch.Tensor] = None,
    *,
    g_gamma: Optional[torch.Tensor] = None,
    cu_seqlens: torch.Tensor,
    cu_chains: torch.Tensor,
    source: Optional[torch.Tensor] = None,
    bodies: Optional[Union[ScalarSummary, SummaryTable]] = None,
    initial_states: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
    summarize: bool = False,
    summary_spans: Optional[Union[torch.Tensor, Tuple[int, int]]] = None,
    record_rows: Optional[torch.Tensor] = None,
    num_records: Optional[int] = None,
    body_rotation: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[ScalarSummary], Optional[torch.Tensor]]:
    """Forward of live spans that sit in chains between cached bodies (a PIC forward's linear
    layer of a scalar-decay family): each live span starts from the state its chain reaches there.

    The B chains (``cu_chains [B+1]``) list elements in order: element i is live span
    ``source[i]`` of ``cu_seqlens`` when ``source[i] >= 0``, else body ``-source[i] - 1`` of
    ``bodies`` (scalar summaries, or a :class:`SummaryTable` read where the store holds them);
    without ``source`` the chains are the live spans in order. ``initial_states [B, HV, K, V]``
    (None: zeros) start the chains. Returns ``(o [T, HV, V], final [B, HV, K, V], summary,
    incoming)``: ``summary`` (with ``summarize``) the zero-start summaries of the live spans
    ``summary_spans`` (an index tensor, a host ``(a, b)`` range, or None: all), else None;
    ``incoming [num_records, HV, K, V]`` (with ``record_rows``, int64 ``[M]`` per chain element,
    -1: not kept) the state entering element i in row ``record_rows[i]``, else None.
    ``body_rotation`` ``(cos, sin)``, rotate-half tables ``[num bodies, rotary_dim]`` of each
    body's shift (``RotaryEmbedding.cos_sin``): the bodies' S are used rotated on the key axis,
    ``S' = R(shift) S`` (:func:`~hypic.ops.rope.rotate_summary_keys`; a scalar T commutes with it).

    The live spans' summaries, :func:`~hypic.ops.linear.scan.scan_chain_from` and a forward from
    the scanned states; T is closed-form, so no kernel forms it."""
    gate = _per_token_gate(g, g_gamma, v)
    _family.validate_forward(SPEC, q, k, v, gate, None, cu_seqlens, None, scale)
    check_cu_seqlens_cpu(cu_seqlens_cpu, cu_seqlens, q.shape[0])
    if (source is None) != (bodies is None):
        raise ValueError("source and bodies go together: both or neither")
    if summary_spans is not None and not summarize:
        raise ValueError("summary_spans needs summarize=True")
    if body_rotation is not None and bodies is None:
        raise ValueError("body_rotation needs bodies")
    check_chain_records(record_rows, num_records, cu_seqlens, source)
    if fla_paths.scalar_chain_takes(q, k, v, g, g_gamma, cu_seqlens, cu_seqlens_cpu, initial_states, bodies,
                                    summarize, record_rows):
        o, final = fla_paths.simple_gla_chain_walk(
            q, k, v, g_gamma, cu_seqlens=cu_seqlens, cu_chains=cu_chains, source=source, bodies=bodies,
            initial_states=initial_states, scale=scale, cu_seqlens_cpu=cu_seqlens_cpu, body_rotation=body_rotation)
        return o, final, None, None
    if body_rotation is not None:
        stacked = bodies.stacked() if isinstance(bodies, SummaryTable) else bodies
        bodies = rotate_summary_keys_cos_sin(stacked, *body_rotation)
    live = simple_gla_summarize(k, v, g, g_gamma=g_gamma, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)
    incoming, final = chain_incoming_states(live, cu_chains, source, bodies, initial_states)
    o, _ = simple_gla_forward(q, k, v, g, g_gamma=g_gamma, cu_seqlens=cu_seqlens, initial_state=incoming,
                              scale=scale, cu_seqlens_cpu=cu_seqlens_cpu)
    records = chain_recorded_states(live, cu_chains, source, bodies, initial_states, record_rows, num_records)
    return o, final, select_spans(live, summary_spans) if summarize else None, records
