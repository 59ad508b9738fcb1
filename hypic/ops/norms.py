"""RMSNorm variants used by the Qwen3-Next / Qwen3.5 family.

All math is done in fp32 (or fp64 for fp64 inputs) and cast back to the input dtype, matching
transformers' reference modules bit-for-bit in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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


def rms_norm_zero_centered(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rmsnorm(x) * (1 + weight)``: weights are stored zero-centred (initialised to 0)."""
    _check("rms_norm_zero_centered", x, weight)
    xf = x.to(_math_dtype(x))
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = out * (1.0 + weight.to(xf.dtype))
    return out.to(x.dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN output norm: ``(weight * rmsnorm(x)) * silu(gate)`` - norm before gate, weight not
    zero-centred (initialised to 1). Normalises over the last dim (one value head)."""
    _check("gated_rms_norm", x, weight)
    if gate.shape != x.shape:
        raise ValueError(f"gated_rms_norm: gate shape {tuple(gate.shape)} != x shape {tuple(x.shape)}")
    math = _math_dtype(x)
    xf = x.to(math)
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    # transformers rounds the normalised value to the input dtype before the weight multiply.
    out = weight * normed
    out = out.to(math) * F.silu(gate.to(math))
    return out.to(x.dtype)


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim, in fp32 (as fla / transformers' l2norm)."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOAT:
        raise ValueError("l2_normalize: x must be a floating tensor")
    xf = x.to(_math_dtype(x))
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)
