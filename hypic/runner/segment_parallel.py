"""Segment parallelism: a request's cold segments prefilled on several workers at once.

Under the ``standalone`` cold policy every missed segment is prefilled alone at position 0
(:meth:`hypic.runner.pic_runner.PicRunner._run_standalone`): its store entry depends on its own
tokens only, so the segments are independent work. On one GPU that saves only the attention
between segments (measured at most 1.24x on the all-cold 32k prompt on the H200, attention being
126.6 of 662.1 ms of its full prefill). Spread over ``m`` workers the linear and MoE work
divides too: ``O(n |C|)`` becomes ``O(ceil(n / m) |C| + c)``, with ``c`` the combine, the
all-hit forward of the request on the router (architecture.md section 2, the published system:
cold 32k TTFT 2.83 s -> 0.49 s on 8 H20s).

The processes form one ``torch.distributed`` group: rank 0 is the engine (router and combine
worker), ranks ``1..m-1`` each hold a replica of the model on their own device (NCCL between
GPUs, gloo on CPU). For a batch's cold segments the router

1. splits them over all ranks, itself included, longest processing time first
   (:func:`lpt_assign`; a segment's cost is its prefill FLOPs, linear plus its local attention);
2. sends each worker its share (token ids, body start and store key; over a gloo group, even
   with NCCL, as Python objects);
3. prefills its own share meanwhile, and inserts the entries into its store;
4. receives each worker's entries: the manifest (:func:`hypic.pic.persist.encode_entries`) and
   the tensors packed into one byte buffer (:func:`pack_tensors`), received straight onto its
   device, unpacked as views and compacted by the store's insert.

A worker that fails a share answers with its error, which the router raises
(:class:`SegmentWorkerError`); the worker keeps serving. :func:`start_segment_workers` spawns
the workers and joins the group; :meth:`SegmentParallel.close` stops them.
"""

from __future__ import annotations

import dataclasses
import datetime
import heapq
import os
import socket
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from hypic.pic.persist import decode_entries, encode_entries
from hypic.pic.payload import SegmentEntry

ALIGN_BYTES = 16  # every packed tensor starts here: its dtype view is aligned, loads vectorise
Todo = Dict[object, Tuple[Tuple[int, ...], int]]  # store key -> (token ids, body start)


class SegmentWorkerError(RuntimeError):
    """A worker could not prefill its share of segments."""


@dataclasses.dataclass(frozen=True)
class SegmentParallelConfig:
    """``num_workers``: processes that prefill cold segments, the engine's own included (1: no
    segment parallelism). ``backend``: ``auto`` (NCCL on CUDA, gloo on CPU), ``nccl`` or
    ``gloo``. ``devices``: one per rank (default: ``cuda:r`` on CUDA, else the engine's device
    for every rank). ``timeout_s``: how long a collective may wait."""

    num_workers: int = 1
    backend: str = "auto"
    devices: Optional[Tuple[str, ...]] = None
    timeout_s: float = 600.0

    def __post_init__(self):
        if not isinstance(self.num_workers, int) or isinstance(self.num_workers, bool) or self.num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1, got {self.num_workers!r}")
        if self.backend not in ("auto", "nccl", "gloo"):
            raise ValueError(f"backend must be 'auto', 'nccl' or 'gloo', got {self.backend!r}")
        if self.devices is not None:
            if not isinstance(self.devices, tuple) or len(self.devices) != self.num_workers:
                raise ValueError(f"devices must be a tuple naming one device per worker ({self.num_workers}), "
                                 f"got {self.devices!r}")
            for d in self.devices:
                try:
                    torch.device(d)
                except (RuntimeError, TypeError):
                    raise ValueError(f"devices: {d!r} is not a device name (cpu, cuda, cuda:N)") from None
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be a number > 0, got {self.timeout_s!r}")

    def rank_devices(self, engine_device: torch.device) -> Tuple[torch.device, ...]:
        if self.devices is not None:
            return tuple(torch.device(d) for d in self.devices)
        engine_device = torch.device(engine_device)
        if engine_device.type == "cuda":
            first = engine_device.index or 0
            return tuple(torch.device("cuda", first + r) for r in range(self.num_workers))
        return (engine_device,) * self.num_workers

    def resolved_backend(self, engine_device: torch.device) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if torch.device(engine_device).type == "cuda" else "gloo"


def lpt_assign(costs: Sequence[float], num_workers: int) -> List[List[int]]:
    """Indices of ``costs`` per worker, longest processing time first: the costliest item goes
    to the least loaded worker (ties: the lower index and rank first). Within 4/3 of the best
    makespan; deterministic, so every run splits a batch alike."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if any(c < 0 for c in costs):
        raise ValueError("costs must be >= 0")
    shares: List[List[int]] = [[] for _ in range(num_workers)]
    loads = [(0.0, r) for r in range(num_workers)]  # a heap of (load, rank)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, rank = heapq.heappop(loads)
        shares[rank].append(i)
        heapq.heappush(loads, (load + costs[i], rank))
    return shares


def segment_cost_fn(spec) -> Callable[[int], float]:
    """A segment's standalone prefill FLOPs by its length: per token linear work plus causal
    attention within the segment (:func:`hypic.bench.flops.flop_model`)."""
    from hypic.bench.flops import flop_model

    model = flop_model(spec)
    return lambda n: model.prefill(n, n * (n + 1) // 2, logits_rows=0)


# ---- tensors over the wire ----------------------------------------------------------------------

def pack_tensors(tensors: Dict[str, torch.Tensor], device: torch.device) -> Tuple[torch.Tensor, List[tuple]]:
    """One uint8 buffer on ``device`` holding every tensor's bytes (each start 16-byte aligned)
    and ``(name, dtype name, shape, offset)`` of each: one send instead of one per tensor (a
    64-segment batch has ~7,000)."""
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
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        out[name] = buffer[start:start + nbytes].view(dtype).view(shape)
    return out


# ---- the router (rank 0) ------------------------------------------------------------------------

class SegmentParallel:
    """Rank 0's side of a segment-parallel group (the process group is initialised)."""

    def __init__(self, world_size: int, control, device: torch.device, cost_fn: Callable[[int], float],
                 processes: Sequence = ()) -> None:
        self.world_size = world_size
        self.control = control  # a gloo group for the Python objects
        self.device = torch.device(device)
        self.cost_fn = cost_fn
        self._processes = list(processes)
        self.closed = False
        self.num_batches = 0
        self.segments_by_rank = [0] * world_size  # segments each rank prefilled, over all batches

    def prefill(self, todo: Todo, run_share: Callable[[Todo], None],
                on_entries: Callable[[List[SegmentEntry]], None]) -> None:
        """Prefill ``todo``'s segments over the group: each worker's share remotely, rank 0's by
        ``run_share(share)`` (which inserts its entries itself) while they run; every worker's
        entries are handed to ``on_entries`` as they arrive. Raises SegmentWorkerError naming
        the workers that failed, after every worker has answered."""
        if self.closed:
            raise RuntimeError("the segment-parallel group is closed")
        items = list(todo.items())
        shares = lpt_assign([self.cost_fn(len(tokens)) for _, (tokens, _) in items], self.world_size)
        for rank in range(1, self.world_size):
            dist.send_object_list([("work", [items[i] for i in shares[rank]])], dst=rank, group=self.control)
        errors = []
        try:
            if shares[0]:
                run_share(dict(items[i] for i in shares[0]))
        finally:
            # every worker's answer is taken even when the own share failed: the protocol stays
            # in step for the next batch
            for rank in range(1, self.world_size):
                reply = [None]
                dist.recv_object_list(reply, src=rank, group=self.control)
                status, manifest, specs, nbytes = reply[0]
                if status != "ok":
                    errors.append(f"rank {rank}: {manifest}")
                    continue
                buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
                if nbytes:
                    dist.recv(buffer, src=rank)
                entries = decode_entries(manifest, unpack_tensors(buffer, specs))
                self.segments_by_rank[rank] += len(entries)
                on_entries(entries)
        self.segments_by_rank[0] += len(shares[0])
        self.num_batches += 1
        if errors:
            raise SegmentWorkerError("segment workers failed: " + "; ".join(errors))

    def close(self) -> None:
        """Stop the workers, wait for their processes and leave the process group."""
        if self.closed:
            return
        self.closed = True
        try:
            for rank in range(1, self.world_size):
                dist.send_object_list([("stop", None)], dst=rank, group=self.control)
        finally:
            for p in self._processes:
                p.join(timeout=60)
                if p.is_alive():
                    p.terminate()
            if dist.is_initialized():
                dist.destroy_process_group()


# ---- the workers (ranks 1..m-1) -----------------------------------------------------------------

def serve(runner, control, device: torch.device) -> int:
    """A worker's loop: prefill each share the router sends (with ``runner``'s standalone pass,
    in groups that fit the device) and send the entries back, until told to stop. Returns the
    number of shares served."""
    served = 0
    while True:
        msg = [None]
        dist.recv_object_list(msg, src=0, group=control)
        kind, share = msg[0]
        if kind == "stop":
            return served
        buffer = None
        try:
            entries: List[SegmentEntry] = []
            for group in runner._standalone_groups(dict(share)):
                entries += runner._standalone_entries(group)
            manifest, tensors = encode_entries(entries, to_cpu=False)
            buffer, specs = pack_tensors(tensors, device)
            del entries, tensors
            reply = ("ok", manifest, specs, buffer.numel())
        except Exception as exc:  # noqa: BLE001 - the router raises it; this worker keeps serving
            reply, buffer = ("error", f"{type(exc).__name__}: {exc}", [], 0), None
        dist.send_object_list([reply], dst=0, group=control)
        if buffer is not None and buffer.numel():
            dist.send(buffer, dst=0)
        served += 1


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(rank: int, world_size: int, init_method: str, backend: str, timeout_s: float, device: torch.device):
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


def _worker_main(rank: int, world_size: int, init_method: str, backend: str, timeout_s: float, device: str,
                 model_dir: str, dtype: str, load_format: str, seed: int, enforce_eager: bool,
                 moe_backend: str) -> None:
    from hypic.runner.pic_runner import PicRunner
    from hypic.models.loader import load_model

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dev = torch.device(device)
    control = _join(rank, world_size, init_method, backend, timeout_s, dev)
    try:
        spec, model = load_model(model_dir, dtype=getattr(torch, dtype), device=dev, load_format=load_format,
                                 seed=seed, moe_backend=moe_backend)
        serve(PicRunner(model, spec, None, dev, getattr(torch, dtype), enforce_eager=enforce_eager), control, dev)
    finally:
        dist.destroy_process_group()


def start_segment_workers(config: SegmentParallelConfig, spec, *, model_dir: str, dtype: torch.dtype,
                          device: torch.device, load_format: str, seed: int,
                          enforce_eager: bool = False, moe_backend: str = "auto") -> Optional[SegmentParallel]:
    """Spawn ranks ``1..m-1`` (each loads ``model_dir`` on its device, its runner without CUDA
    graphs under ``enforce_eager``, its experts on ``moe_backend``) and join them as rank 0; None for ``num_workers`` 1. The
    caller's process then holds the default process group."""
    if config.num_workers == 1:
        return None
    if dist.is_initialized():
        raise RuntimeError("segment parallelism needs its own process group: torch.distributed is already initialised")
    import torch.multiprocessing as mp

    devices = config.rank_devices(device)
    backend = config.resolved_backend(device)
    if backend == "nccl" and any(d.type != "cuda" for d in devices):
        raise ValueError(f"the nccl backend needs a CUDA device per worker, got {devices}")
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    ctx = mp.get_context("spawn")
    processes = []
    for rank in range(1, config.num_workers):
        p = ctx.Process(target=_worker_main, daemon=True,
                        args=(rank, config.num_workers, init_method, backend, config.timeout_s, str(devices[rank]),
                              str(model_dir), str(dtype).removeprefix("torch."), load_format, seed,
                              enforce_eager, moe_backend))
        p.start()
        processes.append(p)
    try:
        control = _join(0, config.num_workers, init_method, backend, config.timeout_s, devices[0])
    except BaseException:
        for p in processes:
            p.terminate()
        raise
    return SegmentParallel(config.num_workers, control, devices[0], segment_cost_fn(spec), processes)


__all__ = ["SegmentParallel", "SegmentParallelConfig", "SegmentWorkerError", "lpt_assign", "pack_tensors",
           "segment_cost_fn", "serve", "start_segment_workers", "unpack_tensors"]
