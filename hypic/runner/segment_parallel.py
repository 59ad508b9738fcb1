"""Segment parallelism: a request's cold segments prefilled on several workers at once.

Under the ``standalone`` cold policy every missed segment is prefilled alone at position 0
(:meth:`hypic.runner.pic_runner.PicRunner.prefill_standalone`): its store entry depends on its
own tokens only, so the segments are independent work. On one GPU that saves only the attention
between segments (measured at most 1.24x on the all-cold 32k prompt on the H200, attention being
126.6 of 662.1 ms of its full prefill). Spread over ``m`` ranks the linear and MoE work divides
too: ``O(n |C|)`` becomes ``O(ceil(n / m) |C| + c)``, with ``c`` the combine, the all-hit forward
of the request on the engine (architecture.md section 2, the published system: cold 32k TTFT
2.83 s -> 0.49 s on 8 H20s).

Rank 0 is the engine; ranks ``1..m-1`` are worker processes (:mod:`hypic.runner.segment_worker`),
each with a replica of the model on its own device. For a batch's cold segments the engine

1. splits them over every live rank, itself included, by the configured assignment
   (:mod:`hypic.runner.segment_assign`: longest processing time first by default);
2. sends each worker its share (token ids, body start and store key);
3. prefills its own share meanwhile, group by group, and between groups inserts whatever entries
   the workers have sent: a worker sends each group's entries as soon as they are written, so
   the transfer overlaps compute on both sides;
4. waits (bounded) for the rest.

**Transport.** Each worker has its own pipe; a group's tensors cross it packed in one buffer, as
a CUDA IPC handle between GPUs and as bytes on the CPU (:mod:`hypic.runner.segment_wire`), not
through ``torch.distributed``: a collective or a point-to-point receive on a dead peer hangs or poisons
the whole process group (an NCCL receive also wedges the receiving stream until the communicator
is aborted), and a group cannot drop a member without every survivor re-joining a new one. Pipes
share no state: one worker's death closes only its own pipe, is seen at once (the pipe's end and
the process's sentinel), and every wait of the engine has a deadline.

**Faults.** A worker that dies (its pipe closes), hangs (no answer within ``reply_timeout_s``: it
is killed) or raises (it answers with its error) loses only the part of its share not yet
received: the engine prefills that itself, so the request completes with the same entries and
nothing is lost. A dead or hung worker is dropped (later batches split over the survivors, or the
engine alone); one that raised keeps serving. Every fault is logged, kept in :attr:`faults` and
handed to ``on_fault`` (the engine's counters).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple

import torch
import torch.multiprocessing as mp

from hypic.pic.payload import SegmentEntry
from hypic.pic.persist import decode_entries
from hypic.runner.segment_assign import ASSIGN_LPT, ASSIGNMENTS, assign, rank_loads, segment_cost_fn
from hypic.runner.segment_link import Lost, WorkerLink, exit_detail
from hypic.runner.segment_report import FAULT_DIED, FAULT_HUNG, FAULT_RAISED, ScatterReport, WorkerFault
from hypic.runner.segment_wire import (Done, Entries, Failed, Ready, ShareItem, Stop, Todo, Work, now_s,
                                       share_groups, unpack_tensors)
from hypic.runner.segment_worker import worker_main

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0  # how long close() waits for workers to leave before killing them


def _positive_number(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class SegmentParallelConfig:
    """``num_workers``: processes that prefill cold segments, the engine's own included (1: no
    segment parallelism). ``devices``: one per rank (default: ``cuda:r`` on CUDA, else the
    engine's device for every rank). ``assignment``: how a batch's segments are split
    (``lpt``, ``round_robin``). ``group_tokens``: tokens of one forward on a rank; each group's
    entries are sent as soon as they are written, so their transfer overlaps the next group's
    compute (None: a rank's whole share in one forward, as device memory allows).
    ``start_timeout_s``: how long a worker may take to load the model. ``reply_timeout_s``: how
    long a worker with work may stay silent (one group's forward must fit) before the engine
    takes it for hung, kills it and prefills the rest of its share itself."""

    num_workers: int = 1
    devices: Optional[Tuple[str, ...]] = None
    assignment: str = ASSIGN_LPT
    group_tokens: Optional[int] = 2048
    start_timeout_s: float = 600.0
    reply_timeout_s: float = 60.0

    def __post_init__(self):
        if not isinstance(self.num_workers, int) or isinstance(self.num_workers, bool) or self.num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1, got {self.num_workers!r}")
        if self.devices is not None:
            if not isinstance(self.devices, tuple) or len(self.devices) != self.num_workers:
                raise ValueError(f"devices must be a tuple naming one device per worker ({self.num_workers}), "
                                 f"got {self.devices!r}")
            for d in self.devices:
                try:
                    torch.device(d)
                except (RuntimeError, TypeError):
                    raise ValueError(f"devices: {d!r} is not a device name (cpu, cuda, cuda:N)") from None
        if self.assignment not in ASSIGNMENTS:
            raise ValueError(f"assignment must be one of {', '.join(ASSIGNMENTS)}, got {self.assignment!r}")
        if self.group_tokens is not None and (isinstance(self.group_tokens, bool)
                                              or not isinstance(self.group_tokens, int) or self.group_tokens < 1):
            raise ValueError(f"group_tokens must be an int >= 1 or None, got {self.group_tokens!r}")
        _positive_number("start_timeout_s", self.start_timeout_s)
        _positive_number("reply_timeout_s", self.reply_timeout_s)

    def rank_devices(self, engine_device: torch.device) -> Tuple[torch.device, ...]:
        engine_device = torch.device(engine_device)
        if self.devices is not None:
            devices = tuple(torch.device(d) for d in self.devices)
            if _normal(devices[0]) != _normal(engine_device):
                # rank 0 is the engine: its entries and the workers' land on the engine's device
                raise ValueError(f"segment_devices[0] is rank 0, the engine itself: expected the engine's device "
                                 f"{engine_device}, got {devices[0]}")
            return devices
        if engine_device.type == "cuda":
            first = engine_device.index or 0
            return tuple(torch.device("cuda", first + r) for r in range(self.num_workers))
        return (engine_device,) * self.num_workers


def _normal(device: torch.device) -> torch.device:
    return torch.device(device.type, device.index or 0) if device.type == "cuda" else torch.device(device.type)


@dataclasses.dataclass
class _Batch:
    """The engine's state of one batch: local groups still to run (``True``: a lost worker's),
    and per worker the items not received yet."""

    batch: int
    local: Deque[Tuple[List[ShareItem], bool]]
    pending: Dict[int, Dict[object, Tuple[Tuple[int, ...], int]]]
    report: ScatterReport


class SegmentParallel:
    """The engine's side of segment parallelism over started workers (``links``, answering to
    ``events``); see the module. ``cost_fn``: a segment's cost by its length."""

    def __init__(self, links: Sequence[WorkerLink], events: "queue.Queue", device: torch.device,
                 cost_fn: Callable[[int], float], config: SegmentParallelConfig,
                 on_fault: Optional[Callable[[WorkerFault], None]] = None) -> None:
        self.links = {link.rank: link for link in links}
        self.events = events
        self.device = torch.device(device)
        self.cost_fn = cost_fn
        self.config = config
        self.on_fault = on_fault
        self.closed = False
        self.num_batches = 0
        # segments each rank prefilled, over all batches (rank 0: its shares and failed workers' rest)
        self.segments_by_rank = [0] * (1 + len(self.links))
        self.num_segments_recomputed = 0  # a failed worker's segments the engine prefilled itself
        self.faults: List[WorkerFault] = []
        self.last_report: Optional[ScatterReport] = None
        self._assignment = config.assignment

    @property
    def assignment(self) -> str:
        """The split policy of the next batches: ``config.assignment``, or another set here
        between batches (a benchmark compares policies on one set of workers)."""
        return self._assignment

    @assignment.setter
    def assignment(self, policy: str) -> None:
        if policy not in ASSIGNMENTS:
            raise ValueError(f"assignment must be one of {', '.join(ASSIGNMENTS)}, got {policy!r}")
        self._assignment = policy

    @property
    def live_ranks(self) -> List[int]:
        return [rank for rank, link in self.links.items() if link.alive]

    def await_ready(self, timeout_s: float) -> None:
        """Wait until every worker has loaded its model; raises RuntimeError naming a worker that
        failed, died or took longer than ``timeout_s``."""
        waiting = set(self.links)
        deadline = now_s() + timeout_s
        while waiting:
            try:
                rank, message = self.events.get(timeout=max(0.0, deadline - now_s()))
            except queue.Empty:
                raise RuntimeError(f"segment workers {sorted(waiting)} did not start within {timeout_s} s") from None
            if isinstance(message, Ready):
                waiting.discard(rank)
            elif isinstance(message, Failed):
                raise RuntimeError(f"segment worker {rank} failed to start: {message.message}")
            elif isinstance(message, Lost):
                link = self.links[rank]
                link.process.join(1.0)
                raise RuntimeError(f"segment worker {rank} ended while starting ({exit_detail(link.process.exitcode)})")

    # ---- a batch ------------------------------------------------------------------------------
    def prefill(self, todo: Todo, run_share: Callable[[Todo], None],
                on_entries: Callable[[List[SegmentEntry]], None]) -> ScatterReport:
        """Prefill ``todo``'s segments over the live ranks: each worker's share remotely, the
        engine's by ``run_share(share)`` (which inserts its entries itself), group by group;
        workers' entries are handed to ``on_entries`` as they arrive; a failed worker's missing
        segments go through ``run_share`` too. Returns the batch's report. An error of
        ``run_share`` or ``on_entries`` propagates (the workers' late answers are dropped)."""
        if self.closed:
            raise RuntimeError("the segment workers are stopped")
        self.num_batches += 1
        items = list(todo.items())
        state = _Batch(self.num_batches, collections.deque(), {},
                       ScatterReport(self.num_batches, self.assignment, len(items),
                                     sum(len(tokens) for _, (tokens, _) in items), [], started_at=now_s()))
        # a worker lost between batches is dropped before the split: by its pipe, or by its process
        self._pump(state, on_entries, block=False)
        for rank in self.live_ranks:
            if not self.links[rank].process.is_alive():
                self._handle(state, rank, Lost("the process ended"), on_entries)
        self._dispatch(state, items)
        while state.local or state.pending:
            if state.local:
                group, fallback = state.local.popleft()
                started = now_s()
                run_share(dict(group))
                self._synchronize()  # stamps of device time, like the workers'
                state.report.local_done_at = now_s()
                if fallback:
                    state.report.fallback_compute_s += state.report.local_done_at - started
                else:
                    state.report.own_compute_s += state.report.local_done_at - started
                self.segments_by_rank[0] += len(group)
                self._pump(state, on_entries, block=False)
            else:
                self._pump(state, on_entries, block=True)
        self._synchronize()
        state.report.finished_at = now_s()
        self.last_report = state.report
        return state.report

    def _dispatch(self, state: _Batch, items: List[ShareItem]) -> None:
        """Split ``items`` over the live ranks: the engine's share into its queue, each worker's
        sent to it."""
        ranks = self.live_ranks
        costs = [self.cost_fn(len(tokens)) for _, (tokens, _) in items]
        shares = assign(self.assignment, costs, 1 + len(ranks))
        state.report.estimated_loads = rank_loads(costs, shares)
        own = [items[i] for i in shares[0]]
        # groups only let workers' entries be inserted between them: with no worker live the share
        # is one call of run_share (which still splits it to fit the device)
        state.local.extend((g, False) for g in share_groups(own, self.config.group_tokens if ranks else None))
        for rank, share in zip(ranks, shares[1:]):
            if share:
                link = self.links[rank]
                state.pending[rank] = dict(items[i] for i in share)
                link.last_heard_s = now_s()
                link.send(Work(state.batch, [items[i] for i in share]))

    def _pump(self, state: _Batch, on_entries, block: bool) -> None:
        """Handle every answer already in; with ``block`` and none in, wait for one until the
        nearest reply deadline. Then drop the workers past their deadline."""
        try:
            if block:
                deadline = min(self.links[r].last_heard_s for r in state.pending) + self.config.reply_timeout_s
                first = self.events.get(timeout=max(0.0, deadline - now_s()))
            else:
                first = self.events.get_nowait()
        except queue.Empty:
            first = None
        while first is not None:
            self._handle(state, *first, on_entries)
            try:
                first = self.events.get_nowait()
            except queue.Empty:
                first = None
        for rank in list(state.pending):
            link = self.links[rank]
            silent_s = now_s() - link.last_heard_s
            if link.alive and silent_s > self.config.reply_timeout_s:
                self._fail(state, link, FAULT_HUNG, f"no answer for {silent_s:.1f} s; {link.kill()}")

    def _handle(self, state: _Batch, rank: int, message, on_entries) -> None:
        link = self.links[rank]
        if isinstance(message, Lost):
            if link.alive:
                link.alive = False
                link.process.join(1.0)  # its pipe closed: it is ending, if not already gone
                detail = exit_detail(link.process.exitcode)
                if link.process.is_alive():
                    detail = f"{message.detail}; {link.kill()}"
                self._fail(state, link, FAULT_DIED, detail)
            return
        if not link.alive or getattr(message, "batch", None) != state.batch:
            return  # an answer after the worker was given up, or to a batch given up
        if isinstance(message, Entries):
            self._insert(state, rank, message, on_entries)
        elif isinstance(message, Failed):
            self._fail(state, link, FAULT_RAISED, message.message)
        elif isinstance(message, Done):
            if state.pending.get(rank):  # done without some of its share: prefilled here like a failure's
                self._fail(state, link, FAULT_RAISED, f"done without {len(state.pending[rank])} of its segments")
            state.pending.pop(rank, None)

    def _insert(self, state: _Batch, rank: int, message: Entries, on_entries) -> None:
        inserting_at = now_s()
        want = state.pending.get(rank, {})
        entries = [e for e in decode_entries(message.manifest, unpack_tensors(message.buffer, message.specs))
                   if e.key in want]
        if message.buffer.is_cuda:  # copied on the receiver's stream, read on the engine's
            message.buffer.record_stream(torch.cuda.current_stream(message.buffer.device))
        on_entries(entries)
        for e in entries:
            del want[e.key]
        report = state.report
        # the transfer's two parts: packed, sent and copied (worker and receiver), then inserted
        # here; the wait in between, behind the engine's own group, is no transfer work
        report.transfers += [(message.written_at, message.received_at), (inserting_at, now_s())]
        report.worker_compute_s[rank] = report.worker_compute_s.get(rank, 0.0) + message.compute_s
        report.worker_done_at[rank] = max(report.worker_done_at.get(rank, 0.0), message.written_at)
        report.received_bytes += message.buffer.numel()
        self.segments_by_rank[rank] += len(entries)

    def _fail(self, state: _Batch, link: WorkerLink, kind: str, detail: str) -> None:
        """``link``'s unanswered segments to the engine's own queue; the fault recorded and told."""
        missing = list(state.pending.pop(link.rank, {}).items())
        state.local.extend((g, True) for g in share_groups(missing, self.config.group_tokens))
        state.report.fallback_segments += len(missing)
        self.num_segments_recomputed += len(missing)
        fault = WorkerFault(link.rank, link.pid, kind, detail, state.batch, len(missing), len(self.live_ranks))
        self.faults.append(fault)
        state.report.faults.append(fault)
        logger.warning("segment worker %d (pid %d) %s in batch %d (%s): the engine prefills %d of its segments "
                       "itself; %d worker(s) %s", link.rank, link.pid, kind, state.batch, detail, len(missing),
                       fault.workers_left, "serve on" if kind == FAULT_RAISED else "left")
        if self.on_fault is not None:
            self.on_fault(fault)

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """Stop the workers (killing any that do not leave within STOP_TIMEOUT_S) and reap them."""
        if self.closed:
            return
        self.closed = True
        for link in self.links.values():
            if link.alive:
                link.send(Stop())
        deadline = now_s() + STOP_TIMEOUT_S
        for link in self.links.values():
            link.process.join(max(0.0, deadline - now_s()))
            if link.process.is_alive():
                link.kill()
            link.alive = False


# ---- starting workers ---------------------------------------------------------------------------

def launch(target: Callable, args_by_rank: Sequence[tuple], device: torch.device, cost_fn: Callable[[int], float],
           config: SegmentParallelConfig, on_fault: Optional[Callable[[WorkerFault], None]] = None) -> SegmentParallel:
    """Spawn one worker per ``args_by_rank`` entry (rank 1 first), each running ``target(conn,
    *args)`` (:func:`hypic.runner.segment_worker.worker_main`, or any function that ends in
    :func:`~hypic.runner.segment_worker.serve`), and wait until all are ready. Spawned, not
    forked: CUDA cannot be forked, and a fork would copy the engine's model."""
    ctx = mp.get_context("spawn")
    events: "queue.Queue" = queue.Queue()
    links: List[WorkerLink] = []
    try:
        for rank, args in enumerate(args_by_rank, start=1):
            conn, child_conn = ctx.Pipe(duplex=True)
            process = ctx.Process(target=target, args=(child_conn, *args), daemon=True,
                                  name=f"hypic-segment-worker-{rank}")
            process.start()
            child_conn.close()  # the worker's end lives in the worker only: its death closes the pipe
            links.append(WorkerLink(rank, process, conn, events, device))
        pool = SegmentParallel(links, events, device, cost_fn, config, on_fault)
        pool.await_ready(config.start_timeout_s)
    except BaseException:
        for link in links:
            link.kill()
        raise
    return pool


def start_segment_workers(config: SegmentParallelConfig, spec, *, model_dir: str, dtype: torch.dtype,
                          device: torch.device, load_format: str, seed: int, enforce_eager: bool = False,
                          moe_backend: str = "auto",
                          on_fault: Optional[Callable[[WorkerFault], None]] = None) -> Optional[SegmentParallel]:
    """Spawn ranks ``1..m-1``, each loading ``model_dir`` on its device (its runner without CUDA
    graphs under ``enforce_eager``, its experts on ``moe_backend``); None for ``num_workers`` 1.
    A device that does not exist is a ValueError; a worker that cannot start, a RuntimeError."""
    if config.num_workers == 1:
        return None
    devices = config.rank_devices(device)
    for d in devices:
        if d.type == "cuda" and (d.index or 0) >= torch.cuda.device_count():
            raise ValueError(f"segment worker device {d} does not exist ({torch.cuda.device_count()} CUDA devices)")
    threads = max(1, (os.cpu_count() or 1) // config.num_workers)
    args = [(str(devices[rank]), str(model_dir), str(dtype).removeprefix("torch."), load_format, seed, enforce_eager,
             moe_backend, config.group_tokens, threads) for rank in range(1, config.num_workers)]
    return launch(worker_main, args, devices[0], segment_cost_fn(spec), config, on_fault)


__all__ = ["STOP_TIMEOUT_S", "SegmentParallel", "SegmentParallelConfig", "launch", "start_segment_workers"]
