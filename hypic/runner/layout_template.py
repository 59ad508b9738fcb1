"""Templates of a PIC forward's packed layout, one per batch *geometry*, so that a batch whose
geometry was seen before builds its layout without :func:`~hypic.runner.layout.build_fresh`'s
Python pass over every element.

Why: a cached request's host time before its first layer is pure GPU idle, and adds one for one
to TTFT. On the H200 host an all-hit 32k request (64 segments of 512 tokens and a query) had its
layout built 1.22 ms after planning; on a 2-core CPU (``benchmarks/pre_layer0_host_cpu.py``)
``build_layout`` took 0.72 ms of the 0.83 between them
(one Python pass over 129 elements, then ~20 tables expanded into the index buffer). Yet the
all-hit requests of one pool share almost all of it: a new order of the same segments and a new
query of the same length change only the live tokens, which entry sits where (its K/V and
summary addresses, its RoPE shift), never a span bound, a position, a key row or a chain.

A batch's *geometry* is, per request, each element's class, start and token count, which live
elements write and what kinds, the prefix checkpoints' lengths and the modes (``use_transition``,
``rerotate_keys``, ``need_logits``), plus the conv width and the device: everything
:func:`~hypic.runner.layout.build_fresh` reads but the token ids, the entries and the
writes' objects. Every index table but :data:`~hypic.runner.layout.REQUEST_TABLES` is a
function of it, and so is every host field of :class:`~hypic.runner.layout.PackedLayout` but
the entries, bodies, writes and what is read off the entries (their address tables, RoPE shifts
and K/V format). A template is a fresh build's host buffer and those fields; a build from it
copies the buffer, writes the request tables into the copy and moves it like a fresh one, so the
layout is the same, tensor for tensor (tests/engine/test_layout_template.py builds both).

A template whose entries read differently (an address table present in one and not the other,
another layer count: per entry, not geometry) is not used for that batch: it is built fresh.
Templates are made from a geometry's second fresh build (among the last :data:`SEEN_GEOMETRIES`
seen), as :class:`~hypic.graphs.layer_graphs.LayoutGraphs` keeps graphs: a RAG trace's requests
rarely repeat one, and copying each one's buffer would cost them host time for nothing.
"""

from __future__ import annotations

import struct
from array import array
from collections import OrderedDict
from itertools import chain, compress, repeat
from operator import attrgetter, is_, sub
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from hypic.runner.entry_tables import PointerRows, entry_tables, kv_pointers, summary_pointers
from hypic.runner.index_buffer import BufferLayout, check_out, new_host_buffer
from hypic.runner.layout import (
    HOST_TABLES,
    BodyElement,
    BufferFor,
    LiveElement,
    PackedLayout,
    RequestLayout,
    build_fresh,
    layout_signature,
    packed_layout,
)

MAX_TEMPLATES = 8  # geometries whose templates a LayoutTemplates keeps (least recently used dropped)
SEEN_GEOMETRIES = 32  # geometries it remembers having built once, to make a template at the second

# C-level attribute reads: a batch's scan maps them over its elements instead of a Python loop
_START = attrgetter("start")
_NUM_TOKENS = attrgetter("num_tokens")
_TOKEN_IDS = attrgetter("token_ids")
_WRITES = attrgetter("writes")
_ENTRY = attrgetter("entry")
_SEGMENT_START = attrgetter("segment_start")
_ORIGIN = attrgetter("origin_position")
_BODY_TOKENS = attrgetter("num_body_tokens")


def request_geometry(req: RequestLayout) -> Optional[Tuple[tuple, List[LiveElement]]]:
    """``(geometry key of the request, its live elements)``, or None when an element is of no
    known kind (the fresh build says what is wrong). The key holds each element's class, start
    and token count (starts and counts: a template only exists for a geometry a fresh build
    accepted, so a request matching one is valid as well), the kinds of the writes and which
    live elements make them, the prefix's lengths and the modes."""
    els = req.elements
    try:
        types = tuple(map(type, els))
        # starts and counts as one int64 string: hashed and compared as bytes, not as ~260 int
        # objects (the kept key's are cold in the caches by the next request)
        bounds = array("q", chain(map(_START, els), map(_NUM_TOKENS, els))).tobytes()
        live = list(compress(els, map(is_, types, repeat(LiveElement))))
        writes = list(map(_WRITES, live))
        if writes.count(()) == len(writes):
            kinds: tuple = ()
        else:
            # where a write's K/V (and a segment's parts) start picks its key and summary rows
            kinds = tuple((i, tuple((w.kind, w.first_position, w.low_rank) for w in ws))
                          for i, ws in enumerate(writes) if ws)
        prefix = tuple(map(_NUM_TOKENS, req.prefix))
    except (AttributeError, TypeError, OverflowError):  # no such element, a start that is no int64
        return None
    key = (types, bounds, kinds, prefix, req.use_transition, req.rerotate_keys, req.need_logits)
    return key, live


class _RequestPart:
    """What a template knows of one request of its batch: which elements are bodies, each body's
    token count, its prefix's length, and (index among its live elements, live span index, index
    among the element's writes) of each of its writes."""

    __slots__ = ("body_mask", "body_lengths", "num_prefix", "writes")

    def __init__(self, req: RequestLayout, b: int, first_span: int, layout: PackedLayout) -> None:
        types = [type(e) for e in req.elements]
        self.body_mask = tuple(t is BodyElement for t in types)
        self.body_lengths = [e.num_tokens for e in req.elements if type(e) is BodyElement]
        self.num_prefix = len(req.prefix)
        self.writes = []
        live_index = {}  # live span index -> index among this request's live elements
        span = first_span
        for e in req.elements:
            if type(e) is LiveElement:
                live_index[span] = len(live_index)
                span += 1
        previous, nth = None, 0
        for wb, s, _ in layout.writes:
            if wb == b:
                nth = nth + 1 if s == previous else 0
                previous = s
                self.writes.append((live_index[s], s, nth))


class LayoutTemplate:
    """One geometry's layout, less what depends on the batch's tokens and entries."""

    def __init__(self, requests: Sequence[RequestLayout], layout: PackedLayout, buffer) -> None:
        self.buffer_layout: BufferLayout = buffer.layout
        # the fresh build's host buffer: its request tables are rewritten in every copy
        self.image = buffer.host_tensor.numpy().copy()
        self.body_t_packed = layout.body_t_packed
        self.signature = layout_signature(buffer.signature(HOST_TABLES), layout.body_t_packed)
        self.parts = []
        first_span = 0
        for b, req in enumerate(requests):
            self.parts.append(_RequestPart(req, b, first_span, layout))
            first_span += sum(type(e) is LiveElement for e in req.elements)
        self.any_drop_transition = any(layout.body_drop_transition_host)
        # index of each body among the cached pieces (each request's prefix, then its bodies);
        # None: the pieces are the bodies, in order
        bodies: List[int] = []
        num_pieces = 0
        for part in self.parts:
            num_pieces += part.num_prefix
            bodies.extend(range(num_pieces, num_pieces + len(part.body_lengths)))
            num_pieces += len(part.body_lengths)
        self.body_pieces = None if bodies == list(range(num_pieces)) else bodies
        offset = self.buffer_layout.offset
        self.input_ids_at = offset("input_ids")
        self.cached_shift_at = offset("cached_shift")
        self.body_shape = None if layout.body_addresses is None else tuple(layout.body_addresses.shape)
        self.kv_shape = None if layout.kv_addresses is None else tuple(layout.kv_addresses.shape)
        self.body_addresses_at = None if self.body_shape is None else offset("body_addresses")
        self.kv_addresses_at = None if self.kv_shape is None else offset("kv_addresses")
        self.geometry = {name: getattr(layout, name) for name in _GEOMETRY_FIELDS}
        self.cache: dict = {}  # every build's PackedLayout.geometry_cache

    def build(self, requests: Sequence[RequestLayout], lives: Sequence[List[LiveElement]],
              device: torch.device, buffer_for: Optional[BufferFor]) -> Optional[PackedLayout]:
        """The layout of ``requests`` (of this template's geometry; ``lives``: each one's live
        elements), or None when their entries do not fit it (another address table)."""
        device = torch.device(device)
        pieces: list = []
        shifts: List[int] = []
        bodies: list = []
        body_entries: list = []
        tokens: list = []
        writes: list = []
        for b, (req, live, part) in enumerate(zip(requests, lives, self.parts)):
            body_els = list(compress(req.elements, part.body_mask))
            entries = list(map(_ENTRY, body_els))
            if list(map(_BODY_TOKENS, entries)) != part.body_lengths:
                return None  # the fresh build says which body does not fit its entry
            if part.num_prefix:
                pieces += req.prefix
                shifts += [0] * part.num_prefix
            pieces += entries
            body_entries += entries
            if req.rerotate_keys:
                shifts += map(sub, map(_SEGMENT_START, body_els), map(_ORIGIN, entries))
            else:
                shifts += [0] * len(entries)
            bodies += zip(repeat(b), body_els)
            tokens += map(_TOKEN_IDS, live)
            for i, s, nth in part.writes:
                writes.append((b, s, live[i].writes[nth]))
        piece_tables = entry_tables(pieces, device)
        if self.body_pieces is None:
            body_tables = piece_tables
        else:
            body_tables = [piece_tables[i] for i in self.body_pieces]
        body_addresses = None if self.any_drop_transition else summary_pointers(body_entries, body_tables)
        kv_addresses, kv_format = kv_pointers(pieces, piece_tables)
        if not (_fits(body_addresses, self.body_shape) and _fits(kv_addresses, self.kv_shape)):
            return None
        if body_addresses is not None and body_addresses.t_packed != self.body_t_packed:
            return None  # the bodies' T in another storage form: another signature

        host = new_host_buffer(self.buffer_layout.numel, device)
        buf = host.numpy()
        np.copyto(buf, self.image)
        flat = list(chain.from_iterable(tokens))
        struct.pack_into(f"{len(flat)}q", buf, 8 * self.input_ids_at, *flat)
        if shifts:
            struct.pack_into(f"{len(shifts)}q", buf, 8 * self.cached_shift_at, *shifts)
        if body_addresses is not None:
            _fill_stacked(buf, self.body_addresses_at, self.body_shape, body_addresses)
        if kv_addresses is not None:
            _fill_stacked(buf, self.kv_addresses_at, self.kv_shape, kv_addresses)
        signature = self.signature
        out = None if buffer_for is None else buffer_for(signature)
        check_out(out, self.buffer_layout.numel, device)
        cpu, dev, moved = self.buffer_layout.move(host, device, HOST_TABLES, out)
        g = self.geometry
        return packed_layout(
            dev, cpu, self.body_shape if body_addresses is not None else None,
            self.kv_shape if kv_addresses is not None else None,
            requests=list(requests),
            cu_live_host=list(g["cu_live_host"]),
            linear_one_run_per_request=g["linear_one_run_per_request"],
            bodies=bodies,
            body_drop_transition_host=list(g["body_drop_transition_host"]),
            body_t_packed=body_addresses is not None and self.body_t_packed,
            chain_has_prefix=list(g["chain_has_prefix"]),
            run_init=list(g["run_init"]),
            writes=writes,
            write_span_range=g["write_span_range"],
            write_spans_host=g["write_spans_host"],
            write_parts=list(g["write_parts"]),
            low_rank_writes=list(g["low_rank_writes"]),
            any_segment_write=g["any_segment_write"],
            num_checkpoint_records=g["num_checkpoint_records"],
            write_after_checkpoint_rows=list(g["write_after_checkpoint_rows"]),
            cu_keys_host=list(g["cu_keys_host"]),
            index_causal=g["index_causal"],
            keys_by_position=g["keys_by_position"],
            max_live_per_request=g["max_live_per_request"],
            max_keys_per_request=g["max_keys_per_request"],
            cached_pieces=pieces,
            any_rerotate=any(shifts),
            kv_format=kv_format,
            write_key_rows=list(g["write_key_rows"]),
            final_tail_slots=list(g["final_tail_slots"]),
            index_device=moved,
            index_signature=None if buffer_for is None else signature,
            geometry_cache=self.cache,
        )


# the host fields of a PackedLayout that are functions of its geometry (copied into each build:
# lists are copied, so that a caller changing one cannot change the template)
_GEOMETRY_FIELDS = (
    "cu_live_host", "linear_one_run_per_request", "body_drop_transition_host", "chain_has_prefix",
    "run_init", "write_span_range", "write_spans_host", "write_parts", "low_rank_writes", "any_segment_write",
    "num_checkpoint_records",
    "write_after_checkpoint_rows", "cu_keys_host", "index_causal", "keys_by_position",
    "max_live_per_request", "max_keys_per_request", "write_key_rows", "final_tail_slots",
)


def _fits(tables: Optional[PointerRows], shape: Optional[Tuple[int, int, int]]) -> bool:
    """Whether per-piece pointer tables (or None) make the template's ``[L, 2, N']`` table (or
    none): the same presence and layer count (the piece count is the geometry's)."""
    if tables is None or shape is None:
        return tables is None and shape is None
    return tables.width == shape[0] * 2


def _fill_stacked(buf: np.ndarray, at: int, shape: Tuple[int, int, int], tables: PointerRows) -> None:
    """Write the ``[L, 2, N']`` stack of N flat ``[L * 2]`` pointer tables at ``buf[at:]``, as
    :func:`~hypic.runner.layout._add_stacked` lays it (its padding columns are zeros in the
    template's buffer already)."""
    rows, padded = shape[0] * shape[1], shape[2]
    grid = buf[at:at + rows * padded].reshape(rows, padded)
    grid[:, :len(tables)] = tables.stacked().T


class LayoutTemplates:
    """The templates of the last :data:`MAX_TEMPLATES` geometries built twice (a runner keeps
    one): :meth:`build` is :func:`~hypic.runner.layout.build_layout` through them."""

    def __init__(self, max_templates: int = MAX_TEMPLATES, seen_geometries: int = SEEN_GEOMETRIES) -> None:
        if max_templates < 0 or seen_geometries < 0:
            raise ValueError("max_templates and seen_geometries must be >= 0")
        self.max_templates, self.seen_geometries = max_templates, seen_geometries
        self._templates: "OrderedDict[tuple, LayoutTemplate]" = OrderedDict()
        self._seen: "OrderedDict[tuple, None]" = OrderedDict()  # built once, newest last
        self.num_reused = 0  # builds from a template

    def __len__(self) -> int:
        return len(self._templates)

    def build(self, requests: Sequence[RequestLayout], conv_width: int, device: torch.device,
              buffer_for: Optional[BufferFor] = None) -> PackedLayout:
        scanned = [request_geometry(r) for r in requests]
        if not requests or any(s is None for s in scanned) or self.max_templates == 0:
            return build_fresh(requests, conv_width, device, buffer_for)[0]
        key = (conv_width, torch.device(device), tuple(k for k, _ in scanned))
        template = self._templates.get(key)
        if template is not None:
            self._templates.move_to_end(key)
            layout = template.build(requests, [live for _, live in scanned], device, buffer_for)
            if layout is not None:
                self.num_reused += 1
                return layout
            return build_fresh(requests, conv_width, device, buffer_for)[0]
        layout, buffer = build_fresh(requests, conv_width, device, buffer_for)
        if key in self._seen and _templatable(requests):
            del self._seen[key]
            self._templates[key] = LayoutTemplate(requests, layout, buffer)
            if len(self._templates) > self.max_templates:
                self._templates.popitem(last=False)
        else:
            self._seen[key] = None
            self._seen.move_to_end(key)
            if len(self._seen) > self.seen_geometries:
                self._seen.popitem(last=False)
        return layout


def _templatable(requests: Sequence[RequestLayout]) -> bool:
    """Whether every element is exactly a LiveElement or a BodyElement (a subclass would be read
    by the fresh build as its base class, and by a template as neither)."""
    return all(type(e) is LiveElement or type(e) is BodyElement for r in requests for e in r.elements)
