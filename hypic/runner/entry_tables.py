"""Per store entry, what the GPU kernels need to read it in place: the data pointers of its linear
layers' summaries and of its attention layers' K and V (hypic/runner/layout.py stacks them
into a forward's address tables).

Entries are immutable and own their tensors, so each entry's tables are made once per device and
kept on the entry (:attr:`~hypic.pic.payload.SegmentEntry.engine_tables`): a forward finds its
pieces' tables by one C-level look-up each, instead of a Python call per entry (a weak
dictionary's ``get`` was ~0.3 us, 64 per all-hit 32k request).

Each table is a row of a :class:`PointerPool` (one per table width, i.e. layer count), not an
array of its own: a forward's ``[L, 2, N]`` address table is then one gather from one array
instead of a concatenation of N small arrays, each its own object in memory (before a cached
request's first layer the host's caches are cold from the previous forward, and every object
touched is a cache miss). A row is freed when its entry's tables die with the entry.
"""

from __future__ import annotations

import dataclasses
import threading
from itertools import repeat
from operator import attrgetter, is_
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from hypic.ops.kv_gather import PieceFormat, piece_format
from hypic.ops.linear.checks import concrete_device
from hypic.ops.linear.summary import SUMMARY_TYPES, summary_addresses
from hypic.pic.payload import SegmentEntry


class PointerPool:
    """Flat int64 pointer tables of one width, one row each; rows are handed out by :meth:`put`
    and given back by :meth:`free` (when the entry whose table it is dies).

    The array grows by doubling and never shrinks (a row is ``8 * width`` bytes: a few MB for
    thousands of live entries); a freed row is zeroed and handed out again first. ``put`` and
    ``free`` hold a lock: ``free`` runs from ``EntryTables.__del__``, on whatever thread drops an
    entry's last reference (or the garbage collector, possibly inside ``put`` on this thread: the
    lock is reentrant and ``put`` grows the array so that such a ``free`` is kept)."""

    __slots__ = ("width", "t_packed", "rows", "_free", "_in_use", "_lock", "__weakref__")

    def __init__(self, width: int, t_packed: bool = False) -> None:
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise ValueError(f"width must be a positive int, got {width!r}")
        self.width = width
        # summary tables: whether the T they point at are stored as bf16 planes (see _pool)
        self.t_packed = t_packed
        self.rows = np.zeros((0, width), dtype=np.int64)
        self._free: List[int] = []  # a stack: the last row freed is the next one handed out
        self._in_use = bytearray()  # per row: 1 while handed out
        self._lock = threading.RLock()

    def put(self, table: np.ndarray) -> int:
        """A row holding ``table`` (``width`` integer values)."""
        table = np.asarray(table)
        if table.shape != (self.width,) or table.dtype.kind not in "iu":
            raise ValueError(f"a table of {self.width} integers expected, got shape {table.shape} {table.dtype}")
        with self._lock:
            if not self._free:  # grow by doubling: rows already handed out keep their index
                old = self.rows
                num = old.shape[0]
                grown = np.zeros((max(16, 2 * num), self.width), dtype=np.int64)
                grown[:num] = old
                self.rows = grown
                # extended, not replaced: a free() run meanwhile (by the collector) stays in it
                self._in_use.extend(bytes(grown.shape[0] - num))
                self._free.extend(range(grown.shape[0] - 1, num - 1, -1))
            row = self._free.pop()
            self._in_use[row] = 1
            self.rows[row] = table
        return row

    def free(self, row: int) -> None:
        """Give ``row`` back (zeroed); a row not handed out is a ValueError."""
        with self._lock:
            if not 0 <= row < len(self._in_use) or not self._in_use[row]:
                raise ValueError(f"row {row!r} is not in use in this pool")
            self._in_use[row] = 0
            self.rows[row] = 0
            self._free.append(row)

    @property
    def num_used(self) -> int:
        return self.rows.shape[0] - len(self._free)


# by (width, t_packed): a pointer is an int whatever its device. Summary tables of entries whose
# T are stored packed (bf16 planes, hypic.ops.linear.t_planes) have pools of their own, so a
# forward's bodies come from one pool only when they share T's storage form: the walk reads
# them all one way (a mix is not read in place: _one_pool gives None and they are copied).
_POOLS: Dict[Tuple[int, bool], PointerPool] = {}


def _pool(width: int, t_packed: bool = False) -> PointerPool:
    pool = _POOLS.get((width, t_packed))
    if pool is None:
        pool = _POOLS[width, t_packed] = PointerPool(width, t_packed)
    return pool


class PointerRows:
    """Some rows of one pool, in order: the flat tables of a forward's pieces."""

    __slots__ = ("pool", "rows")

    def __init__(self, pool: PointerPool, rows: List[int]) -> None:
        self.pool, self.rows = pool, rows

    @property
    def width(self) -> int:
        return self.pool.width

    @property
    def t_packed(self) -> bool:
        """Summary tables: whether every T they point at is stored as bf16 planes."""
        return self.pool.t_packed

    def __len__(self) -> int:
        return len(self.rows)

    def stacked(self) -> np.ndarray:
        """``[len, width]``: one table per row."""
        return self.pool.rows.take(self.rows, axis=0)


class EntryTables:
    """What the GPU kernels need to read one store entry in place on ``device``, each part
    computed on its first use: ``summary_row``, the row of its pool holding the flat ``[L * 2]``
    (T, S) data pointers of its linear layers' summaries (zeros where a layer has none), or None
    when some summary cannot be read in place; ``kv_row``, the same of its attention layers' K and
    V, with ``kv_format`` the format they share. Its rows are freed when it dies (with its entry)."""

    __slots__ = ("device", "summary_pool", "summary_row", "kv_pool", "kv_row", "kv_format")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.summary_pool: object = _UNSET
        self.summary_row: Optional[int] = None
        self.kv_pool: object = _UNSET
        self.kv_row: Optional[int] = None
        self.kv_format: Optional[PieceFormat] = None

    def __del__(self) -> None:
        # (a row is set only with its pool; no module global is read: this may run at shutdown)
        if self.summary_row is not None:
            self.summary_pool.free(self.summary_row)
        if self.kv_row is not None:
            self.kv_pool.free(self.kv_row)


_UNSET = object()
# Every PieceFormat an entry's table has, once: equal formats are then one object, and a batch's
# common format is found by identity instead of comparing (or hashing) dataclasses, ~0.5 us each.
_FORMATS: Dict[PieceFormat, PieceFormat] = {}

_ENGINE_TABLES = attrgetter("engine_tables")
_SUMMARY_POOL = attrgetter("summary_pool")
_SUMMARY_ROW = attrgetter("summary_row")
_KV_POOL = attrgetter("kv_pool")
_KV_ROW = attrgetter("kv_row")
_KV_FORMAT = attrgetter("kv_format")


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


def _entry_summary_pointers(entry: SegmentEntry, device: torch.device) -> Tuple[Optional[np.ndarray], bool]:
    """The entry's flat summary pointer table (what its :attr:`EntryTables.summary_row` holds)
    and whether its T are stored packed; ``(None, False)`` when some summary cannot be read in
    place, or its layers' T are not all of one storage form."""
    if not entry.linear:
        return None, False
    table = np.zeros((max(entry.linear) + 1, 2), dtype=np.int64)
    forms = set()
    for layer, payload in entry.linear.items():
        summary = getattr(payload, "summary", None)
        # a factored summary (hypic.ops.linear.low_rank) has no T to read in place
        pair = None if not isinstance(summary, SUMMARY_TYPES) else summary_addresses(summary, device)
        if pair is None:
            return None, False
        forms.add(bool(getattr(summary, "t_packed", False)))
        table[layer] = pair
    if len(forms) != 1:
        return None, False
    return table.reshape(-1), forms.pop()


def _entry_kv_pointers(entry: SegmentEntry, device: torch.device) -> Tuple[Optional[np.ndarray], Optional[PieceFormat]]:
    """The entry's flat K/V pointer table (what its :attr:`EntryTables.kv_row` holds) and
    ``kv_format``; ``(None, None)`` when some layer's K/V cannot be read in place."""
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


def summary_pointers(entries: Sequence[SegmentEntry], tables: Sequence[EntryTables]) -> Optional[PointerRows]:
    """Every body's flat summary pointer table (``tables[i]`` is ``entries[i]``'s), or None (no
    body, or one whose summaries must be copied before a scan can read them, or tables of
    different layer counts or T storage forms); :attr:`PointerRows.t_packed` says the form."""
    if not tables:
        return None
    if any(map(is_, map(_SUMMARY_POOL, tables), repeat(_UNSET))):
        for entry, t in zip(entries, tables):
            if t.summary_pool is _UNSET:
                table, t_packed = _entry_summary_pointers(entry, t.device)
                t.summary_pool = None if table is None else _pool(table.size, t_packed)
                t.summary_row = None if table is None else t.summary_pool.put(table)
    return _one_pool(list(map(_SUMMARY_POOL, tables)), tables, _SUMMARY_ROW)


def kv_pointers(entries: Sequence[SegmentEntry], tables: Sequence[EntryTables]
                ) -> Tuple[Optional[PointerRows], Optional[PieceFormat]]:
    """``(every piece's flat K/V pointer table, their common format)``, or ``(None, None)`` (no
    piece, or one the K/V gather cannot read in place)."""
    if not tables:
        return None, None
    if any(map(is_, map(_KV_POOL, tables), repeat(_UNSET))):
        for entry, t in zip(entries, tables):
            if t.kv_pool is _UNSET:
                table, t.kv_format = _entry_kv_pointers(entry, t.device)
                t.kv_pool = None if table is None else _pool(table.size)
                t.kv_row = None if table is None else t.kv_pool.put(table)
    fmt = common_format(list(map(_KV_FORMAT, tables)))
    pointers = None if fmt is None else _one_pool(list(map(_KV_POOL, tables)), tables, _KV_ROW)
    return (None, None) if pointers is None else (pointers, fmt)


def _one_pool(pools: List[Optional[PointerPool]], tables: Sequence[EntryTables], row) -> Optional[PointerRows]:
    """The tables' rows when every one has a table and all are of one pool (one width: one layer
    count), else None."""
    first = pools[0]
    if first is None or pools.count(first) != len(pools):  # count: by identity first, then ==
        return None
    return PointerRows(first, list(map(row, tables)))


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
