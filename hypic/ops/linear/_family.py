"""Shared plumbing of the family modules: validation, head expansion, and the three drivers
(forward, decode, summarize) on top of the chunked and per-token references.

A family is described by its gate kind ('none', 'scalar' = one log decay per value head,
'channel' = one per key channel) and whether it uses the delta rule (beta).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .checks import (
    FLOAT_DTYPES,
    GATE_DTYPES,
    STATE_DTYPES,
    check_cu_seqlens,
    check_head_ratio,
    check_same_device,
    check_scale,
    check_tensor,
    compute_dtype,
    cu_seqlens_to_list,
)
from ._chunked import chunked_recurrence, segment_sums
from .naive import recurrence_step
from .summary import DenseSummary, DiagonalSummary, ScalarSummary, Summary

GATE_KINDS = ("none", "scalar", "channel")


@dataclass(frozen=True)
class FamilySpec:
    name: str
    gate: str  # one of GATE_KINDS
    delta: bool

    def __post_init__(self) -> None:
        if self.gate not in GATE_KINDS:
            raise ValueError(f"gate must be one of {GATE_KINDS}, got {self.gate!r}")

    @property
    def transition(self) -> str:
        if self.delta:
            return "dense"
        return {"none": "scalar", "scalar": "scalar", "channel": "diagonal"}[self.gate]


@dataclass(frozen=True)
class Dims:
    num_tokens: int
    num_key_heads: int
    num_value_heads: int
    key_dim: int
    value_dim: int


def check_qkv(q: Optional[torch.Tensor], k: torch.Tensor, v: torch.Tensor, names=("q", "k", "v")) -> Dims:
    """q, k ``[T, H, K]`` (same shape, q optional); v ``[T, HV, V]``; one float dtype."""
    qn, kn, vn = names
    check_tensor(kn, k, (None, None, None), FLOAT_DTYPES)
    t, h, kd = k.shape
    if q is not None:
        check_tensor(qn, q, (t, h, kd), FLOAT_DTYPES)
    check_tensor(vn, v, (t, None, None), FLOAT_DTYPES)
    hv, vd = v.shape[1:]
    check_head_ratio(hv, h)
    dtypes = {x.dtype for x in (q, k, v) if x is not None}
    if len(dtypes) != 1:
        raise ValueError(f"{qn}, {kn}, {vn} must share one dtype, got {sorted(str(d) for d in dtypes)}")
    if kd == 0 or vd == 0:
        raise ValueError(f"key dim ({kd}) and value dim ({vd}) must be positive")
    return Dims(t, h, hv, kd, vd)


def check_gates(spec: FamilySpec, dims: Dims, g: Optional[torch.Tensor], beta: Optional[torch.Tensor], lead: int) -> None:
    """g: scalar ``[lead, HV]`` / channel ``[lead, HV, K]``; beta ``[lead, HV]`` for delta families."""
    if spec.gate == "scalar":
        check_tensor("g", g, (lead, dims.num_value_heads), GATE_DTYPES)
    elif spec.gate == "channel":
        check_tensor("g", g, (lead, dims.num_value_heads, dims.key_dim), GATE_DTYPES)
    elif g is not None:
        raise ValueError(f"{spec.name} takes no gate g")
    if spec.delta:
        check_tensor("beta", beta, (lead, dims.num_value_heads), FLOAT_DTYPES)
    elif beta is not None:
        raise ValueError(f"{spec.name} takes no beta")


def check_state(name: str, state: Optional[torch.Tensor], num_seqs: int, dims: Dims) -> None:
    if state is not None:
        check_tensor(name, state, (num_seqs, dims.num_value_heads, dims.key_dim, dims.value_dim), STATE_DTYPES)


def expand_heads(x: torch.Tensor, num_value_heads: int) -> torch.Tensor:
    """GVA: ``[T, H, K] -> [T, HV, K]`` with value head j reading key head j // (HV // H)."""
    ratio = num_value_heads // x.shape[1]
    return x if ratio == 1 else x.repeat_interleave(ratio, dim=1)


def _cast(x: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    return None if x is None else x.to(dtype)


def forward(
    spec: FamilySpec,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: Optional[torch.Tensor],
    beta: Optional[torch.Tensor],
    cu_seqlens: torch.Tensor,
    initial_state: Optional[torch.Tensor],
    scale: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Validated inputs in, ``(o [T, HV, V] in v.dtype, final [N, HV, K, V])`` out."""
    dims = Dims(k.shape[0], k.shape[1], v.shape[1], k.shape[2], v.shape[2])
    bounds = cu_seqlens_to_list(cu_seqlens, dims.num_tokens)
    dtype = compute_dtype(q, k, v, initial_state)
    hv = dims.num_value_heads
    out, final = chunked_recurrence(
        expand_heads(q, hv).to(dtype),
        expand_heads(k, hv).to(dtype),
        v.to(dtype),
        _cast(g, dtype),
        _cast(beta, dtype),
        bounds,
        initial_state,
        scale,
    )
    return out.to(v.dtype), final


def decode(
    spec: FamilySpec,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: Optional[torch.Tensor],
    beta: Optional[torch.Tensor],
    state: torch.Tensor,
    scale: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: ``(o [N, HV, V] in v.dtype, new_state)``."""
    dtype = compute_dtype(q, k, v, state)
    hv = v.shape[1]
    out, new_state = recurrence_step(
        state.to(dtype),
        expand_heads(q, hv).to(dtype),
        expand_heads(k, hv).to(dtype),
        v.to(dtype),
        _cast(g, dtype),
        _cast(beta, dtype),
        scale,
    )
    return out.to(v.dtype), new_state


def summarize(
    spec: FamilySpec,
    k: torch.Tensor,
    v: torch.Tensor,
    g: Optional[torch.Tensor],
    beta: Optional[torch.Tensor],
    cu_seqlens: torch.Tensor,
) -> Summary:
    """Zero-start final state and structured T of every span of ``cu_seqlens``."""
    dims = Dims(k.shape[0], k.shape[1], v.shape[1], k.shape[2], v.shape[2])
    bounds = cu_seqlens_to_list(cu_seqlens, dims.num_tokens)
    dtype = compute_dtype(k, v)
    hv, vd = dims.num_value_heads, dims.value_dim
    k_exp = expand_heads(k, hv).to(dtype)
    g_c, beta_c = _cast(g, dtype), _cast(beta, dtype)
    _, state = chunked_recurrence(
        None, k_exp, v.to(dtype), g_c, beta_c, bounds, None, 1.0, with_transition=spec.delta
    )
    if spec.delta:
        return DenseSummary(state[..., vd:].contiguous(), state[..., :vd].contiguous())
    num_spans = len(bounds) - 1
    if spec.gate == "none":
        return ScalarSummary(state.new_zeros(num_spans, hv), state)
    log_decay = segment_sums(g_c, bounds)
    if spec.gate == "scalar":
        return ScalarSummary(log_decay, state)
    return DiagonalSummary(log_decay, state)


def forward_and_summarize(
    spec: FamilySpec,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: Optional[torch.Tensor],
    beta: Optional[torch.Tensor],
    cu_seqlens: torch.Tensor,
    initial_state: Optional[torch.Tensor],
    scale: float,
) -> Tuple[torch.Tensor, torch.Tensor, Summary]:
    """Forward and the zero-start summaries of the same spans in one chunked pass (the intra-chunk
    work is shared; the state hand-off carries ``[S | S(C|0) | T]``)."""
    dims = Dims(k.shape[0], k.shape[1], v.shape[1], k.shape[2], v.shape[2])
    bounds = cu_seqlens_to_list(cu_seqlens, dims.num_tokens)
    dtype = compute_dtype(q, k, v, initial_state)
    hv, vd = dims.num_value_heads, dims.value_dim
    g_c, beta_c = _cast(g, dtype), _cast(beta, dtype)
    dual = initial_state is not None
    out, state = chunked_recurrence(
        expand_heads(q, hv).to(dtype),
        expand_heads(k, hv).to(dtype),
        v.to(dtype),
        g_c,
        beta_c,
        bounds,
        initial_state,
        scale,
        with_transition=spec.delta,
        with_zero_start=dual,
    )
    final = state[..., :vd].contiguous()
    zero_start = state[..., vd : 2 * vd].contiguous() if dual else final.clone()
    width = 2 * vd if dual else vd
    if spec.delta:
        summary: Summary = DenseSummary(state[..., width:].contiguous(), zero_start)
    elif spec.gate == "none":
        summary = ScalarSummary(state.new_zeros(len(bounds) - 1, hv), zero_start)
    elif spec.gate == "scalar":
        summary = ScalarSummary(segment_sums(g_c, bounds), zero_start)
    else:
        summary = DiagonalSummary(segment_sums(g_c, bounds), zero_start)
    return out.to(v.dtype), final, summary


def validate_forward(spec, q, k, v, g, beta, cu_seqlens, initial_state, scale) -> float:
    dims = check_qkv(q, k, v)
    check_gates(spec, dims, g, beta, dims.num_tokens)
    check_cu_seqlens(cu_seqlens, dims.num_tokens)
    check_state("initial_state", initial_state, cu_seqlens.numel() - 1, dims)
    check_same_device(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    return check_scale(scale, dims.key_dim)


def validate_decode(spec, q, k, v, g, beta, state, scale) -> float:
    dims = check_qkv(q, k, v)
    check_gates(spec, dims, g, beta, dims.num_tokens)
    if state is None:
        raise ValueError("state must be a tensor [N, HV, K, V]")
    check_state("state", state, dims.num_tokens, dims)
    check_same_device(q=q, k=k, v=v, g=g, beta=beta, state=state)
    return check_scale(scale, dims.key_dim)


def validate_summarize(spec, k, v, g, beta, cu_seqlens) -> None:
    dims = check_qkv(None, k, v)
    check_gates(spec, dims, g, beta, dims.num_tokens)
    check_cu_seqlens(cu_seqlens, dims.num_tokens)
    check_same_device(k=k, v=v, g=g, beta=beta)
