"""Argument validation shared by the linear-attention ops (and the conv, RoPE and K/V gather ops,
the CUDA graphs and the PIC runner, which take its tensor and device checks).

Every public op checks ranks, shapes, dtypes and head counts up front and raises ``ValueError``
naming the offending argument, so that nothing broadcasts silently.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Gates are log decays: keep them at least fp32 (bf16 rounds decays near 1 to exactly 1).
GATE_DTYPES = (torch.float32, torch.float64)
STATE_DTYPES = (torch.float32, torch.float64)


def check_tensor(
    name: str,
    tensor: object,
    shape: Sequence[Optional[int]],
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
) -> torch.Tensor:
    """Check that ``tensor`` is a tensor of rank ``len(shape)``; ``None`` entries match any size."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != len(shape):
        raise ValueError(
            f"{name} must have rank {len(shape)} (expected shape {_fmt(shape)}), "
            f"got shape {tuple(tensor.shape)}"
        )
    for axis, (got, want) in enumerate(zip(tensor.shape, shape)):
        if want is not None and got != want:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)}, expected {_fmt(shape)} "
                f"(mismatch on axis {axis})"
            )
    if tensor.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{name} has dtype {tensor.dtype}, expected one of: {allowed}")
    return tensor


def _fmt(shape: Sequence[Optional[int]]) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def check_same_device(**tensors: Optional[torch.Tensor]) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        detail = ", ".join(f"{name} on {dev}" for name, dev in devices.items())
        raise ValueError(f"all tensors must be on one device: {detail}")


def concrete_device(device) -> torch.device:
    """``device`` with its index: tensors report ``cuda:0`` where a caller may say ``cuda``, and
    the two compare unequal."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def on_device(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``t`` on ``device`` in ``dtype``; no tensor op at all when it already is (the common case of
    a device-resident store: skipping the no-op ``.to`` saves a dispatch per segment per layer)."""
    if t.device == device and t.dtype == dtype:
        return t
    return t.to(device=device, dtype=dtype)


def check_head_ratio(num_value_heads: int, num_key_heads: int, what: str = "key") -> int:
    """GVA: value head j reads key head j // (HV // H); HV must be a multiple of H."""
    if num_key_heads <= 0 or num_value_heads % num_key_heads != 0:
        raise ValueError(
            f"number of value heads ({num_value_heads}) must be a positive multiple of the "
            f"number of {what} heads ({num_key_heads})"
        )
    return num_value_heads // num_key_heads


def check_cu_seqlens(cu_seqlens: object, num_tokens: int) -> torch.Tensor:
    """Shape/dtype check (no device sync). Values are checked by ``cu_seqlens_to_list``."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise ValueError(f"cu_seqlens must be a LongTensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"cu_seqlens must be 1-D with at least 2 entries, got shape {tuple(cu_seqlens.shape)}"
        )
    if cu_seqlens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"cu_seqlens must be int64 (or int32), got {cu_seqlens.dtype}")
    return cu_seqlens


def check_cu_seqlens_cpu(cu_seqlens_cpu: object, cu_seqlens: torch.Tensor, num_tokens: int) -> None:
    """``cu_seqlens_cpu``: an optional host copy of ``cu_seqlens`` that GPU paths read lengths from
    instead of reading the device tensor back (a synchronisation). Checked here on the host
    (shape and values, free); that it equals the device tensor is the caller's promise."""
    if cu_seqlens_cpu is None:
        return
    if not isinstance(cu_seqlens_cpu, torch.Tensor) or cu_seqlens_cpu.device.type != "cpu":
        raise ValueError("cu_seqlens_cpu must be a CPU tensor (a host copy of cu_seqlens)")
    if cu_seqlens_cpu.dtype != torch.int64 or tuple(cu_seqlens_cpu.shape) != tuple(cu_seqlens.shape):
        raise ValueError(
            f"cu_seqlens_cpu must be int64 with the shape of cu_seqlens {tuple(cu_seqlens.shape)}, "
            f"got {cu_seqlens_cpu.dtype} {tuple(cu_seqlens_cpu.shape)}"
        )
    cu_seqlens_to_list(cu_seqlens_cpu, num_tokens, name="cu_seqlens_cpu")


def check_chain_records(record_rows, num_records, cu_seqlens: torch.Tensor, source) -> None:
    """The chain ops' ``record_rows`` (int64 ``[M]``, one per chain element: the live spans of
    ``cu_seqlens``, or the elements ``source`` lists) and ``num_records``, given together."""
    num_elements = int(cu_seqlens.numel() - 1) if source is None else int(source.numel())
    if record_rows is not None:
        if num_records is None or num_records < 0:
            raise ValueError("record_rows needs num_records >= 0")
        if record_rows.dim() != 1 or record_rows.numel() != num_elements:
            raise ValueError(f"record_rows must be [{num_elements}] (one per chain element), "
                             f"got shape {tuple(record_rows.shape)}")
    elif num_records is not None:
        raise ValueError("num_records without record_rows")


def cu_seqlens_to_list(cu_seqlens: torch.Tensor, num_tokens: int, name: str = "cu_seqlens") -> list:
    """Value check: starts at 0, non-decreasing, ends at ``num_tokens``. Returns a Python list."""
    values = [int(x) for x in cu_seqlens.tolist()]
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {values[0]}")
    if values[-1] != num_tokens:
        raise ValueError(f"{name} must end at the number of tokens ({num_tokens}), got {values[-1]}")
    if any(b < a for a, b in zip(values[:-1], values[1:])):
        raise ValueError(f"{name} must be non-decreasing, got {values}")
    return values


def compute_dtype(*tensors: Optional[torch.Tensor]) -> torch.dtype:
    """fp32 math, or fp64 when any input is fp64 (the exactness tests run in fp64)."""
    for t in tensors:
        if t is not None and t.dtype == torch.float64:
            return torch.float64
    return torch.float32


def check_scale(scale: Optional[float], key_dim: int) -> float:
    if scale is None:
        return key_dim ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise ValueError(f"scale must be a float or None, got {type(scale).__name__}")
    return float(scale)
