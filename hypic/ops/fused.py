"""Opt-in fusion of the memory-bound glue between the big kernels (norms, gates, residuals).

In eager mode every elementwise step of a norm or gate is one full pass over the activations: at
a 32k-token prefill of Qwen3.5-35B-A3B shapes these passes are a large share of the time
(prefill_profile_h200.txt: ``mul`` 211 ms, ``copy_`` 145 ms, ``add_`` 88 ms, ``silu`` 38 ms of
1,374 ms). With ``HYPIC_COMPILE_GLUE=1`` the small math functions of :mod:`hypic.ops.norms` and
this module run through ``torch.compile`` on CUDA (one generated kernel each: read once, write
once; dynamic shapes, since token counts change every step). Off by default until an H200 run
measures it; the eager functions are the reference, and tests compare the compiled graphs with
them (on CPU, through inductor's C++ backend).
"""

from __future__ import annotations

import os
from typing import Callable, Dict, Tuple

import torch
import torch.nn.functional as F

COMPILE_ENV = "HYPIC_COMPILE_GLUE"
_COMPILED: Dict[Callable, Callable] = {}


def compile_glue_enabled() -> bool:
    """Whether CUDA glue goes through the compiled math (``HYPIC_COMPILE_GLUE`` = 0 or 1)."""
    value = os.environ.get(COMPILE_ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{COMPILE_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def compiled(fn: Callable) -> Callable:
    """``torch.compile(fn)`` once per function."""
    out = _COMPILED.get(fn)
    if out is None:
        out = torch.compile(fn, dynamic=True, fullgraph=True)
        _COMPILED[fn] = out
    return out


def dispatch(fn: Callable, x: torch.Tensor) -> Callable:
    """The compiled ``fn`` for CUDA tensors when enabled, else ``fn`` itself."""
    # The switch is read first, so a bad value is an error on every device.
    return compiled(fn) if compile_glue_enabled() and x.is_cuda else fn


def swiglu_math(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` (the SwiGLU of dense and routed experts)."""
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate shape {tuple(gate.shape)} != up shape {tuple(up.shape)}")
    return dispatch(swiglu_math, gate)(gate, up)


def sigmoid_gate_math(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(gate)


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(gate)`` (the gated-attention output gate)."""
    if gate.shape != x.shape:
        raise ValueError(f"sigmoid_gate: gate shape {tuple(gate.shape)} != x shape {tuple(x.shape)}")
    return dispatch(sigmoid_gate_math, x)(x, gate)


def add_then(norm_math: Callable) -> Callable:
    """``(x + h, norm_math(x + h, weight, eps))`` as one function (one compiled kernel)."""

    def fn(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
        s = x + h
        return s, norm_math(s, weight, eps)

    fn.__name__ = f"add_then_{norm_math.__name__}"
    return fn
