"""Wall-clock timing between device synchronisations, shared by the GPU benchmark scripts."""

from __future__ import annotations

import time
from typing import Callable, Tuple, TypeVar

import torch

T = TypeVar("T")


def sync(device: str = "cuda") -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], T], device: str = "cuda") -> Tuple[T, float]:
    """``(fn(), seconds)`` with the device drained before and after the call."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - start
