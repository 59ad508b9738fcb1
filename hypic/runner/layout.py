"""The packed layout of one PIC forward: which tokens are live, and how each request's chain of
live spans and cached bodies fits together (architecture.md section 2).

A request becomes a chain of *elements* in prompt order:

* :class:`LiveElement` - tokens computed in this forward (a HIT's seam window, a MISS, the query);
  it may carry :class:`Write` s: record what the store needs at its end (a segment body entry,
  prefix-cache checkpoints; a segment's body may end where a checkpoint goes).
* :class:`BodyElement` - a reused body from a store entry (per linear layer its summary and conv
  tail, per full-attention layer its K/V).

plus the prefix-cache checkpoints the request resumes from (their K/V, and the last one's linear
and conv states as the starting point), or, for a later chunk of a chunked prefill, the request's
own cache so far in the same form.

:func:`build_layout` turns the requests of a batch into index tensors, computed once per batch on
the host; every layer then works with batched tensor ops only (no Python loop per head). The
cached pieces' K/V and linear summaries are read in place through per-layer address tables built
here; only where a piece cannot be read so (another device or dtype, not contiguous) does a layer
loop over the pieces to concatenate them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from hypic.runner.index_buffer import ALIGN_INT64, IndexBuffer
from hypic.runner.entry_tables import PointerRows, entry_tables, kv_pointers, summary_pointers
from hypic.ops.kv_gather import PieceFormat, PieceTable
from hypic.pic.frozen import frozen_constructor
from hypic.pic.keys import StoreKey
from hypic.pic.payload import SegmentEntry

WRITE_SEGMENT = "segment"
WRITE_CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class Write:
    """Store write recorded at the end of a live element: ``kind`` is ``segment`` (a body entry:
    the element's zero-start summary, its conv tail, its K/V) or ``checkpoint`` (prefix cache: the
    running state and conv state at the element's end, and the K/V of the positions from
    ``origin_position`` to there, which may begin before the element, in the prefix)."""

    kind: str
    key: StoreKey
    # segment: absolute position of the segment's first token in this forward (what its K's
    # RoPE is relative to); checkpoint: the first position of its K/V
    origin_position: int
    # the first position of what the entry holds (its K/V; a segment's summary too): a segment's
    # body may span several live elements (a checkpoint falls inside it), whose summaries the
    # entry writer composes; None: the element's own start
    first_position: Optional[int] = None
    # a segment whose body is stored factored (hypic.ops.linear.low_rank: short bodies), formed
    # from the body's token rows instead of the linear op's dense summaries
    low_rank: bool = False


@dataclass(frozen=True)
class LiveElement:
    token_ids: Tuple[int, ...]
    start: int  # absolute position of the first token
    writes: Tuple[Write, ...] = ()  # at most one segment write

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class BodyElement:
    entry: SegmentEntry
    start: int  # absolute position of the body's first token in this request
    num_tokens: int
    segment_start: int  # absolute position of the segment's first token in this request


# LiveElement(...) / BodyElement(...) with every field given, ~0.2 us less each (hypic.pic.frozen):
# an all-hit 64-segment request makes 129 elements
make_live = frozen_constructor(LiveElement)
make_body = frozen_constructor(BodyElement)


@dataclass(frozen=True)
class RequestLayout:
    """One request of a PIC forward. ``elements`` are contiguous in positions, starting right after
    the prefix; the last one must be live (its last token's logits are sampled)."""

    elements: Tuple[object, ...]
    prefix: Tuple[SegmentEntry, ...] = ()  # prefix_cache checkpoints, root first
    use_transition: bool = True  # False: `addition` mode (T of cached bodies dropped)
    rerotate_keys: bool = True  # move cached K to its new positions
    need_logits: bool = True

    @property
    def prefix_tokens(self) -> int:
        return sum(e.num_tokens for e in self.prefix)

    @property
    def num_tokens(self) -> int:
        return self.prefix_tokens + sum(e.num_tokens for e in self.elements)


@dataclass
class PackedLayout:
    """Index tensors of a batch (all on ``device``)."""

    requests: List[RequestLayout]
    input_ids: torch.Tensor  # [T] live tokens, request after request
    positions: torch.Tensor  # [T]
    cu_live_per_request: torch.Tensor  # [B+1] live tokens of each request
    cu_live_per_request_cpu: torch.Tensor  # host copy
    cu_live_host: List[int]  # the same as a list (the attention op's kernel choice reads it)
    # No cached body and no write in the batch: each request's live tokens are one run from its
    # prefix state (or zero), so the linear layers need no summaries and no chain scan.
    linear_one_run_per_request: bool
    cu_spans: torch.Tensor  # [S+1] live elements
    cu_spans_cpu: torch.Tensor  # host copy: fla reads lengths from it instead of the device
    # chain of every request: live elements and bodies in prompt order
    cu_chains: torch.Tensor  # [B+1]
    chain_source: torch.Tensor  # [M] int64 per chain element: live span s -> s, body b -> -b - 1
    bodies: List[Tuple[int, BodyElement]]  # (request, body) in body-summary order
    body_drop_transition_host: List[bool]  # per body: `addition` mode drops its T
    # [L, 2, NB'] int64 on the device: per layer, the data pointers of each body's T and S where
    # the store holds them (the GPU scan reads them in place; NB' = NB rounded up to even, zeros
    # after); None when some body's summaries cannot be read so (not fp32 on the device,
    # `addition` mode, or bodies whose T differ in storage form): they are concatenated then.
    body_addresses: Optional[torch.Tensor]
    # whether body_addresses point at T stored as bf16 planes (hypic.ops.linear.t_planes); part
    # of index_signature, since the walk graphs kept for a signature read T in one form
    body_t_packed: bool
    chain_has_prefix: List[bool]
    # conv runs: maximal runs of consecutive live elements of one request
    cu_runs: torch.Tensor  # [R+1]
    cu_runs_cpu: torch.Tensor  # host copy
    run_init: List[Tuple[str, int]]  # ("zero", -1) | ("body", body index) | ("prefix", request)
    tail_index: torch.Tensor  # [NT * (W-1)] rows of cat(x [T], run inits [R*(W-1)])
    # tails recorded: per write (in `writes` order) then per request's final conv state
    writes: List[Tuple[int, int, Write]]  # (request, live element index S, write)
    # the segment writes, the only ones that read their spans' summaries, in `writes` order:
    # each its live elements (one, or the parts of a body that checkpoints cut), in order
    write_spans: torch.Tensor  # [NS] live element index of each part of each segment write
    write_parts: List[int]  # per segment write, how many of those it has
    # host: (a, b) when the segment writes are live elements a..b-1 in order (their summaries are
    # then a slice of every live span's, not a gathered copy), else None
    write_span_range: Optional[Tuple[int, int]]
    # host: the same span indices, for ops that select the written spans' rows on the host
    write_spans_host: Tuple[int, ...]
    # host: whether some write is a segment's with a dense summary
    any_segment_write: bool
    # the factored segment writes: (index in `writes`, first and end packed live row of its body)
    low_rank_writes: List[Tuple[int, int, int]]
    # The states checkpoints store, as the chain walk records them
    # (gated_delta_chain_forward_and_summarize): per chain element its row among those (-1: not
    # kept), their count, and per write the row holding the state after it (-1: its request's
    # final state, None: a segment write, which needs no state).
    checkpoint_record_rows: torch.Tensor  # [M]
    num_checkpoint_records: int
    write_after_checkpoint_rows: List[Optional[int]]
    # attention keys per request: cat(live k [T], cached k [C]) gathered by key_index
    key_index: torch.Tensor  # [Tk]
    positions_k: torch.Tensor  # [Tk]
    cu_keys: torch.Tensor  # [B+1]
    cu_keys_host: List[int]
    # No cached rows at all: each request's keys are its live tokens at positions 0..n-1 in order
    # and its queries are those same tokens, so causal by index equals causal by position.
    index_causal: bool
    # Each request's keys are its positions 0..Lk-1 in order: checkpoints are laid root first from
    # 0 and every element must start where the previous one ended (checked in build_layout).
    keys_by_position: bool
    max_live_per_request: int
    max_keys_per_request: int
    cached_pieces: List[SegmentEntry]  # entries whose K/V rows follow the live rows, in order
    cu_cached: torch.Tensor  # [P+1] piece p is cached rows [cu_cached[p], cu_cached[p+1])
    cached_shift: torch.Tensor  # [P] RoPE shift of each piece's rows, in positions (0 = keep)
    any_rerotate: bool
    # [L, 2, P'] int64 on the device: per layer, the data pointers of each piece's K and V where
    # the store holds them (the K/V gather reads them in place; P' = P rounded up to even, zeros
    # after), every piece of `kv_format`; None when some piece cannot be read so (then the
    # gather concatenates them).
    kv_addresses: Optional[torch.Tensor]
    kv_format: Optional[PieceFormat]
    logits_rows: torch.Tensor  # [B'] packed row of each request's last token (need_logits only)
    write_key_rows: List[Tuple[int, int]]  # per write: its rows [a, b) in the packed keys
    final_tail_slots: List[int]  # per request: index of its final conv state among the tails
    # The one device tensor every index table above is a view of, and what another layout's must
    # share for its views to stand for this one's (IndexBuffer.signature: every table's size,
    # and the values of the tables read on the host; None unless build_layout was given
    # buffer_for): the engine keeps CUDA graphs of a layout's cores and replays them for a later
    # layout of the same signature copied into this buffer.
    index_device: Optional[torch.Tensor] = None
    index_signature: Optional[tuple] = None
    # Values computed from the geometry's tables alone (the RoPE tables at ``positions``,
    # PicContext.rope_cos_sin), shared by every layout built from one template
    # (hypic/runner/layout_template.py) and kept with it; None for a layout built fresh.
    geometry_cache: Optional[dict] = None

    def piece_table(self, layer_idx: int) -> Optional[PieceTable]:
        """The cached pieces of attention layer ``layer_idx`` as the K/V gather reads them in
        place, or None (no address table, or a layer past it)."""
        if self.kv_addresses is None or self.kv_format is None or layer_idx >= self.kv_addresses.shape[0]:
            return None
        return PieceTable(self.kv_addresses[layer_idx], self.kv_format)


# the tables read on the host (each a list of ints): also the ones a layout's signature holds
HOST_TABLES = ("cu_live_per_request", "cu_spans", "cu_runs")
# the PackedLayout fields that are the index buffer's device tables, by the same name
DEVICE_TABLES = ("input_ids", "positions", "cu_live_per_request", "cu_spans", "cu_chains", "chain_source",
                 "cu_runs", "tail_index", "write_spans", "checkpoint_record_rows", "key_index", "positions_k",
                 "cu_keys", "cu_cached", "cached_shift", "logits_rows")


def packed_layout(dev: Dict[str, torch.Tensor], cpu: Dict[str, torch.Tensor],
                  body_shape: Optional[Tuple[int, int, int]], kv_shape: Optional[Tuple[int, int, int]],
                  **fields) -> PackedLayout:
    """A :class:`PackedLayout` over an index buffer's device tables ``dev`` and host copies ``cpu``
    (of :data:`HOST_TABLES`, as ``<name>_cpu``), the stacked address tables viewed in their shapes
    (None: absent), and the remaining fields: the one constructor of :func:`build_fresh` and of
    the layout templates (hypic.runner.layout_template)."""
    return PackedLayout(
        **{name: dev[name] for name in DEVICE_TABLES},
        **{name + "_cpu": cpu[name] for name in HOST_TABLES},
        body_addresses=None if body_shape is None else dev["body_addresses"].view(body_shape),
        kv_addresses=None if kv_shape is None else dev["kv_addresses"].view(kv_shape),
        **fields,
    )


# the tables whose values depend on more than the batch's geometry (its element kinds, starts
# and lengths, writes' kinds, prefix lengths, modes): every other table is the same for every
# batch of one geometry (what a layout template reuses, hypic/runner/layout_template.py)
REQUEST_TABLES = ("input_ids", "cached_shift", "body_addresses", "kv_addresses")

BufferFor = Callable[[tuple], Optional[torch.Tensor]]


def layout_signature(buffer_signature: tuple, body_t_packed: bool) -> tuple:
    """A layout's :attr:`PackedLayout.index_signature`: its index buffer's signature and the
    storage form of its bodies' T (a kept graph's walk reads T in the form it was captured
    with: ``T_PACKED`` is compiled in)."""
    return buffer_signature, bool(body_t_packed)


def build_layout(requests: Sequence[RequestLayout], conv_width: int, device: torch.device,
                 buffer_for: Optional[BufferFor] = None, templates=None) -> PackedLayout:
    """The packed layout of ``requests``. ``buffer_for(signature)``: a device tensor of an earlier
    layout with that :attr:`PackedLayout.index_signature` to copy this one's tables into (so
    that graphs captured over the earlier one read this one's), or None for a new tensor.
    ``templates``: a :class:`~hypic.runner.layout_template.LayoutTemplates` that builds the
    layout from a template of the batch's geometry when it holds one (the same layout, for less
    host time), or None."""
    if not requests:
        raise ValueError("a PIC forward needs at least one request")
    if templates is not None:
        return templates.build(requests, conv_width, device, buffer_for)
    return build_fresh(requests, conv_width, device, buffer_for)[0]


def build_fresh(requests: Sequence[RequestLayout], conv_width: int, device: torch.device,
                buffer_for: Optional[BufferFor] = None) -> Tuple[PackedLayout, IndexBuffer]:
    """:func:`build_layout` without a template: the layout, and the finished buffer of its tables
    (what a template is made from)."""
    if not requests:
        raise ValueError("a PIC forward needs at least one request")
    w1 = conv_width - 1
    # One Python pass per element (none per token): index lists that are runs of consecutive ints
    # are kept as (start, length) and expanded by numpy straight into the host buffer.
    live_tokens: List[Tuple[int, ...]] = []  # token ids of each live element
    live_positions: List[int] = []  # position of each live element's first token
    live_lengths: List[int] = []
    # key pieces (a request's prefix checkpoints, then its elements): first row of each in
    # cat(live rows, cached rows), the cached ones counted from 0 here (past the live rows at
    # the end, when their count is known), and length
    piece_rows: List[int] = []
    piece_cached: List[bool] = []
    piece_lengths: List[int] = []
    cu_req = [0]
    cu_spans = [0]
    cu_chains = [0]
    chain_source: List[int] = []  # live span s -> s, body b -> -b - 1
    bodies: List[Tuple[int, BodyElement]] = []
    body_pieces: List[int] = []  # index of each body among the cached pieces
    drop_t: List[bool] = []
    runs: List[List[int]] = []  # [first live token, num tokens]
    run_init: List[Tuple[str, int]] = []
    tail_ends: List[Tuple[int, int]] = []  # (run index, run-local end) of each recorded tail
    writes: List[Tuple[int, int, Write]] = []
    segment_write_spans: List[int] = []  # the live elements of each (dense) segment write, in order
    write_parts: List[int] = []
    low_rank_writes: List[Tuple[int, int, int]] = []
    write_chain_pos: List[int] = []
    write_key_rows: List[Tuple[int, int]] = []
    cu_keys = [0]
    cached_pieces: List[SegmentEntry] = []
    cu_cached = [0]
    cached_shift: List[int] = []
    logits_rows: List[int] = []
    final_tail_ends: List[Tuple[int, int]] = []  # per request: (run index, run-local end) of its last run

    cached_count = 0
    num_live = 0  # live tokens so far
    num_keys = 0  # keys so far

    for b, req in enumerate(requests):
        if not req.elements or not isinstance(req.elements[-1], LiveElement):
            raise ValueError(f"request {b}: the last element must be live (the query)")
        position = req.prefix_tokens
        # prefix checkpoints: their K/V as cached rows at their own positions (never shifted)
        for ckpt in req.prefix:
            n = ckpt.num_tokens
            cached_pieces.append(ckpt)
            piece_rows.append(cached_count)
            piece_cached.append(True)
            piece_lengths.append(n)
            cached_shift.append(0)
            cached_count += n
            cu_cached.append(cached_count)
            num_keys += n
        drop_transition, rerotate = not req.use_transition, req.rerotate_keys
        prev_live = False
        run_local = 0
        live_starts: List[Tuple[int, int, int]] = []  # (position, span index, tokens) of its live elements
        live_rows: List[int] = []  # the first packed row of each of them
        for e in req.elements:
            if e.start != position:
                raise ValueError(f"request {b}: element starts at {e.start}, expected {position}")
            if isinstance(e, LiveElement):
                n = len(e.token_ids)
                if n <= 0:
                    raise ValueError(f"request {b}: empty element")
                first = num_live
                live_tokens.append(e.token_ids)
                live_positions.append(position)
                live_lengths.append(n)
                num_live += n
                s = len(cu_spans) - 1
                cu_spans.append(num_live)
                if not prev_live:  # a new conv run
                    if len(chain_source) == cu_chains[-1]:  # first element of the chain
                        run_init.append(("prefix", b) if req.prefix else ("zero", -1))
                    else:
                        run_init.append(("body", len(bodies) - 1))
                    runs.append([first, 0])
                    run_local = 0
                chain_source.append(s)
                runs[-1][1] += n
                run_local += n
                piece_rows.append(first)
                piece_cached.append(False)
                piece_lengths.append(n)
                num_keys += n
                live_starts.append((position, s, n))
                live_rows.append(first)
                for w in e.writes:
                    writes.append((b, s, w))
                    write_chain_pos.append(len(chain_source) - 1)
                    tail_ends.append((len(runs) - 1, run_local))
                    first_pos = e.start if w.first_position is None else w.first_position
                    if not 0 <= first_pos <= e.start:
                        raise ValueError(f"request {b}: a write from {first_pos} for an element at {e.start}")
                    # keys are by position: the row of position x is the request's first row + x
                    write_key_rows.append((cu_keys[-1] + first_pos, num_keys))
                    if w.kind == WRITE_SEGMENT:
                        parts = [span for at, span, _ in live_starts if at >= first_pos]
                        if not _tiles(live_starts[len(live_starts) - len(parts):], first_pos):
                            raise ValueError(f"request {b}: a segment write from {first_pos} is not a run of "
                                             f"live elements ending at {e.start + n}")
                        if w.low_rank:
                            low_rank_writes.append((len(writes) - 1, live_rows[len(live_rows) - len(parts)],
                                                    num_live))
                        else:
                            segment_write_spans.extend(parts)
                            write_parts.append(len(parts))
                prev_live = True
            elif isinstance(e, BodyElement):
                n = e.num_tokens
                if n <= 0:
                    raise ValueError(f"request {b}: empty element")
                entry = e.entry
                if entry.num_body_tokens != n:
                    raise ValueError(f"request {b}: body has {n} tokens, its entry {entry.num_body_tokens}")
                bodies.append((b, e))
                drop_t.append(drop_transition)
                chain_source.append(-len(bodies))
                body_pieces.append(len(cached_pieces))
                cached_pieces.append(entry)
                piece_rows.append(cached_count)
                piece_cached.append(True)
                piece_lengths.append(n)
                num_keys += n
                cached_shift.append(e.segment_start - entry.origin_position if rerotate else 0)
                cached_count += n
                cu_cached.append(cached_count)
                prev_live = False
            else:
                raise ValueError(f"request {b}: unknown element type {type(e).__name__}")
            position += n
        final_tail_ends.append((len(runs) - 1, run_local))
        cu_chains.append(len(chain_source))
        cu_req.append(num_live)
        cu_keys.append(num_keys)
        if req.need_logits:
            logits_rows.append(num_live - 1)
    total_live = num_live

    # Tails in the recorded order: every write's (in `writes` order), then each request's final
    # conv state. (Appending a request's final tail after its own writes interleaved them in a
    # batch: write i of a later request then read another request's final tail, which gave the
    # standalone pass's entries but the first wrong conv tails.)
    final_tail_for_request = [len(tail_ends) + b for b in range(len(final_tail_ends))]
    tail_ends = tail_ends + final_tail_ends
    tail_index = _tail_index(tail_ends, runs, w1, total_live)
    cu_runs = [0]
    for _, n in runs:
        cu_runs.append(cu_runs[-1] + n)

    # the state after a checkpoint is the one entering the next element of its chain
    checkpoint_rows = [-1] * len(chain_source)
    num_checkpoint_rows = 0
    write_after_checkpoint_rows: List[Optional[int]] = []
    for (b, _, w), chain_pos in zip(writes, write_chain_pos):
        if w.kind != WRITE_CHECKPOINT:
            write_after_checkpoint_rows.append(None)
        elif chain_pos + 1 >= cu_chains[b + 1]:
            write_after_checkpoint_rows.append(-1)
        else:
            if checkpoint_rows[chain_pos + 1] < 0:
                checkpoint_rows[chain_pos + 1] = num_checkpoint_rows
                num_checkpoint_rows += 1
            write_after_checkpoint_rows.append(checkpoint_rows[chain_pos + 1])
    piece_tables = entry_tables(cached_pieces, device)
    body_tables = [piece_tables[i] for i in body_pieces]
    body_addresses = None if any(drop_t) else summary_pointers([e.entry for _, e in bodies], body_tables)
    kv_addresses, kv_format = kv_pointers(cached_pieces, piece_tables)
    write_span_ids = segment_write_spans

    buffer = IndexBuffer()
    for name, values in (("input_ids", list(itertools.chain.from_iterable(live_tokens))),
                         ("cu_live_per_request", cu_req), ("cu_spans", cu_spans), ("cu_chains", cu_chains),
                         ("cu_runs", cu_runs), ("tail_index", tail_index), ("write_spans", write_span_ids),
                         ("cu_keys", cu_keys), ("chain_source", chain_source),
                         ("checkpoint_record_rows", checkpoint_rows), ("cu_cached", cu_cached),
                         ("cached_shift", cached_shift), ("logits_rows", logits_rows)):
        buffer.values(name, values)
    buffer.ranges("positions", live_positions, live_lengths)
    # cached rows follow the live rows
    key_starts = [row + total_live if cached else row for row, cached in zip(piece_rows, piece_cached)]
    buffer.ranges("key_index", key_starts, piece_lengths)
    # each request's keys are its positions 0..Lk-1 in order (keys_by_position: checkpoints from 0,
    # every element where the previous one ended, as checked above)
    buffer.ranges("positions_k", [0] * len(requests), [b - a for a, b in zip(cu_keys[:-1], cu_keys[1:])])
    body_shape = None if body_addresses is None else _add_stacked(buffer, "body_addresses", body_addresses)
    kv_shape = None if kv_addresses is None else _add_stacked(buffer, "kv_addresses", kv_addresses)
    # the signature only matters to a caller that may reuse a kept buffer
    body_t_packed = body_addresses is not None and body_addresses.t_packed
    signature = None if buffer_for is None else layout_signature(buffer.signature(HOST_TABLES), body_t_packed)
    cpu, dev = buffer.finish(device, host_names=HOST_TABLES,
                             out=None if buffer_for is None else buffer_for(signature))
    layout = packed_layout(
        dev, cpu, body_shape, kv_shape,
        requests=list(requests),
        cu_live_host=cu_req,
        linear_one_run_per_request=not bodies and not writes,
        bodies=bodies,
        body_drop_transition_host=drop_t,
        body_t_packed=body_t_packed,
        chain_has_prefix=[bool(r.prefix) for r in requests],
        run_init=run_init,
        writes=writes,
        write_span_range=_as_range(write_span_ids),
        write_spans_host=tuple(write_span_ids),
        write_parts=write_parts,
        any_segment_write=any(w.kind == WRITE_SEGMENT and not w.low_rank for _, _, w in writes),
        low_rank_writes=low_rank_writes,
        num_checkpoint_records=num_checkpoint_rows,
        write_after_checkpoint_rows=write_after_checkpoint_rows,
        cu_keys_host=cu_keys,
        index_causal=not cached_pieces,
        keys_by_position=True,
        max_live_per_request=max(b - a for a, b in zip(cu_req[:-1], cu_req[1:])),
        max_keys_per_request=max(b - a for a, b in zip(cu_keys[:-1], cu_keys[1:])),
        cached_pieces=cached_pieces,
        any_rerotate=any(cached_shift),
        kv_format=kv_format,
        write_key_rows=write_key_rows,
        final_tail_slots=final_tail_for_request,
        index_device=buffer.device_tensor,
        index_signature=signature,
    )
    return layout, buffer


def _add_stacked(buffer: IndexBuffer, name: str, tables: PointerRows) -> Tuple[int, int, int]:
    """Declare ``name`` in ``buffer``: the ``[L, 2, N']`` stack of N flat ``[L * 2]`` pointer
    tables, N' = N rounded up to an even count (zeros after) so that each layer's ``[2, N']``
    starts 16-byte aligned as the buffer's tables do. Returns that shape."""
    num = len(tables)
    rows = tables.width  # L * 2
    padded = num + num % ALIGN_INT64

    def fill(out: np.ndarray) -> None:
        grid = out.reshape(rows, padded)
        grid[:, :num] = tables.stacked().T
        grid[:, num:] = 0

    buffer.add(name, rows * padded, fill)
    return rows // 2, 2, padded


def _tail_index(tail_ends: Sequence[Tuple[int, int]], runs: Sequence[Sequence[int]], w1: int,
                run_init_offset: int) -> List[int]:
    """Rows of ``cat(x [T], run inits [R*(W-1)])`` holding each recorded tail: run-local index j
    (0-based over [init (W-1 rows), run tokens]) maps to the run's init row j (j < W-1) or live
    row run_start + j - (W-1)."""
    tail_index: List[int] = []
    for run_idx, end in tail_ends:
        start = runs[run_idx][0]
        for j in range(end, end + w1):  # ext coordinates: tail = ext[end : end + W-1]
            if j < w1:
                tail_index.append(run_init_offset + run_idx * w1 + j)
            else:
                tail_index.append(start + j - w1)
    return tail_index


def _tiles(elements: Sequence[Tuple[int, int, int]], first: int) -> bool:
    """Whether live elements (position, span index, tokens) are one run of positions from
    ``first``, back to back (no body between: the parts of one segment's body)."""
    at = first
    for position, _, n in elements:
        if position != at:
            return False
        at += n
    return bool(elements)


def _as_range(values: List[int]) -> Optional[Tuple[int, int]]:
    """``(a, b)`` when ``values`` is ``a, a+1, ..., b-1`` (non-empty), else None."""
    if values and values == list(range(values[0], values[0] + len(values))):
        return values[0], values[0] + len(values)
    return None
