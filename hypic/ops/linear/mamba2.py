"""Mamba2 / SSD (Nemotron-H, Falcon-H1, Granite-4.0-H) mapped onto the scalar-decay recurrence.

Per head h with step ``dt [T, HV]`` (already ``softplus(dt_raw + dt_bias)`` and clamped by the
caller) and ``A [HV]`` (= -exp(A_log), <= 0)::

    S_t = exp(dt_t A) S_{t-1} + B_t (dt_t x_t)^T        state [dstate, headdim]
    y_t = S_t^T C_t + D x_t

i.e. simple GLA with q = C, k = B, v = x * dt, g = dt * A and scale 1. B and C come in G groups
(``[T, G, dstate]``, ``HV % G == 0``, head h reads group h // (HV // G)). The state is
``[N, HV, dstate, headdim]`` fp32 (the transpose of mamba_ssm's ``(headdim, dstate)``); the z gate
and any norm stay outside. T is a scalar per head (``ScalarSummary``).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _family, fla_paths
from .checks import (
    FLOAT_DTYPES,
    GATE_DTYPES,
    check_cu_seqlens,
    check_same_device,
    check_tensor,
    compute_dtype,
    cu_seqlens_to_list,
)
from ._chunked import chunked_recurrence, segment_sums
from .naive import recurrence_step
from .summary import ScalarSummary

NAMES = ("C", "B", "x")


def _check(C, B, x, dt, A, D) -> _family.Dims:
    dims = _family.check_qkv(C, B, x, names=NAMES)
    lead, hv = dims.num_tokens, dims.num_value_heads
    check_tensor("dt", dt, (lead, hv), GATE_DTYPES)
    check_tensor("A", A, (hv,), GATE_DTYPES)
    if D is not None:
        check_tensor("D", D, (hv,), FLOAT_DTYPES)
    return dims


def _mapped(C, B, x, dt, A, dtype):
    """(q, k, v, g) of the scalar-decay recurrence, heads expanded, in the compute dtype."""
    hv = x.shape[1]
    q = None if C is None else _family.expand_heads(C, hv).to(dtype)
    k = _family.expand_heads(B, hv).to(dtype)
    dt_c = dt.to(dtype)
    return q, k, x.to(dtype) * dt_c[:, :, None], dt_c * A.to(dtype)[None, :]


def _skip(y: torch.Tensor, x: torch.Tensor, D: Optional[torch.Tensor]) -> torch.Tensor:
    if D is None:
        return y
    return y + D.to(y.dtype)[None, :, None] * x.to(y.dtype)


def mamba2_forward(
    C: torch.Tensor,
    B: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    D: Optional[torch.Tensor] = None,
    *,
    cu_seqlens: torch.Tensor,
    initial_state: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Varlen SSD. C, B ``[T, G, dstate]``; x ``[T, HV, headdim]``; dt ``[T, HV]``; A, D ``[HV]``.

    Returns ``(y [T, HV, headdim] in x.dtype, final [N, HV, dstate, headdim])``."""
    dims = _check(C, B, x, dt, A, D)
    check_cu_seqlens(cu_seqlens, dims.num_tokens)
    _family.check_state("initial_state", initial_state, cu_seqlens.numel() - 1, dims)
    check_same_device(C=C, B=B, x=x, dt=dt, A=A, D=D, initial_state=initial_state)
    if fla_paths.fla_takes(C, B, x, dt, A, D, initial_state):
        return fla_paths.mamba2_forward(C, B, x, dt, A, D, cu_seqlens=cu_seqlens, initial_state=initial_state)
    bounds = cu_seqlens_to_list(cu_seqlens, dims.num_tokens)
    dtype = compute_dtype(C, B, x, initial_state)
    q, k, v, g = _mapped(C, B, x, dt, A, dtype)
    y, final = chunked_recurrence(q, k, v, g, None, bounds, initial_state, 1.0)
    return _skip(y, x, D).to(x.dtype), final


def mamba2_decode(
    C: torch.Tensor,
    B: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    state: torch.Tensor,
    D: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: C, B ``[N, G, dstate]``; x ``[N, HV, headdim]``; dt ``[N, HV]``."""
    dims = _check(C, B, x, dt, A, D)
    if state is None:
        raise ValueError("state must be a tensor [N, HV, dstate, headdim]")
    _family.check_state("state", state, dims.num_tokens, dims)
    check_same_device(C=C, B=B, x=x, dt=dt, A=A, D=D, state=state)
    if fla_paths.fla_takes(C, B, x, dt, A, D, state):
        return fla_paths.mamba2_decode(C, B, x, dt, A, state, D)
    dtype = compute_dtype(C, B, x, state)
    q, k, v, g = _mapped(C, B, x, dt, A, dtype)
    y, new_state = recurrence_step(state.to(dtype), q, k, v, g, None, 1.0)
    return _skip(y, x, D).to(x.dtype), new_state


def mamba2_summarize(
    B: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
) -> ScalarSummary:
    """Summaries of every span: T = exp(A * sum(dt)) per head, S = S(C|0)."""
    dims = _check(None, B, x, dt, A, None)
    check_cu_seqlens(cu_seqlens, dims.num_tokens)
    check_same_device(B=B, x=x, dt=dt, A=A)
    if fla_paths.fla_takes(B, x, dt, A):
        return fla_paths.mamba2_summarize(B, x, dt, A, cu_seqlens=cu_seqlens)
    bounds = cu_seqlens_to_list(cu_seqlens, dims.num_tokens)
    dtype = compute_dtype(B, x)
    _, k, v, g = _mapped(None, B, x, dt, A, dtype)
    _, state = chunked_recurrence(None, k, v, g, None, bounds, None, 1.0)
    return ScalarSummary(segment_sums(g, bounds), state)


def mamba2_forward_and_summarize(
    C: torch.Tensor,
    B: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    D: Optional[torch.Tensor] = None,
    *,
    cu_seqlens: torch.Tensor,
    initial_state: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, ScalarSummary]:
    """``mamba2_forward`` plus ``mamba2_summarize`` of the same spans in one pass.

    Returns ``(y, final_state, summary)``; the summary's S is the zero-start state of each span."""
    dims = _check(C, B, x, dt, A, D)
    check_cu_seqlens(cu_seqlens, dims.num_tokens)
    _family.check_state("initial_state", initial_state, cu_seqlens.numel() - 1, dims)
    check_same_device(C=C, B=B, x=x, dt=dt, A=A, D=D, initial_state=initial_state)
    bounds = cu_seqlens_to_list(cu_seqlens, dims.num_tokens)
    dtype = compute_dtype(C, B, x, initial_state)
    q, k, v, g = _mapped(C, B, x, dt, A, dtype)
    dual = initial_state is not None
    y, state = chunked_recurrence(q, k, v, g, None, bounds, initial_state, 1.0, with_zero_start=dual)
    width = dims.value_dim
    final = state[..., :width].contiguous()
    zero_start = state[..., width:].contiguous() if dual else final.clone()
    return _skip(y, x, D).to(x.dtype), final, ScalarSummary(segment_sums(g, bounds), zero_start)
