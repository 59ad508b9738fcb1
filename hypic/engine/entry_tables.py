"""Per store entry, what the GPU kernels need to read it in place: the data pointers of its linear
layers' summaries and of its attention layers' K and V (hypic/engine/pic_layout.py stacks them
into a forward's address tables).

Entries are immutable and own their tensors, so each entry's tables are made once per device and
kept on the entry (:attr:`~hypic.pic.payload.SegmentEntry.engine_tables`): a forward finds its
pieces' tables by one C-level look-up each, instead of a Python call per entry (a weak
dictionary's ``get`` was ~0.3 us, 64 per all-hit 32k request).
"""

from __future__ import annotations

import dataclasses
from itertools import repeat
from operator import attrgetter, is_
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from hypic.ops.kv_gather import PieceFormat, piece_format
from hypic.ops.linear._checks import concrete_device
from hypic.ops.linear.summary import summary_addresses
from hypic.pic.payload import SegmentEntry


class EntryTables:
    """What the GPU kernels need to read one store entry in place on ``device``, each part
    computed on its first use. ``summaries``: the flat ``[L * 2]`` (T, S) data pointers of its
    linear layers' summaries (zeros where a layer has none), or None when some summary cannot be
    read in place; ``kv``: the same of its attention layers' K and V, with ``kv_format`` the
    format they share."""

    __slots__ = ("device", "summaries", "kv", "kv_format")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.summaries: object = _UNSET
        self.kv: object = _UNSET
        self.kv_format: Optional[PieceFormat] = None


_UNSET = object()
# Every PieceFormat an entry's table has, once: equal formats are then one object, and a batch's
# common format is found by identity instead of comparing (or hashing) dataclasses, ~0.5 us each.
_FORMATS: Dict[PieceFormat, PieceFormat] = {}

_ENGINE_TABLES = attrgetter("engine_tables")
_SUMMARIES = attrgetter("summaries")
_KV = attrgetter("kv")
_KV_FORMAT = attrgetter("kv_format")
_SIZE = attrgetter("size")


def entry_tables(entries: Sequence[SegmentEntry], device: torch.device) -> List[EntryTables]:
    """The :class:`EntryTables` of each entry on ``device``."""
    if not entries:
        return []
    device = concrete_device(device)
    out = list(map(dict.get, map(_ENGINE_TABLES, entries), repeat(device)))
    if any(map(is_, out, repeat(None))):
        for i, tables in enumerate(out):
            if tables is None:
                out[i] = entries[i].engine_tables[device] = EntryTables(device)
    return out


def _entry_summary_pointers(entry: SegmentEntry, device: torch.device) -> Optional[np.ndarray]:
    """The entry's :attr:`EntryTables.summaries`."""
    if not entry.linear:
        return None
    table = np.zeros((max(entry.linear) + 1, 2), dtype=np.int64)
    for layer, payload in entry.linear.items():
        pair = summary_addresses(payload.summary, device) if hasattr(payload, "summary") else None
        if pair is None:
            return None
        table[layer] = pair
    return table.reshape(-1)


def _entry_kv_pointers(entry: SegmentEntry, device: torch.device) -> Tuple[Optional[np.ndarray], Optional[PieceFormat]]:
    """The entry's :attr:`EntryTables.kv` and ``kv_format``; ``(None, None)`` when some layer's
    K/V cannot be read in place."""
    if not entry.attention:
        return None, None
    table = np.zeros((max(entry.attention) + 1, 2), dtype=np.int64)
    formats = []
    for layer, payload in entry.attention.items():
        formats.append(piece_format(getattr(payload, "key", None), getattr(payload, "value", None), device))
        if formats[-1] is None:
            return None, None
        table[layer] = (payload.key.data_ptr(), payload.value.data_ptr())
    fmt = common_format(formats)
    return (None, None) if fmt is None else (table.reshape(-1), _FORMATS.setdefault(fmt, fmt))


def summary_pointers(entries: Sequence[SegmentEntry], tables: Sequence[EntryTables]
                     ) -> Optional[List[np.ndarray]]:
    """Every body's flat summary pointer table (``tables[i]`` is ``entries[i]``'s), or None (no
    body, or one whose summaries must be copied before a scan can read them, or tables of
    different layer counts)."""
    if not tables:
        return None
    pointers = list(map(_SUMMARIES, tables))
    if any(map(is_, pointers, repeat(_UNSET))):
        for i, (entry, t) in enumerate(zip(entries, tables)):
            if t.summaries is _UNSET:
                t.summaries = pointers[i] = _entry_summary_pointers(entry, t.device)
    return _same_sized(pointers)


def kv_pointers(entries: Sequence[SegmentEntry], tables: Sequence[EntryTables]
                ) -> Tuple[Optional[List[np.ndarray]], Optional[PieceFormat]]:
    """``(every piece's flat K/V pointer table, their common format)``, or ``(None, None)`` (no
    piece, or one the K/V gather cannot read in place)."""
    if not tables:
        return None, None
    pointers = list(map(_KV, tables))
    if any(map(is_, pointers, repeat(_UNSET))):
        for i, (entry, t) in enumerate(zip(entries, tables)):
            if t.kv is _UNSET:
                t.kv, t.kv_format = _entry_kv_pointers(entry, t.device)
                pointers[i] = t.kv
    fmt = common_format(list(map(_KV_FORMAT, tables)))
    pointers = None if fmt is None else _same_sized(pointers)
    return (None, None) if pointers is None else (pointers, fmt)


def _same_sized(tables: List[Optional[np.ndarray]]) -> Optional[List[np.ndarray]]:
    """``tables`` when none is None and all have one size (one layer count), else None."""
    if any(map(is_, tables, repeat(None))) or len(set(map(_SIZE, tables))) != 1:
        return None
    return tables


def common_format(formats: Sequence[Optional[PieceFormat]]) -> Optional[PieceFormat]:
    """The format all of ``formats`` share, with the least alignment among them; None when one
    is None or they differ otherwise."""
    if not formats or formats[0] is None:
        return None
    if formats.count(formats[0]) == len(formats):  # one per store entry, mostly one object (_FORMATS)
        return formats[0]
    if any(f is None for f in formats):
        return None
    formats = set(formats)  # each distinct one replaced once
    align = min(f.align_bytes for f in formats)
    common = {dataclasses.replace(f, align_bytes=align) for f in formats}
    return common.pop() if len(common) == 1 else None
