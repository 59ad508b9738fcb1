"""What the engine and its segment workers say to each other (:mod:`hypic.runner.segment_parallel`).

Each worker has one duplex pipe to the engine; messages are the dataclasses below. A group's
entries travel as a manifest (:func:`hypic.pic.persist.encode_entries`) and one uint8 buffer
holding every tensor (:func:`pack_tensors`; a 64-segment batch has ~7,000 tensors):

* between GPUs the buffer is pickled by torch's reductions (``torch.multiprocessing``) as a CUDA
  IPC handle, which the engine opens and copies from (one device-to-device copy);
* on the CPU its bytes follow the message on the pipe (:meth:`Connection.send_bytes`). Shared
  memory would save a copy, but its handle is a file descriptor fetched from the sender when the
  message is read, so a worker that dies right after sending would lose what it sent; bytes in
  the pipe outlive their sender, and only what a dead worker never sent is prefilled again.

The engine sends :class:`Work` (a share) and :class:`Stop`; a worker answers :class:`Ready` once,
then per share one :class:`Entries` per group it prefilled, as soon as the group's entries are
written, and :class:`Done` — or :class:`Failed` with the message of what it raised. Every answer
names the batch it belongs to, so the engine drops what arrives for a batch it has given up.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

ALIGN_BYTES = 16  # every packed tensor starts here: its dtype view is aligned, loads vectorise
Todo = Dict[object, Tuple[Tuple[int, ...], int]]  # store key -> (token ids, body start)
ShareItem = Tuple[object, Tuple[Tuple[int, ...], int]]  # one (key, (token ids, body start)) of a Todo


@dataclass
class Ready:
    pid: int
    device: str


@dataclass
class Work:
    batch: int
    items: List[ShareItem]


@dataclass
class Stop:
    pass


@dataclass
class Entries:
    """One group's entries: ``manifest`` (:func:`hypic.pic.persist.encode_entries`), the packed
    ``buffer`` of ``nbytes`` and its ``specs``; a CPU buffer is None here, its bytes the pipe's
    next message (:func:`send_entries`). ``compute_s``: the group's forward (device-synchronised);
    ``written_at``: when its entries were written (``time.monotonic()``, one clock for every
    process of the host); ``received_at``: set by the engine's receiver."""

    batch: int
    manifest: list
    specs: list
    buffer: Optional[torch.Tensor]
    nbytes: int
    compute_s: float
    written_at: float
    received_at: Optional[float] = None


@dataclass
class Done:
    batch: int
    num_segments: int


@dataclass
class Failed:
    batch: int
    message: str


def now_s() -> float:
    """The host-wide monotonic clock the engine and its workers stamp messages with."""
    return time.monotonic()


def share_groups(items: Sequence[ShareItem], group_tokens: Optional[int]) -> Iterator[List[ShareItem]]:
    """``items`` in runs of at most ``group_tokens`` tokens (a longer segment alone), in order;
    one run for None. Each run is one forward whose entries are sent (or inserted) together."""
    group: List[ShareItem] = []
    tokens = 0
    for item in items:
        n = len(item[1][0])
        if group and group_tokens is not None and tokens + n > group_tokens:
            yield group
            group, tokens = [], 0
        group.append(item)
        tokens += n
    if group:
        yield group


def send_entries(conn, message: Entries, buffer: torch.Tensor) -> None:
    """Send ``message`` with ``buffer``: a CUDA buffer inside it (an IPC handle), a CPU buffer's
    bytes after it."""
    if buffer.is_cuda:
        message.buffer = buffer
        conn.send(message)
        return
    conn.send(message)
    conn.send_bytes(buffer.numpy())


def receive_buffer(conn, message: Entries) -> torch.Tensor:
    """The buffer of ``message`` just received: its CUDA handle, or the bytes that follow it."""
    if message.buffer is not None:
        return message.buffer
    raw = bytearray(message.nbytes)
    conn.recv_bytes_into(raw)
    return torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)


def pack_tensors(tensors: Dict[str, torch.Tensor], device: torch.device) -> Tuple[torch.Tensor, List[tuple]]:
    """One uint8 buffer on ``device`` holding every tensor's bytes (each start 16-byte aligned)
    and ``(name, dtype name, shape, offset)`` of each."""
    specs: List[tuple] = []
    offset = 0
    for name, t in tensors.items():
        specs.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset))
        offset += t.numel() * t.element_size()
        offset += -offset % ALIGN_BYTES
    buffer = torch.empty(offset, dtype=torch.uint8, device=device)
    for (name, _, _, start), t in zip(specs, tensors.values()):
        nbytes = t.numel() * t.element_size()
        if nbytes:
            buffer[start:start + nbytes].copy_(t.contiguous().reshape(-1).view(torch.uint8))
    return buffer, specs


def unpack_tensors(buffer: torch.Tensor, specs: Sequence[tuple]) -> Dict[str, torch.Tensor]:
    """The tensors :func:`pack_tensors` packed, as views of ``buffer``."""
    out = {}
    for name, dtype_name, shape, start in specs:
        dtype = getattr(torch, dtype_name)
        nbytes = math.prod(shape) * dtype.itemsize
        out[name] = buffer[start:start + nbytes].view(dtype).view(shape)
    return out


__all__ = ["ALIGN_BYTES", "Done", "Entries", "Failed", "Ready", "ShareItem", "Stop", "Todo", "Work", "now_s",
           "pack_tensors", "receive_buffer", "send_entries", "share_groups", "unpack_tensors"]
