"""The run of ``hypic bench serve`` (the command line and what it measures: :mod:`hypic.bench.serve`):
its configuration, the rate search, and the sequence warm-up, calibration, rate points against one
server."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import statistics
import time
import traceback
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

from hypic.bench.serve_client import (encode_body, flush_cache, health_ok, run_beside, run_closed_loop,
                                      run_schedule, scrape_metrics, wait_idle)
from hypic.bench.serve_metrics import metrics_delta, point_metrics
from hypic.bench.serve_trace import (PROMPT_FORMS, ServeRequest, build_trace, corpus_fit, poisson_arrivals_s,
                                     rate_stream_name, request_body, request_stream)


@dataclass(frozen=True)
class ServeBenchConfig:
    modes: Tuple[str, ...]
    prompt_tokens: Tuple[int, ...]
    segment_tokens: int = 512
    prompt_form: str = "tokens"
    doc_tokens: Tuple[int, int] = (256, 2048)
    system_tokens: int = 256
    query_tokens: Tuple[int, int] = (32, 64)
    output_tokens: Tuple[int, int] = (64, 256)
    zipf_exponent: float = 1.0
    corpus_factor: float = 4.0
    num_documents: int = 0
    trace_seed: int = 0
    request_rates: Optional[Tuple[float, ...]] = None
    rate_start: Optional[float] = None
    rate_factor: float = 2.0
    bisect_steps: int = 2
    max_points: int = 8
    min_rate: float = 0.01
    warmup_s: float = 5.0
    measure_s: float = 20.0
    min_requests: int = 16
    max_requests: int = 2000
    drain_timeout_s: float = 60.0
    corpus_warmup: bool = True
    warmup_max_sampled: int = 2
    calibration_requests: int = 4
    slo_ttft_ms: float = 1000.0
    slo_attainment: float = 0.9
    goodput_ms: Tuple[Tuple[str, float], ...] = (("ttft", 1000.0),)
    max_seconds: Optional[float] = None
    extra_body: Tuple[Tuple[str, object], ...] = ()
    beside_long_tokens: int = 0  # after the calibration: requests one at a time beside a long cold prompt

    def __post_init__(self):
        if not self.modes or not self.prompt_tokens:
            raise ValueError("modes and prompt tokens: need at least one each")
        if self.prompt_form not in PROMPT_FORMS:
            raise ValueError(f"--prompt-form: expected one of {PROMPT_FORMS}, got {self.prompt_form!r}")
        if self.request_rates is not None and (not self.request_rates or any(not r > 0 for r in self.request_rates)):
            raise ValueError(f"--request-rates: expected rates > 0, got {self.request_rates!r}")
        for name in ("rate_factor",):
            if not getattr(self, name) > 1:
                raise ValueError(f"--{name.replace('_', '-')}: expected > 1")
        for name in ("min_rate", "measure_s", "drain_timeout_s", "slo_ttft_ms"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')}: expected > 0")
        if self.rate_start is not None and not self.rate_start > 0:
            raise ValueError("--rate-start: expected > 0")
        if self.warmup_s < 0 or not 0 < self.slo_attainment <= 1:
            raise ValueError("--warmup-s must be >= 0 and --slo-attainment in (0, 1]")
        if not 1 <= self.min_requests <= self.max_requests or self.max_points < 0 or self.bisect_steps < 0:
            raise ValueError("need 1 <= --min-requests <= --max-requests, --max-points >= 0 (0: calibration only), --bisect-steps >= 0")
        if self.calibration_requests < 1 and self.request_rates is None and self.rate_start is None:
            raise ValueError("the rate search starts from the calibration: keep --calibration-requests >= 1 "
                             "or give --rate-start / --request-rates")
        if not 1 <= self.output_tokens[0] <= self.output_tokens[1]:
            raise ValueError(f"--output-tokens: need 1 <= min <= max, got {self.output_tokens!r}")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ValueError("--max-seconds: expected > 0")
        if self.beside_long_tokens < 0 or (self.beside_long_tokens and self.calibration_requests < 1):
            raise ValueError("--beside-long-tokens: expected >= 0, and the calibration's idle TTFT to compare with")


def point_sizes(config: ServeBenchConfig, rate_rps: float) -> Tuple[int, int]:
    """``(warm-up requests, measured requests)`` of a point at ``rate_rps``."""
    warmup = math.ceil(rate_rps * config.warmup_s) if config.warmup_s > 0 else 0
    measured = min(config.max_requests, max(config.min_requests, math.ceil(rate_rps * config.measure_s)))
    return warmup, measured


def _sig2(x: float) -> float:
    """Two significant digits: readable rates in the report."""
    return float(f"{x:.2g}")


class RateSearch:
    """The rates to try, one at a time: a ladder, or expand by ``factor`` until the SLO flips and
    bisect the bracket geometrically ``bisect_steps`` times."""

    def __init__(self, config: ServeBenchConfig, start_rps: float) -> None:
        self.config = config
        self.ladder = sorted(config.request_rates) if config.request_rates else None
        self.next_rate: Optional[float] = self.ladder[0] if self.ladder else start_rps
        self.outcomes: Dict[float, bool] = {}  # rate -> met the SLO
        self.bisections = 0

    @property
    def tried(self) -> List[float]:
        return list(self.outcomes)

    @property
    def failing(self) -> Optional[float]:
        """The lowest failing rate."""
        failed = [r for r, ok in self.outcomes.items() if not ok]
        return min(failed) if failed else None

    @property
    def passing(self) -> Optional[float]:
        """The highest passing rate below every failing one (a pass above a failure is noise)."""
        ceiling = self.failing
        passed = [r for r, ok in self.outcomes.items() if ok and (ceiling is None or r < ceiling)]
        return max(passed) if passed else None

    def record(self, rate: float, passed: bool) -> None:
        self.outcomes[rate] = passed
        self.next_rate = self._next(rate)

    def _next(self, last: float) -> Optional[float]:
        if self.ladder is not None:
            rest = [r for r in self.ladder if r not in self.outcomes]
            return rest[0] if rest else None
        factor = self.config.rate_factor
        passing, failing = self.passing, self.failing
        if failing is None:
            return _sig2(last * factor)
        if passing is None:
            lower = _sig2(min(self.outcomes) / factor)
            return lower if lower >= self.config.min_rate else None
        if self.bisections >= self.config.bisect_steps:
            return None
        middle = _sig2(math.sqrt(passing * failing))
        if not passing < middle < failing or middle in self.outcomes:
            return None
        self.bisections += 1
        return middle


# ---- the run ----------------------------------------------------------------------------------------


class ServeBench:
    def __init__(self, config: ServeBenchConfig, *, vocab_size: int, first_token_id: int, words, spec, dtype,
                 seam, budgets: Dict[str, Optional[int]], api_key: Optional[str], schedule_dir: Optional[str],
                 checkpoint=None) -> None:
        self._alive = None  # set per launched server: whether its process still runs
        self.config = config
        self.vocab_size, self.first_token_id, self.words = vocab_size, first_token_id, words
        self.spec, self.dtype, self.seam, self.budgets = spec, dtype, seam, budgets
        self.api_key, self.schedule_dir = api_key, schedule_dir
        self.rows: List[Dict] = []
        self.targets: List[Dict] = []
        self.corpus: List[Dict] = []
        self.errors = 0
        self._checkpoint = checkpoint or (lambda: None)
        self._traces = {}

    def trace(self, prompt_tokens: int):
        if prompt_tokens not in self._traces:
            c = self.config
            trace = build_trace(self.vocab_size, prompt_tokens, c.segment_tokens, first_token_id=self.first_token_id,
                                doc_tokens=c.doc_tokens, system_tokens=c.system_tokens, query_tokens=c.query_tokens,
                                zipf_exponent=c.zipf_exponent, corpus_factor=c.corpus_factor,
                                num_documents=c.num_documents, seed=c.trace_seed)
            self._traces[prompt_tokens] = trace
            entry = {"prompt_tokens": prompt_tokens, "segment_tokens": c.segment_tokens}
            if self.spec is not None:
                entry.update(corpus_fit(trace, self.spec, self.dtype, self.seam, self.budgets))
            else:
                entry.update(corpus_documents=len(trace.documents),
                             corpus_tokens=sum(len(d) for d in trace.documents))
            self.corpus.append(entry)
        return self._traces[prompt_tokens]

    def _bodies(self, requests, model: str, output_tokens: Optional[int] = None) -> List[bytes]:
        if output_tokens is not None:
            requests = [replace(r, output_tokens=output_tokens) for r in requests]
        extra = dict(self.config.extra_body)
        return [encode_body({**request_body(r, self.config.prompt_form, model=model, words=self.words), **extra})
                for r in requests]

    def run_target(self, mode: str, base_url: str, model: str, target: Dict, alive=None) -> None:
        """Every trace against one server (``alive()``: whether a launched server's process runs)."""
        self._alive = alive
        for p in self.config.prompt_tokens:
            info = {"prompt_tokens": p}
            target.setdefault("traces", []).append(info)
            try:
                self._run_trace(mode, base_url, model, p, info)
            except Exception:  # noqa: BLE001 - recorded; the next trace / mode still runs
                self.errors += 1
                info["error"] = traceback.format_exc()
                self.rows.append({"mode": mode, "prompt_tokens": p, "error": info["error"]})
                print(f"[{mode} P={p}] ERROR\n{info['error']}", flush=True)
            self._checkpoint()

    def _run_trace(self, mode: str, base_url: str, model: str, p: int, info: Dict) -> None:
        c = self.config
        trace = self.trace(p)
        info["flushed_entries"] = flush_cache(base_url)
        if c.corpus_warmup:
            warm = [ServeRequest(r.prompt.segments, r.prompt.query, 1, r.doc_ids)
                    for r in trace.warmup_requests(c.warmup_max_sampled)]
            t0 = time.perf_counter()
            results = asyncio.run(run_closed_loop(base_url, self._bodies(warm, model), api_key=self.api_key))
            info["corpus_warmup"] = {"requests": len(results), "failed": sum(not r.success for r in results),
                                     "seconds": time.perf_counter() - t0}
            _raise_if_all_failed(results, "corpus warm-up")
        idle_ttft_ms = None
        if c.calibration_requests:
            calib = request_stream(trace, c.calibration_requests, "calibration", *c.output_tokens)
            results = asyncio.run(run_closed_loop(base_url, self._bodies(calib, model, output_tokens=1),
                                                  api_key=self.api_key))
            _raise_if_all_failed(results, "calibration")
            print(f"[{mode} P={p}] idle TTFT p50 {statistics.median(r.ttft_s * 1e3 for r in results if r.success):.2f} "
                  f"ms over {len(results)} requests one at a time", flush=True)
            done_ms = sorted(r.ttft_s * 1e3 for r in results if r.success)
            idle_ttft_ms = statistics.median(done_ms)
            info["calibration"] = {"requests": len(results), "failed": sum(not r.success for r in results),
                                   "idle_ttft_ms": idle_ttft_ms,
                                   "idle_ttft_p90_ms": done_ms[min(len(done_ms) - 1, int(0.9 * len(done_ms)))],
                                   "ttft_ms": [None if r.ttft_s is None else r.ttft_s * 1e3 for r in results]}
        if c.beside_long_tokens:
            info["beside_long"] = self._beside_long(base_url, model, trace, idle_ttft_ms)
        start = c.rate_start if c.rate_start is not None else (
            _sig2(500.0 / idle_ttft_ms) if idle_ttft_ms else None)
        search = RateSearch(c, start)
        t_start = time.perf_counter()
        while search.next_rate is not None and len(search.tried) < c.max_points:
            rate = search.next_rate
            span_s = sum(point_sizes(c, rate)) / rate
            if c.max_seconds is not None and time.perf_counter() - t_start + span_s > c.max_seconds:
                # a slow rate's arrivals alone can outlast any budget: a point starts only if they fit
                info["stopped"] = (f"{rate:g} req/s ({span_s:.0f} s of arrivals) does not fit the time budget of "
                                   f"{c.max_seconds:g} s")
                break
            row = self.run_point(mode, base_url, model, p, rate)
            self.rows.append(row)
            if row["completed"] == 0:
                self._check_alive(base_url)
            search.record(rate, row["meets_slo"])
            self._checkpoint()
            print(f"[{mode} P={p}] {rate:g} req/s: TTFT p50 {_ms(row['median_ttft_ms'])} p90 "
                  f"{_ms(row['p90_ttft_ms'])}, {row['ttft_slo_attainment']:.0%} within {c.slo_ttft_ms:g} ms, "
                  f"{row['completed']}/{row['num_requests']} done, steady={row['steady']} -> "
                  f"{'meets' if row['meets_slo'] else 'misses'} SLO", flush=True)

    def _beside_long(self, base_url: str, model: str, trace, idle_ttft_ms: float) -> Dict:
        """Requests of the trace one at a time while a long cold prompt (``beside_long_tokens``
        fresh tokens in the trace's segments, one output token) is prefilling: their TTFT against
        the idle TTFT, i.e. whether a long prefill freezes the requests beside it."""
        c = self.config
        rng = random.Random(f"beside-long-{c.trace_seed}")
        first, vocab = trace.config.first_token_id, trace.config.vocab_size
        tokens = [rng.randrange(first, vocab) for _ in range(c.beside_long_tokens)]
        segments = tuple(tuple(tokens[i:i + c.segment_tokens]) for i in range(0, len(tokens), c.segment_tokens))
        query = tuple(rng.randrange(first, vocab) for _ in range(16))
        (long_body,) = self._bodies([ServeRequest(segments, query, 1, ())], model)
        shorts = request_stream(trace, 256, "beside-long", *c.output_tokens)
        long_result, results = asyncio.run(run_beside(base_url, long_body, self._bodies(shorts, model, output_tokens=1),
                                                      api_key=self.api_key))
        if not long_result.success:
            raise RuntimeError(f"the long prompt failed: {long_result.error}")
        done_ms = sorted(r.ttft_s * 1e3 for r in results if r.success)
        p50 = statistics.median(done_ms) if done_ms else None
        out = {"long_prompt_tokens": long_result.prompt_tokens, "long_ttft_ms": long_result.ttft_s * 1e3,
               "requests": len(results), "failed": sum(not r.success for r in results),
               "ttft_p50_ms": p50, "ttft_max_ms": done_ms[-1] if done_ms else None, "ttft_ms": done_ms,
               "idle_ttft_ms": idle_ttft_ms, "ratio_to_idle": None if p50 is None else p50 / idle_ttft_ms}
        print(f"beside a {out['long_prompt_tokens']}-token cold prompt (TTFT {out['long_ttft_ms']:.0f} ms): "
              f"{len(done_ms)} requests, TTFT p50 {_ms(p50)} against {idle_ttft_ms:.1f} ms idle", flush=True)
        return out

    def _check_alive(self, base_url: str) -> None:
        """Raise when the server is gone (a crash, out of memory): the search would otherwise go on
        halving the rate against a dead server."""
        if self._alive is not None and not self._alive():
            raise RuntimeError("the server process has exited")
        if not health_ok(base_url):
            raise RuntimeError(f"{base_url}/health does not answer 200")

    def run_point(self, mode: str, base_url: str, model: str, p: int, rate: float) -> Dict:
        c = self.config
        n_warm, n_meas = point_sizes(c, rate)
        requests = request_stream(self.trace(p), n_warm + n_meas, rate_stream_name(rate), *c.output_tokens)
        # whole milliseconds: the instants an external tool replaying --schedule-dir can send at
        arrivals = [round(t * 1e3) / 1e3
                    for t in poisson_arrivals_s(n_warm + n_meas, rate, f"{c.trace_seed}-{p}-{rate:.6g}")]
        if self.schedule_dir is not None:
            write_schedule(os.path.join(self.schedule_dir, f"schedule_{p}_{rate:g}.jsonl"), requests, arrivals,
                           [request_body(r, "text", model=model, words=self.words)["prompt"] for r in requests])
        before = scrape_metrics(base_url)
        results = asyncio.run(run_schedule(base_url, self._bodies(requests, model), arrivals,
                                           drain_timeout_s=c.drain_timeout_s, api_key=self.api_key))
        wait_idle(base_url, timeout_s=c.drain_timeout_s)
        after = scrape_metrics(base_url)
        measured = results[n_warm:]
        row = {"mode": mode, "prompt_tokens": p, "segment_tokens": c.segment_tokens, "request_rate_rps": rate,
               "warmup_requests": n_warm, "slo_ttft_ms": c.slo_ttft_ms}
        row.update(point_metrics(measured, [r.output_tokens for r in requests[n_warm:]],
                                 [r.prompt_tokens for r in requests[n_warm:]], goodput_ms=dict(c.goodput_ms),
                                 ttft_slo_ms=c.slo_ttft_ms, slo_attainment=c.slo_attainment))
        row["server_metrics"] = metrics_delta(before, after)
        row["samples"] = [_sample(r, q, i >= n_warm) for i, (r, q) in enumerate(zip(results, requests))]
        return row


def _sample(r, req, measured: bool) -> Dict:
    out = {"measured": measured, "scheduled_s": r.scheduled_s, "start_s": r.start_s, "success": r.success,
           "ttft_ms": None if r.ttft_s is None else r.ttft_s * 1e3,
           "e2el_ms": None if r.latency_s is None else r.latency_s * 1e3,
           "output_tokens": r.output_tokens, "max_tokens": req.output_tokens,
           "prompt_tokens": r.prompt_tokens if r.prompt_tokens is not None else req.prompt_tokens,
           "segment_hit_tokens": r.segment_hit_tokens, "prefix_hit_tokens": r.prefix_hit_tokens}
    if r.error:
        out["error"] = r.error
    return out


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _raise_if_all_failed(results, what: str) -> None:
    if results and not any(r.success for r in results):
        raise RuntimeError(f"{what}: every request failed; the first: {results[0].error}")


def write_schedule(path: str, requests, arrivals_s: Sequence[float], texts: Sequence[str]) -> None:
    """AIPerf's ``mooncake_trace`` JSONL of a point (``timestamp`` in ms from the start)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for req, t, text in zip(requests, arrivals_s, texts):
            f.write(json.dumps({"timestamp": round(t * 1e3), "text_input": text,
                                "output_length": req.output_tokens}) + "\n")
