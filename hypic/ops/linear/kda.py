"""KDA (Kimi-Linear): ``S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T``.

``g [T, HV, K]`` is the per-channel log alpha (<= 0, fp32), ``beta [T, HV]`` in (0, 1); q, k
L2-normalised by the caller; GVA ``HV % H == 0``. T is dense K x K (``DenseSummary``).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _family, fla_paths
from .summary import DenseSummary

SPEC = _family.FamilySpec("kda", gate="channel", delta=True)


def kda_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    initial_state: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Varlen forward. q, k ``[T, H, K]``; v ``[T, HV, V]``; g ``[T, HV, K]``; beta ``[T, HV]``;
    initial_state ``[N, HV, K, V]`` or None. Returns ``(o [T, HV, V], final [N, HV, K, V])``."""
    scale_f = _family.validate_forward(SPEC, q, k, v, g, beta, cu_seqlens, initial_state, scale)
    if fla_paths.fla_takes(q, k, v, g, beta, initial_state, key_dim=k.shape[-1]):
        return fla_paths.kda_forward(
            q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=initial_state, scale=scale)
    return _family.forward(SPEC, q, k, v, g, beta, cu_seqlens, initial_state, scale_f)


def kda_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    scale: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: q, k ``[N, H, K]``; v ``[N, HV, V]``; g ``[N, HV, K]``; beta ``[N, HV]``."""
    scale_f = _family.validate_decode(SPEC, q, k, v, g, beta, state, scale)
    if fla_paths.fla_takes(q, k, v, g, beta, state, key_dim=k.shape[-1]):
        return fla_paths.kda_decode(q, k, v, g, beta, state, scale=scale)
    return _family.decode(SPEC, q, k, v, g, beta, state, scale_f)


def kda_summarize(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
) -> DenseSummary:
    """Summaries ``(T, S(C|0))`` of every span of ``cu_seqlens`` in one call."""
    _family.validate_summarize(SPEC, k, v, g, beta, cu_seqlens)
    if fla_paths.fla_takes(k, v, g, beta, key_dim=k.shape[-1]):
        return fla_paths.kda_summarize(k, v, g, beta, cu_seqlens=cu_seqlens)
    return _family.summarize(SPEC, k, v, g, beta, cu_seqlens)


def kda_forward_and_summarize(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    initial_state: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor, DenseSummary]:
    """``kda_forward`` plus ``kda_summarize`` of the same spans in one pass.

    Returns ``(o, final_state, summary)``; the summary's S is the zero-start state of each span
    whatever ``initial_state`` is."""
    scale_f = _family.validate_forward(SPEC, q, k, v, g, beta, cu_seqlens, initial_state, scale)
    if fla_paths.fla_takes(q, k, v, g, beta, initial_state, key_dim=k.shape[-1]):
        return fla_paths.kda_forward_and_summarize(
            q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=initial_state, scale=scale)
    return _family.forward_and_summarize(SPEC, q, k, v, g, beta, cu_seqlens, initial_state, scale_f)
