"""RMSNorm variants used by the Qwen3-Next / Qwen3.5 family.

All math is done in fp32 (or fp64 for fp64 inputs) and cast back to the input dtype, matching
transformers' reference modules bit-for-bit in fp32.

Fused path (opt-in, CUDA): in eager mode each norm is 6-8 full passes over the activations (an
fp32 copy, pow, mean, two or three multiplies, the cast back); at a 32k-token prefill of
Qwen3.5-35B-A3B shapes these elementwise passes are a large share of the memory-bound time
(prefill_profile_h200.txt: ``mul`` 211 ms and ``copy_`` 145 ms of 1,374 ms). With
``HYPIC_COMPILE_NORMS=1`` the same math runs through ``torch.compile`` (one generated kernel per
norm: read once, write once). It is off by default until the H200 run that measures it; the eager
functions here stay the reference, and tests compare the compiled math against them.
"""

from __future__ import annotations

import os
from typing import Callable, Dict

import torch
import torch.nn.functional as F

_COMPILE_ENV = "HYPIC_COMPILE_NORMS"
_COMPILED: Dict[Callable, Callable] = {}


def compile_norms_enabled() -> bool:
    """Whether CUDA norms go through the compiled math (``HYPIC_COMPILE_NORMS`` = 0 or 1)."""
    value = os.environ.get(_COMPILE_ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{_COMPILE_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def compiled(fn: Callable) -> Callable:
    """``torch.compile(fn)`` once per function (dynamic shapes: token counts vary per step)."""
    out = _COMPILED.get(fn)
    if out is None:
        out = torch.compile(fn, dynamic=True, fullgraph=True)
        _COMPILED[fn] = out
    return out


def _dispatch(fn: Callable, x: torch.Tensor) -> Callable:
    # The switch is read first, so a bad value is an error on every device.
    return compiled(fn) if compile_norms_enabled() and x.is_cuda else fn

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


def rms_norm_zero_centered(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rmsnorm(x) * (1 + weight)``: weights are stored zero-centred (initialised to 0)."""
    _check("rms_norm_zero_centered", x, weight)
    return _dispatch(rms_norm_zero_centered_math, x)(x, weight, eps)


def gated_rms_norm_math(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The unchecked math of :func:`gated_rms_norm`."""
    math = _math_dtype(x)
    xf = x.to(math)
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    # transformers rounds the normalised value to the input dtype before the weight multiply.
    out = weight * normed
    out = out.to(math) * F.silu(gate.to(math))
    return out.to(x.dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN output norm: ``(weight * rmsnorm(x)) * silu(gate)`` - norm before gate, weight not
    zero-centred (initialised to 1). Normalises over the last dim (one value head)."""
    _check("gated_rms_norm", x, weight)
    if gate.shape != x.shape:
        raise ValueError(f"gated_rms_norm: gate shape {tuple(gate.shape)} != x shape {tuple(x.shape)}")
    return _dispatch(gated_rms_norm_math, x)(x, gate, weight, eps)


def l2_normalize_math(x: torch.Tensor, eps: float) -> torch.Tensor:
    """The unchecked math of :func:`l2_normalize`."""
    xf = x.to(_math_dtype(x))
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim, in fp32 (as fla / transformers' l2norm)."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOAT:
        raise ValueError("l2_normalize: x must be a floating tensor")
    return _dispatch(l2_normalize_math, x)(x, eps)
