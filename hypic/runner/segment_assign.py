"""How a batch's cold segments are split over the ranks of segment parallelism.

A rank's time in the scatter phase is the sum of its segments' prefill costs; the batch waits for
the slowest rank, so the split that matters is the one with the smallest largest load (the
makespan). Two policies:

* ``lpt`` (the default): longest processing time first, the costliest segment to the least loaded
  rank; within 4/3 of the best makespan.
* ``round_robin``: segment ``i`` (in prompt order) to rank ``i mod m``, whatever its cost: the
  baseline LPT is measured against. Equal on segments of one length, behind on uneven ones.

A segment's cost is its standalone prefill FLOPs (:func:`segment_cost_fn`): linear work per
token plus causal attention within the segment, so a 4096-token segment costs more than eight
512-token ones.
"""

from __future__ import annotations

import heapq
from typing import Callable, Dict, List, Sequence

from hypic.bench.flops import flop_model

ASSIGN_LPT = "lpt"
ASSIGN_ROUND_ROBIN = "round_robin"


def _check(costs: Sequence[float], num_workers: int) -> None:
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
    if any(c < 0 for c in costs):
        raise ValueError("costs must be >= 0")


def lpt_assign(costs: Sequence[float], num_workers: int) -> List[List[int]]:
    """Indices of ``costs`` per rank, longest processing time first: the costliest item goes to
    the least loaded rank (ties: the lower index and rank first). Deterministic, so every run
    splits a batch alike."""
    _check(costs, num_workers)
    shares: List[List[int]] = [[] for _ in range(num_workers)]
    loads = [(0.0, r) for r in range(num_workers)]  # a heap of (load, rank)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, rank = heapq.heappop(loads)
        shares[rank].append(i)
        heapq.heappush(loads, (load + costs[i], rank))
    return shares


def round_robin_assign(costs: Sequence[float], num_workers: int) -> List[List[int]]:
    """Indices of ``costs`` per rank in turn, item ``i`` to rank ``i mod num_workers`` (costs
    are checked, not used)."""
    _check(costs, num_workers)
    return [list(range(r, len(costs), num_workers)) for r in range(num_workers)]


ASSIGNMENTS: Dict[str, Callable[[Sequence[float], int], List[List[int]]]] = {
    ASSIGN_LPT: lpt_assign,
    ASSIGN_ROUND_ROBIN: round_robin_assign,
}


def assign(policy: str, costs: Sequence[float], num_workers: int) -> List[List[int]]:
    """The shares of ``policy`` (a name of :data:`ASSIGNMENTS`)."""
    if policy not in ASSIGNMENTS:
        raise ValueError(f"assignment must be one of {', '.join(ASSIGNMENTS)}, got {policy!r}")
    return ASSIGNMENTS[policy](costs, num_workers)


def rank_loads(costs: Sequence[float], shares: Sequence[Sequence[int]]) -> List[float]:
    """Each rank's summed cost; the makespan estimate is their maximum."""
    return [float(sum(costs[i] for i in share)) for share in shares]


def segment_cost_fn(spec) -> Callable[[int], float]:
    """A segment's standalone prefill FLOPs by its length: per token linear work plus causal
    attention within the segment (:func:`hypic.bench.flops.flop_model`)."""
    model = flop_model(spec)
    return lambda n: model.prefill(n, n * (n + 1) // 2, logits_rows=0)


__all__ = ["ASSIGNMENTS", "ASSIGN_LPT", "ASSIGN_ROUND_ROBIN", "assign", "lpt_assign", "rank_loads",
           "round_robin_assign", "segment_cost_fn"]
