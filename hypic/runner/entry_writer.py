"""Store entries of a forward's writes, copied from the layers' records after the forward.

A cold prefill of 64 segments records, per linear layer, each segment's summary (T and S, 2 MiB
each in fp32 at Qwen3.5-35B-A3B widths) and conv tail, and per attention layer its K/V rows:
~8 GiB of entries. The writer is told when each layer's records are complete and keeps them; after
the forward it copies every write's rows into the entries' buffers, one multi-tensor copy per
dtype on the forward's stream (5.0 ms of GPU time at that prompt on the H200). Copying each
layer's rows as the layer ended instead, on a side stream, measured 720.35 ms against 724.72 on
the cold 32k request (full_recompute 682.75; interleaved, 4 rounds whose spreads overlap), and on
the forward's own stream 876.29 (two of four requests at 1,150 and 1,022 ms); a host-bound forward
with a few writes pays the per-layer copies' host work in full (docs/decisions.md).

A cold batch's linear layers write their segment writes' summaries (T, S) straight into the
entries' rows instead (:meth:`EntryWriter.summary_targets`): cold 32k 712.92 ms against 716.60
with the summaries returned and copied (full_recompute 681.11; H200, interleaved, 4 rounds), and
the forward's peak memory loses every layer's summary records (64 writes x 30 layers x 4 MiB =
7.5 GiB at that prompt). A layer whose op returns its summaries (the PyTorch reference, or a
batch with checkpoints) has them copied like the other fields.

Each entry owns one buffer per field (``transition``, ``state``, ``tail`` over its linear layers,
no ``tail`` for a family without a conv; ``key``, ``value`` over its attention layers), so
evicting the entry frees exactly its bytes, and its tensors are that buffer's rows; its conv
tails are noted as one buffer's rows (:func:`~hypic.runner.pic_context.remember_tail_rows`) for
the forwards that read them.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch

from hypic.runner.pic_context import _LazyItems, remember_tail_rows
from hypic.runner.layout import WRITE_CHECKPOINT, PackedLayout
from hypic.ops.linear.low_rank import LowRankSummary
from hypic.ops.linear.summary import DenseSummary, SummaryTable, compose
from hypic.ops.linear.t_planes import pack_planes_, presplit_wanted
from hypic.pic.payload import AttentionLayerCache, LinearLayerCache, LinearStateCheckpoint, SegmentEntry


class EntryWriter:
    """Collects one forward's writes (``layout.writes``) as the layers record them.

    ``linear_done(layer, record)`` after a linear layer has its conv tails and its write
    summaries (segment writes) or states (checkpoints); ``attention_done(layer, record)`` once an
    attention layer has its packed K/V; ``finish()`` after the forward: the entries, in write
    order, their copies ordered before whatever the current stream runs next."""

    def __init__(self, layout: PackedLayout, linear_layers: Sequence[int], attention_layers: Sequence[int],
                 device: torch.device) -> None:
        self.writes = layout.writes
        self.key_rows = layout.write_key_rows
        self.linear_layers = list(linear_layers)
        self.attention_layers = list(attention_layers)
        self._linear_row = {layer: j for j, layer in enumerate(self.linear_layers)}
        self._attention_row = {layer: j for j, layer in enumerate(self.attention_layers)}
        device = torch.device(device)
        # segment writes' T stored as bf16 planes for the walks that will read them
        # (hypic/ops/linear/t_planes.py), packed in finish(): decided once per forward
        self._presplit = bool(self.writes) and presplit_wanted(device)
        # each layer's records as it ends (nothing done per layer: a cached request with a few cold
        # segments is host-bound), collected and copied in finish()
        self._stashed: List[tuple] = []
        # per write: field -> (buffer, its rows); allocated at the first layer that fills it
        self._buffers: List[Dict[str, tuple]] = [{} for _ in self.writes]
        self._summary_cls = None
        self._done = set()
        # summary_targets(): per linear layer row, the segment entries' (T, S) rows as a
        # SummaryTable that the layer's op writes in place; the rows of the layers it was handed to
        self._targets: Optional[List[SummaryTable]] = None
        self._in_place = set()
        # the segment writes (a checkpoint stores a state): write index -> (its first summary
        # row, its parts: live elements whose summaries compose its body's)
        self._summary_row: Dict[int, tuple] = {}
        parts = iter(layout.write_parts)
        row = 0
        for i, (_, _, w) in enumerate(self.writes):
            if w.kind != WRITE_CHECKPOINT and not w.low_rank:
                n = next(parts)
                self._summary_row[i] = (row, n)
                row += n
        self._targets_on = bool(self._summary_row)
        # the factored segment writes: write index -> its row of a record's low_rank_summaries
        self._low_rank_row = {i: j for j, (i, _, _) in enumerate(layout.low_rank_writes)}

    # ---------------------------------------------------------------------------------------------
    def _rows(self, i: int, field: str, count: int, like: torch.Tensor, device=None) -> tuple:
        held = self._buffers[i].get(field)
        if held is None:
            buffer = torch.empty((count,) + tuple(like.shape), dtype=like.dtype,
                                 device=like.device if device is None else device)
            held = self._buffers[i][field] = (buffer, buffer.unbind(0))
        return held[1]

    def _check_new(self, layer_idx: int, table: Dict[int, int], kind: str) -> int:
        if layer_idx not in table:
            raise ValueError(f"layer {layer_idx} is not one of the forward's {kind} layers")
        if layer_idx in self._done:
            raise ValueError(f"layer {layer_idx}'s records were already written")
        self._done.add(layer_idx)
        return table[layer_idx]

    def summary_targets(self, layer_idx: int, num_heads: int, key_dim: int, value_dim: int,
                        device: torch.device) -> Optional[SummaryTable]:
        """The segment entries' T and S rows of linear layer ``layer_idx``, one per segment write
        (in write order), as a :class:`~hypic.ops.linear.summary.SummaryTable` with its address
        table on ``device``, for the layer's op to write its written spans' summaries into
        (``gated_delta_chain_forward_and_summarize(summary_out=)``): a cold 32k prefill's 64
        writes then skip copying 7.5 GiB of fp32 rows after the forward. None without segment
        writes (a checkpoint stores a state, copied after the forward). Once handed out,
        :meth:`linear_done` takes the layer's summaries as written (the record's
        ``write_summaries`` is None then)."""
        if not self._targets_on:
            return None
        j = self._linear_row.get(layer_idx)
        if j is None:
            raise ValueError(f"layer {layer_idx} is not one of the forward's linear layers")
        if self._targets is None:
            self._targets = self._allocate_targets(num_heads, key_dim, value_dim, torch.device(device))
        self._in_place.add(layer_idx)
        return self._targets[j]

    def _allocate_targets(self, num_heads: int, key_dim: int, value_dim: int, device: torch.device):
        """Every write's T and S buffers over the linear layers, and per layer row the table of
        their rows: one host-built address tensor ``[L, 2, NW]`` copied to the device once."""
        count = len(self.linear_layers)
        self._summary_cls = DenseSummary
        t_like = torch.empty((1, num_heads, key_dim, key_dim), dtype=torch.float32, device="meta")
        s_like = torch.empty((1, num_heads, key_dim, value_dim), dtype=torch.float32, device="meta")
        t_rows, s_rows = [], []
        for i, (_, parts) in self._summary_row.items():
            for field in _part_fields(parts):
                t_rows.append(self._rows(i, "transition" + field, count, t_like, device))
                s_rows.append(self._rows(i, "state" + field, count, s_like, device))
        addresses = None
        if device.type == "cuda":
            t_step, s_step = t_like.numel() * 4, s_like.numel() * 4  # rows of one buffer, in bytes
            layers = torch.arange(count, dtype=torch.int64)[:, None]
            t_base = torch.tensor([rows[0].data_ptr() for rows in t_rows], dtype=torch.int64)
            s_base = torch.tensor([rows[0].data_ptr() for rows in s_rows], dtype=torch.int64)
            table = torch.stack([t_base + layers * t_step, s_base + layers * s_step], dim=1)  # [L, 2, NW]
            addresses = table.pin_memory().to(device, non_blocking=True)
        def row(j: int):  # layer row j of every segment write's buffers, one-span summaries built on access
            return _LazyItems(range(len(t_rows)), lambda i: DenseSummary(t_rows[i][j], s_rows[i][j]))

        return [SummaryTable(row(j), None if addresses is None else addresses[j]) for j in range(count)]

    def linear_done(self, layer_idx: int, rec) -> None:
        self._take(self._check_new(layer_idx, self._linear_row, "linear"), rec, self._linear)

    def attention_done(self, layer_idx: int, rec) -> None:
        self._take(self._check_new(layer_idx, self._attention_row, "attention"), rec, self._attention)

    def _take(self, j: int, rec, collect) -> None:
        """Keep layer row ``j``'s record for :meth:`finish`, which copies what ``collect(j, rec)``
        gives."""
        if self.writes:
            self._stashed.append((collect, j, rec))

    def _linear(self, j: int, rec) -> tuple:
        """``(dsts, srcs)``: every write's copies of linear layer row ``j``'s records."""
        count = len(self.linear_layers)
        tails = None if rec.tails is None else rec.tails.unbind(0)  # None: the family has no conv
        summaries = None
        in_place = self.linear_layers[j] in self._in_place
        if in_place and rec.write_summaries is not None:
            raise ValueError(f"layer {self.linear_layers[j]} was given summary targets but returned its summaries")
        if rec.write_summaries is not None:
            if getattr(rec.write_summaries, "t_packed", False):
                raise ValueError(f"layer {self.linear_layers[j]} returned packed summaries; live ones are plain")
            self._summary_cls = type(rec.write_summaries)
            t, s = rec.write_summaries.parts()
            # row i of each as a one-span summary ([1, ...]), by one call each
            summaries = (t.unsqueeze(1).unbind(0), s.unsqueeze(1).unbind(0))
        states = None
        if rec.write_states is not None:
            states = rec.write_states.unbind(0)
        dsts: List[torch.Tensor] = []
        srcs: List[torch.Tensor] = []
        for i, (_, _, w) in enumerate(self.writes):
            tail = () if tails is None else (("tail", tails[i]),)
            if w.kind == WRITE_CHECKPOINT:
                pairs = (("state", states[i]),) + tail
            elif w.low_rank:  # formed from the body's rows (hypic.ops.linear.low_rank)
                lr = rec.low_rank_summaries[self._low_rank_row[i]]
                pairs = tail + tuple((LOW_RANK_FIELD + name, getattr(lr, name)) for name in LOW_RANK_PARTS)
            elif in_place:  # the op wrote T and S into the entries' rows
                pairs = tail
            else:
                r, parts = self._summary_row[i]
                pairs = tail
                for k, field in enumerate(_part_fields(parts)):
                    pairs += (("transition" + field, summaries[0][r + k]), ("state" + field, summaries[1][r + k]))
            for field, src in pairs:
                dsts.append(self._rows(i, field, count, src)[j])
                srcs.append(src)
        return dsts, srcs

    def _attention(self, j: int, rec) -> tuple:
        """``(dsts, srcs)`` of attention layer row ``j``'s K/V (every write's rows)."""
        count = len(self.attention_layers)
        dsts: List[torch.Tensor] = []
        srcs: List[torch.Tensor] = []
        for i, (a, z) in enumerate(self.key_rows):
            for field, src in (("key", rec.keys[a:z]), ("value", rec.values[a:z])):
                dsts.append(self._rows(i, field, count, src)[j])
                srcs.append(src)
        return dsts, srcs

    @staticmethod
    def _copy(dsts: List[torch.Tensor], srcs: List[torch.Tensor]) -> None:
        """``dsts[i] <- srcs[i]``, one multi-tensor copy per dtype, on the current stream."""
        by_dtype: Dict[torch.dtype, tuple] = {}
        for d, s in zip(dsts, srcs):
            pair = by_dtype.setdefault(d.dtype, ([], []))
            pair[0].append(d)
            pair[1].append(s)
        for d, s in by_dtype.values():
            torch._foreach_copy_(d, s)

    # ---------------------------------------------------------------------------------------------
    def finish(self) -> List[SegmentEntry]:
        missing = [layer for layer in self.linear_layers + self.attention_layers if layer not in self._done]
        if self.writes and missing:
            raise ValueError(f"layers {missing} recorded nothing for the forward's writes")
        if self._stashed:  # every layer's rows now, in one copy per dtype
            dsts: List[torch.Tensor] = []
            srcs: List[torch.Tensor] = []
            for collect, j, rec in self._stashed:
                d, s = collect(j, rec)
                dsts += d
                srcs += s
            self._stashed = []
            self._copy(dsts, srcs)
        self._compose_parts()
        packed = self._pack_transitions()
        entries = []
        for i, (_, _, w) in enumerate(self.writes):
            held = self._buffers[i]
            lin = {}
            tails = held.get("tail")  # None: the family has no conv
            for j, layer in enumerate(self.linear_layers):
                tail = None if tails is None else tails[1][j]
                if w.kind == WRITE_CHECKPOINT:
                    lin[layer] = LinearStateCheckpoint(held["state"][1][j], tail)
                elif w.low_rank:
                    parts = {name: held[LOW_RANK_FIELD + name][1][j] for name in LOW_RANK_PARTS}
                    lin[layer] = LinearLayerCache(LowRankSummary(**parts), tail)
                else:
                    summary = (DenseSummary(held["transition"][1][j], held["state"][1][j], True) if packed
                               else self._summary_cls(held["transition"][1][j], held["state"][1][j]))
                    lin[layer] = LinearLayerCache(summary, tail)
            att = {layer: AttentionLayerCache(held["key"][1][j], held["value"][1][j])
                   for j, layer in enumerate(self.attention_layers)}
            entry = SegmentEntry(key=w.key, linear=lin, attention=att, origin_position=w.origin_position)
            if self.linear_layers and tails is not None:
                # every layer's tail in one buffer: a forward reusing the entry reads them at once
                tail_buffer, tail_rows = tails
                remember_tail_rows(entry, "conv_state" if w.kind == WRITE_CHECKPOINT else "conv_tail",
                                   self.linear_layers, list(tail_rows), tail_buffer)
            entries.append(entry)
        return entries


    def _compose_parts(self) -> None:
        """The body summary of every segment write whose body checkpoints cut into parts: the
        parts' summaries composed in order (``(T2 T1, T2 S1 + S2)``, every layer at once), into
        the entry's own rows; the parts' buffers are dropped."""
        for i, (_, parts) in self._summary_row.items():
            if parts == 1:
                continue
            held = self._buffers[i]
            acc = None
            for field in _part_fields(parts):
                # [L, 1, HV, ...] buffers: the layers as the summaries' spans (T in the family's form)
                part = self._summary_cls(held.pop("transition" + field)[0].squeeze(1),
                                         held.pop("state" + field)[0].squeeze(1))
                acc = part if acc is None else compose(part, acc)
            for field, value in zip(("transition", "state"), acc.parts()):
                buffer = value.unsqueeze(1).contiguous()
                held[field] = (buffer, buffer.unbind(0))

    def _pack_transitions(self) -> bool:
        """Every segment write's T rows packed in place into bf16 planes (one launch after
        their writes and copies, in stream order); whether they were. Only dense T (the other
        structures keep no matrix) and only when :func:`presplit_wanted` said so.

        Cost: one read and one write of T, 2 MiB per write and layer at Qwen3.5-35B-A3B widths
        (a cold 32k prefill's 64 writes x 30 layers: 3.75 GiB each way, ~1.6 ms at the H200's
        bandwidth by arithmetic, not measured), against ~0.9 ms saved by every all-hit request
        reading them (hypic/ops/linear/t_planes.py)."""
        if not self._presplit or self._summary_cls is not DenseSummary:
            return False
        buffers = [held["transition"][0] for held in self._buffers if "transition" in held]
        pack_planes_(buffers)
        return bool(buffers)

# a factored summary's tensors (LowRankSummary's fields), each one buffer over the linear layers
LOW_RANK_PARTS = ("log_decay", "keys", "weights", "values")
LOW_RANK_FIELD = "low_rank."


def _part_fields(parts: int) -> List[str]:
    """Buffer name suffixes of a segment write's summary rows: its own (``""``) when its body is
    one live element, else one temporary per part (composed by :meth:`EntryWriter.finish`)."""
    return [""] if parts == 1 else [f".part{k}" for k in range(parts)]


def entry_writer(layout: PackedLayout, linear_layers: Sequence[int], attention_layers: Sequence[int],
                 device: torch.device) -> Optional[EntryWriter]:
    """An :class:`EntryWriter` for a forward with writes, else None."""
    return EntryWriter(layout, linear_layers, attention_layers, device) if layout.writes else None


__all__ = ["EntryWriter", "entry_writer"]
