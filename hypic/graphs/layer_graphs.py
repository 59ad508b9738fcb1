"""CUDA graphs of a mixer core that every layer of one kind runs in one forward.

A cached PIC request is host-bound below ~32k tokens: on the H200 host, queueing an all-hit 8k
request took 66.0 ms of its 66.7 ms TTFT, and the linear layers' eager cores took most of it
(``short_conv`` 0.52 ms and ``linear_attention`` 0.95 ms of host time per layer, for a few Triton
launches at 60-90 us each; measured by benchmarks/host_time_h200.py). The row-wise phases are
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
for the host; a timeline of graphs made per forward: 5.3 and 7.5 ms against 1.8 for every
later linear layer; with the graphs kept: 2.3 and 1.6 ms, TTFT 69.5 ms). The all-hit
requests of one pool in new orders share a signature; requests of other segment counts or
lengths do not. What a graph reads besides its inputs and the layout's tables (tables derived
from them on the host, :mod:`hypic.ops.linear._layout_tables`) lives as long as the kept layout
does. Graphs are dropped when the next forward starts, never while a replay of theirs may still
be queued.

A call whose inputs do not fit the capture (an input that was read in place moved, a shape or
dtype changed, an input became None) runs eagerly; a core whose capture fails (e.g. a host sync
in its path) runs eagerly for the rest of the forward. A core is never captured at its first
call: on torch 2.11 a capture that fails leaves the graph pool unusable for every later capture
(``benchmarks/graph_capture_probe_h200.py``), and the first call of new shapes
may compile or autotune. **Outputs are the graph's own buffers**, rewritten by the next replay
of the same core: consume them, or clone what is kept, before the core runs again.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

logger = logging.getLogger(__name__)

# A forward that writes nothing, on a layout whose graphs will not be kept (seen for the first
# time, as nearly every RAG request's is), runs its cores eagerly from this many live tokens on.
# Such a forward is GPU-bound (~1.85 ms of GPU time per layer at a RAG 32k request's 671 live
# tokens, against ~1.1-1.9 ms of eager host time), so eager launches stay ahead of the GPU, and a
# capture (~2.5-3 ms of host time for the two cores, at the second linear layer, the GPU only
# ~1 ms behind) leaves it waiting. Fewer live tokens (an 8k prompt's ~200) leave the forward
# host-bound and its graphs pay. Forwards with writes capture either way (a RAG 32k request
# with one segment missed and written: p50 96.40 ms with core graphs against 98.29 eager, H200;
# benchmarks/rag_ab_h200.py), as does a kept layout (its graphs serve later forwards). Measured
# on the H200, RAG 32k requests on new layouts, eager against captured at the second call,
# interleaved in one process (benchmarks/rag_ab_h200.py): 79.59 against 82.23 ms, 79.16 against
# 82.16, and 69.17 against 71.66 on later code (docs/decisions.md). On a host ~40% slower (plan
# 1.09 against 0.78 ms) the TTFT bench's RAG 32k took 88.81 ms under this rule against 84.25
# with captures on another machine: eager launches cost host time per layer, so a slow host can
# make such a forward host-bound; the two were not set side by side on one slow host.
FRESH_EAGER_LIVE_TOKENS = 512


Signature = Optional[Tuple[int, Tuple[int, ...], Tuple[int, ...], torch.dtype]]


def _signature(t: Optional[torch.Tensor]) -> Signature:
    return None if t is None else (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _layout(t: Optional[torch.Tensor]):
    return None if t is None else (tuple(t.shape), t.dtype)


def release_rng_after_failed_capture(device: torch.device) -> None:
    """Clears the capture mark a failed capture leaves on the device's default generator.

    ``capture_begin`` registers the default CUDA generator with the graph, and only a successful
    ``capture_end`` takes the registration back: after a capture that raised (a host read inside
    it, say), every random op on the device that draws from the default generator raises "Offset
    increment outside graph capture encountered unexpectedly" (seen on an H100 in ``pytest -m
    cuda``: the test after ``test_a_block_that_cannot_be_captured_runs_eagerly`` failed so).
    A clone of the state has the same seed and offset and no capture mark."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    generator = torch.cuda.default_generators[index]
    try:
        generator.graphsafe_set_state(generator.clone_state())
    except RuntimeError as err:  # the caller's eager fallback must not fail on this
        logger.warning("could not clear a failed capture's mark on cuda:%d's generator: %s", index, err)


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
        except Exception:
            release_rng_after_failed_capture(self.device)
            raise
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

    ``run(name, fn, *inputs, stable=...)``: the first call eager, the second captured then
    replayed, later ones replayed. An input listed in ``stable`` (positions the caller expects at
    one address in every layer, e.g. a row-wise phase's static output buffer) whose address,
    shape and strides were the same in the first two calls is read in place; any other is
    copied into a static copy before each replay. (A fresh tensor may land at the address its
    predecessor was freed from, so an address seen twice alone does not make an input stable.)
    ``fn`` must be a function of its inputs alone for this forward (what it reads otherwise,
    e.g. the layout's index tensors, must stay as it is until the forward ends)."""

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


# Layouts whose core graphs are kept across forwards (each ~the outputs of two cores).
MAX_KEPT_LAYOUTS = 4


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
    forward, instead of holding memory and evicting layouts that do repeat. (With every layout
    kept, hypic's RAG requests measured 97.3 / 50.7 ms at 32k / 8k on the H200, against 87.9 /
    45.5 without keeping on other machines; the cause is not pinned down, and this admission
    rule has not been timed on the device.)"""

    def __init__(self, max_layouts: int = MAX_KEPT_LAYOUTS) -> None:
        if not isinstance(max_layouts, int) or isinstance(max_layouts, bool) or max_layouts < 0:
            raise ValueError(f"max_layouts must be an int >= 0, got {max_layouts!r}")
        self.max_layouts = max_layouts
        self._kept: "OrderedDict[tuple, _Kept]" = OrderedDict()
        self._seen: "OrderedDict[tuple, None]" = OrderedDict()  # signatures seen once, newest last
        self.num_reused = 0  # forwards that found their layout's graphs kept

    def __len__(self) -> int:
        return len(self._kept)

    def buffer_for(self, signature: tuple) -> Optional[torch.Tensor]:
        if self.max_layouts == 0:
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
        if limit == 0:  # nothing is kept
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


__all__ = ["CudaGraphBackend", "FRESH_EAGER_LIVE_TOKENS", "LayerReplays", "LayoutGraphs", "MAX_KEPT_LAYOUTS",
           "SEEN_SIGNATURES"]
