"""A dense T stored pre-split into bf16 high and low planes, for the GPU chain walk.

The walk's bf16x3 products (:mod:`hypic.ops.linear.triton_scan`) split every body's fp32 T into
``hi = bf16(T)`` and ``lo = bf16(T - hi)`` at each step. A store entry's T is written once and
read by every request that hits it, so the split can be done once, when the entry is written:
each head's ``K * K`` fp32 words then hold ``K * K`` bf16 ``hi`` followed by ``K * K`` bf16
``lo`` (the same bytes: the entry's memory and address table do not change), and the walk loads
the two planes instead of loading fp32 and splitting. The products are the same bits (the split
is the same rounding). Measured on the H200 (``benchmarks/scan_ablation_h200.py``, variant
``presplit``): one layer's all-hit walk 0.497 against 0.527 ms (-5.7%), ~0.9 ms of a 54 ms
all-hit request.

``hi + lo`` holds T to 16 significant bits (relative error below 2^-16 per element, ~1.5e-5):
:func:`unpack_planes` gives those values, and every reader of T as a matrix goes through it
(:attr:`~hypic.ops.linear.summary.DenseSummary.transition`).

Store entries written on CUDA keep T packed (:func:`presplit_wanted`); elsewhere (the CPU
reference, whose products read T as a matrix) T stays fp32 values.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from hypic.envs import triton_interpret


def presplit_wanted(device: torch.device) -> bool:
    """Whether T written on ``device`` is to be stored packed: on CUDA, where the chain walk
    reads the planes in place; elsewhere the reference reads T as values, which a packed T
    would have to be unpacked into first."""
    return torch.device(device).type == "cuda"


def _check_fp32_square(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.dim() < 2 or t.shape[-1] != t.shape[-2]:
        raise ValueError(f"{name} must be a float32 tensor [..., K, K], got "
                         f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")


def split_planes(t: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(hi, lo)`` bf16 of fp32 ``t``: ``hi = bf16(t)``, ``lo = bf16(t - hi)``, both rounded to
    nearest even, as the walk kernel's ``split_bf16`` does."""
    _check_fp32_square("t", t)
    hi = t.to(torch.bfloat16)
    return hi, (t - hi.to(torch.float32)).to(torch.bfloat16)


def pack_planes(t: torch.Tensor) -> torch.Tensor:
    """fp32 ``t [..., K, K]`` as its packed storage: a new contiguous fp32 tensor of the same
    shape whose every ``[K, K]`` matrix's words hold its ``hi`` plane then its ``lo`` plane."""
    hi, lo = split_planes(t)
    k = t.shape[-1]
    both = torch.cat([hi.reshape(-1, k * k), lo.reshape(-1, k * k)], dim=-1)  # [M, 2 K K] bf16
    return both.view(torch.float32).reshape(t.shape)


def planes(storage: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(hi, lo)`` bf16 ``[..., K, K]`` views of packed ``storage`` (contiguous fp32)."""
    _check_fp32_square("storage", storage)
    if not storage.is_contiguous():
        raise ValueError("packed T storage must be contiguous (its planes are laid out per matrix)")
    k = storage.shape[-1]
    both = storage.reshape(-1, k * k).view(torch.bfloat16).view(-1, 2, k, k)
    shape = tuple(storage.shape)
    return both[:, 0].reshape(shape), both[:, 1].reshape(shape)


def unpack_planes(storage: torch.Tensor) -> torch.Tensor:
    """T's fp32 values ``hi + lo`` from packed ``storage`` (a new tensor)."""
    hi, lo = planes(storage)
    return hi.to(torch.float32) + lo.to(torch.float32)


def pack_planes_(tensors: Sequence[torch.Tensor]) -> None:
    """Pack each fp32 ``[..., K, K]`` tensor in place (contiguous, one device, one K): on CUDA
    one Triton launch over all of them (each matrix read once and written once), elsewhere
    through :func:`pack_planes`."""
    tensors = list(tensors)
    if not tensors:
        return
    k = tensors[0].shape[-1]
    device = tensors[0].device
    for i, t in enumerate(tensors):
        _check_fp32_square(f"tensors[{i}]", t)
        if t.shape[-1] != k or t.device != device or not t.is_contiguous():
            raise ValueError(f"tensors[{i}] must be contiguous [..., {k}, {k}] on {device}, got "
                             f"{tuple(t.shape)} on {t.device}")
    if device.type != "cuda" and not triton_interpret():
        for t in tensors:
            t.copy_(pack_planes(t))
        return
    from hypic.ops.linear._t_planes_kernel import launch_pack

    tensors = [t for t in tensors if t.numel()]  # (the launch's addresses count from the first)
    if tensors:
        launch_pack(tensors, k)


__all__: List[str] = [
    "pack_planes", "pack_planes_", "planes", "presplit_wanted", "split_planes", "unpack_planes",
]
