"""CUDA graphs of a mixer core that every layer of one kind runs in one forward.

A cached PIC request is host-bound below ~32k tokens: on the H200 host, queueing an all-hit 8k
request took 66.0 ms of its 66.7 ms TTFT, and the linear layers' eager cores took most of it
(``short_conv`` 0.52 ms and ``linear_attention`` 0.95 ms of host time per layer, for a few Triton
launches at 60-90 us each; benchmarks/host_time_h200.py, session 10). The row-wise phases are
already graphs (:mod:`hypic.graphs.cuda_graphs`), but the cores read the request's layout
(span bounds, chain tables, chunk indices), so they cannot be captured once at start-up.

Within one forward, though, every linear layer runs its core on the same layout with the same
shapes: only a few inputs move (the layer's conv weight, its conv tails and cached-body address
table), and the others are the row-wise phases' static output buffers, at the same address in
every layer. So the first call of a core runs eagerly (it compiles and autotunes what the shapes
need), the second is captured into a graph and replayed, and every later call copies the inputs
that moved into the graph's static copies and replays: one launch and a few copies instead of
the core's Python, checks and launches.

A graph is valid for the layout it was captured over: a :class:`LayerReplays` belongs to one
layout. **Across forwards** (:class:`LayoutGraphs`) the runner keeps the graphs of the last few
layouts whose signature it has seen twice, by that signature (every index table's size and the
host-read tables' values, so every host-side decision of a core and every shape is the same): a
later forward of that signature builds its index tables into the kept layout's device buffer,
and its every layer, the first two included, replays. Those first two otherwise cost ~9 ms of an
all-hit 32k request on the H200 (layer 0's cores eager, layer 1's captured, with the GPU waiting
for the host; session 15 call 3 timeline: 5.3 and 7.5 ms against 1.8 for every later linear
layer; with the graphs kept, session 18 call 1: 2.3 and 1.6 ms, TTFT 69.5 ms). The all-hit
requests of one pool in new orders share a signature; requests of other segment counts or
lengths do not. What a graph reads besides its inputs and the layout's tables (tables derived
from them on the host, :mod:`hypic.ops.linear._layout_tables`) lives as long as the kept layout
does. Graphs are dropped when the next forward starts, never while a replay of theirs may still
be queued.

A call whose inputs do not fit the capture (an input that was read in place moved, a shape or
dtype changed, an input became None) runs eagerly; a core whose capture fails (e.g. a host sync
in its path) runs eagerly for the rest of the forward. A core is never captured at its first
call: on torch 2.11 a capture that fails leaves the graph pool unusable for every later capture
(session 18 call 1, ``benchmarks/graph_capture_probe_h200.py``), and the first call of new shapes
may compile or autotune. **Outputs are the graph's own buffers**, rewritten by the next replay
of the same core: consume them, or clone what is kept, before the core runs again.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

from hypic.envs import env_switch

ENV = "HYPIC_LAYER_GRAPHS"


def layer_graphs_enabled() -> bool:
    """``HYPIC_LAYER_GRAPHS`` (default 1; 0 runs every core eagerly, for A/B measurements)."""
    return env_switch(ENV)


WRITE_ENV = "HYPIC_WRITE_GRAPHS"


def write_graphs_enabled() -> bool:
    """``HYPIC_WRITE_GRAPHS`` (default 1): a forward with writes whose live tokens fit the
    row-wise graphs (a cached request with a few missed segments, as in a RAG trace) replays its
    cores too, from graphs of its own (never kept across forwards); 0 runs such a forward's cores
    eagerly, as before session 19, for A/B runs. Before, every RAG request with a miss ran its 30
    linear layers' conv and chain cores eagerly. Measured on the H200 (session 19 call 3,
    ``benchmarks/rag_ab_h200.py --force-misses 1``: RAG 32k requests with one document segment
    missed and written, the values interleaved in one process): p50 96.40 ms against 98.29 over
    6 requests each (the forward is GPU-bound, ~83 ms of kernels); under the profiler the GPU
    idled 39.9 ms of a 122.8 ms span against 145.7 of 228.2."""
    return env_switch(WRITE_ENV)


FRESH_ENV = "HYPIC_FRESH_GRAPHS"
FRESH_MODES = ("auto", "always")
FRESH_EAGER_LIVE_TOKENS = 512  # auto: a forward of this many live tokens on a new layout runs eagerly


def fresh_graphs_mode() -> str:
    """``HYPIC_FRESH_GRAPHS``: whether a forward that writes nothing, on a layout whose graphs
    will not be kept (seen for the first time, as nearly every RAG request's is), captures its
    cores. ``auto`` (default): not with :data:`FRESH_EAGER_LIVE_TOKENS` or more live tokens; such
    a forward is GPU-bound (~1.85 ms of GPU time per layer at a RAG 32k request's 671 live
    tokens, against ~1.1-1.9 ms of eager host time), so eager launches stay ahead of the GPU,
    and a capture (~2.5-3 ms of host time for the two cores, at the second linear layer, the GPU
    only ~1 ms behind) leaves the GPU waiting. Fewer live tokens (an 8k prompt's ~200) leave the
    forward host-bound and its graphs pay. ``always``: every such forward captures, as before
    session 20. Forwards with writes capture either way (``HYPIC_WRITE_GRAPHS``; session 19
    measured them faster with graphs), as does a kept layout (its graphs serve later forwards).

    Measured on the H200, RAG 32k requests on new layouts, settings interleaved in one process
    (``benchmarks/rag_ab_h200.py``, 8 requests each): every core eager 79.59 ms p50 against
    82.23 captured at the second call (session 20 call 1), 79.16 against 82.16 captured at the
    third (call 3, an event-based rule that captured once the GPU had reached the previous
    call's work; it fired at the third call every time and was dropped). With this rule the TTFT
    bench's RAG 32k requests took 88.81 ms (call 4) on a machine whose host was ~40% slower
    (plan 1.09 against 0.78 ms), against 84.25 with captures (call 2, another machine): eager
    launches cost host time per layer, so a slow host can make such a forward host-bound; not
    yet set side by side on one slow host."""
    value = os.environ.get(FRESH_ENV, "auto")
    if value not in FRESH_MODES:
        raise ValueError(f"{FRESH_ENV} must be one of {FRESH_MODES}, got {value!r}")
    return value


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
        # Set per forward by the runner (its layout): what a core reads besides its inputs
        # (tables derived from the layout, kept while it lives) must outlive the graphs captured
        # over it, so each capture holds the holder of its forward.
        self.holder: object = None
        self._held: list = []

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
        if self.holder is not None and not any(h is self.holder for h in self._held):
            self._held.append(self.holder)
        self.num_captures += 1
        return output


KEPT_ENV = "HYPIC_KEPT_LAYOUTS"
MAX_KEPT_LAYOUTS = 4  # layouts whose graphs are kept across forwards (each ~the outputs of two cores)


def kept_layouts() -> int:
    """``HYPIC_KEPT_LAYOUTS`` (default 4): how many layouts' core graphs are kept across forwards;
    0: a forward neither uses nor keeps any (it captures its own, as before), while what is kept
    stays for later forwards (an A/B in one process, one request per value in turn)."""
    value = os.environ.get(KEPT_ENV, str(MAX_KEPT_LAYOUTS))
    if not value.isdigit():
        raise ValueError(f"{KEPT_ENV} must be an integer >= 0, got {value!r}")
    return int(value)


class _Kept:
    __slots__ = ("layout", "replays")

    def __init__(self, layout, replays: LayerReplays) -> None:
        self.layout = layout  # keeps the index buffer, and the tables derived from it, alive
        self.replays = replays


SEEN_SIGNATURES = 64  # signatures remembered (not kept) so that a second forward of one is kept


class LayoutGraphs:
    """The :class:`LayerReplays` of the last ``max_layouts`` layouts, by
    :attr:`~hypic.runner.layout.PackedLayout.index_signature`, least recently used dropped
    first. ``buffer_for(signature)`` gives ``build_layout`` the device buffer of a kept layout to
    copy its tables into; ``replays_for(layout, make)`` then gives that layout's graphs, or
    ``make()``'s for a layout not kept.

    **A signature is kept from its second forward on** (among the last :data:`SEEN_SIGNATURES`
    seen): the all-hit requests of one pool share theirs, while a RAG trace's requests rarely
    do (their segment counts and lengths differ), and their graphs are then dropped at the next
    forward as before keeping existed, instead of holding memory and evicting layouts that do
    repeat. (Session 18 call 3 measured hypic's RAG requests 97.3 / 50.7 ms at 32k / 8k with every
    layout kept, against 87.9 / 45.5 in sessions 15-16 on other machines; the cause is not
    pinned down, and this admission rule was not run on the device.)"""

    def __init__(self, max_layouts: Optional[int] = None) -> None:
        if max_layouts is not None and (not isinstance(max_layouts, int) or max_layouts < 0):
            raise ValueError(f"max_layouts must be an int >= 0 or None, got {max_layouts!r}")
        self._max_layouts = max_layouts
        self._kept: "OrderedDict[tuple, _Kept]" = OrderedDict()
        self._seen: "OrderedDict[tuple, None]" = OrderedDict()  # signatures seen once, newest last
        self.num_reused = 0  # forwards that found their layout's graphs kept

    @property
    def max_layouts(self) -> int:
        """As given, or :func:`kept_layouts` (read at every call) when None."""
        return kept_layouts() if self._max_layouts is None else self._max_layouts

    def __len__(self) -> int:
        return len(self._kept)

    def buffer_for(self, signature: tuple) -> Optional[torch.Tensor]:
        if self.max_layouts == 0:  # keeping is off for now: what is kept stays for later
            return None
        kept = self._kept.get(signature)
        return None if kept is None else kept.layout.index_device

    def keeps(self, layout) -> bool:
        """Whether ``layout``'s device buffer is kept: a later forward rewrites it, so nothing
        that outlives the forward (a decode cache) may hold a view of it."""
        kept = self._kept.get(layout.index_signature)
        return kept is not None and kept.layout.index_device is layout.index_device

    def replays_for(self, layout, make: Callable[[], LayerReplays]) -> LayerReplays:
        limit = self.max_layouts
        if limit == 0:
            return make()
        signature = layout.index_signature
        kept = self._kept.get(signature)
        if kept is not None and kept.layout.index_device is layout.index_device:
            self._kept.move_to_end(signature)
            self.num_reused += 1
            return kept.replays
        replays = make()
        if signature is not None and layout.index_device is not None:
            if signature in self._kept or signature in self._seen:
                self._seen.pop(signature, None)
                self._kept[signature] = _Kept(layout, replays)
                self._kept.move_to_end(signature)
            else:
                self._seen[signature] = None
                while len(self._seen) > SEEN_SIGNATURES:
                    self._seen.popitem(last=False)
        while len(self._kept) > limit:
            self._kept.popitem(last=False)
        return replays


__all__ = ["CudaGraphBackend", "ENV", "FRESH_EAGER_LIVE_TOKENS", "FRESH_ENV", "FRESH_MODES", "KEPT_ENV",
           "fresh_graphs_mode", "LayerReplays", "LayoutGraphs", "MAX_KEPT_LAYOUTS", "SEEN_SIGNATURES",
           "WRITE_ENV", "kept_layouts", "layer_graphs_enabled", "write_graphs_enabled"]
