"""The packed layout of one PIC forward: which tokens are live, and how each request's chain of
live spans and cached bodies fits together (architecture.md section 2).

A request becomes a chain of *elements* in prompt order:

* :class:`LiveElement` - tokens computed in this forward (a HIT's seam window, a MISS, the query);
  it may carry a :class:`Write`: record what the store needs at its end (a segment body entry or a
  prefix-cache checkpoint).
* :class:`BodyElement` - a reused body from a store entry (per linear layer its summary and conv
  tail, per full-attention layer its K/V).

plus, for ``prefix_cache``, the checkpoints of the reused prefix (their K/V, and the last one's
linear and conv states as the starting point).

:func:`build_layout` turns the requests of a batch into index tensors, computed once per batch on
the host; every layer then works with batched tensor ops only (no Python loop per head). The
cached pieces' K/V and linear summaries are read in place through per-layer address tables built
here; only where a piece cannot be read so (another device or dtype, not contiguous) does a layer
loop over the pieces to concatenate them.
"""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from hypic.ops.kv_gather import PieceFormat, PieceTable, piece_format
from hypic.ops.linear._checks import concrete_device
from hypic.ops.linear.summary import summary_addresses
from hypic.pic.keys import StoreKey
from hypic.pic.payload import SegmentEntry

WRITE_SEGMENT = "segment"
WRITE_CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class Write:
    """Store write recorded at the end of a live element: ``kind`` is ``segment`` (a body entry:
    the element's zero-start summary, its conv tail, its K/V) or ``checkpoint`` (prefix cache: the
    running state and conv state at the element's end, and the element's K/V)."""

    kind: str
    key: StoreKey
    origin_position: int  # absolute position of the segment's first token in this forward


@dataclass(frozen=True)
class LiveElement:
    token_ids: Tuple[int, ...]
    start: int  # absolute position of the first token
    write: Optional[Write] = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class BodyElement:
    entry: SegmentEntry
    start: int  # absolute position of the body's first token in this request
    num_tokens: int
    segment_start: int  # absolute position of the segment's first token in this request


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
    # `addition` mode): they are concatenated then.
    body_addresses: Optional[torch.Tensor]
    chain_has_prefix: List[bool]
    # conv runs: maximal runs of consecutive live elements of one request
    cu_runs: torch.Tensor  # [R+1]
    cu_runs_cpu: torch.Tensor  # host copy
    run_init: List[Tuple[str, int]]  # ("zero", -1) | ("body", body index) | ("prefix", request)
    tail_index: torch.Tensor  # [NT * (W-1)] rows of cat(x [T], run inits [R*(W-1)])
    # tails recorded: per write (in `writes` order) then per request's final conv state
    writes: List[Tuple[int, int, Write]]  # (request, live element index S, write)
    write_spans: torch.Tensor  # [NW] live element index of each write
    # host: (a, b) when the writes are live elements a..b-1 in order (their summaries are then a
    # slice of every live span's, not a gathered copy), else None
    write_span_range: Optional[Tuple[int, int]]
    # host: whether some write is a segment's (the only writes that read the spans' summaries)
    any_segment_write: bool
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

    def piece_table(self, layer_idx: int) -> Optional[PieceTable]:
        """The cached pieces of attention layer ``layer_idx`` as the K/V gather reads them in
        place, or None (no address table, or a layer past it)."""
        if self.kv_addresses is None or self.kv_format is None or layer_idx >= self.kv_addresses.shape[0]:
            return None
        return PieceTable(self.kv_addresses[layer_idx], self.kv_format)


def build_layout(requests: Sequence[RequestLayout], conv_width: int, device: torch.device) -> PackedLayout:
    if not requests:
        raise ValueError("a PIC forward needs at least one request")
    w1 = conv_width - 1
    # Index lists that are runs of consecutive ints are kept as (start, length) pairs and expanded
    # once at the end (_Ranges): a Python loop per element, none per token.
    live_tokens: List[Tuple[int, ...]] = []  # token ids of each live element
    pos = _Ranges()
    cu_req = [0]
    cu_spans = [0]
    cu_chains = [0]
    chain_source: List[int] = []  # live span s -> s, body b -> -b - 1
    bodies: List[Tuple[int, BodyElement]] = []
    drop_t: List[bool] = []
    runs: List[List[int]] = []  # [first live token, num tokens]
    run_init: List[Tuple[str, int]] = []
    tail_ends: List[Tuple[int, int]] = []  # (run index, run-local end) of each recorded tail
    writes: List[Tuple[int, int, Write]] = []
    write_chain_pos: List[int] = []
    write_key_rows: List[Tuple[int, int]] = []
    key_index = _Ranges()
    pos_k = _Ranges()
    cu_keys = [0]
    cached_pieces: List[SegmentEntry] = []
    cu_cached = [0]
    cached_shift: List[int] = []
    logits_rows: List[int] = []
    final_tail_ends: List[Tuple[int, int]] = []  # per request: (run index, run-local end) of its last run

    # Cached rows are numbered after all live rows; count them in a first pass.
    total_live = 0
    for r in requests:
        total_live += sum(e.num_tokens for e in r.elements if isinstance(e, LiveElement))
    cached_count = 0
    num_live = 0  # live tokens so far
    num_keys = 0  # keys so far

    for b, req in enumerate(requests):
        if not req.elements or not isinstance(req.elements[-1], LiveElement):
            raise ValueError(f"request {b}: the last element must be live (the query)")
        position = req.prefix_tokens
        # prefix checkpoints: their K/V as cached rows at their own positions (never shifted)
        p0 = 0
        for ckpt in req.prefix:
            n = ckpt.num_tokens
            cached_pieces.append(ckpt)
            key_index.add(total_live + cached_count, n)
            pos_k.add(p0, n)
            cached_shift.append(0)
            cached_count += n
            cu_cached.append(cached_count)
            num_keys += n
            p0 += n
        prev_live = False
        run_local = 0
        for e in req.elements:
            if e.start != position:
                raise ValueError(f"request {b}: element starts at {e.start}, expected {position}")
            if isinstance(e, LiveElement):
                n = len(e.token_ids)
                if n <= 0:
                    raise ValueError(f"request {b}: empty element")
                first = num_live
                live_tokens.append(e.token_ids)
                num_live += n
                pos.add(position, n)
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
                k_first = num_keys
                key_index.add(first, n)
                pos_k.add(position, n)
                num_keys += n
                if e.write is not None:
                    writes.append((b, s, e.write))
                    write_chain_pos.append(len(chain_source) - 1)
                    tail_ends.append((len(runs) - 1, run_local))
                    write_key_rows.append((k_first, num_keys))
                prev_live = True
            elif isinstance(e, BodyElement):
                n = e.num_tokens
                if n <= 0:
                    raise ValueError(f"request {b}: empty element")
                if e.entry.num_body_tokens != n:
                    raise ValueError(
                        f"request {b}: body has {n} tokens, its entry {e.entry.num_body_tokens}"
                    )
                bodies.append((b, e))
                drop_t.append(not req.use_transition)
                chain_source.append(-len(bodies))
                cached_pieces.append(e.entry)
                key_index.add(total_live + cached_count, n)
                pos_k.add(position, n)
                num_keys += n
                cached_shift.append(e.segment_start - e.entry.origin_position if req.rerotate_keys else 0)
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

    # Tails in the recorded order: every write's (in `writes` order), then each request's final
    # conv state. (Appending a request's final tail after its own writes interleaved them in a
    # batch: write i of a later request then read another request's final tail, which gave the
    # standalone pass's entries but the first wrong conv tails; session 13.)
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
    body_addresses = None if any(drop_t) else _body_addresses([e.entry for _, e in bodies], device)
    kv_addresses, kv_format = _kv_addresses(cached_pieces, device)
    write_span_ids = [span for _, span, _ in writes]

    lists = dict(input_ids=_flat_tokens(live_tokens, num_live), positions=pos.array(),
                 cu_live_per_request=cu_req, cu_spans=cu_spans,
                 cu_chains=cu_chains, cu_runs=cu_runs,
                 tail_index=tail_index, write_spans=write_span_ids,
                 key_index=key_index.array(), positions_k=pos_k.array(), cu_keys=cu_keys,
                 chain_source=chain_source,
                 checkpoint_record_rows=checkpoint_rows, cu_cached=cu_cached, cached_shift=cached_shift,
                 logits_rows=logits_rows)
    if body_addresses is not None:
        lists["body_addresses"] = body_addresses
    if kv_addresses is not None:
        lists["kv_addresses"] = kv_addresses
    cpu, dev = _to_device(lists, device)
    layout = PackedLayout(
        requests=list(requests),
        input_ids=dev["input_ids"],
        positions=dev["positions"],
        cu_live_per_request=dev["cu_live_per_request"],
        cu_live_per_request_cpu=cpu["cu_live_per_request"],
        cu_live_host=cu_req,
        linear_one_run_per_request=not bodies and not writes,
        cu_spans=dev["cu_spans"],
        cu_spans_cpu=cpu["cu_spans"],
        cu_chains=dev["cu_chains"],
        chain_source=dev["chain_source"],
        bodies=bodies,
        body_drop_transition_host=drop_t,
        body_addresses=None if body_addresses is None else dev["body_addresses"].view(body_addresses.shape),
        chain_has_prefix=[bool(r.prefix) for r in requests],
        cu_runs=dev["cu_runs"],
        cu_runs_cpu=cpu["cu_runs"],
        run_init=run_init,
        tail_index=dev["tail_index"],
        writes=writes,
        write_spans=dev["write_spans"],
        write_span_range=_as_range(write_span_ids),
        any_segment_write=any(w.kind == WRITE_SEGMENT for _, _, w in writes),
        checkpoint_record_rows=dev["checkpoint_record_rows"],
        num_checkpoint_records=num_checkpoint_rows,
        write_after_checkpoint_rows=write_after_checkpoint_rows,
        key_index=dev["key_index"],
        positions_k=dev["positions_k"],
        cu_keys=dev["cu_keys"],
        cu_keys_host=cu_keys,
        index_causal=not cached_pieces,
        keys_by_position=True,
        max_live_per_request=max(b - a for a, b in zip(cu_req[:-1], cu_req[1:])),
        max_keys_per_request=max(b - a for a, b in zip(cu_keys[:-1], cu_keys[1:])),
        cached_pieces=cached_pieces,
        cu_cached=dev["cu_cached"],
        cached_shift=dev["cached_shift"],
        any_rerotate=any(cached_shift),
        kv_addresses=None if kv_addresses is None else dev["kv_addresses"].view(kv_addresses.shape),
        kv_format=kv_format,
        logits_rows=dev["logits_rows"],
        write_key_rows=write_key_rows,
        final_tail_slots=final_tail_for_request,
    )
    return layout


# Per store entry (entries are immutable and own their tensors), what the GPU kernels need to read
# it in place: computed once per entry and device instead of per request and layer.
_ENTRY_ADDRESSES: "weakref.WeakKeyDictionary[SegmentEntry, tuple]" = weakref.WeakKeyDictionary()
_ENTRY_KV: "weakref.WeakKeyDictionary[SegmentEntry, tuple]" = weakref.WeakKeyDictionary()


def _per_entry(cache: "weakref.WeakKeyDictionary", entry: SegmentEntry, device: torch.device, compute):
    hit = cache.get(entry)
    if hit is not None and hit[0] == device:
        return hit[1]
    value = compute(entry, device)
    cache[entry] = (device, value)
    return value


def _entry_addresses(entry: SegmentEntry, device: torch.device) -> Optional[np.ndarray]:
    """The (T, S) data pointers of the entry's linear layers' summaries, [L, 2] (zeros where a
    layer has none), or None when some summary cannot be read in place."""
    if not entry.linear:
        return None
    table = np.zeros((max(entry.linear) + 1, 2), dtype=np.int64)
    for layer, payload in entry.linear.items():
        pair = summary_addresses(payload.summary, device) if hasattr(payload, "summary") else None
        if pair is None:
            return None
        table[layer] = pair
    return table


def _entry_kv(entry: SegmentEntry, device: torch.device) -> Tuple[Optional[np.ndarray], Optional[PieceFormat]]:
    """The K and V data pointers of the entry's attention layers, [L, 2] (zeros where a layer has
    none), and the format they share; ``(None, None)`` when some layer's cannot be read in place."""
    if not entry.attention:
        return None, None
    table = np.zeros((max(entry.attention) + 1, 2), dtype=np.int64)
    formats = []
    for layer, payload in entry.attention.items():
        formats.append(piece_format(getattr(payload, "key", None), getattr(payload, "value", None), device))
        if formats[-1] is None:
            return None, None
        table[layer] = (payload.key.data_ptr(), payload.value.data_ptr())
    fmt = _common_format(formats)
    return (None, None) if fmt is None else (table, fmt)


def _stacked(tables: Sequence[Optional[np.ndarray]]) -> Optional[np.ndarray]:
    """``[L, 2, N']`` of N per-entry ``[L, 2]`` tables, N' = N rounded up to an even count (zeros
    after) so that each layer's table is 16-byte aligned (see _to_device); None when one is None
    or their shapes differ."""
    if any(t is None for t in tables) or len({t.shape for t in tables}) != 1:
        return None
    out = np.zeros(tables[0].shape + (len(tables) + len(tables) % _ALIGN_INT64,), dtype=np.int64)
    np.stack(tables, axis=-1, out=out[..., :len(tables)])  # np.pad cost ~10x this
    return out


_ALIGN_INT64 = 2  # 16 bytes


def _body_addresses(entries: Sequence[SegmentEntry], device: torch.device) -> Optional[np.ndarray]:
    """``[L, 2, NB']`` data pointers of every body's summaries, or None (no body, or one whose
    summaries must be copied before a scan can read them)."""
    if not entries:
        return None
    device = concrete_device(device)
    return _stacked([_per_entry(_ENTRY_ADDRESSES, e, device, _entry_addresses) for e in entries])


def _common_format(formats: Sequence[Optional[PieceFormat]]) -> Optional[PieceFormat]:
    """The format all of ``formats`` share, with the least alignment among them; None when one
    is None or they differ otherwise."""
    if not formats or any(f is None for f in formats):
        return None
    formats = set(formats)  # one per store entry, mostly equal: replace each distinct one once
    align = min(f.align_bytes for f in formats)
    common = {dataclasses.replace(f, align_bytes=align) for f in formats}
    return common.pop() if len(common) == 1 else None


def _kv_addresses(entries: Sequence[SegmentEntry], device: torch.device
                  ) -> Tuple[Optional[np.ndarray], Optional[PieceFormat]]:
    """``([L, 2, P'] data pointers of every piece's K and V, their common format)``, or
    ``(None, None)`` (no piece, or one the K/V gather cannot read in place)."""
    if not entries:
        return None, None
    device = concrete_device(device)
    found = [_per_entry(_ENTRY_KV, e, device, _entry_kv) for e in entries]
    fmt = _common_format([f for _, f in found])
    table = None if fmt is None else _stacked([t for t, _ in found])
    return (None, None) if table is None else (table, fmt)


class _Ranges:
    """An int64 index list made of runs of consecutive ints, held as (start, length) pairs.

    A 32k-token all-hit prompt's key index has ~33k entries but only ~130 runs: they are
    expanded by one vectorised numpy pass at the end, not a Python loop per token (17 ms of host
    time per request as ``list.extend(range(...))``) nor one ``np.arange`` per run (~0.5 ms)."""

    def __init__(self) -> None:
        self._starts: List[int] = []
        self._lengths: List[int] = []

    def add(self, start: int, n: int) -> None:
        self._starts.append(start)
        self._lengths.append(n)

    def array(self) -> np.ndarray:
        lengths = np.asarray(self._lengths, dtype=np.int64)
        starts = np.asarray(self._starts, dtype=np.int64)
        total = int(lengths.sum())
        # entry i of run r is starts[r] + (i - offset[r]), offset[r] = entries before run r
        offsets = np.cumsum(lengths) - lengths
        return np.repeat(starts - offsets, lengths) + np.arange(total, dtype=np.int64)


def _flat_tokens(token_lists: Sequence[Tuple[int, ...]], total: int) -> np.ndarray:
    """The token ids of the live elements, concatenated, as int64 (one numpy call, not one per
    element)."""
    return np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int64, count=total)


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


def _to_device(lists: "Dict[str, Union[List[int], np.ndarray]]", device: torch.device) -> "Tuple[dict, dict]":
    """Every index list as an int64 tensor, through one host buffer and one copy: ``(host views,
    device views)`` of that buffer (the host views are what fla reads lengths from).

    On CUDA the buffer is pinned and the copy asynchronous: a copy from pageable memory would
    make the host wait for the device (one synchronisation per tensor, 13 per forward before).
    The lists are written straight into it; the caching host allocator keeps it alive until the
    copy has run."""
    device = torch.device(device)
    arrays = [np.asarray(v, dtype=np.int64).reshape(-1) for v in lists.values()]
    # Every list starts 16-byte aligned: Triton specialises a kernel on whether each pointer
    # argument is, so slices at varying offsets compiled a new variant of a kernel whenever a
    # request's list lengths changed the parity (seconds inside a measured request).
    parts: List[int] = []  # list, padding, list, padding, ...
    for a in arrays:
        parts += [a.size, -a.size % _ALIGN_INT64]
    host = torch.empty(sum(parts), dtype=torch.long, pin_memory=device.type == "cuda")
    buf = host.numpy()
    offset = 0
    for a, pad in zip(arrays, parts[1::2]):
        buf[offset:offset + a.size] = a
        buf[offset + a.size:offset + a.size + pad] = 0
        offset += a.size + pad
    moved = host.to(device, non_blocking=True) if device.type == "cuda" else host.to(device)
    # one split per buffer gives every view (a slice per list cost a dispatch each)
    host_views = host.split(parts)[::2]
    device_views = moved.split(parts)[::2]
    return dict(zip(lists.keys(), host_views)), dict(zip(lists.keys(), device_views))


def _as_range(values: List[int]) -> Optional[Tuple[int, int]]:
    """``(a, b)`` when ``values`` is ``a, a+1, ..., b-1`` (non-empty), else None."""
    if values and values == list(range(values[0], values[0] + len(values))):
        return values[0], values[0] + len(values)
    return None
