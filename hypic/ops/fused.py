"""Fusion of the memory-bound glue between the big kernels (norms, the MoE combine).

In eager mode every elementwise step of a norm is one full pass over the activations: at a
32k-token prefill of Qwen3.5-35B-A3B shapes these passes were a large share of the time
(prefill_profile_h200.txt, session 2: ``mul`` 211 ms, ``copy_`` 145 ms, ``add_`` 88 ms of
1,374 ms). On CUDA the small math functions of :mod:`hypic.ops.norms` and the MoE combine
(:func:`hypic.ops.moe_grouped.combine_slots_math`) run through ``torch.compile`` (one generated
kernel each: read once, write once; dynamic shapes, since token counts change every step).
``HYPIC_COMPILE_GLUE=0`` turns this off (the eager functions are the reference; tests compare
the compiled graphs with them on CPU through inductor's C++ backend, and
benchmarks/glue_check_h200.py on the GPU).

Measured on the H200 at 32k tokens (benchmarks/results/glue_check_h200.json): a norm takes
0.23-0.66 ms compiled against 0.78-3.45 ms eager, and the whole plain prefill 787 ms against
1,022 ms. SwiGLU and the sigmoid gates stay eager: two-op chains, compiled they were no faster
(0.41 vs 0.36 ms, 0.44 vs 0.35 ms).
"""

from __future__ import annotations

import os
import warnings
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

COMPILE_ENV = "HYPIC_COMPILE_GLUE"
# Below this many elements the eager math runs instead. A compiled call costs ~150-270 us of host
# time (guards, the AOT wrapper, the launcher: session 5's all-hit profile, 241 compiled calls
# for 65 ms of a ~240 ms host-bound request) while the passes it saves at that size take a few
# microseconds of GPU time; at 32k tokens x 2048 (67M elements) it saves 0.5-2.8 ms per call.
MIN_COMPILED_ELEMENTS = 1 << 22
_COMPILED: Dict[Callable, Callable] = {}


def compile_glue_enabled() -> bool:
    """Whether CUDA glue goes through the compiled math (``HYPIC_COMPILE_GLUE`` = 0 or 1, default 1)."""
    value = os.environ.get(COMPILE_ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{COMPILE_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def compile_graph(fn: Callable) -> Callable:
    """The compiled graph of ``fn`` (dynamic shapes, one graph), without any fallback: what the
    tests and benchmarks compare with the eager math."""
    return torch.compile(fn, dynamic=True, fullgraph=True)


def compiled(fn: Callable) -> Callable:
    """``torch.compile(fn)`` once per function, falling back to ``fn`` where compiling fails.

    The glue is compiled by default, so a machine whose toolchain cannot compile (no working
    Triton or C compiler) must still serve: when a compiled call raises but ``fn`` itself runs
    on the same arguments, the failure was the compiler's; it is reported once as a warning and
    ``fn`` is used from then on. When ``fn`` raises too, that error propagates (bad inputs)."""
    out = _COMPILED.get(fn)
    if out is None:
        graph = compile_graph(fn)

        def run(*args):
            try:
                return graph(*args)
            except Exception as err:  # noqa: BLE001 - sorted out by running the eager math below
                result = fn(*args)
                warnings.warn(f"hypic: compiling {fn.__name__} failed ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); using the eager version",
                              RuntimeWarning, stacklevel=2)
                _COMPILED[fn] = fn
                return result

        out = _COMPILED[fn] = run
    return out


def dispatch(fn: Callable, x: torch.Tensor, eager: Optional[Callable] = None) -> Callable:
    """The compiled ``fn`` for CUDA tensors of at least ``MIN_COMPILED_ELEMENTS`` elements when
    enabled, else ``eager`` (default ``fn`` itself: an ``fn`` written for the compiler may have a
    cheaper eager equivalent)."""
    # The switch is read first, so a bad value is an error on every device.
    if compile_glue_enabled() and x.is_cuda and x.numel() >= MIN_COMPILED_ELEMENTS:
        return compiled(fn)
    return fn if eager is None else eager


def swiglu_math(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` (the SwiGLU of dense and routed experts)."""
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate shape {tuple(gate.shape)} != up shape {tuple(up.shape)}")
    return swiglu_math(gate, up)


def sigmoid_gate_math(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(gate)


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(gate)`` (the gated-attention output gate)."""
    if gate.shape != x.shape:
        raise ValueError(f"sigmoid_gate: gate shape {tuple(gate.shape)} != x shape {tuple(x.shape)}")
    return sigmoid_gate_math(x, gate)


def add_sigmoid_gated_math(x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x + torch.sigmoid(gate) * h


def add_sigmoid_gated(x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``x + sigmoid(gate) * h`` with ``gate`` broadcast over ``h`` (the shared expert's gate)."""
    if h.shape != x.shape:
        raise ValueError(f"add_sigmoid_gated: h shape {tuple(h.shape)} != x shape {tuple(x.shape)}")
    if gate.dim() != x.dim() or gate.shape[:-1] != x.shape[:-1] or gate.shape[-1] not in (1, x.shape[-1]):
        raise ValueError(f"add_sigmoid_gated: gate shape {tuple(gate.shape)} does not broadcast to {tuple(x.shape)}")
    return add_sigmoid_gated_math(x, h, gate)


def add_then(norm_math: Callable) -> Callable:
    """``(x + h, norm_math(x + h, weight, eps))`` as one function (one compiled kernel)."""

    def fn(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
        s = x + h
        return s, norm_math(s, weight, eps)

    fn.__name__ = f"add_then_{norm_math.__name__}"
    return fn
