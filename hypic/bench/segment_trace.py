"""The cold prompts of ``hypic bench segment-parallel`` and what its rows derive.

A trace is ``NxL`` (N segments of L tokens) or ``NxA-B`` (N segments whose lengths are drawn
log-uniformly in [A, B]: many short, a few long — the uneven split on which the assignment
policy matters). The lengths of request ``r`` depend only on the seed, the trace and ``r``, so
every worker count and assignment sees the same lengths, request by request.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from hypic.bench.common import median

_TRACE = re.compile(r"\s*(\d+)x(\d+)(?:-(\d+))?\s*")


@dataclass(frozen=True)
class Trace:
    num_segments: int
    min_tokens: int
    max_tokens: int

    @property
    def name(self) -> str:
        if self.min_tokens == self.max_tokens:
            return f"{self.num_segments}x{self.min_tokens}"
        return f"{self.num_segments}x{self.min_tokens}-{self.max_tokens}"

    @property
    def uneven(self) -> bool:
        return self.min_tokens != self.max_tokens

    @property
    def max_prompt_tokens(self) -> int:
        return self.num_segments * self.max_tokens

    def lengths(self, seed: int, request_index: int) -> List[int]:
        """The segment lengths of request ``request_index``."""
        if not self.uneven:
            return [self.min_tokens] * self.num_segments
        return uneven_lengths(random.Random(f"{seed}/{self.name}/{request_index}"), self.num_segments,
                              self.min_tokens, self.max_tokens)


def uneven_lengths(rng: random.Random, num_segments: int, min_tokens: int, max_tokens: int) -> List[int]:
    """``num_segments`` lengths drawn log-uniformly in [min_tokens, max_tokens]."""
    lo, hi = math.log(min_tokens), math.log(max_tokens)
    return [min(max_tokens, max(min_tokens, round(math.exp(rng.uniform(lo, hi))))) for _ in range(num_segments)]


def parse_traces(text: str) -> List[Trace]:
    """``64x512,24x256-4096`` -> the traces; a clear ValueError for anything else."""
    traces = []
    for part in text.split(","):
        match = _TRACE.fullmatch(part)
        if match is None:
            raise ValueError(f"--traces: {part!r} is not NxL or NxA-B (e.g. 64x512, 24x256-4096)")
        n, a = int(match.group(1)), int(match.group(2))
        b = int(match.group(3)) if match.group(3) else a
        if n < 1 or a < 1 or b < a:
            raise ValueError(f"--traces: {part!r} needs N >= 1 and 1 <= A <= B")
        traces.append(Trace(n, a, b))
    return traces


def _p50(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return median(present) if present else None


def split_p50(samples: Sequence[Dict]) -> Dict[str, Optional[float]]:
    """The p50 over requests of each phase: ``scatter_ms`` (the standalone pass: workers' and the
    engine's compute and the transfer), ``combine_ms`` (the rest of the TTFT: planning, the
    request's all-hit forward, the first token) and, with workers, the scatter's split."""
    splits = [s["split"] for s in samples]
    out = {"scatter_ms_p50": _p50([s["scatter_ms"] for s in samples]),
           "combine_ms_p50": _p50([s["ttft_ms"] - s["scatter_ms"] if s["scatter_ms"] is not None else None
                                   for s in samples])}
    for key in ("compute_ms", "own_compute_ms", "transfer_ms", "exposed_transfer_ms", "transfer_overlap",
                "estimated_imbalance"):
        out[f"{key}_p50"] = _p50([sp[key] if sp is not None else None for sp in splits])
    return out


def derive(rows: List[Dict]) -> None:
    """Per row, against the one-worker rows of its trace: TTFT speedup over ``full_recompute``
    and over one worker, the scatter phase's speedup and its efficiency (speedup / workers); on
    LPT rows, the speedup over round-robin at the same worker count."""
    def find(trace, mode, workers, assignment=None):
        return next((r for r in rows if r["trace"] == trace and r["mode"] == mode and r["workers"] == workers
                     and (assignment is None or r["assignment"] == assignment)), None)

    for r in rows:
        full, one = find(r["trace"], "full_recompute", 1), find(r["trace"], "hypic", 1)
        r["speedup_vs_full_recompute"] = full["ttft_p50_ms"] / r["ttft_p50_ms"] if full else None
        r["ttft_speedup_vs_1_worker"] = one["ttft_p50_ms"] / r["ttft_p50_ms"] if one and r["mode"] == "hypic" else None
        scatter, base = r["scatter_ms_p50"], one["scatter_ms_p50"] if one else None
        r["scatter_speedup_vs_1_worker"] = base / scatter if base and scatter else None
        r["scatter_efficiency"] = (r["scatter_speedup_vs_1_worker"] / r["workers"]
                                   if r["scatter_speedup_vs_1_worker"] else None)
        rr = find(r["trace"], "hypic", r["workers"], "round_robin") if r["assignment"] == "lpt" else None
        r["lpt_speedup_over_round_robin"] = rr["ttft_p50_ms"] / r["ttft_p50_ms"] if rr else None


def format_row(r: Dict) -> str:
    def f(v, spec=".1f"):
        return "-" if v is None else format(v, spec)

    return (f"{r['trace']:>14} {r['mode']:>14} {r['workers']:2d} {r['assignment'] or '-':>11}"
            f"  ttft p50 {f(r['ttft_p50_ms']):>8} p90 {f(r['ttft_p90_ms']):>8}"
            f"  scatter {f(r['scatter_ms_p50']):>8} (compute {f(r['compute_ms_p50']):>8},"
            f" exposed transfer {f(r['exposed_transfer_ms_p50']):>6} of {f(r['transfer_ms_p50']):>6},"
            f" overlap {f(r['transfer_overlap_p50'], '.2f')})  combine {f(r['combine_ms_p50']):>7}"
            f"  x{f(r['speedup_vs_full_recompute'], '.2f')} vs full, scatter x{f(r['scatter_speedup_vs_1_worker'], '.2f')}"
            f" (eff {f(r['scatter_efficiency'], '.2f')}), lpt/rr x{f(r['lpt_speedup_over_round_robin'], '.2f')}")


__all__ = ["Trace", "derive", "format_row", "parse_traces", "split_p50", "uneven_lengths"]
