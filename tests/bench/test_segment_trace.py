"""The cold prompts of ``hypic bench segment-parallel`` (hypic.bench.segment_trace), and LPT
against round-robin on the uneven trace the bench measures on GPUs."""

from __future__ import annotations

import json
import statistics

import pytest

from hypic.bench.common import QWEN3_5_35B_A3B_CONFIG
from hypic.bench.segment_trace import Trace, derive, parse_traces
from hypic.models.config import spec_from_config
from hypic.runner.segment_assign import lpt_assign, rank_loads, round_robin_assign, segment_cost_fn


def test_traces_parse_and_draw_the_same_lengths_per_request():
    uniform, uneven = parse_traces("64x512, 24x256-4096")
    assert uniform == Trace(64, 512, 512) and uniform.name == "64x512" and not uniform.uneven
    assert uniform.lengths(0, 3) == [512] * 64 and uniform.max_prompt_tokens == 64 * 512
    assert uneven.name == "24x256-4096" and uneven.uneven
    first = uneven.lengths(0, 0)
    assert len(first) == 24 and all(256 <= n <= 4096 for n in first)
    assert uneven.lengths(0, 0) == first and uneven.lengths(0, 1) != first and uneven.lengths(1, 0) != first
    assert max(first) / min(first) > 4  # uneven indeed
    for bad in ("64", "0x512", "4x512-256", "4x0", "ax5", ""):
        with pytest.raises(ValueError, match="--traces"):
            parse_traces(bad)


@pytest.mark.parametrize("workers", [4, 8])
def test_lpt_beats_round_robin_on_the_uneven_trace(workers):
    """On 24 segments of 256-4096 tokens (Qwen3.5-35B-A3B prefill FLOPs as the cost), LPT's
    makespan estimate is never worse than round-robin's and clearly better on average."""
    with open(QWEN3_5_35B_A3B_CONFIG, encoding="utf-8") as f:
        cost = segment_cost_fn(spec_from_config(json.load(f)))
    trace = parse_traces("24x256-4096")[0]
    ratios = []
    for request in range(20):
        costs = [cost(n) for n in trace.lengths(0, request)]
        lpt = max(rank_loads(costs, lpt_assign(costs, workers)))
        rr = max(rank_loads(costs, round_robin_assign(costs, workers)))
        assert lpt <= rr
        ratios.append(rr / lpt)
    assert statistics.mean(ratios) > 1.2, ratios


def test_derive_relates_rows_to_one_worker_and_round_robin():
    def row(mode, workers, assignment, ttft, scatter):
        return {"trace": "t", "mode": mode, "workers": workers, "assignment": assignment, "ttft_p50_ms": ttft,
                "scatter_ms_p50": scatter}

    rows = [row("full_recompute", 1, None, 1000.0, None), row("hypic", 1, None, 800.0, 600.0),
            row("hypic", 4, "lpt", 400.0, 200.0), row("hypic", 4, "round_robin", 600.0, 400.0)]
    derive(rows)
    lpt, rr = rows[2], rows[3]
    assert lpt["speedup_vs_full_recompute"] == 2.5 and lpt["ttft_speedup_vs_1_worker"] == 2.0
    assert lpt["scatter_speedup_vs_1_worker"] == 3.0 and lpt["scatter_efficiency"] == 0.75
    assert lpt["lpt_speedup_over_round_robin"] == 1.5 and rr["lpt_speedup_over_round_robin"] is None
    assert rows[0]["ttft_speedup_vs_1_worker"] is None and rows[0]["scatter_efficiency"] is None
