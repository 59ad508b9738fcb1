"""Segment workers that fail on purpose (tests/runner/test_segment_faults.py). They are spawned by
:func:`hypic.runner.segment_parallel.launch`, so they live in a module the new process imports."""

from __future__ import annotations

import os
import signal

import torch

from hypic.models.loader import load_model
from hypic.runner.pic_runner import PicRunner
from hypic.runner.segment_worker import serve

FAULT_DIE, FAULT_HANG, FAULT_RAISE = "die", "hang", "raise"


class FaultyRunner:
    """A worker's runner whose ``at_group``-th forward (counted over the worker's life) fails
    once its entries are made, after the earlier groups' entries were sent: ``die`` SIGKILLs its
    own process, ``hang`` SIGSTOPs it, ``raise`` raises (as an out-of-memory would)."""

    def __init__(self, runner: PicRunner, fault: str, at_group: int) -> None:
        if fault not in (FAULT_DIE, FAULT_HANG, FAULT_RAISE):
            raise ValueError(f"unknown fault {fault!r}")
        self.runner, self.fault, self.at_group = runner, fault, at_group
        self.groups = 0

    def standalone_entry_groups(self, todo):
        for entries in self.runner.standalone_entry_groups(todo):
            self.groups += 1
            if self.groups == self.at_group:
                if self.fault == FAULT_DIE:
                    os.kill(os.getpid(), signal.SIGKILL)
                if self.fault == FAULT_HANG:
                    os.kill(os.getpid(), signal.SIGSTOP)
                raise RuntimeError("CUDA out of memory (a fault the test injected)")
            yield entries


def faulty_worker_main(conn, fault: str, at_group: int, model_dir: str, device: str, dtype: str, seed: int,
                       group_tokens: int) -> None:
    """A worker of ``model_dir`` (as the engine loads it) serving through a FaultyRunner."""
    torch.set_num_threads(1)
    dev = torch.device(device)
    spec, model = load_model(model_dir, dtype=getattr(torch, dtype), device=dev, seed=seed)
    runner = PicRunner(model, spec, None, dev, getattr(torch, dtype), enforce_eager=True)
    serve(FaultyRunner(runner, fault, at_group), conn, dev, group_tokens)
