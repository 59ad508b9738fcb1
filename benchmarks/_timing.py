"""Wall-clock timing between device synchronisations, shared by the GPU benchmark scripts."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from typing import Callable, Iterator, List, Tuple, TypeVar

import torch

T = TypeVar("T")


@contextlib.contextmanager
def env_vars(**values: str) -> Iterator[None]:
    """Set environment switches (read by hypic at each call) for the ``with`` block, then put
    back what was there (unset stays unset)."""
    old = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def sync(device: str = "cuda") -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], T], device: str = "cuda") -> Tuple[T, float]:
    """``(fn(), seconds)`` with the device drained before and after the call."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - start



def event_times_ms(fn: Callable[[], object], repeats: int = 10, lead_sleep_cycles: int = 0) -> List[float]:
    """GPU time of each of ``repeats`` calls of ``fn`` in milliseconds, between CUDA events, after
    one untimed call (compiles, autotuning). ``lead_sleep_cycles``: a sleep kernel of that many
    cycles before each call keeps the GPU busy while the host launches, so that the events time
    the kernels alone rather than the launch latency of an eager call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        if lead_sleep_cycles:
            torch.cuda._sleep(lead_sleep_cycles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def event_median_ms(fn: Callable[[], object], repeats: int = 10) -> float:
    """Median of :func:`event_times_ms`."""
    return statistics.median(event_times_ms(fn, repeats))


class CaptureSets:
    """For an A/B of a switch read when a CUDA graph is captured (``HYPIC_GRAPH_GLUE``), not at
    every call: each value gets graphs of its own, the runner's row-wise
    :class:`~hypic.graphs.cuda_graphs.TokenGraphs` (every bucket captured at the value's first
    use, under its switches) and its kept core graphs, swapped in for the ``with`` block. Without
    graphs (CPU) it does nothing."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.sets = {}

    @contextlib.contextmanager
    def use(self, value: str) -> Iterator[None]:
        from hypic.graphs.cuda_graphs import TokenGraphs
        from hypic.graphs.layer_graphs import LayoutGraphs

        runner = self.runner
        if runner.graphs is None:
            yield
            return
        first = value not in self.sets
        if first:
            self.sets[value] = (TokenGraphs(runner.graphs.device, runner.graphs.buckets), LayoutGraphs())
        old = (runner.graphs, runner.layout_graphs)
        runner.graphs, runner.layout_graphs = self.sets[value]
        try:
            if first:
                runner.capture_graphs()
            yield
        finally:
            runner.graphs, runner.layout_graphs = old
