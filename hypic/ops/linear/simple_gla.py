"""Scalar-decay linear attention: RetNet, simple GLA, lightning attention (MiniMax, Ring-linear).

``S_t = exp(g_t) S_{t-1} + k_t v_t^T`` with exactly one of:
- ``g [T, HV]``: data-dependent per-head log decay (simple GLA), fp32, <= 0;
- ``g_gamma [HV]``: constant per-head log decay (RetNet ``log(1 - 2^(-5-h))``, lightning
  ``-rate_h``; lightning models use ``scale=1.0``).
Plain undecayed linear attention is ``g_gamma = zeros(HV)``. T is a scalar per head
(``ScalarSummary``). GVA ``HV % H == 0``.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _family, fla_paths
from .checks import GATE_DTYPES, check_tensor
from .summary import ScalarSummary

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
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Varlen forward. q, k ``[T, H, K]``; v ``[T, HV, V]``; g ``[T, HV]`` xor g_gamma ``[HV]``."""
    gate = _per_token_gate(g, g_gamma, v)
    scale_f = _family.validate_forward(SPEC, q, k, v, gate, None, cu_seqlens, initial_state, scale)
    if fla_paths.fla_takes(q, k, v, g, g_gamma, initial_state):
        return fla_paths.simple_gla_forward(
            q, k, v, g, g_gamma=g_gamma, cu_seqlens=cu_seqlens, initial_state=initial_state, scale=scale)
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
) -> ScalarSummary:
    """Summaries of every span: T = exp(sum of g) per head, S = S(C|0)."""
    gate = _per_token_gate(g, g_gamma, v)
    _family.validate_summarize(SPEC, k, v, gate, None, cu_seqlens)
    if fla_paths.fla_takes(k, v, g, g_gamma):
        return fla_paths.simple_gla_summarize(k, v, g, g_gamma=g_gamma, cu_seqlens=cu_seqlens)
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
