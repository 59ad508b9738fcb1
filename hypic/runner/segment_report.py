"""What the scatter phase of segment parallelism reports: per batch, how its cold segments were
split, when each rank computed, when the workers' entries arrived and were inserted, and every
worker fault (:mod:`hypic.runner.segment_parallel`).

Stamps are ``time.monotonic()`` seconds, one clock for every process of the host; a rank's
compute ends at its last group's device-synchronised end. From them:

* ``compute_s``: from the scatter's start until the last rank finished computing (the engine's
  own share and what it prefilled for a lost worker included);
* ``transfer_s``: wall time during which some group's entries were moving: from written (on
  the worker) to received (packed, sent, copied onto the engine's device), and while the engine
  inserted them (between its own groups; the wait for that is not counted);
* ``exposed_transfer_s``: from the end of compute until the last entries were inserted — the
  part of the transfer that no compute hid; ``transfer_overlap`` = 1 - exposed / transfer.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

FAULT_DIED = "died"  # the process ended (killed, crashed) or its pipe broke
FAULT_HUNG = "hung"  # no answer within the reply timeout: killed by the engine
FAULT_RAISED = "raised"  # the worker answered with an error and keeps serving


@dataclass(frozen=True)
class WorkerFault:
    """A worker that failed its share: ``kind`` (died, hung, raised), what was seen, the batch,
    how many of its segments the engine prefilled itself, and how many workers remain."""

    rank: int
    pid: int
    kind: str
    detail: str
    batch: int
    segments_recomputed: int
    workers_left: int


class PhaseTimer:
    """A span of the engine's work, timed on its device: CUDA events (nothing waits for them
    until :meth:`elapsed_s` is asked) or the host clock."""

    def __init__(self, device: torch.device) -> None:
        self._device = torch.device(device)
        self._cuda = self._device.type == "cuda"
        if self._cuda:
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._start.record(torch.cuda.current_stream(self._device))
        else:
            self._start_s, self._end_s = time.perf_counter(), None

    def stop(self) -> None:
        if self._cuda:
            self._end.record(torch.cuda.current_stream(self._device))
        else:
            self._end_s = time.perf_counter()

    def elapsed_s(self) -> float:
        if self._cuda:
            self._end.synchronize()
            return self._start.elapsed_time(self._end) / 1e3
        return self._end_s - self._start_s


def union_s(spans: List[Tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` spans."""
    total, reach = 0.0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


@dataclass
class ScatterReport:
    """One batch of the scatter phase (see the module). ``estimated_loads``: each rank's summed
    segment cost (FLOPs) under the assignment, rank 0 (the engine) first."""

    batch: int
    assignment: str
    num_segments: int
    num_tokens: int
    estimated_loads: List[float]
    started_at: float
    finished_at: Optional[float] = None
    own_compute_s: float = 0.0
    fallback_compute_s: float = 0.0
    fallback_segments: int = 0
    local_done_at: Optional[float] = None
    worker_compute_s: Dict[int, float] = field(default_factory=dict)
    worker_done_at: Dict[int, float] = field(default_factory=dict)
    transfers: List[Tuple[float, float]] = field(default_factory=list)  # (start, end) of each transfer span
    received_bytes: int = 0
    faults: List[WorkerFault] = field(default_factory=list)

    @property
    def scatter_s(self) -> float:
        return self.finished_at - self.started_at

    @property
    def compute_end(self) -> float:
        ends = [t for t in [self.local_done_at, *self.worker_done_at.values()] if t is not None]
        return max(ends, default=self.started_at)

    @property
    def compute_s(self) -> float:
        return self.compute_end - self.started_at

    @property
    def transfer_s(self) -> float:
        return union_s(self.transfers)

    @property
    def exposed_transfer_s(self) -> float:
        return max(0.0, self.finished_at - self.compute_end) if self.transfers else 0.0

    @property
    def transfer_overlap(self) -> Optional[float]:
        transfer = self.transfer_s
        return None if transfer <= 0 else max(0.0, 1.0 - self.exposed_transfer_s / transfer)

    @property
    def estimated_imbalance(self) -> float:
        """The estimated makespan over the mean load (1.0: perfectly even)."""
        mean = sum(self.estimated_loads) / len(self.estimated_loads)
        return max(self.estimated_loads) / mean if mean > 0 else 1.0

    def summary(self) -> Dict[str, object]:
        """The figures a benchmark row keeps (seconds as ms)."""
        return {
            "assignment": self.assignment, "num_segments": self.num_segments, "num_tokens": self.num_tokens,
            "estimated_imbalance": self.estimated_imbalance,
            "scatter_ms": self.scatter_s * 1e3, "compute_ms": self.compute_s * 1e3,
            "own_compute_ms": self.own_compute_s * 1e3,
            "worker_compute_ms": {str(r): s * 1e3 for r, s in self.worker_compute_s.items()},
            "transfer_ms": self.transfer_s * 1e3, "exposed_transfer_ms": self.exposed_transfer_s * 1e3,
            "transfer_overlap": self.transfer_overlap, "received_bytes": self.received_bytes,
            "fallback_segments": self.fallback_segments, "faults": [asdict(f) for f in self.faults],
        }


__all__ = ["FAULT_DIED", "FAULT_HUNG", "FAULT_RAISED", "PhaseTimer", "ScatterReport", "WorkerFault", "union_s"]
