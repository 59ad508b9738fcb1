"""Lazy lookup of GPU fast paths.

``hypic.ops.linear.fla_paths`` (written separately) holds fla/Triton implementations named like
the public reference functions. It is imported only when a call sees CUDA tensors, so a CPU-only
machine never needs fla or Triton. A missing module or function means "use the reference".
"""

from __future__ import annotations

import importlib
from typing import Callable, Optional

import torch

_FAST_MODULE = "hypic.ops.linear.fla_paths"


def cuda_fast_path(name: str, *tensors: Optional[torch.Tensor]) -> Optional[Callable]:
    """Return ``fla_paths.<name>`` when any tensor is on CUDA and the function exists, else None."""
    if not any(t is not None and t.is_cuda for t in tensors):
        return None
    try:
        module = importlib.import_module(_FAST_MODULE)
    except ModuleNotFoundError as err:
        # Only the absence of fla_paths itself means "no fast path"; any other missing module
        # inside it is a real error and must surface.
        if err.name != _FAST_MODULE:
            raise
        return None
    return getattr(module, name, None)
