"""GLA (and HGRN2): ``S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T``.

``g [T, HV, K]`` per-channel log decay (<= 0, fp32). HGRN2 is this recurrence with
``g = logsigmoid(f)`` and ``k = 1 - exp(g)`` (computed by the caller). GVA ``HV % H == 0``.
T is diagonal (``DiagonalSummary``: K numbers per head, never a K x K matrix).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _family, fla_paths
from .summary import DiagonalSummary

SPEC = _family.FamilySpec("gla", gate="channel", delta=False)


def gla_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    initial_state: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Varlen forward. q, k ``[T, H, K]``; v ``[T, HV, V]``; g ``[T, HV, K]``."""
    scale_f = _family.validate_forward(SPEC, q, k, v, g, None, cu_seqlens, initial_state, scale)
    if fla_paths.fla_takes(q, k, v, g, initial_state):
        return fla_paths.gla_forward(q, k, v, g, cu_seqlens=cu_seqlens, initial_state=initial_state, scale=scale)
    return _family.forward(SPEC, q, k, v, g, None, cu_seqlens, initial_state, scale_f)


def gla_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    state: torch.Tensor,
    *,
    scale: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: q, k ``[N, H, K]``; v ``[N, HV, V]``; g ``[N, HV, K]``."""
    scale_f = _family.validate_decode(SPEC, q, k, v, g, None, state, scale)
    if fla_paths.fla_takes(q, k, v, g, state):
        return fla_paths.gla_decode(q, k, v, g, state, scale=scale)
    return _family.decode(SPEC, q, k, v, g, None, state, scale_f)


def gla_summarize(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
) -> DiagonalSummary:
    """Summaries of every span: T = Diag(exp(sum of g over the span)), S = S(C|0)."""
    _family.validate_summarize(SPEC, k, v, g, None, cu_seqlens)
    if fla_paths.fla_takes(k, v, g):
        return fla_paths.gla_summarize(k, v, g, cu_seqlens=cu_seqlens)
    return _family.summarize(SPEC, k, v, g, None, cu_seqlens)


def gla_forward_and_summarize(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    initial_state: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor, DiagonalSummary]:
    """``gla_forward`` plus ``gla_summarize`` of the same spans in one pass.

    Returns ``(o, final_state, summary)``; the summary's S is the zero-start state of each span
    whatever ``initial_state`` is."""
    scale_f = _family.validate_forward(SPEC, q, k, v, g, None, cu_seqlens, initial_state, scale)
    return _family.forward_and_summarize(SPEC, q, k, v, g, None, cu_seqlens, initial_state, scale_f)
