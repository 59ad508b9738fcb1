"""CUDA graphs of the row-wise phases of a forward (everything but the mixers' cores).

A cached PIC request runs a few hundred live tokens through every layer: each kernel is short and
the forward is bound by the host launching ~100 kernels per layer. The phases between the
context's calls (input norm and projections; the q/k/v gates after the conv; output norm and
projection, residuals, post norm and the MoE: router, top-k, sort, two grouped GEMMs, combine,
shared expert) map row t of their inputs to row t of their outputs and depend on nothing else,
so each is captured once per (phase, padded token count) and replayed as one launch, the way
vLLM captures its piecewise graphs. The mixers' cores (short conv, linear attention, full
attention over a request's cached layout) stay eager.

Token counts are padded up to a bucket (:data:`DEFAULT_BUCKETS`); larger inputs run eagerly (a
long prefill's kernels are long enough that launching them costs little). Rows are independent,
so padding rows (zeros, then stale rows of an earlier call) never change the real rows. The same
phase of every layer shares one set of static input and output buffers per bucket: inputs are
copied in right before a replay and the graph copies its results into the outputs, in stream
order. An input that was an earlier phase's output buffer when the phase was captured (the
residual from the previous layer, ``z`` and the gates' ``b, a`` from the layer's first phase) is
read from that buffer in place, without the copy: all-hit 32k 60.53 ms against 63.30 with every
input copied, 8k 33.62 against 34.59 (H200, interleaved in one process; docs/decisions.md).
**A replay returns views of those output buffers**: they are valid until the next replay
of the same phase function at the same bucket (any layer), so a caller consumes them, or copies
what it keeps, before that phase runs again. The decoder layers do (a layer's phase outputs are
read within the layer; its output is the next layer's input, which a replay copies in before
it runs), and the contexts keep only tensors they computed (gathered conv tails, appended K/V).
All graphs share one memory pool, so a later capture reuses what an earlier phase allocated for
itself. A phase whose capture fails (e.g. a host sync
in an eager fallback path) runs eagerly from then on. One :class:`TokenGraphs` serves a device
for the whole process (:func:`make_token_graphs`); a layer's graphs go when the layer is freed.
The engine's ``enforce_eager`` setting (:class:`hypic.config.KernelConfig`) turns graphs off;
:meth:`hypic.runner.pic_runner.PicRunner.capture_graphs` captures every bucket at start-up.
"""

from __future__ import annotations

import bisect
import weakref
from typing import Dict, Hashable, Optional, Sequence, Tuple

import torch

from hypic.graphs.layer_graphs import release_rng_after_failed_capture
from hypic.ops.fused import recording_graph
from hypic.ops.linear.checks import concrete_device

DEFAULT_BUCKETS: Tuple[int, ...] = (8, 16, 32, 64, 96, 128, 192, 256, 320, 384, 512, 640, 768, 1024, 1280,
                                    1536, 2048)


def pick_bucket(buckets: Sequence[int], num_tokens: int) -> Optional[int]:
    """The smallest bucket holding ``num_tokens`` rows (``buckets`` sorted), None when none does."""
    i = bisect.bisect_left(buckets, num_tokens)
    return buckets[i] if i < len(buckets) else None


# A group's outputs must cover at least this share of the span copied for them, or each is copied
# alone: a phase returning two narrow slices of a wide tensor must not copy all of it.
MIN_GROUP_COVERAGE = 0.75


def _span(t: torch.Tensor) -> Tuple[int, int]:
    """``[lo, hi)``: the elements of ``t``'s storage that ``t`` can address."""
    lo = t.storage_offset()
    return lo, lo + 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def _output_groups(outs: Sequence[torch.Tensor]) -> Tuple[Tuple[int, ...], ...]:
    """Indices of outputs copied out together: two or more outputs of one dtype, views of one
    storage with non-negative strides, not overlapping, that cover ``MIN_GROUP_COVERAGE`` of
    their span (the fused input projections' ``[qkv | z | b | a]`` column blocks: four strided
    copies per layer became one contiguous one). Every other output is a group of one."""
    by_storage: Dict[Tuple[int, torch.dtype], list] = {}
    for i, o in enumerate(outs):
        if o.numel() and all(s >= 0 for s in o.stride()):
            by_storage.setdefault((o.untyped_storage().data_ptr(), o.dtype), []).append(i)
    grouped = []
    for members in by_storage.values():
        if len(members) < 2:
            continue
        spans = sorted(_span(outs[i]) for i in members)
        lo, hi = spans[0][0], max(end for _, end in spans)
        # element counts, not spans: strided views interleave, so spans overlap by design
        covered = sum(outs[i].numel() for i in members)
        if covered > hi - lo or covered < MIN_GROUP_COVERAGE * (hi - lo):
            continue  # overlapping views, or a sparse cover
        grouped.append(tuple(members))
    alone = [(i,) for i in range(len(outs)) if not any(i in g for g in grouped)]
    return tuple(sorted(grouped + alone))


def _layout(outs: Sequence[torch.Tensor], groups) -> Tuple:
    """What a replay's output buffers must match: each output's dtype, shape and, for grouped ones,
    strides and offset in the group's span."""
    layout = []
    for g in groups:
        lo = min(_span(outs[i])[0] for i in g)
        layout.append(tuple((outs[i].dtype, tuple(outs[i].shape))
                            + ((tuple(outs[i].stride()), outs[i].storage_offset() - lo) if len(g) > 1 else ())
                            for i in g))
    return tuple(layout)


class _OutputBuffers:
    """The static outputs of one phase function and layout: a contiguous buffer per lone output;
    per group, one buffer holding the group's span, its outputs as views of it with the strides
    they had in the phase."""

    def __init__(self, warm: Sequence[torch.Tensor], groups) -> None:
        self.groups = groups
        self.spans = []  # per group: (lo, hi) in the warm-up storage, or None for a lone output
        self.buffers = []  # per group: the buffer copied into
        outputs: list = [None] * len(warm)
        for g in groups:
            if len(g) == 1:
                o = warm[g[0]]
                buf = torch.empty_like(o, memory_format=torch.contiguous_format)
                outputs[g[0]] = buf
                self.spans.append(None)
            else:
                lo = min(_span(warm[i])[0] for i in g)
                hi = max(_span(warm[i])[1] for i in g)
                buf = torch.empty(hi - lo, dtype=warm[g[0]].dtype, device=warm[g[0]].device)
                for i in g:
                    outputs[i] = buf.as_strided(warm[i].shape, warm[i].stride(), warm[i].storage_offset() - lo)
                self.spans.append((lo, hi))
            self.buffers.append(buf)
        self.outputs = tuple(outputs)

    def copy_from(self, result: Sequence[torch.Tensor]) -> None:
        """Inside the capture: the phase's results into the buffers (one copy per group)."""
        for g, span, buf in zip(self.groups, self.spans, self.buffers):
            if span is None:
                buf.copy_(result[g[0]])
            else:
                first = result[g[0]]
                lo = min(_span(result[i])[0] for i in g)
                buf.copy_(first.as_strided((span[1] - span[0],), (1,), lo))


class _Graph:
    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: Tuple[torch.Tensor, ...], output) -> None:
        self.graph = graph
        self.inputs = inputs
        self.output = output  # a tensor or a tuple of tensors, first dim the bucket size


def _holds(static: torch.Tensor, t: torch.Tensor) -> bool:
    """Whether ``t`` is the first rows of ``static`` (an adopted buffer fed its own rows)."""
    return t.data_ptr() == static.data_ptr() and t.stride() == static.stride()


def _fn_key(fn) -> Hashable:
    """A stable key for ``fn``: bound methods are new objects on every attribute access."""
    owner = getattr(fn, "__self__", None)
    return (id(owner), fn.__func__) if owner is not None else id(fn)


def _owner(fn):
    return getattr(fn, "__self__", fn)


def _rows(out, num_tokens: int):
    """The first ``num_tokens`` rows of a graph's output(s), as views of the shared buffers (no
    copy: one clone per output per layer was ~400 allocations and device copies per cached
    request, most of them host time). They hold until the next replay of the same phase."""
    if isinstance(out, torch.Tensor):
        return out[:num_tokens]
    return tuple(t[:num_tokens] for t in out)


class TokenGraphs:
    """Captured replays of row-wise phases ``fn(*tensors)`` (every input and output has the T
    tokens as its first dim) on one CUDA device."""

    def __init__(self, device: torch.device, buckets: Sequence[int] = DEFAULT_BUCKETS) -> None:
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        buckets = tuple(sorted(int(b) for b in buckets))
        if not buckets or buckets[0] < 1 or len(set(buckets)) != len(buckets):
            raise ValueError(f"buckets must be distinct positive token counts, got {buckets}")
        self.device = concrete_device(device)
        self.buckets = buckets
        self.pool = torch.cuda.graph_pool_handle()
        self._graphs: Dict[Hashable, _Graph] = {}
        # Static inputs shared by every graph of one phase function and shape (the same phase of
        # every layer): inputs are copied in right before each replay, and replays never overlap.
        self._inputs: Dict[Hashable, Tuple[torch.Tensor, ...]] = {}
        self._outputs: Dict[Hashable, _OutputBuffers] = {}  # per phase function, shapes and layout
        self._output_at: Dict[int, torch.Tensor] = {}  # every output buffer, by address (adoption)
        self._failed: Dict[Hashable, str] = {}  # phase -> why its capture failed
        self.num_captures = 0
        self.warmed: "weakref.WeakKeyDictionary[torch.nn.Module, set]" = weakref.WeakKeyDictionary()
        self._watched: set = set()  # ids of the owners whose death drops their graphs

    def failed(self, fn) -> Optional[str]:
        return self._failed.get(_fn_key(fn))

    def run(self, fn, *tensors: torch.Tensor):
        """``fn(*tensors)``, through a captured graph when the token count fits a bucket (then the
        outputs are views valid until the next replay of ``fn``'s phase at this bucket)."""
        num_tokens = tensors[0].shape[0]
        size = pick_bucket(self.buckets, num_tokens)
        fn_key = _fn_key(fn)
        if (size is None or fn_key in self._failed or torch.is_grad_enabled()
                or any(t.device != self.device or t.dim() == 0 or t.shape[0] != num_tokens for t in tensors)):
            return fn(*tensors)
        key = (fn_key, size, tuple((t.dtype, tuple(t.shape[1:])) for t in tensors))
        with torch.inference_mode():
            entry = self._graphs.get(key)
            if entry is None:
                entry = self._capture(fn, fn_key, size, tensors)
                if entry is None:
                    return fn(*tensors)
                self._graphs[key] = entry
            for static, t in zip(entry.inputs, tensors):
                if not _holds(static, t):  # an adopted buffer already holding t is not copied into
                    static[:num_tokens].copy_(t)
            entry.graph.replay()
            return _rows(entry.output, num_tokens)

    def _capture(self, fn, fn_key, size: int, tensors: Sequence[torch.Tensor]) -> Optional[_Graph]:
        # Static inputs hold the real rows of the first call (the warm-up runs on them); padding
        # rows start at zero and later hold stale rows, which row-wise phases never mix in.
        shapes = tuple((t.dtype, tuple(t.shape[1:])) for t in tensors)
        in_key = (getattr(fn, "__func__", fn_key), size, shapes)
        inputs = self._inputs.get(in_key)
        if inputs is None:
            inputs = self._inputs[in_key] = tuple(
                torch.zeros(size, *t.shape[1:], dtype=t.dtype, device=self.device) for t in tensors)
        adopted = [self._adoptable(t, size) for t in tensors]
        inputs = tuple(static if buf is None else buf for static, buf in zip(inputs, adopted))
        for static, t in zip(inputs, tensors):
            if not _holds(static, t):
                static[:t.shape[0]].copy_(t)
        # Warm up on a side stream (first-call work such as compilation or cuBLAS workspace
        # allocation must not land in the graph), then capture; both record the compiled glue
        # (hypic.ops.fused.recording_graph), so it compiles in the warm-up. The captured phase
        # copies its results into output buffers shared by every graph of the phase function and
        # shape (the same phase of every layer; each replay's rows are copied out before the next
        # replay), so a bucket costs one set of outputs, not one per layer; what the phase
        # allocates itself returns to the pool for the next capture.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with recording_graph(), torch.cuda.stream(side):
                for _ in range(2):
                    warm = fn(*inputs)
            torch.cuda.current_stream(self.device).wait_stream(side)
            single = isinstance(warm, torch.Tensor)
            warm = (warm,) if single else tuple(warm)
            if not all(isinstance(o, torch.Tensor) and o.dim() > 0 and o.shape[0] == size for o in warm):
                self._fail(fn, fn_key, "outputs are not tensors with one row per token")
                return None
            groups = _output_groups(warm)
            layout = _layout(warm, groups)
            out_key = (in_key, groups, layout)
            buffers = self._outputs.get(out_key)
            if buffers is None:
                buffers = self._outputs[out_key] = _OutputBuffers(warm, groups)
                self._output_at.update((o.data_ptr(), o) for o in buffers.outputs)
            outputs = buffers.outputs
            del warm
            graph = torch.cuda.CUDAGraph()
            with recording_graph(), torch.cuda.graph(graph, pool=self.pool):
                result = fn(*inputs)
                result = (result,) if isinstance(result, torch.Tensor) else tuple(result)
                # checked, not raised, inside the capture: a capture that raises can leave the
                # pool unusable (hypic.graphs.layer_graphs)
                moved = _layout(result, groups) != layout or any(
                    len({result[i].untyped_storage().data_ptr() for i in g}) > 1 for g in groups)
                if not moved:
                    buffers.copy_from(result)
                del result
        except Exception as err:  # noqa: BLE001 - any capture failure means "run eagerly"
            torch.cuda.current_stream(self.device).wait_stream(side)
            release_rng_after_failed_capture(self.device)
            self._fail(fn, fn_key, f"{type(err).__name__}: {err}")
            return None
        if moved:
            self._fail(fn, fn_key, "the captured call's outputs are laid out unlike the warm-up's")
            return None
        self.num_captures += 1
        self._watch(fn)
        return _Graph(graph, tuple(inputs), outputs[0] if single else outputs)

    def _adoptable(self, t: torch.Tensor, size: int) -> Optional[torch.Tensor]:
        """The output buffer whose first rows ``t`` is (an earlier phase's replay output at this
        bucket), else None. A phase captured over such an input reads that buffer in place
        instead of a static copy: the layer's residual from the previous layer's last phase,
        ``z`` / ``b, a`` / the attention gate from the layer's first phase. A later call whose
        input is that buffer's rows again (the same flow) skips the copy; any other input is
        copied into the buffer, whose own rows are then stale (its producer's output was not what
        came here), as the static copy would have been."""
        buf = self._output_at.get(t.data_ptr())
        if (buf is None or buf.shape[0] != size or buf.dtype != t.dtype or buf.shape[1:] != t.shape[1:]
                or buf.stride() != t.stride()):
            return None
        return buf

    def failures(self) -> Dict[Hashable, str]:
        """Why each phase that runs eagerly failed to capture (by phase key)."""
        return dict(self._failed)

    def _fail(self, fn, fn_key, why: str) -> None:
        # Watched like a captured phase: the entry must go with its layer, or a later layer
        # allocated at the same address would inherit it and never be captured.
        self._failed[fn_key] = why
        self._watch(fn)

    def _watch(self, fn) -> None:
        """Drop the graphs of ``fn``'s owner (a layer) when it is freed: a graph holds the
        addresses of that layer's weights, and a new object may later reuse its id."""
        owner = _owner(fn)
        if id(owner) in self._watched:
            return
        self._watched.add(id(owner))
        weakref.finalize(owner, self._forget, id(owner))

    def _forget(self, owner_id: int) -> None:
        self._watched.discard(owner_id)
        for key in [k for k in self._graphs if _owner_id(k[0]) == owner_id]:
            del self._graphs[key]
        for key in [k for k in self._failed if _owner_id(k) == owner_id]:
            del self._failed[key]
        if not self._graphs:
            # The pool died with its last graph (PyTorch frees a private pool when no graph uses
            # it; capturing into the old handle then fails inside the caching allocator, seen
            # when a second model was built after the first was freed): start a new one.
            self.pool = torch.cuda.graph_pool_handle()


def _owner_id(fn_key: Hashable) -> int:
    return fn_key[0] if isinstance(fn_key, tuple) else fn_key


_SHARED: Dict[torch.device, TokenGraphs] = {}


def make_token_graphs(device: torch.device) -> Optional[TokenGraphs]:
    """The process's :class:`TokenGraphs` for ``device`` when it is CUDA, else None. One per
    device: graphs are keyed by the layers they replay, so every runner of a model shares them
    (and their memory pool) instead of capturing its own."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    device = concrete_device(device)
    if device not in _SHARED:
        _SHARED[device] = TokenGraphs(device)
    return _SHARED[device]


__all__ = ["DEFAULT_BUCKETS", "TokenGraphs", "make_token_graphs", "pick_bucket"]
