"""RMSNorm variants: the zero-centred and SiLU-gated ones of Qwen3-Next / Qwen3.5, the standard
one (``weight * rmsnorm(x)``) of Ring-linear and MiniMax, and Ring-linear's grouped, sigmoid-gated
output norm.

All math is done in fp32 (or fp64 for fp64 inputs) and cast back to the input dtype, matching
transformers' reference modules bit-for-bit in fp32. Each public function checks its inputs and
runs its ``*_math`` function, compiled for large CUDA inputs and inside CUDA graphs
(:mod:`hypic.ops.fused`: in eager mode a norm is 6-8 passes over the activations).
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F

from hypic.ops.fused import add_then, dispatch

_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check(name: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOAT or x.dim() < 1:
        raise ValueError(f"{name}: x must be a floating tensor of rank >= 1")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"{name}: weight must have shape [{x.shape[-1]}] (last dim of x), got {tuple(weight.shape)}"
        )


def _math_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def rms_norm_zero_centered_math(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The unchecked math of :func:`rms_norm_zero_centered` (what the fused path compiles)."""
    xf = x.to(_math_dtype(x))
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = out * (1.0 + weight.to(xf.dtype))
    return out.to(x.dtype)


def rms_norm_zero_centered_eager(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The same math through ``F.rms_norm`` (one fused kernel on CUDA): what small CUDA inputs
    run, where the compiled call's host cost is not worth it and every launch counts."""
    math = _math_dtype(x)
    return F.rms_norm(x.to(math), (x.shape[-1],), 1.0 + weight.to(math), eps).to(x.dtype)


def rms_norm_zero_centered(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rmsnorm(x) * (1 + weight)``: weights are stored zero-centred (initialised to 0)."""
    _check("rms_norm_zero_centered", x, weight)
    return dispatch(rms_norm_zero_centered_math, x, eager=_eager_on_cuda(x, rms_norm_zero_centered_eager))(
        x, weight, eps)


def _eager_on_cuda(x: torch.Tensor, fused_eager):
    """CUDA inputs below the compile threshold take ``fused_eager`` (fewer launches); CPU keeps
    the plain math, which is the reference the tests hold everything else to."""
    return fused_eager if x.is_cuda else None


_ADD_RMS_NORM_ZERO_CENTERED = add_then(rms_norm_zero_centered_math)
_ADD_RMS_NORM_ZERO_CENTERED_EAGER = add_then(rms_norm_zero_centered_eager)


def add_rms_norm_zero_centered(
    x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(x + h, rms_norm_zero_centered(x + h))``: a decoder layer's residual add and the norm
    that follows it (one kernel on the fused path)."""
    if h.shape != x.shape or h.dtype != x.dtype:
        raise ValueError(f"add_rms_norm_zero_centered: h {tuple(h.shape)} {h.dtype} != x {tuple(x.shape)} {x.dtype}")
    _check("add_rms_norm_zero_centered", x, weight)
    return dispatch(_ADD_RMS_NORM_ZERO_CENTERED, x, eager=_eager_on_cuda(x, _ADD_RMS_NORM_ZERO_CENTERED_EAGER))(
        x, h, weight, eps)


def gated_rms_norm_math(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The unchecked math of :func:`gated_rms_norm`."""
    math = _math_dtype(x)
    xf = x.to(math)
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    # transformers rounds the normalised value to the input dtype before the weight multiply.
    out = weight * normed
    out = out.to(math) * F.silu(gate.to(math))
    return out.to(x.dtype)


def gated_rms_norm_eager(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`gated_rms_norm_math` with the normalisation through ``F.rms_norm``."""
    math = _math_dtype(x)
    normed = F.rms_norm(x.to(math), (x.shape[-1],), None, eps).to(x.dtype)
    return ((weight * normed).to(math) * F.silu(gate.to(math))).to(x.dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN output norm: ``(weight * rmsnorm(x)) * silu(gate)`` - norm before gate, weight not
    zero-centred (initialised to 1). Normalises over the last dim (one value head)."""
    _check("gated_rms_norm", x, weight)
    if gate.shape != x.shape:
        raise ValueError(f"gated_rms_norm: gate shape {tuple(gate.shape)} != x shape {tuple(x.shape)}")
    return dispatch(gated_rms_norm_math, x, eager=_eager_on_cuda(x, gated_rms_norm_eager))(x, gate, weight, eps)


def l2_normalize_math(x: torch.Tensor, eps: float) -> torch.Tensor:
    """The unchecked math of :func:`l2_normalize`."""
    xf = x.to(_math_dtype(x))
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


def l2_normalize_eager(x: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`l2_normalize_math` through ``F.rms_norm``: ``sum = D * mean``, so
    ``x * rsqrt(sum + eps) = rms_norm(x, eps / D) / sqrt(D)``."""
    dim = x.shape[-1]
    return (F.rms_norm(x.to(_math_dtype(x)), (dim,), None, eps / dim) * dim**-0.5).to(x.dtype)


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim, in fp32 (as fla / transformers' l2norm)."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOAT:
        raise ValueError("l2_normalize: x must be a floating tensor")
    return dispatch(l2_normalize_math, x, eager=_eager_on_cuda(x, l2_normalize_eager))(x, eps)


def rms_norm_math(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The unchecked math of :func:`rms_norm`."""
    xf = x.to(_math_dtype(x))
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    # transformers rounds the normalised value to the input dtype before the weight multiply
    return weight * normed


def rms_norm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`rms_norm_math` with the normalisation through ``F.rms_norm``."""
    return weight * F.rms_norm(x.to(_math_dtype(x)), (x.shape[-1],), None, eps).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * rmsnorm(x)`` over the last dim (transformers' Llama-style RMSNorm: weight
    initialised to 1; the normalisation in fp32, rounded to x's dtype before the weight)."""
    _check("rms_norm", x, weight)
    return dispatch(rms_norm_math, x, eager=_eager_on_cuda(x, rms_norm_eager))(x, weight, eps)


_ADD_RMS_NORM = add_then(rms_norm_math)
_ADD_RMS_NORM_EAGER = add_then(rms_norm_eager)


def add_rms_norm(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(x + h, rms_norm(x + h))``: a pre-norm decoder layer's residual add and the norm after it."""
    if h.shape != x.shape or h.dtype != x.dtype:
        raise ValueError(f"add_rms_norm: h {tuple(h.shape)} {h.dtype} != x {tuple(x.shape)} {x.dtype}")
    _check("add_rms_norm", x, weight)
    return dispatch(_ADD_RMS_NORM, x, eager=_eager_on_cuda(x, _ADD_RMS_NORM_EAGER))(x, h, weight, eps)


def group_rms_norm_sigmoid_gated_math(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, num_groups: int,
                                      eps: float) -> torch.Tensor:
    """The unchecked math of :func:`group_rms_norm_sigmoid_gated`."""
    math = _math_dtype(x)
    xf = x.to(math)
    grouped = xf.unflatten(-1, (num_groups, x.shape[-1] // num_groups))
    normed = (grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2)
    return (normed * weight.to(math) * torch.sigmoid(gate.to(math))).to(x.dtype)


def group_rms_norm_sigmoid_gated(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, num_groups: int,
                                 eps: float) -> torch.Tensor:
    """``rmsnorm_g(x) * weight * sigmoid(gate)`` with the RMS taken over each of ``num_groups``
    equal groups of the last dim (Ring-linear's ``g_norm``: fla's gated RMSNorm with
    ``norm_before_gate`` and a sigmoid gate, all in fp32, rounded once to x's dtype)."""
    _check("group_rms_norm_sigmoid_gated", x, weight)
    if gate.shape != x.shape:
        raise ValueError(f"group_rms_norm_sigmoid_gated: gate shape {tuple(gate.shape)} != x shape {tuple(x.shape)}")
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1 or x.shape[-1] % num_groups:
        raise ValueError(f"group_rms_norm_sigmoid_gated: num_groups must divide {x.shape[-1]}, got {num_groups!r}")
    return dispatch(group_rms_norm_sigmoid_gated_math, x)(x, gate, weight, num_groups, eps)
