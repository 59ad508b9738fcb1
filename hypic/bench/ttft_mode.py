"""One PIC mode under measurement for ``hypic bench ttft``: its own store, keyer and runner, and
the timing of one request (planning + prefill between device synchronisations)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Union

import torch

from hypic.bench.common import device_name, synchronize
from hypic.bench.floor import WorkModel, device_peaks
from hypic.pic.keys import Keyer, KeyNamespace
from hypic.pic.modes import PICConfig
from hypic.pic.plan import RequestPlan, plan_request
from hypic.pic.segments import SegmentedPrompt
from hypic.pic.store import SegmentStore


class CountingStore(SegmentStore):
    """A SegmentStore that also counts the bytes of the entries inserted (for the byte model)."""

    def __init__(self, device_budget_bytes: Optional[int], host_budget_bytes: int = 0, *,
                 device: Union[str, torch.device] = "cpu"):
        super().__init__(device_budget_bytes, host_budget_bytes, device=device)
        self.written_bytes = 0
        self.reread_bytes = 0  # inserted with acquire=True: the standalone entries read back

    def insert(self, entry, *, acquire: bool = False, compact: bool = True):
        new = entry.key not in self
        handle = super().insert(entry, acquire=acquire, compact=compact)
        if new:
            self.written_bytes += entry.nbytes
            if acquire:
                self.reread_bytes += entry.nbytes
        return handle


@dataclass
class Sample:
    ttft_s: float
    plan_s: float
    prompt_tokens: int
    live_tokens: int
    standalone_tokens: int
    reused_tokens: int  # segment hits + prefix-cache hits
    flops: float
    bytes: float
    floor_s: float


class ModeBench:
    """Fresh store + keyer + runner for one (mode, cold policy)."""

    def __init__(self, model, spec, work: WorkModel, device, dtype, mode: str, cold_policy: str,
                 seam, store_bytes: Optional[int], namespace: str, prefix_block_tokens: Optional[int] = None,
                 segment_min_tokens: int = 0):
        from hypic.runner.pic_runner import PicRunner  # heavy import, only when benchmarking

        self.mode, self.cold_policy = mode, cold_policy
        self.device = torch.device(device)
        self.work = work
        self.peaks = device_peaks(device_name(self.device))
        self.policy = PICConfig(mode=mode, seam=seam, cold_policy=cold_policy,
                                segment_min_tokens=segment_min_tokens).resolve()
        spec_mode = self.policy.mode
        uses_store = spec_mode.name != "full_recompute"
        self.store = CountingStore(store_bytes, 0, device=self.device) if uses_store else None
        self.keyer = Keyer(KeyNamespace(namespace, str(dtype).replace("torch.", "")))
        self.runner = PicRunner(model, spec, self.store, self.device, dtype)
        # the prefix cache, as an engine runs it (every mode but full_recompute, which keeps nothing)
        self.prefix_block_tokens = (prefix_block_tokens or self.runner.default_prefix_block_tokens()) \
            if uses_store else None
        # CUDA graphs of the row-wise phases for every token bucket, before any timed request
        # (a serving engine captures them at start-up); shared by every mode's runner.
        self.runner.capture_graphs()

    def plan(self, prompt: SegmentedPrompt) -> RequestPlan:
        return plan_request(prompt, self.policy, store=self.store, keyer=self.keyer,
                            prefix_block_tokens=self.prefix_block_tokens)

    def run(self, prompt: SegmentedPrompt) -> Sample:
        """Plan and prefill one request; TTFT between device synchronisations."""
        if self.store is not None:
            self.store.written_bytes = self.store.reread_bytes = 0
        synchronize(self.device)
        t0 = time.perf_counter()
        plan = self.plan(prompt)
        t1 = time.perf_counter()
        with plan:
            results = self.runner.prefill([plan])
            synchronize(self.device)
            t2 = time.perf_counter()
            del results  # the request's decode cache: not needed, free it now
            written = self.store.written_bytes if self.store is not None else 0
            reread = self.store.reread_bytes if self.store is not None else 0
            work = self.work.count(plan, written, reread)
            sample = Sample(
                ttft_s=t2 - t0, plan_s=t1 - t0, prompt_tokens=plan.prompt_tokens,
                live_tokens=plan.live_tokens, standalone_tokens=plan.standalone_tokens,
                reused_tokens=plan.cached_tokens + plan.prefix_hit_tokens,
                flops=work.flops, bytes=work.bytes, floor_s=work.floor_s(*self.peaks),
            )
        return sample

    def close(self) -> None:
        if self.store is not None:
            self.store.clear()
        self.store = self.runner = None


# ---- the benchmark ------------------------------------------------------------------------------
