"""Rotate-half RoPE, partial (only the first ``rotary_dim`` dims rotate, as in Qwen3-Next /
Qwen3.5), and re-rotation of linear-attention summaries whose keys carry RoPE (Ring-linear).

For a key rotated at absolute position p + t, ``R(p + t) = R(p) R(t)``; a recurrence whose
transitions are built from such keys (``I - beta k k^T``, scalar decays, or diagonal decays that
are constant within each rotated pair) conjugates by ``R(p)``. A summary made at position 0 thus
moves to start p by ``S' = R(p) S`` and ``T' = R(p) T R(p)^-1`` on the K axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

from hypic.ops.fused import dispatch
from hypic.ops.linear.checks import FLOAT_DTYPES, check_tensor
from hypic.ops.linear.summary import DenseSummary, DiagonalSummary, ScalarSummary, Summary


@dataclass(frozen=True)
class RotaryEmbedding:
    """``head_dim`` total dims, the first ``rotary_dim`` (even) rotate with base ``theta``."""

    head_dim: int
    rotary_dim: int
    theta: float = 10000.0

    def __post_init__(self) -> None:
        if self.head_dim <= 0:
            raise ValueError(f"head_dim must be positive, got {self.head_dim}")
        if self.rotary_dim <= 0 or self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ValueError(
                f"rotary_dim must be even and in (0, head_dim={self.head_dim}], got {self.rotary_dim}"
            )
        if not self.theta > 0:
            raise ValueError(f"theta must be positive, got {self.theta}")

    def inv_freq(self, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
        """``theta^(-2i/rotary_dim)`` for i < rotary_dim/2 (computed like HF transformers)."""
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64, device=device).to(dtype)
        return 1.0 / (self.theta ** (exponents / self.rotary_dim))

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> Tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[P, rotary_dim]`` for integer ``positions [P]`` (fp32 maths, or fp64)."""
        if not isinstance(positions, torch.Tensor) or positions.dim() != 1:
            raise ValueError("positions must be a 1-D tensor of token positions")
        if positions.is_floating_point() or positions.is_complex():
            raise ValueError(f"positions must be an integer tensor, got {positions.dtype}")
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"dtype must be a float dtype, got {dtype}")
        math_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        freqs = positions.to(math_dtype)[:, None] * self.inv_freq(math_dtype, positions.device)[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _rotate_last(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of x's last axis; cos/sin broadcast to x."""
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    rot = rot * cos + _rotate_half(rot) * sin
    return torch.cat([rot, rest], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x ``[T, H, D]`` rotated by cos, sin ``[T, rotary_dim]`` (rotate-half); output in x.dtype."""
    check_tensor("x", x, (None, None, None), FLOAT_DTYPES)
    num_tokens, _, head_dim = x.shape
    check_tensor("cos", cos, (num_tokens, None), FLOAT_DTYPES)
    check_tensor("sin", sin, tuple(cos.shape), (cos.dtype,))
    rd = cos.shape[1]
    if rd % 2 or rd > head_dim or rd == 0:
        raise ValueError(f"cos/sin width {rd} must be even and in (0, head_dim={head_dim}]")
    return dispatch(apply_rotary_math, x, graph_only=True)(x, cos, sin)


def apply_rotary_math(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The unchecked math of :func:`apply_rotary` (compiled inside CUDA graphs: eager, a partial
    rotation is ~9 kernels)."""
    rd = cos.shape[1]
    dtype = torch.promote_types(x.dtype, cos.dtype)
    rot = _rotate_last(x[..., :rd].to(dtype), cos.to(dtype)[:, None, :], sin.to(dtype)[:, None, :]).to(x.dtype)
    if rd == x.shape[-1]:
        return rot
    # Partial rotary (Qwen3.5: 64 of 256 dims): only the rotated dims go through the wider dtype;
    # the rest is copied once (converting the whole head there and back was three full passes).
    return torch.cat([rot, x[..., rd:]], dim=-1)


def rotate_summary_keys(summary: Summary, offsets: torch.Tensor, rotary: RotaryEmbedding) -> Summary:
    """Move summaries made at position 0 to absolute starts ``offsets [N]`` (K axis = key dims).

    ``S' = R(p) S``; dense ``T' = R(p) T R(p)^T``; scalar T is unchanged; diagonal T is unchanged
    but only valid when it is constant within each rotated pair (ValueError otherwise).
    """
    if not isinstance(summary, (ScalarSummary, DiagonalSummary, DenseSummary)):
        raise ValueError(f"summary must be a Scalar/Diagonal/DenseSummary, got {type(summary).__name__}")
    if not isinstance(rotary, RotaryEmbedding):
        raise ValueError(f"rotary must be a RotaryEmbedding, got {type(rotary).__name__}")
    num_spans, _, key_dim, _ = summary.state.shape
    if key_dim != rotary.head_dim:
        raise ValueError(f"summary key dim {key_dim} != rotary.head_dim {rotary.head_dim}")
    if not isinstance(offsets, torch.Tensor) or offsets.shape != (num_spans,):
        raise ValueError(f"offsets must be a tensor of shape [{num_spans}] (one start per span)")
    cos, sin = rotary.cos_sin(offsets.to(summary.device), dtype=summary.dtype)  # [N, rd]
    return rotate_summary_keys_cos_sin(summary, cos, sin)


def rotate_summary_keys_cos_sin(summary: Summary, cos: torch.Tensor, sin: torch.Tensor) -> Summary:
    """:func:`rotate_summary_keys` given each span's rotate-half tables ``cos, sin [N, rotary_dim]``
    (``RotaryEmbedding.cos_sin`` of its offset; the first ``rotary_dim`` key dims rotate)."""
    if not isinstance(summary, (ScalarSummary, DiagonalSummary, DenseSummary)):
        raise ValueError(f"summary must be a Scalar/Diagonal/DenseSummary, got {type(summary).__name__}")
    num_spans, _, key_dim, _ = summary.state.shape
    check_tensor("cos", cos, (num_spans, None), FLOAT_DTYPES)
    check_tensor("sin", sin, tuple(cos.shape), (cos.dtype,))
    rotary_dim = cos.shape[1]
    if rotary_dim % 2 or not 0 < rotary_dim <= key_dim:
        raise ValueError(f"cos/sin width {rotary_dim} must be even and in (0, key dim {key_dim}]")
    cos, sin = cos.to(summary.state), sin.to(summary.state)
    # The state's K axis is dim 2: rotate the columns of S^T, i.e. S viewed as [N, HV, V, K].
    state_t = summary.state.transpose(-1, -2)
    state = _rotate_last(state_t, cos[:, None, None, :], sin[:, None, None, :]).transpose(-1, -2)
    state = state.contiguous()
    if isinstance(summary, ScalarSummary):
        return ScalarSummary(summary.log_decay, state)
    if isinstance(summary, DiagonalSummary):
        half = rotary_dim // 2
        first, second = summary.log_decay[..., :half], summary.log_decay[..., half : 2 * half]
        if not torch.equal(first, second):
            raise ValueError(
                "a diagonal T commutes with the rotation only if it is constant within each rotated "
                "pair (dims i and i + rotary_dim/2); this summary's is not"
            )
        return DiagonalSummary(summary.log_decay, state)
    # T' = R T R^T: rotate T's rows (left factor) then its columns (right factor).
    trans = summary.transition
    left = _rotate_last(trans.transpose(-1, -2), cos[:, None, None, :], sin[:, None, None, :]).transpose(-1, -2)
    both = _rotate_last(left, cos[:, None, None, :], sin[:, None, None, :])
    return DenseSummary(both.contiguous(), state)
