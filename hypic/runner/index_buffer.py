"""The int64 index tables of one forward, packed into one host buffer and moved to the device by
one copy (:class:`IndexBuffer`).

Why one buffer: on CUDA a copy from pageable memory makes the host wait for the device (one
synchronisation per tensor, 13 per forward before), so the buffer is pinned and its one copy
asynchronous. Why every table starts 16-byte aligned: Triton specialises a kernel on whether each
pointer argument is, so slices at varying offsets compiled a new variant of a kernel whenever a
request's list lengths changed the parity (seconds inside a measured request).

Why tables are declared first and written at the end, by kind: a request's host time is mostly
spent with the caches cold (after the previous forward's kernels), where each numpy call costs
several microseconds. Every list of ints is written by one ``struct.pack_into`` (under half
numpy's per-int cost of reading a Python list) and every run-length table by one vectorised
expansion, whatever their number; only the host views a caller asks for are made as tensors.
"""

from __future__ import annotations

import struct
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

ALIGN_INT64 = 2  # int64 elements per 16 bytes: every table starts at a multiple of this


class IndexBuffer:
    """Named int64 tables laid one after another (each 16-byte aligned) in one host buffer: the
    lists of ints first, then the run-length tables, then those with their own fill."""

    def __init__(self) -> None:
        self._values: List[Tuple[str, List[int]]] = []
        self._ranges: List[Tuple[str, List[int], List[int], int]] = []
        self._custom: List[Tuple[str, int, Callable[[np.ndarray], None]]] = []
        self.device_tensor: Optional[torch.Tensor] = None  # after finish(): what every device view is of
        self.host_tensor: Optional[torch.Tensor] = None  # after finish(): the host buffer it was filled in
        self.layout: Optional["BufferLayout"] = None  # after finish(): where each table lies

    def values(self, name: str, values: List[int]) -> None:
        """A table holding ``values`` (Python ints)."""
        self._values.append((name, values))

    def ranges(self, name: str, starts: List[int], lengths: List[int]) -> None:
        """The runs ``starts[r], starts[r] + 1, ..., starts[r] + lengths[r] - 1``, one after another
        (see :func:`fill_ranges`)."""
        self._ranges.append((name, starts, lengths, sum(lengths)))

    def add(self, name: str, size: int, fill: Callable[[np.ndarray], None]) -> None:
        """A table of ``size`` elements that ``fill(out)`` writes into ``out`` (a writable int64
        array of that size; not called when ``size`` is 0)."""
        self._custom.append((name, size, fill))

    def _names_sizes(self) -> Tuple[List[str], List[int]]:
        names = [t[0] for t in self._values] + [t[0] for t in self._ranges] + [t[0] for t in self._custom]
        sizes = [len(t[1]) for t in self._values] + [t[3] for t in self._ranges] + [t[1] for t in self._custom]
        return names, sizes

    def numel(self) -> int:
        """Elements of the whole buffer (every table and its alignment padding)."""
        return sum(size + (-size % ALIGN_INT64) for size in self._names_sizes()[1])

    def signature(self, value_names: Sequence[str]) -> tuple:
        """What two buffers must share for one's device tensor to stand for the other's: every
        table's name and size, and the values of the ``values`` tables named in ``value_names``
        (those a reader looks at on the host)."""
        names, sizes = self._names_sizes()
        values = dict(self._values)
        missing = [n for n in value_names if n not in values]
        if missing:
            raise ValueError(f"signature: {missing} are not value tables of this buffer")
        return tuple(names), tuple(sizes), tuple(tuple(values[n]) for n in value_names)

    def finish(self, device: torch.device, host_names: Sequence[str] = (), out: Optional[torch.Tensor] = None
               ) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
        """``(host views, device views)``: each table as a 1-D int64 tensor on ``device`` (views of
        one buffer), and host views of the tables named in ``host_names``.

        On CUDA the host buffer is pinned and copied asynchronously; the caching host allocator
        keeps it alive until the copy has run (and the host views keep their part alive).
        ``out``: an int64 tensor of :meth:`numel` elements on ``device`` to copy into (in stream
        order, after whatever reads it already queued) instead of a new one, so that device views
        of an earlier buffer with this one's :meth:`signature` now hold this one's tables."""
        device = torch.device(device)
        names, sizes = self._names_sizes()
        layout = BufferLayout(names, sizes)
        check_out(out, layout.numel, device)
        host = new_host_buffer(layout.numel, device)
        buf = host.numpy()
        offsets, pads = layout.offsets, layout.pads
        num_values, num_ranges = len(self._values), len(self._ranges)
        flat: List[int] = []  # every list, each followed by its zero padding
        for (_, values), pad in zip(self._values, pads):
            flat += values
            flat += [0] * pad
        if flat:
            struct.pack_into(f"{len(flat)}q", buf, 0, *flat)
        starts: List[int] = []  # every run, each table's padding a run from 0
        lengths: List[int] = []
        for (_, table_starts, table_lengths, _), pad in zip(self._ranges, pads[num_values:]):
            starts += table_starts
            lengths += table_lengths
            if pad:
                starts.append(0)
                lengths.append(pad)
        if starts:
            a, b = offsets[num_values], offsets[num_values + num_ranges]
            fill_ranges(buf[a:b], np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64))
        for i, (_, size, fill) in enumerate(self._custom, num_values + num_ranges):
            if size:
                fill(buf[offsets[i]:offsets[i] + size])
            buf[offsets[i] + size:offsets[i + 1]] = 0
        self.layout, self.host_tensor = layout, host
        host_views, device_views, self.device_tensor = layout.move(host, device, host_names, out)
        return host_views, device_views


class BufferLayout:
    """Where each table of an :class:`IndexBuffer` lies (every one 16-byte aligned, zeros after
    it up to the next), and how one split makes every table's view: what a buffer filled on the
    host without an :class:`IndexBuffer` (a layout template's copy, hypic/runner/layout_template.py)
    needs to be moved and viewed the same way."""

    __slots__ = ("names", "sizes", "pads", "offsets", "numel", "_parts", "_pieces")

    def __init__(self, names: Sequence[str], sizes: Sequence[int]) -> None:
        self.names, self.sizes = tuple(names), tuple(sizes)
        self.pads = tuple(-size % ALIGN_INT64 for size in self.sizes)
        offsets = [0]
        parts: List[int] = []  # each table, and after it its padding where it has any
        pieces: List[int] = []  # index of each table among the parts
        for size, pad in zip(self.sizes, self.pads):
            offsets.append(offsets[-1] + size + pad)
            pieces.append(len(parts))
            parts.append(size)
            if pad:  # a zero-size piece would cost a tensor too
                parts.append(pad)
        self.offsets = tuple(offsets)  # offsets[i]: first element of table i; offsets[-1] = numel
        self.numel = offsets[-1]
        self._parts, self._pieces = parts, pieces

    def offset(self, name: str) -> int:
        """First element of table ``name``."""
        return self.offsets[self.names.index(name)]

    def move(self, host: torch.Tensor, device: torch.device, host_names: Sequence[str] = (),
             out: Optional[torch.Tensor] = None) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor], torch.Tensor]:
        """``(host views, device views, device tensor)`` of a filled host buffer: moved to
        ``device`` (into ``out`` when given, already checked by :func:`check_out`), one split
        giving every device view (a slice per table cost a dispatch each)."""
        if out is not None:
            moved = out.copy_(host, non_blocking=device.type == "cuda")
        else:
            moved = host.to(device, non_blocking=True) if device.type == "cuda" else host.to(device)
        pieces = moved.split_with_sizes(self._parts)  # not Tensor.split: its Python wrapper costs ~2 us
        device_views = {name: pieces[i] for name, i in zip(self.names, self._pieces)}
        if moved is host:  # the device is the host: its views are the host views
            return {name: device_views[name] for name in host_names}, device_views, moved
        host_views = {}
        for name in host_names:
            i = self.names.index(name)
            host_views[name] = host[self.offsets[i]:self.offsets[i] + self.sizes[i]]
        return host_views, device_views, moved


def new_host_buffer(numel: int, device: torch.device) -> torch.Tensor:
    """An uninitialised int64 host buffer for tables bound to ``device`` (pinned for CUDA, so that
    its one copy is asynchronous)."""
    return torch.empty(numel, dtype=torch.long, pin_memory=device.type == "cuda")


def check_out(out: Optional[torch.Tensor], numel: int, device: torch.device) -> None:
    """Raise unless ``out`` is None or a contiguous 1-D int64 tensor of ``numel`` elements on
    ``device`` (what a buffer's copy may go into)."""
    if out is not None and (out.dtype != torch.long or out.dim() != 1 or out.numel() != numel
                            or out.device.type != device.type or not out.is_contiguous()
                            or (device.index is not None and out.device.index != device.index)):
        raise ValueError(f"out must be a contiguous 1-D int64 tensor of {numel} elements on {device}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")


def fill_ranges(out: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
    """Write the runs ``starts[r] + (0, 1, ..., lengths[r] - 1)`` one after another into ``out``
    (``lengths.sum()`` elements) by one vectorised pass, not a Python loop per element or per run:
    a 32k-token all-hit prompt's key index is ~33k entries in ~130 runs (17 ms of host time per
    request as ``list.extend(range(...))``, ~0.5 ms as one ``np.arange`` per run)."""
    # entry i of run r is starts[r] + (i - offsets[r]), offsets[r] = entries before run r
    offsets = np.cumsum(lengths) - lengths
    np.add(np.repeat(starts - offsets, lengths), iota(out.size), out=out)


_IOTA = np.arange(0, dtype=np.int64)


def iota(n: int) -> np.ndarray:
    """``np.arange(n)`` as a read-only view of one array kept between calls (making a 33k-entry
    arange costs about what the ranges' own arithmetic does)."""
    global _IOTA
    if _IOTA.size < n:
        grown = np.arange(max(n, 2 * _IOTA.size), dtype=np.int64)
        grown.flags.writeable = False
        _IOTA = grown
    return _IOTA[:n]
