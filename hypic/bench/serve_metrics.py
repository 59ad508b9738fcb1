"""The numbers of one rate point of ``hypic bench serve``, under ``vllm bench serve``'s names.

Over the point's measured requests (its warm-up requests excluded):

* ``completed`` (succeeded) and ``failed`` (everything else sent: refused, broken, cancelled);
* ``duration_s``: from the first measured request's send to the last measured completion;
* ``request_throughput`` = completed / duration; ``request_goodput`` = requests meeting every
  goodput SLO (``--goodput ttft:1000``: TTFT <= 1000 ms; ``tpot``, ``e2el`` likewise; a request of
  one output token has TPOT 0) / duration; ``output_throughput`` = output tokens / duration;
  ``total_token_throughput`` = (prompt + output tokens) / duration;
* ``mean_/median_/std_/p90_/p99_`` of ``ttft_ms``, ``tpot_ms`` (per request: (E2EL - TTFT) /
  (output tokens - 1), requests of more than one token), ``itl_ms`` (every gap between token
  events, pooled) and ``e2el_ms``; percentiles interpolate linearly (numpy's default);
* ``max_output_tokens_per_s``, ``max_concurrent_requests``: the busiest one-second bucket.

And hypic's own: ``ttft_slo_attainment`` (measured requests that succeeded with TTFT <= the SLO,
over all sent), ``ttft_median_all_ms`` (a failed request counts as infinitely late), the steady-state
check (:func:`steady_state`), ``output_tokens_mismatch`` (completed requests whose output length is
not the ``max_tokens`` asked for: with ``ignore_eos`` there should be none), and the token hit
rates from the responses' usage.
"""

from __future__ import annotations

import math
import statistics
from typing import Dict, List, Optional, Sequence

from hypic.bench.serve_client import RequestResult
from hypic.bench.ttft_report import percentile

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
# a point is unsteady when its second half's median TTFT exceeds the first half's by both of
# these: a queue that grows through the window shows as TTFT climbing with time
DRIFT_RATIO = 1.5
DRIFT_SLO_FRACTION = 0.25


def parse_goodput(items: Sequence[str]) -> Dict[str, float]:
    """``["ttft:1000", "e2el:20000"]`` -> {"ttft": 1000.0, "e2el": 20000.0} (milliseconds)."""
    out = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or name not in GOODPUT_METRICS:
            raise ValueError(f"--goodput: expected NAME:MS with NAME one of {GOODPUT_METRICS}, got {item!r}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--goodput: {item!r}: not a number of milliseconds") from None
        if not ms > 0:
            raise ValueError(f"--goodput: {item!r}: expected > 0 ms")
        out[name] = ms
    return out


def _stats(name: str, values_ms: Sequence[float]) -> Dict[str, Optional[float]]:
    keys = ("mean", "median", "std", "p90", "p99")
    if not values_ms:
        return {f"{k}_{name}_ms": None for k in keys}
    return {f"mean_{name}_ms": statistics.fmean(values_ms), f"median_{name}_ms": percentile(values_ms, 50),
            f"std_{name}_ms": statistics.pstdev(values_ms), f"p90_{name}_ms": percentile(values_ms, 90),
            f"p99_{name}_ms": percentile(values_ms, 99)}


def tpot_s(r: RequestResult) -> float:
    """(E2EL - TTFT) / (output tokens - 1); 0 for a request of one token."""
    return (r.latency_s - r.ttft_s) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0


def steady_state(results: Sequence[RequestResult], ttft_slo_ms: float) -> Dict:
    """``ttft_drift_ratio``: median TTFT of the later half of the measured requests (arrival
    order) over the earlier half's, successful requests only; ``steady``: False when that ratio is
    above 1.5 and the medians differ by more than a quarter of the SLO, or when more than a tenth
    of the measured requests were cancelled at the drain timeout (the server fell behind)."""
    ok = sorted((r for r in results if r.success), key=lambda r: r.scheduled_s)
    cancelled = sum(1 for r in results if r.error.startswith("cancelled"))
    half = len(ok) // 2
    if half == 0:
        return {"ttft_drift_ratio": None, "steady": cancelled == 0 and bool(ok)}
    early = percentile([r.ttft_s for r in ok[:half]], 50) * 1e3
    late = percentile([r.ttft_s for r in ok[half:]], 50) * 1e3
    ratio = late / early if early > 0 else math.inf
    drifting = ratio > DRIFT_RATIO and late - early > DRIFT_SLO_FRACTION * ttft_slo_ms
    return {"ttft_drift_ratio": ratio, "steady": not drifting and cancelled <= 0.1 * len(results)}


def peak_rates(results: Sequence[RequestResult]) -> Dict[str, float]:
    """The busiest one-second bucket of token events and of requests in flight (vLLM's peak)."""
    ok = [r for r in results if r.success]
    if not ok:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    t0 = min(r.start_s for r in ok)
    buckets = int(math.ceil(max(r.end_s for r in ok) - t0)) + 1
    tokens, active = [0] * buckets, [0] * buckets
    for r in ok:
        t = r.start_s + r.ttft_s
        for gap in [0.0, *r.itl_s]:
            t += gap
            tokens[min(buckets - 1, int(t - t0))] += 1
        for second in range(int(r.start_s - t0), int(r.end_s - t0) + 1):
            active[second] += 1
    return {"max_output_tokens_per_s": float(max(tokens)), "max_concurrent_requests": max(active)}


def point_metrics(results: Sequence[RequestResult], expected_output_tokens: Sequence[int],
                  trace_prompt_tokens: Sequence[int], *, goodput_ms: Dict[str, float], ttft_slo_ms: float,
                  slo_attainment: float) -> Dict:
    """The metrics of one point's measured requests (``expected_output_tokens[i]``: the
    ``max_tokens`` request ``i`` asked for; ``trace_prompt_tokens[i]``: its prompt length in the
    trace, used where the server reports none)."""
    if not (len(results) == len(expected_output_tokens) == len(trace_prompt_tokens)):
        raise ValueError("results, expected output tokens and prompt tokens differ in length")
    ok = [r for r in results if r.success]
    input_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else p
                       for r, p in zip(results, trace_prompt_tokens) if r.success)
    output_tokens = sum(r.output_tokens for r in ok)
    duration = (max(r.end_s for r in ok) - min(r.start_s for r in results)) if ok else None
    good = 0
    for r in ok:
        values = {"ttft": r.ttft_s * 1e3, "tpot": tpot_s(r) * 1e3, "e2el": r.latency_s * 1e3}
        good += all(values[k] <= slo for k, slo in goodput_ms.items())

    def per_s(x: float) -> Optional[float]:
        return x / duration if duration else None

    out = {
        "num_requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "cancelled": sum(1 for r in results if r.error.startswith("cancelled")),
        "total_input_tokens": input_tokens, "total_output_tokens": output_tokens,
        "expected_output_tokens": sum(n for r, n in zip(results, expected_output_tokens) if r.success),
        "output_tokens_mismatch": sum(1 for r, n in zip(results, expected_output_tokens)
                                      if r.success and r.output_tokens != n),
        "duration_s": duration,
        "request_throughput": per_s(len(ok)), "request_goodput": per_s(good),
        "output_throughput": per_s(output_tokens), "total_token_throughput": per_s(input_tokens + output_tokens),
    }
    out.update(_stats("ttft", [r.ttft_s * 1e3 for r in ok]))
    out.update(_stats("tpot", [tpot_s(r) * 1e3 for r in ok if r.output_tokens > 1]))
    out.update(_stats("itl", [g * 1e3 for r in ok for g in r.itl_s]))
    out.update(_stats("e2el", [r.latency_s * 1e3 for r in ok]))
    out.update(peak_rates(results))
    within = sum(1 for r in ok if r.ttft_s * 1e3 <= ttft_slo_ms)
    out["ttft_slo_attainment"] = within / len(results) if results else None
    out["ttft_median_all_ms"] = _median_with_inf([r.ttft_s * 1e3 for r in ok] + [math.inf] * (len(results) - len(ok)))
    out.update(steady_state(results, ttft_slo_ms))
    out["meets_slo"] = bool(out["steady"] and out["ttft_slo_attainment"] is not None
                            and out["ttft_slo_attainment"] >= slo_attainment)
    out["meets_slo_p50"] = bool(out["steady"] and out["ttft_median_all_ms"] is not None
                                and out["ttft_median_all_ms"] <= ttft_slo_ms)
    out.update(usage_hit_rates(ok))
    errors: Dict[str, int] = {}
    for r in results:
        if not r.success:
            key = r.error.splitlines()[0][:120] if r.error else "unknown"
            errors[key] = errors.get(key, 0) + 1
    out["errors"] = errors
    return out


def _median_with_inf(values_ms: List[float]) -> Optional[float]:
    """The median of values that may hold inf (failed requests); None when it is inf or there are
    none (JSON has no infinity)."""
    if not values_ms:
        return None
    m = statistics.median(values_ms)
    return None if math.isinf(m) else m


def usage_hit_rates(ok: Sequence[RequestResult]) -> Dict[str, Optional[float]]:
    """Prompt-token hit rates of the completed requests from their usage: segment hits, prefix
    hits (hypic's ``usage.pic``) and all cached tokens; None where the server reports none."""
    prompt = sum(r.prompt_tokens or 0 for r in ok)

    def rate(field: str) -> Optional[float]:
        values = [getattr(r, field) for r in ok]
        if not prompt or any(v is None for v in values):
            return None
        return sum(values) / prompt

    return {"segment_hit_rate": rate("segment_hit_tokens"), "prefix_hit_rate": rate("prefix_hit_tokens"),
            "cached_token_rate": rate("cached_tokens")}


# ---- /metrics deltas ------------------------------------------------------------------------------

COUNTERS = {
    "prompt_tokens": "hypic:prompt_tokens_total",
    "generation_tokens": "hypic:generation_tokens_total",
    "cached_tokens": "hypic:prompt_cached_tokens_total",
    "segment_hit_tokens": "hypic:prompt_segment_hit_tokens_total",
    "prefix_hit_tokens": "hypic:prompt_prefix_hit_tokens_total",
    "store_hits": "hypic:segment_cache_hits_total",
    "store_misses": "hypic:segment_cache_misses_total",
    "store_insertions": "hypic:segment_cache_insertions_total",
    "store_evictions": "hypic:segment_cache_evictions_total",
    "store_spills": "hypic:segment_cache_spills_total",
    "store_promotions": "hypic:segment_cache_promotions_total",
    "store_drops": "hypic:segment_cache_drops_total",
}
GAUGES = {
    "store_device_bytes": "hypic:segment_cache_device_bytes",
    "store_host_bytes": "hypic:segment_cache_host_bytes",
    "store_device_entries": "hypic:segment_cache_device_entries",
    "store_host_entries": "hypic:segment_cache_host_entries",
}


def metrics_delta(before: Optional[Dict[str, float]], after: Optional[Dict[str, float]]) -> Optional[Dict]:
    """What the server's ``/metrics`` moved by over a point (its warm-up requests included):
    counter deltas, the store gauges after (and ``*_before``), and the token hit rates and store
    hit rate they give.
    None where the server has no hypic metrics."""
    if before is None or after is None or COUNTERS["prompt_tokens"] not in after:
        return None
    out: Dict[str, Optional[float]] = {k: after.get(n, 0.0) - before.get(n, 0.0) for k, n in COUNTERS.items()}
    out.update({k: after.get(n) for k, n in GAUGES.items()})
    out.update({f"{k}_before": before.get(n) for k, n in GAUGES.items()})
    prompt = out["prompt_tokens"]
    out["segment_hit_rate"] = out["segment_hit_tokens"] / prompt if prompt else None
    out["prefix_hit_rate"] = out["prefix_hit_tokens"] / prompt if prompt else None
    lookups = out["store_hits"] + out["store_misses"]
    out["store_hit_rate"] = out["store_hits"] / lookups if lookups else None
    return out
