"""What the lightning-attention families (Ring-linear-2.0, MiniMax) share: the constant per-head
decay of a linear layer.

Lightning attention is linear attention whose state decays by a constant per head:
``S_t = exp(-rate_h) S_{t-1} + k_t v_t^T``, ``o_t = scale * q_t^T S_t`` (the ``simple_gla`` family of
:mod:`hypic.ops.linear` with ``g_gamma = -rate``). The rates are ALiBi's slopes scaled down with
depth, so that early layers forget fast and the last ones hardly at all; the two families write the
depth factor slightly differently, and each layer keeps the exact float32 values its reference
computes.
"""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

import torch


def alibi_slopes(num_heads: int) -> List[float]:
    """ALiBi's head slopes: ``start^(h+1)`` with ``start = 2^(-8/n)`` for a power-of-two ``n``;
    otherwise the slopes of the power of two below, then every other slope of twice that."""
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")

    def power_of_two(n: int) -> List[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    below = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(below) + alibi_slopes(2 * below)[0::2][: num_heads - below]


def bailing_decay_rates(num_heads: int, layer_idx: int, num_layers: int) -> torch.Tensor:
    """Ring-linear-2.0's rates ``[H]`` (fp32, CPU): ALiBi slopes times ``1 - l / (L - 1) + 1e-5``
    (``1 + 1e-5`` for a one-layer model), ``l`` the layer's index among all ``L`` layers."""
    slopes = torch.tensor(alibi_slopes(num_heads), dtype=torch.float32, device="cpu")
    factor = 1 + 1e-5 if num_layers <= 1 else 1 - layer_idx / (num_layers - 1) + 1e-5
    return slopes * factor


def minimax_decay_rates(num_heads: int, layer_idx: int, num_layers: int) -> torch.Tensor:
    """transformers' MiniMax rates ``[H]`` (fp32, CPU): ``(2^(-8/H))^(h+1) * (1 - l / (L - 1 +
    1e-5) + 1e-5)``, computed as transformers does (a float32 power of the Python base)."""
    base = 1 / (2 ** (8 / num_heads))
    exponent = torch.arange(num_heads, device="cpu") + 1
    factor = 1 - layer_idx / (num_layers - 1 + 1e-5) + 1e-5
    return (base**exponent).to(torch.float32) * factor


class LogDecay:
    """A layer's log decay ``g_gamma = -rate [H]`` per (device, dtype): float32, or float64 for a
    float64 model (the ops take gates in either; the values are the float32 rates). Kept off the
    module tree like the RoPE tables, so a model built on the meta device has them."""

    def __init__(self, rates: torch.Tensor) -> None:
        if rates.dim() != 1 or rates.dtype != torch.float32 or not bool((rates > 0).all()):
            raise ValueError("rates must be a positive float32 vector [H]")
        self._rates = rates
        self._cache: Dict[Tuple[torch.device, torch.dtype], torch.Tensor] = {}

    @property
    def rates(self) -> torch.Tensor:
        return self._rates

    def on(self, device: torch.device, activation_dtype: torch.dtype) -> torch.Tensor:
        dtype = torch.float64 if activation_dtype == torch.float64 else torch.float32
        key = (torch.device(device), dtype)
        if key not in self._cache:
            self._cache[key] = (-self._rates).to(device=device, dtype=dtype)
        return self._cache[key]


__all__ = ["LogDecay", "alibi_slopes", "bailing_decay_rates", "minimax_decay_rates"]
