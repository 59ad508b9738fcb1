"""CUDA graphs of a mixer core that every layer of one kind runs in one forward.

A cached PIC request is host-bound below ~32k tokens: on the H200 host, queueing an all-hit 8k
request took 66.0 ms of its 66.7 ms TTFT, and the linear layers' eager cores took most of it
(``short_conv`` 0.52 ms and ``linear_attention`` 0.95 ms of host time per layer, for a few Triton
launches at 60-90 us each; benchmarks/host_time_h200.py, session 10). The row-wise phases are
already graphs (:mod:`hypic.engine.cuda_graphs`), but the cores read the request's layout
(span bounds, chain tables, chunk indices), so they cannot be captured once at start-up.

Within one forward, though, every linear layer runs its core on the same layout with the same
shapes: only a few inputs move (the layer's conv weight, its conv tails and cached-body address
table), and the others are the row-wise phases' static output buffers, at the same address in
every layer. So the first call of a core runs eagerly (it compiles and autotunes what the shapes
need), the second is captured into a graph and replayed, and every later call copies the inputs
that moved into the graph's static copies and replays: one launch and a few copies instead of
the core's Python, checks and launches.

The graph is valid for one forward's layout only: a :class:`LayerReplays` belongs to one
forward (the runner keeps the last one until the next forward, so no graph is destroyed while a
replay may still be queued). A call whose inputs do not fit the capture (an input that was read
in place moved, a shape or dtype changed, an input became None) runs eagerly; a core whose
capture fails (e.g. a host sync in its path) runs eagerly for the rest of the forward.
**Outputs are the graph's own buffers**, rewritten by the next replay of the same core: consume
them, or clone what is kept, before the core runs again.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

ENV = "HYPIC_LAYER_GRAPHS"


def layer_graphs_enabled() -> bool:
    """``HYPIC_LAYER_GRAPHS`` (default 1; 0 runs every core eagerly, for A/B measurements)."""
    value = os.environ.get(ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{ENV} must be 0 or 1, got {value!r}")
    return value == "1"


Signature = Optional[Tuple[int, Tuple[int, ...], Tuple[int, ...], torch.dtype]]


def _signature(t: Optional[torch.Tensor]) -> Signature:
    return None if t is None else (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _layout(t: Optional[torch.Tensor]):
    return None if t is None else (tuple(t.shape), t.dtype)


class CudaGraphBackend:
    """Captures on a side stream with ``capture_begin``/``capture_end`` rather than
    ``torch.cuda.graph``, whose entry synchronises the device and empties the allocator's cache
    (costly once per request). Graphs share ``pool`` (the row-wise phases' pool): memory freed by
    one forward's graphs is reused by the next one's captures instead of being allocated anew."""

    def __init__(self, device: torch.device, pool) -> None:
        self.device = torch.device(device)
        self.pool = pool
        self._stream: Optional[torch.cuda.Stream] = None

    def capture(self, fn: Callable, inputs: Sequence[Optional[torch.Tensor]]):
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        current = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(current)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(self._stream):
                graph.capture_begin(pool=self.pool)
                try:
                    out = fn(*inputs)
                finally:
                    graph.capture_end()
        finally:
            current.wait_stream(self._stream)
        graph.replay()  # the capture only recorded: this runs the call the capture stood for
        return graph, out

    @staticmethod
    def replay(graph) -> None:
        graph.replay()


class _Slot:
    __slots__ = ("first", "graph", "inputs", "in_place", "output", "failed")

    def __init__(self) -> None:
        self.first: Optional[Tuple[Signature, ...]] = None  # the first (eager) call's inputs
        self.graph = None
        self.inputs: Tuple[Optional[torch.Tensor], ...] = ()  # what the graph reads
        self.in_place: Tuple[bool, ...] = ()  # read where the caller's tensor lives (no copy)
        self.output = None
        self.failed: Optional[str] = None


class LayerReplays:
    """Per-forward graphs of cores ``fn(*inputs)`` (tensors or None) run once per layer.

    ``run(name, fn, *inputs, stable=...)``: call 1 eager, call 2 captured then replayed, later
    calls replayed. An input listed in ``stable`` (positions the caller expects at one address in
    every layer, e.g. a row-wise phase's static output buffer) whose address, shape and strides
    were the same in calls 1 and 2 is read in place; any other is copied into a static copy
    before each replay. (A fresh tensor may land at the address its predecessor was freed from,
    so an address seen twice alone does not make an input stable.) ``fn`` must be a function of its inputs alone for this forward (what it reads
    otherwise, e.g. the layout's index tensors, must stay as it is until the forward ends)."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self._slots: Dict[str, _Slot] = {}
        self.num_captures = 0
        self.num_replays = 0

    def failures(self) -> Dict[str, str]:
        """Why each core that runs eagerly could not be captured."""
        return {name: slot.failed for name, slot in self._slots.items() if slot.failed}

    def run(self, name: str, fn: Callable, *inputs: Optional[torch.Tensor], stable: Tuple[int, ...] = ()):
        slot = self._slots.get(name)
        if slot is None:
            slot = self._slots[name] = _Slot()
        if slot.failed is not None:
            return fn(*inputs)
        signature = tuple(_signature(t) for t in inputs)
        if slot.first is None:
            slot.first = signature
            return fn(*inputs)
        if slot.graph is None:
            return self._capture(slot, fn, inputs, signature, stable)
        if len(inputs) != len(slot.inputs):
            return fn(*inputs)
        for t, static, in_place in zip(inputs, slot.inputs, slot.in_place):
            if _layout(t) != _layout(static) or (in_place and _signature(t) != _signature(static)):
                return fn(*inputs)  # this call does not fit the capture
        for t, static, in_place in zip(inputs, slot.inputs, slot.in_place):
            if t is not None and not in_place:
                static.copy_(t)
        self.backend.replay(slot.graph)
        self.num_replays += 1
        return slot.output

    def _capture(self, slot: _Slot, fn: Callable, inputs, signature, stable):
        if len(signature) != len(slot.first) or any(
                (a is None) != (b is None) or (a is not None and a[1:] != b[1:])
                for a, b in zip(signature, slot.first)):
            slot.failed = "the inputs' shapes changed between the first two calls"
            return fn(*inputs)
        in_place = tuple(t is not None and i in stable and a == b
                         for i, (t, a, b) in enumerate(zip(inputs, signature, slot.first)))
        static = tuple(t if (t is None or keep) else t.clone() for t, keep in zip(inputs, in_place))
        try:
            graph, output = self.backend.capture(fn, static)
        except Exception as err:  # noqa: BLE001 - any capture failure means "run eagerly"
            slot.failed = f"{type(err).__name__}: {err}"
            return fn(*inputs)
        slot.graph, slot.inputs, slot.in_place, slot.output = graph, static, in_place, output
        self.num_captures += 1
        return output


__all__ = ["CudaGraphBackend", "ENV", "LayerReplays", "layer_graphs_enabled"]
