"""Executes PIC request plans on a model: the only place where layers meet the segment store.

``PicRunner.prefill(plans)`` does, for a batch of planned requests:

1. **standalone** cold segments (the ``standalone`` policy): every distinct one is prefilled alone
   at position 0, all of them in one varlen forward with attention local to each segment, which
   writes canonical store entries;
2. the main forward over the live tokens of every request (see :mod:`hypic.runner.pic_context`);
3. store writes (segment bodies, prefix-cache checkpoints) from what the layers recorded, and a
   :class:`~hypic.engine.context.SequenceCache` per request, after which it decodes like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from hypic.engine.context import AttentionLayerCache as DecodeAttentionCache
from hypic.engine.context import LinearLayerCache as DecodeLinearCache
from hypic.engine.context import PlainContext, SequenceCache
from hypic.graphs.cuda_graphs import make_token_graphs
from hypic.runner.entry_writer import entry_writer
from hypic.graphs.layer_graphs import FRESH_EAGER_LIVE_TOKENS, CudaGraphBackend, LayerReplays, LayoutGraphs
from hypic.runner.layout_pieces import ChunkWindow, clip_pieces, merge_live, split_at_checkpoints
from hypic.runner.layout_template import LayoutTemplates
from hypic.runner.pic_context import PicContext
from hypic.runner.segment_report import PhaseTimer
from hypic.runner.layout import (
    WRITE_SEGMENT,
    BodyElement,
    LiveElement,
    RequestLayout,
    Write,
    build_layout,
    make_body,
    make_live,
)
from hypic.models.config import LINEAR_ATTENTION, ModelSpec
from hypic.models.spec import TRANSITION_DENSE
from hypic.ops.linear.low_rank import low_rank_is_smaller
from hypic.pic.modes import COLD_CANONICAL
from hypic.pic.payload import SegmentEntry
from hypic.pic.plan import ENTRY_FROM_STANDALONE, RequestPlan, SpanKind
from hypic.pic.prefix import default_block_tokens
from hypic.pic.store import SegmentHandle, SegmentStore


@dataclass
class PrefillResult:
    logits: Optional[torch.Tensor]  # [vocab] at the last prompt token
    cache: SequenceCache
    live_tokens: int
    standalone_tokens: int


class PicRunner:
    """``enforce_eager``: no CUDA graphs (:mod:`hypic.graphs`); on a CPU device there are none
    either way."""

    def __init__(self, model: torch.nn.Module, spec: ModelSpec, store: Optional[SegmentStore],
                 device: torch.device, dtype: torch.dtype, *, enforce_eager: bool = False) -> None:
        self.model = model
        self.spec = spec
        self.store = store
        self.device = torch.device(device)
        self.dtype = dtype
        self.linear_layers = [i for i, t in enumerate(spec.layer_types) if t == LINEAR_ATTENTION]
        self.attention_layers = [i for i, t in enumerate(spec.layer_types) if t != LINEAR_ATTENTION]
        self.skipped_writes = 0  # cold segments not recorded because the store could not hold them
        self.graphs = None if enforce_eager else make_token_graphs(self.device)  # None on CPU
        self._replays: Optional[LayerReplays] = None  # the last forward's core graphs
        self.layout_graphs = LayoutGraphs()  # core graphs kept across forwards, by layout signature
        self.layout_templates = LayoutTemplates()  # layouts' index tables by batch geometry
        # Set by the engine when cold standalone segments are spread over several workers
        # (hypic.runner.segment_parallel); None: this runner prefills them all.
        self.segment_parallel = None
        self.last_standalone: Optional[PhaseTimer] = None  # the last standalone pass (the scatter phase)

    # ---------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture_graphs(self, max_tokens: int = 2048) -> int:
        """Capture the CUDA graphs of every row-wise phase for each bucket up to ``max_tokens``
        now (one dummy forward per bucket) instead of on first use inside a request, as vLLM does
        at start-up. Buckets already captured for this model are skipped. Returns the number of
        graphs the process holds; 0 without graphs (CPU, ``enforce_eager``)."""
        if self.graphs is None:
            return 0
        done = self.graphs.warmed.setdefault(self.model, set())
        for size in self.graphs.buckets:
            if size > max_tokens or size in done:
                continue
            cache = SequenceCache.allocate(self.spec, self.device, self.dtype)
            ctx = PlainContext(self.spec, [cache], [size])
            ctx.graphs = self.graphs
            self.model(torch.zeros(size, dtype=torch.long, device=self.device), ctx.positions, ctx)
            done.add(size)
        return self.graphs.num_captures

    @torch.inference_mode()
    def prefill(self, plans: Sequence[RequestPlan],
                windows: Optional[Sequence[Optional["ChunkWindow"]]] = None) -> List[PrefillResult]:
        """Prefill ``plans`` in one forward. ``windows[i]`` (a chunked prefill of a plain prompt:
        plan i's spans are its query alone) restricts plan i to the tokens ``[start, end)``, from
        ``resume`` (the request's cache after ``start`` tokens; None at the first chunk, which
        starts from the plan's prefix), writing the checkpoints in ``(start, end]``; its logits
        are None unless ``end`` is the prompt's end."""
        windows = [None] * len(plans) if windows is None else list(windows)
        if len(windows) != len(plans):
            raise ValueError(f"{len(windows)} windows for {len(plans)} plans")
        standalone = self._run_standalone(plans)
        try:
            budget = _WriteBudget(lambda: self._write_budget(sum(p.live_tokens for p in plans)),
                                  _writes_in_place(plans))
            canonical: Dict[object, Tuple[Tuple[int, ...], int]] = {}
            layouts = [self._request_layout(p, standalone, budget, canonical, w) for p, w in zip(plans, windows)]
            logits, caches, ctx = self._forward(layouts)
            self._write_entries(ctx)
            del ctx  # its records are written: free them before the canonical pass
            self._touch_prefix_chains(plans)
            if canonical:
                # Canonical entries of this batch's cold segments (``canonical`` policy): after
                # the requests' own exact forward, as the standalone policy would have made them.
                for entry in self._standalone_entries(canonical):
                    self.store.insert(entry, compact=False)
        finally:
            for h in standalone.values():
                h.release()
        out = []
        row = 0
        for i, (plan, layout) in enumerate(zip(plans, layouts)):
            sampled = None
            if layout.need_logits:
                sampled, row = logits[row], row + 1
            out.append(PrefillResult(
                logits=sampled, cache=caches[i], live_tokens=sum(e.num_tokens for e in layout.elements
                                                                 if isinstance(e, LiveElement)),
                standalone_tokens=plan.standalone_tokens,
            ))
        return out

    def _touch_prefix_chains(self, plans: Sequence[RequestPlan]) -> None:
        """Each request's prefix chain (what it found, then what it wrote) made the most recently
        used leaf first, so that the store evicts chains from their ends."""
        if self.store is None:
            return
        for plan in plans:
            if plan.checkpoints:
                keys = [h.key for h in plan.prefix_handles] + [c.key for c in plan.checkpoints]
                self.store.touch(keys[::-1])

    # ---------------------------------------------------------------------------------------------
    def _run_standalone(self, plans: Sequence[RequestPlan]) -> Dict[object, SegmentHandle]:
        """Prefill every distinct standalone segment alone at position 0 (one varlen forward)."""
        todo: Dict[object, Tuple[Tuple[int, ...], int]] = {}
        for plan in plans:
            if ENTRY_FROM_STANDALONE not in map(_ENTRY_SOURCE, plan.spans):  # one C-level pass
                continue
            for s in plan.spans:
                if s.kind is SpanKind.HIT and s.entry_source == ENTRY_FROM_STANDALONE and s.key not in todo:
                    todo[s.key] = (plan.prompt.segments[s.segment_index], s.body_start)
        return self.prefill_standalone(todo)

    @torch.inference_mode()
    def prefill_standalone(self, todo: Dict[object, Tuple[Tuple[int, ...], int]]) -> Dict[object, SegmentHandle]:
        """Canonical store entries of the segments ``todo`` (store key -> (tokens, body start)),
        each prefilled alone at position 0 (on the segment workers too, where the engine has
        them); returns their handles, acquired: the caller releases them. The standalone cold
        policy's first pass, run inside :meth:`prefill` or, for a prompt whose cold segments
        exceed a step's token budget, by the engine over several steps before the request's own
        forward."""
        if not todo:
            return {}
        if self.store is None:
            raise ValueError("the standalone cold policy needs a segment store")
        handles: Dict[object, SegmentHandle] = {}

        def run_here(share):
            for entries in self.standalone_entry_groups(share):
                for entry in entries:
                    handles[entry.key] = self.store.insert(entry, acquire=True, compact=False)

        def received(entries):  # views of one received buffer: the store compacts each
            for entry in entries:
                handles[entry.key] = self.store.insert(entry, acquire=True)

        timer = PhaseTimer(self.device)
        try:
            if self.segment_parallel is not None:
                self.segment_parallel.prefill(todo, run_here, received)
            else:
                run_here(todo)
        except BaseException:
            for h in handles.values():
                h.release()
            raise
        timer.stop()
        self.last_standalone = timer
        return handles

    @torch.inference_mode()
    def standalone_entry_groups(self, todo: Dict[object, Tuple[Tuple[int, ...], int]]) -> Iterator[List[SegmentEntry]]:
        """The canonical entries of ``todo``'s segments (each prefilled alone at position 0), one
        list per forward, in groups that fit the device (:meth:`_standalone_groups`); the store
        is left alone (the caller inserts them, or a segment worker sends them)."""
        for group in self._standalone_groups(todo):
            yield self._standalone_entries(group)

    def _standalone_groups(self, todo: Dict[object, Tuple[Tuple[int, ...], int]]):
        """``todo`` in groups whose records fit the device while they are made (one segment at
        least per group): the standalone pass records every segment it runs, and all of a
        128k-token prompt's at once would not fit beside the model on one GPU. Each group's room
        is asked (:func:`record_headroom_bytes`, with the activations of every segment still to
        run reserved) when the previous group's entries are in the store."""
        items = list(todo.items())
        while items:
            headroom = record_headroom_bytes(self.device, sum(len(seg) for _, (seg, _) in items))
            group: Dict[object, Tuple[Tuple[int, ...], int]] = {}
            for key, (seg, body_start) in items:
                need = self.entry_nbytes(len(seg) - body_start, checkpoint=False)
                if group and headroom is not None and need > headroom:
                    break
                if headroom is not None:
                    headroom -= need
                group[key] = (seg, body_start)
            items = items[len(group):]
            yield group

    def _standalone_entries(self, todo: Dict[object, Tuple[Tuple[int, ...], int]]) -> List[SegmentEntry]:
        """Canonical entries: each segment ``key -> (tokens, body_start)`` prefilled alone at
        position 0 from a zero state (one varlen forward), its body recorded."""
        layouts = []
        for key, (tokens, body_start) in todo.items():
            elems = []
            if body_start > 0:
                elems.append(LiveElement(tuple(tokens[:body_start]), 0))
            write = Write(WRITE_SEGMENT, key, 0, body_start, self._factored(len(tokens) - body_start))
            elems.append(LiveElement(tuple(tokens[body_start:]), body_start, (write,)))
            layouts.append(RequestLayout(tuple(elems), need_logits=False))
        _, _, ctx = self._forward(layouts, want_caches=False)
        return self._write_entries(ctx, insert=False)

    def _write_budget(self, num_live_tokens: int) -> Tuple[Optional[int], Optional[int]]:
        """``(entry bytes this forward may record, device bytes they may take at their peak)``:
        what the store can hold (device + host tier; None = unbounded), and on CUDA what the
        device can hold while they are made (:func:`record_headroom_bytes`; each write is
        charged its own peak, :meth:`_take_budget`)."""
        if self.store is None:
            return 0, 0
        budget = None
        if self.store.device_budget_bytes is not None:
            budget = self.store.device_budget_bytes + self.store.host_budget_bytes
        return budget, record_headroom_bytes(self.device, num_live_tokens, 1)

    def _factored(self, num_body_tokens: int) -> bool:
        """Whether a segment body of ``num_body_tokens`` is stored factored (:func:`factored_body`)."""
        return factored_body(self.spec, num_body_tokens)

    def entry_nbytes(self, num_body_tokens: int, checkpoint: bool) -> int:
        """Bytes of one store entry (:func:`entry_nbytes` of this runner's model and dtype)."""
        return entry_nbytes(self.spec, self.dtype, num_body_tokens, checkpoint)

    def default_prefix_block_tokens(self) -> int:
        """The prefix cache's spine spacing for this model and dtype
        (:func:`~hypic.pic.prefix.default_block_tokens`: a checkpoint costs at most its block's
        K/V)."""
        state = self.entry_nbytes(0, checkpoint=True)
        return default_block_tokens(state, self.entry_nbytes(1, checkpoint=True) - state)

    def _request_layout(self, plan: RequestPlan, standalone: Dict[object, SegmentHandle],
                        budget: "_WriteBudget", canonical: Dict[object, Tuple[Tuple[int, ...], int]],
                        window: Optional["ChunkWindow"] = None) -> RequestLayout:
        """``budget``: bytes of writes still allowed in this batch. Cold segments beyond it run
        live without being recorded: their entries could not stay in the store anyway, and
        recording them would hold their summaries in device memory until the forward ends (a
        checkpoint refused ends the request's checkpoints: a later one would continue a chain the
        store lacks). Under the ``canonical`` cold policy a cold segment runs live unrecorded and
        is added to ``canonical`` (key -> tokens, body start) for the standalone pass after the
        forward. ``window``: see :meth:`prefill`."""
        prompt = plan.prompt
        mode = plan.policy.mode
        segments, handles = prompt.segments, plan.handles
        # BodyElement, or [tokens, start, writes, whether it is a written segment's body] of a live run
        pieces: List[object] = []
        for s in plan.spans:
            kind = s.kind
            if kind is SpanKind.HIT:  # most spans of a cached request: its own short path
                start = s.start
                if s.live_end > 0:
                    pieces.append([tuple(segments[s.segment_index][: s.live_end]), start, (), False])
                handle = standalone[s.key] if s.entry_source == ENTRY_FROM_STANDALONE else handles[s.entry_index]
                pieces.append(make_body(handle.entry, start + s.body_start, s.num_tokens - s.body_start, start))
                continue
            source = prompt.query if kind is SpanKind.QUERY else segments[s.segment_index]
            tokens = tuple(source[s.offset: s.offset + s.num_tokens])
            if kind is SpanKind.MISS and s.writes_entry and self._take_budget(budget, s.num_tokens - s.body_start,
                                                                              checkpoint=False):
                if plan.policy.cold_policy == COLD_CANONICAL:
                    canonical[s.key] = (tokens, s.body_start)
                    pieces.append([tokens, s.start, (), False])
                    continue
                if s.body_start > 0:
                    pieces.append([tokens[: s.body_start], s.start, (), False])
                body = s.start + s.body_start
                write = Write(WRITE_SEGMENT, s.key, s.start, body, self._factored(s.num_tokens - s.body_start))
                pieces.append([tokens[s.body_start:], body, (write,), True])
            else:  # MISS that writes nothing, or the query
                pieces.append([tokens, s.start, (), False])
        checkpoints = plan.checkpoints
        need_logits = True
        if window is not None:
            pieces = clip_pieces(pieces, window.start, window.end)
            checkpoints = [c for c in checkpoints if window.start < c.position <= window.end]
            need_logits = window.end == prompt.num_tokens
        if window is not None and window.resume is not None:
            prefix = (window.resume,)  # a later chunk: the plan's prefix is in the request's cache
        else:
            prefix = tuple(h.entry for h in plan.prefix_handles)
        taken = []
        for c in checkpoints:
            if not self._take_budget(budget, c.position - c.kv_start, checkpoint=True):
                break
            taken.append(c)
        pieces = merge_live(split_at_checkpoints(pieces, taken))
        elems = [p if isinstance(p, BodyElement) else make_live(p[0], p[1], p[2]) for p in pieces]
        return RequestLayout(tuple(elems), prefix, use_transition=mode.use_transition,
                             rerotate_keys=mode.rerotate_keys, need_logits=need_logits)

    def _take_budget(self, budget: "_WriteBudget", num_tokens: int, checkpoint: bool) -> bool:
        """Whether a write of ``num_tokens`` fits what ``budget`` has left (then charged): its
        entry's bytes in the store, and on the device its peak, once for a segment summary a
        cold forward writes in place, :data:`RECORD_PEAK_FACTOR` times for what is copied from
        the forward's records (a checkpoint's states, any write of a forward with cached
        bodies)."""
        store_left, device_left = budget.remaining()
        need = self.entry_nbytes(num_tokens, checkpoint)
        peak = need * (IN_PLACE_PEAK_FACTOR if budget.in_place and not checkpoint else RECORD_PEAK_FACTOR)
        if (store_left is not None and need > store_left) or (device_left is not None and peak > device_left):
            self.skipped_writes += 1
            return False
        budget.left = (None if store_left is None else store_left - need,
                       None if device_left is None else device_left - peak)
        return True

    # ---------------------------------------------------------------------------------------------
    def _forward(self, layouts: Sequence[RequestLayout], want_caches: bool = True):
        # a family without a conv records no tails: width 1 leaves W - 1 = 0 tail rows
        width = max(self.spec.conv_kernel_size, 1)
        layout = build_layout(layouts, width, self.device,
                              buffer_for=self.layout_graphs.buffer_for if self._core_graphs_on() else None,
                              templates=self.layout_templates)
        ctx = PicContext(self.spec, layout)
        ctx.graphs = self.graphs
        ctx.replays = self._layer_replays(layout)
        ctx.writer = entry_writer(layout, self.linear_layers, self.attention_layers, self.device)
        logits = self.model(layout.input_ids, layout.positions, ctx)
        caches = self._decode_caches(ctx) if want_caches else []
        return logits, caches, ctx

    def _core_graphs_on(self) -> bool:
        return self.graphs is not None

    def _replays_backend(self):
        return CudaGraphBackend(self.device, self.graphs.pool)

    def _max_core_graph_tokens(self) -> int:
        return self.graphs.buckets[-1]

    def _layer_replays(self, layout) -> Optional[LayerReplays]:
        """Graphs of the linear layers' cores (:mod:`hypic.graphs.layer_graphs`) for a forward
        whose live tokens fit the row-wise graphs' largest bucket (a cached request: above it,
        kernels are long enough that launching them costs little), else None: for a forward
        that writes nothing, those of an earlier forward of the same layout signature when they
        are kept (:class:`LayoutGraphs`), else new ones, or none for a GPU-bound one
        (:data:`~hypic.graphs.layer_graphs.FRESH_EAGER_LIVE_TOKENS`); for one that writes (a
        cached request with missed segments), new ones, never kept. Graphs are dropped here,
        when the next forward starts, not when their forward returned with its replays possibly
        still queued."""
        self._replays = None
        if (not self._core_graphs_on() or layout.linear_one_run_per_request
                or layout.input_ids.shape[0] > self._max_core_graph_tokens()):
            return None
        if layout.writes:
            # per forward only: what its cores read besides the layout's tables (the written
            # spans' rows, hypic/ops/linear/_fla_chain.py) is not in the layout's signature
            self._replays = LayerReplays(self._replays_backend())
        else:
            replays = self.layout_graphs.replays_for(layout, lambda: LayerReplays(self._replays_backend()))
            # graphs that die with this forward: not for a GPU-bound one
            if (not self.layout_graphs.keeps(layout)
                    and layout.cu_live_host[-1] >= FRESH_EAGER_LIVE_TOKENS):
                return None
            self._replays = replays
        self._replays.holder = layout
        return self._replays

    def _decode_caches(self, ctx: PicContext) -> List[SequenceCache]:
        lay = ctx.layout
        cu_keys = lay.cu_keys_host
        # a kept index buffer is rewritten by the next forward of its signature: the decode
        # caches hold a copy of the key positions instead (one for every layer)
        positions_k = lay.positions_k.clone() if self.layout_graphs.keeps(lay) else lay.positions_k
        out = []
        for b, req in enumerate(lay.requests):
            layers = []
            num_tokens = req.num_tokens  # a sum over the request's elements: once, not per layer
            for i, kind in enumerate(self.spec.layer_types):
                rec = ctx.records[i]
                if kind == LINEAR_ATTENTION:
                    tail = None if rec.tails is None else _own_row(rec.tails, lay.final_tail_slots[b])
                    cache = DecodeLinearCache(_own_row(rec.final_states, b), tail)
                    cache.num_tokens = num_tokens
                elif len(lay.requests) == 1:  # the record is this sequence's alone: no copy
                    cache = DecodeAttentionCache.adopt(rec.keys, rec.values, positions_k)
                else:
                    cache = DecodeAttentionCache(self.spec.num_key_value_heads, self.spec.head_dim,
                                                 rec.keys.dtype, rec.keys.device)
                    a, z = cu_keys[b], cu_keys[b + 1]
                    cache.append(rec.keys[a:z], rec.values[a:z], lay.positions_k[a:z])
                layers.append(cache)
            out.append(SequenceCache(layers))
        return out

    def _write_entries(self, ctx: PicContext, insert: bool = True) -> List[SegmentEntry]:
        """The forward's store entries (:class:`~hypic.runner.entry_writer.EntryWriter`: their
        tensors filled from the layers' records, or written by the ops in place), inserted into
        the store unless ``insert`` is False."""
        entries = ctx.writer.finish() if ctx.writer is not None else []
        if insert and self.store is not None:
            for e in entries:
                self.store.insert(e, compact=False)  # fresh exact-size copies, already on the device
        return entries


_ENTRY_SOURCE = attrgetter("entry_source")


class _WriteBudget:
    """``(entry bytes, device peak bytes)`` one batch may still record (None: unbounded), asked
    (``ask``) at the first write the batch considers: a cached request, which writes nothing,
    does not query the device's free memory. ``in_place``: the batch's segment summaries are
    written in place (:func:`_writes_in_place`)."""

    __slots__ = ("_ask", "_asked", "left", "in_place")

    def __init__(self, ask, in_place: bool = False) -> None:
        self._ask = ask
        self._asked = False
        self.left: Tuple[Optional[int], Optional[int]] = (None, None)
        self.in_place = in_place

    def remaining(self) -> Tuple[Optional[int], Optional[int]]:
        if not self._asked:
            self.left, self._asked = self._ask(), True
        return self.left


# Device memory a forward needs per live token besides its records (activations: the MoE's
# gathered rows and intermediates, projections, fla's chunk states; ~200 KiB per token at
# Qwen3.5-35B-A3B widths by their shapes), and a write's peak multiple of its entry bytes: the
# forward's record (a view of the layer's summaries can keep every span's alive, ~2x) and then
# the entry's compact copy.
ACTIVATION_BYTES_PER_LIVE_TOKEN = 256 << 10
RECORD_PEAK_FACTOR = 3
# The same multiple for a forward whose writes go in place (_writes_in_place): its linear layers
# write T and S straight into the entries' rows (hypic/runner/entry_writer.py, summary_targets),
# and its attention layers' K/V are copied once, after the forward, from the records the forward
# keeps anyway. On the H200, a 128k-token prompt in 512-token segments (256 entries, 34 GB; a
# 40 GiB store, ~71 GB free beside the model): under the multiple 3 its cold forward could record
# ~90 of them, and after the warm-up requests the all-hit ones still left 0.93 of their tokens
# cached and took 1,001 ms; under 1 every entry was recorded, with no out-of-memory, and they
# took 189 ms.
IN_PLACE_PEAK_FACTOR = 1


def _writes_in_place(plans: Sequence[RequestPlan]) -> bool:
    """Whether a forward of ``plans`` writes its segment entries' summaries in place: no cached
    body in the batch, every span a miss or the query (the conditions of
    :meth:`EntryWriter.summary_targets` and of the linear layers that take them,
    hypic/runner/pic_context.py); prefix-cache checkpoints are copied, and they are small beside
    the segment summaries (a state per linear layer against a state and a K x K transition)."""
    for plan in plans:
        if any(s.kind not in (SpanKind.MISS, SpanKind.QUERY) for s in plan.spans):
            return False
    return True


def factored_body(spec: ModelSpec, num_body_tokens: int) -> bool:
    """Whether a segment body of ``num_body_tokens`` is stored factored (T = gamma I - P^T Q, S =
    P^T R: :mod:`hypic.ops.linear.low_rank`): only a dense T has the low-rank form, and only
    where it holds fewer numbers (:func:`~hypic.ops.linear.low_rank.low_rank_is_smaller`)."""
    return spec.linear_transition == TRANSITION_DENSE and low_rank_is_smaller(
        num_body_tokens, spec.linear_key_head_dim, spec.linear_value_head_dim)


def entry_nbytes(spec: ModelSpec, dtype: torch.dtype, num_body_tokens: int, checkpoint: bool) -> int:
    """Bytes of one store entry of a model run in ``dtype``: per linear layer the fp32 summary (S,
    and T in its family's structure, or a short dense body's factors; a checkpoint holds S only)
    and conv tail (``ModelSpec.linear_entry_words``), per attention layer the body's K and V.
    Needs only the model's config, so a benchmark can size a store before any weights exist."""
    state_bytes = 8 if dtype == torch.float64 else 4
    linear = spec.linear_entry_words(checkpoint)
    if not checkpoint and factored_body(spec, num_body_tokens):
        hv, k, v = spec.linear_num_value_heads, spec.linear_key_head_dim, spec.linear_value_head_dim
        linear += hv * (num_body_tokens * (2 * k + v) + 1) - hv * k * (k + v)
    attention = 2 * num_body_tokens * spec.num_key_value_heads * spec.head_dim
    elem = torch.empty(0, dtype=dtype).element_size()
    num_linear = sum(1 for t in spec.layer_types if t == LINEAR_ATTENTION)
    num_attention = len(spec.layer_types) - num_linear
    return num_linear * linear * state_bytes + num_attention * attention * elem


def device_free_bytes(device: torch.device) -> Optional[int]:
    """Bytes the caching allocator could still hand out on a CUDA device (the driver's free memory
    plus what the allocator holds unused); None elsewhere."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def record_headroom_bytes(device: torch.device, num_live_tokens: int,
                          peak_factor: int = RECORD_PEAK_FACTOR) -> Optional[int]:
    """Entry bytes a forward of ``num_live_tokens`` can record without running the device out of
    memory; None when the device does not say (CPU). The store's own budget does not bound this:
    a write exists up to ``peak_factor`` times at its peak (3 when its rows are copied from the
    forward's records, 1 when written in place) and the forward's activations come on top, so on
    the H200 a cold 128k-token prompt in 512-token segments ran out of memory under a 20 GiB
    store with the model's 69 GB resident.
    Writes beyond it run live, unrecorded, as writes beyond the store's budget do."""
    if peak_factor < 1:
        raise ValueError(f"peak_factor must be >= 1, got {peak_factor}")
    free = device_free_bytes(device)
    if free is None:
        return None
    return max(0, (free - ACTIVATION_BYTES_PER_LIVE_TOKEN * num_live_tokens) // peak_factor)


def _own_row(t: torch.Tensor, i: int) -> torch.Tensor:
    """Row ``i`` of a record for a decode cache: a copy when the record holds other rows (the
    cache must not keep them alive), else the row itself (one copy per layer saved on the common
    single-request, nothing-written forward)."""
    return t[i] if t.shape[0] == 1 else t[i].clone()
