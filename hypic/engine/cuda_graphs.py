"""CUDA graphs of the token-wise blocks of a forward (the MoE / MLP after each mixer).

A cached PIC request runs a few hundred live tokens through every layer: each kernel is short and
the forward is bound by the host launching ~100 kernels per layer. A layer's feed-forward block
(router, top-k, sort, two grouped GEMMs, the combine, the shared expert: ~35 launches) depends on
nothing but its ``[T, H]`` input, so it is captured once per (layer, padded token count) and
replayed as one launch, the way vLLM captures its piecewise graphs. The mixers (linear attention
and full attention over a request's cached layout) stay eager.

Token counts are padded up to a bucket (:data:`DEFAULT_BUCKETS`); larger inputs run eagerly (a
long prefill's kernels are long enough that launching them costs little). Rows are independent in
these blocks, so padding rows (stale values from an earlier replay) never change the real rows.
All graphs of one :class:`TokenGraphs` share one memory pool: replays run in stream order and
each output is copied out before the next replay, so a later graph may reuse an earlier one's
intermediates. A block whose capture fails (e.g. a host sync in an eager fallback path) runs
eagerly from then on. ``HYPIC_CUDA_GRAPHS=0`` turns graphs off.
"""

from __future__ import annotations

import bisect
import os
from typing import Dict, Optional, Sequence, Tuple

import torch

ENV = "HYPIC_CUDA_GRAPHS"
DEFAULT_BUCKETS: Tuple[int, ...] = (8, 16, 32, 64, 96, 128, 192, 256, 320, 384, 512, 640, 768, 1024, 1280,
                                    1536, 2048)


def graphs_enabled() -> bool:
    value = os.environ.get(ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def pick_bucket(buckets: Sequence[int], num_tokens: int) -> Optional[int]:
    """The smallest bucket holding ``num_tokens`` rows (``buckets`` sorted), None when none does."""
    i = bisect.bisect_left(buckets, num_tokens)
    return buckets[i] if i < len(buckets) else None


class _Graph:
    def __init__(self, graph: torch.cuda.CUDAGraph, output: torch.Tensor) -> None:
        self.graph = graph
        self.output = output


class TokenGraphs:
    """Captured replays of token-wise blocks ``f: [T, H] -> [T, H']`` on one CUDA device."""

    def __init__(self, device: torch.device, buckets: Sequence[int] = DEFAULT_BUCKETS) -> None:
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        buckets = tuple(sorted(int(b) for b in buckets))
        if not buckets or buckets[0] < 1 or len(set(buckets)) != len(buckets):
            raise ValueError(f"buckets must be distinct positive token counts, got {buckets}")
        self.device = device
        self.buckets = buckets
        self.pool = torch.cuda.graph_pool_handle()
        self._graphs: Dict[Tuple[int, int, torch.dtype, int], _Graph] = {}
        self._inputs: Dict[Tuple[int, torch.dtype, int], torch.Tensor] = {}
        self._failed: Dict[int, str] = {}  # id(module) -> why its capture failed
        self.num_captures = 0

    def failed(self, module: torch.nn.Module) -> Optional[str]:
        return self._failed.get(id(module))

    def run(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``module(x)`` for ``x [T, H]``, through a captured graph when T fits a bucket."""
        num_tokens = x.shape[0]
        size = pick_bucket(self.buckets, num_tokens) if x.dim() == 2 and x.device == self.device else None
        if size is None or id(module) in self._failed or torch.is_grad_enabled():
            return module(x)
        with torch.inference_mode():
            in_key = (size, x.dtype, x.shape[1])
            static_in = self._inputs.get(in_key)
            if static_in is None:
                static_in = self._inputs[in_key] = torch.zeros(size, x.shape[1], dtype=x.dtype, device=self.device)
            static_in[:num_tokens].copy_(x)
            key = (id(module), size, x.dtype, x.shape[1])
            entry = self._graphs.get(key)
            if entry is None:
                entry = self._capture(module, static_in)
                if entry is None:
                    return module(x)
                self._graphs[key] = entry
            entry.graph.replay()
            # A copy: the graph's buffer is rewritten by the next replay of any graph of the pool.
            return entry.output[:num_tokens].clone()

    def _capture(self, module: torch.nn.Module, static_in: torch.Tensor) -> Optional[_Graph]:
        # Warm up on a side stream (first-call work such as compilation or cuBLAS workspace
        # allocation must not land in the graph), then capture.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with torch.cuda.stream(side):
                for _ in range(2):
                    module(static_in)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                output = module(static_in)
        except Exception as err:  # noqa: BLE001 - any capture failure means "run eagerly"
            torch.cuda.current_stream(self.device).wait_stream(side)
            self._failed[id(module)] = f"{type(err).__name__}: {err}"
            return None
        self.num_captures += 1
        return _Graph(graph, output)


def make_token_graphs(device: torch.device) -> Optional[TokenGraphs]:
    """A :class:`TokenGraphs` for ``device`` when it is CUDA and graphs are enabled, else None."""
    device = torch.device(device)
    if device.type != "cuda" or not graphs_enabled():
        return None
    return TokenGraphs(device)


__all__ = ["DEFAULT_BUCKETS", "ENV", "TokenGraphs", "graphs_enabled", "make_token_graphs", "pick_bucket"]
