"""A segment worker's process: a replica of the model that prefills the cold segments the engine
sends it (:mod:`hypic.runner.segment_parallel`) and sends back their store entries.

Each share runs in groups of at most ``group_tokens`` tokens (and as device memory allows); a
group's entries are packed and sent the moment they are written, so their transfer overlaps the
next group's forward here and the engine's own share there. A share that raises is answered with
:class:`~hypic.runner.segment_wire.Failed` and the worker keeps serving; it stops on
:class:`~hypic.runner.segment_wire.Stop` or when the engine's end of the pipe closes.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import torch.multiprocessing  # noqa: F401 - registers torch's reductions: tensors cross the pipe as handles

from hypic.models.loader import load_model
from hypic.pic.persist import encode_entries
from hypic.runner.pic_runner import PicRunner
from hypic.runner.segment_wire import (Done, Entries, Failed, Ready, Stop, Work, now_s, pack_tensors, send_entries,
                                      share_groups)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _send_share(runner, conn, device: torch.device, work: Work, group_tokens: Optional[int]) -> int:
    num_segments = 0
    for group in share_groups(work.items, group_tokens):
        entry_groups = runner.standalone_entry_groups(dict(group))
        while True:
            started = now_s()
            entries = next(entry_groups, None)
            if entries is None:
                break
            _synchronize(device)  # the forward's time, not its launch
            written = now_s()
            manifest, tensors = encode_entries(entries, to_cpu=False)
            buffer, specs = pack_tensors(tensors, device)
            num_segments += len(entries)
            del entries, tensors
            send_entries(conn, Entries(work.batch, manifest, specs, None, buffer.numel(), written - started, written),
                         buffer)
    return num_segments


def serve(runner, conn, device: torch.device, group_tokens: Optional[int] = None) -> int:
    """A worker's loop: announce itself, then prefill each share ``conn`` brings with
    ``runner``'s standalone pass and send the entries back group by group, until told to stop
    or the engine is gone. Returns the number of shares served."""
    device = torch.device(device)
    conn.send(Ready(os.getpid(), str(device)))
    served = 0
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the engine is gone: nobody to serve
            return served
        if isinstance(message, Stop):
            return served
        if not isinstance(message, Work):
            continue
        try:
            reply = Done(message.batch, _send_share(runner, conn, device, message, group_tokens))
        except (EOFError, OSError):
            return served
        except Exception as exc:  # noqa: BLE001 - the engine prefills the rest itself; this worker keeps serving
            reply = Failed(message.batch, f"{type(exc).__name__}: {exc}")
        conn.send(reply)
        served += 1


def worker_main(conn, device: str, model_dir: str, dtype: str, load_format: str, seed: int, enforce_eager: bool,
                moe_backend: str, group_tokens: Optional[int], num_threads: int) -> None:
    """A spawned worker: load ``model_dir`` on ``device`` and :func:`serve`. A failure to start
    is answered with Failed (batch 0), which the engine raises."""
    torch.set_num_threads(num_threads)
    dev = torch.device(device)
    try:
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        spec, model = load_model(model_dir, dtype=getattr(torch, dtype), device=dev, load_format=load_format,
                                 seed=seed, moe_backend=moe_backend)
        runner = PicRunner(model, spec, None, dev, getattr(torch, dtype), enforce_eager=enforce_eager)
    except Exception as exc:  # noqa: BLE001 - reported to the engine, which raises it
        conn.send(Failed(0, f"{type(exc).__name__}: {exc}"))
        return
    serve(runner, conn, dev, group_tokens)


__all__ = ["serve", "worker_main"]
