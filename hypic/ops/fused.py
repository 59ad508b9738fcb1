"""Fusion of the memory-bound glue between the big kernels (norms, the MoE combine).

In eager mode every elementwise step of a norm is one full pass over the activations: at a
32k-token prefill of Qwen3.5-35B-A3B shapes these passes were a large share of the time (H200
profile: ``mul`` 211 ms, ``copy_`` 145 ms, ``add_`` 88 ms of 1,374 ms). On CUDA the small math
functions of :mod:`hypic.ops.norms` and the MoE combine
(:func:`hypic.ops.moe_grouped.combine_slots_math`) run through ``torch.compile`` (one generated
kernel each: read once, write once; dynamic shapes, since token counts change every step). The
eager functions are the reference: tests compare the compiled graphs with them on CPU through
inductor's C++ backend. CPU tensors always run the eager functions.

Measured on the H200 at 32k tokens: a norm takes 0.23-0.66 ms compiled against 0.78-3.45 ms
eager, and the whole plain prefill 787 ms against 1,022 ms (docs/decisions.md). SwiGLU and the
sigmoid gates stay eager there: two-op chains, compiled they were no faster (0.41 vs 0.36 ms,
0.44 vs 0.35 ms).

**Inside a CUDA graph** (:func:`recording_graph`: the row-wise phases' warm-up and capture,
:mod:`hypic.graphs.cuda_graphs`) every glue function runs its compiled math at any size,
``graph_only`` ones included: a replay pays none of a compiled call's host cost, and each
eager kernel it saves is a graph node fewer, ~2-4 us of GPU time at a cached request's few
hundred rows (an eager norm is 4-9 kernels: casts, the weight's ``1 +``, the norm, the cast
back). All-hit request with the compiled glue recorded against the eager glue recorded, each on
graphs of its own, interleaved: 32k 64.14 against 70.26 ms, 8k 35.19 against 38.96 ms.

A toolchain that cannot compile (no working Triton or C compiler) falls back to the eager math
with one warning (:func:`compiled`).
"""

from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

# Below this many elements the eager math runs instead (outside CUDA graphs). A compiled call
# costs ~150-270 us of host time (guards, the AOT wrapper, the launcher: in an all-hit request's
# profile 241 compiled calls took 65 ms of a ~240 ms host-bound request) while the passes it
# saves at that size take a few microseconds of GPU time; at 32k tokens x 2048 (67M elements) it
# saves 0.5-2.8 ms per call.
MIN_COMPILED_ELEMENTS = 1 << 22
_COMPILED: Dict[Callable, Callable] = {}
_STATE = threading.local()  # .recording: depth of recording_graph() on this thread


@contextmanager
def recording_graph():
    """Glue called inside runs its compiled math at any size on CUDA (:func:`dispatch`): the
    caller is warming up or capturing a CUDA graph, whose replays pay no host cost per call.
    Wrap the warm-up runs too, so that compiling happens there and never inside a capture."""
    _STATE.recording = getattr(_STATE, "recording", 0) + 1
    try:
        yield
    finally:
        _STATE.recording -= 1


def _recording() -> bool:
    return getattr(_STATE, "recording", 0) > 0


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


def dispatch(fn: Callable, x: torch.Tensor, eager: Optional[Callable] = None, graph_only: bool = False) -> Callable:
    """The compiled ``fn`` for CUDA tensors: inside :func:`recording_graph` at any size, elsewhere
    from ``MIN_COMPILED_ELEMENTS`` elements on and not at all for ``graph_only`` functions
    (compiled, they were no faster eagerly); else ``eager`` (default ``fn`` itself: an ``fn``
    written for the compiler may have a cheaper eager equivalent)."""
    if x.is_cuda:
        if _recording():
            return compiled(fn)
        if not graph_only and x.numel() >= MIN_COMPILED_ELEMENTS:
            return compiled(fn)
    return fn if eager is None else eager


def swiglu_math(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` (the SwiGLU of dense and routed experts)."""
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate shape {tuple(gate.shape)} != up shape {tuple(up.shape)}")
    return dispatch(swiglu_math, gate, graph_only=True)(gate, up)


def sigmoid_gate_math(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(gate)


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(gate)`` (the gated-attention output gate)."""
    if gate.shape != x.shape:
        raise ValueError(f"sigmoid_gate: gate shape {tuple(gate.shape)} != x shape {tuple(x.shape)}")
    return dispatch(sigmoid_gate_math, x, graph_only=True)(x, gate)


def add_sigmoid_gated_math(x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x + torch.sigmoid(gate) * h


def add_sigmoid_gated(x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``x + sigmoid(gate) * h`` with ``gate`` broadcast over ``h`` (the shared expert's gate)."""
    if h.shape != x.shape:
        raise ValueError(f"add_sigmoid_gated: h shape {tuple(h.shape)} != x shape {tuple(x.shape)}")
    if gate.dim() != x.dim() or gate.shape[:-1] != x.shape[:-1] or gate.shape[-1] not in (1, x.shape[-1]):
        raise ValueError(f"add_sigmoid_gated: gate shape {tuple(gate.shape)} does not broadcast to {tuple(x.shape)}")
    return dispatch(add_sigmoid_gated_math, x, graph_only=True)(x, h, gate)


def gdn_gates_math(b: torch.Tensor, a: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """The unchecked math of :func:`gdn_gates`."""
    math = torch.float64 if b.dtype == torch.float64 else torch.float32
    beta = torch.sigmoid(b.to(math))
    # -exp(A_log) * softplus(a + dt_bias) <= 0, in fp32 (an fp16 exp(A_log) overflows)
    g = -a_log.to(math).exp() * F.softplus(a.to(math) + dt_bias.to(math))
    return g, beta


def gdn_gates(b: torch.Tensor, a: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """Gated DeltaNet's per-token gates from the raw projections ``b, a [T, HV]``: ``(g, beta)``
    with log decay ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``, both
    fp32 (fp64 for fp64 inputs). Eager, these are ten small kernels."""
    if b.dim() != 2 or a.shape != b.shape:
        raise ValueError(f"gdn_gates: b {tuple(b.shape)} and a {tuple(a.shape)} must both be [T, HV]")
    if a_log.shape != (b.shape[1],) or dt_bias.shape != (b.shape[1],):
        raise ValueError(f"gdn_gates: A_log {tuple(a_log.shape)} and dt_bias {tuple(dt_bias.shape)} must be "
                         f"[{b.shape[1]}]")
    return dispatch(gdn_gates_math, b, graph_only=True)(b, a, a_log, dt_bias)


def add_then(norm_math: Callable) -> Callable:
    """``(x + h, norm_math(x + h, weight, eps))`` as one function (one compiled kernel)."""

    def fn(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
        s = x + h
        return s, norm_math(s, weight, eps)

    fn.__name__ = f"add_then_{norm_math.__name__}"
    return fn
