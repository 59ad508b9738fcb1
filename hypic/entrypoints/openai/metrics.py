"""Prometheus metrics of the server (vLLM's names under a ``hypic:`` prefix).

Token counters and latency histograms are fed by an output listener on the engine loop
(:meth:`AsyncLLMEngine.add_output_listener`), so they count what the engine produced, whether
or not a client read it; gauges and the segment-store figures are read when ``/metrics`` is
scraped. Each app has its own registry, so several servers can live in one process (tests).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hypic.engine.async_engine import AsyncLLMEngine
from hypic.engine.outputs import RequestOutput

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                    10.0, 20.0, 40.0, 80.0)

# StoreStats field -> (metric name, help); counters are cumulative since the engine started
_STORE_COUNTERS = {
    "hits": ("hypic:segment_cache_hits", "Segment lookups that found an entry"),
    "misses": ("hypic:segment_cache_misses", "Segment lookups that found none"),
    "insertions": ("hypic:segment_cache_insertions", "Entries written to the segment store"),
    "evictions": ("hypic:segment_cache_evictions", "Entries removed from the device tier"),
    "spills": ("hypic:segment_cache_spills", "Evictions that landed in the host tier"),
    "promotions": ("hypic:segment_cache_promotions", "Host-tier hits copied back to the device"),
    "drops": ("hypic:segment_cache_drops", "Entries gone from the store entirely"),
    "prefix_hits": ("hypic:prefix_cache_hits", "Prefix-cache checkpoint look-ups that found one"),
    "prefix_misses": ("hypic:prefix_cache_misses", "Prefix-cache checkpoint look-ups that found none"),
    "disk_hits": ("hypic:segment_cache_disk_hits", "Look-ups answered from the disk tier"),
    "disk_writes": ("hypic:segment_cache_disk_writes", "Entries written to the disk tier"),
    "disk_corrupt": ("hypic:segment_cache_disk_corrupt", "Entry files skipped (truncated, checksum mismatch)"),
}
_STORE_GAUGES = {
    "device_bytes": ("hypic:segment_cache_device_bytes", "Bytes of segment entries on the device tier"),
    "host_bytes": ("hypic:segment_cache_host_bytes", "Bytes of segment entries on the host tier"),
    "device_entries": ("hypic:segment_cache_device_entries", "Segment entries on the device tier"),
    "host_entries": ("hypic:segment_cache_host_entries", "Segment entries on the host tier"),
    "held_entries": ("hypic:segment_cache_held_entries", "Entries held by running requests"),
    "prefix_bytes": ("hypic:prefix_cache_bytes", "Bytes of prefix-cache checkpoints (device and host tiers)"),
    "prefix_entries": ("hypic:prefix_cache_entries", "Prefix-cache checkpoints (device and host tiers)"),
    "disk_bytes": ("hypic:segment_cache_disk_bytes", "Bytes of entry files in the disk tier"),
    "disk_entries": ("hypic:segment_cache_disk_entries", "Entry files in the disk tier"),
}


class _EngineCollector:
    """Gauges and store figures read at scrape time."""

    def __init__(self, engine: AsyncLLMEngine) -> None:
        self.engine = engine

    def collect(self):
        running = GaugeMetricFamily("hypic:num_requests_running", "Requests producing tokens")
        running.add_metric([], self.engine.num_running_requests)
        waiting = GaugeMetricFamily("hypic:num_requests_waiting", "Requests queued or prefilling")
        waiting.add_metric([], self.engine.num_waiting_requests)
        aborted = CounterMetricFamily("hypic:request_aborted", "Requests aborted before they finished "
                                      "(client disconnect, cancellation)")
        aborted.add_metric([], self.engine.num_aborted_requests)
        yield running
        yield waiting
        yield aborted
        live, faults, recomputed = self.engine.segment_worker_counts()
        family = GaugeMetricFamily("hypic:segment_workers_live", "Segment worker processes serving")
        family.add_metric([], live)
        yield family
        family = CounterMetricFamily("hypic:segment_worker_faults", "Segment workers that died, hung or raised "
                                     "during a share (each logged)")
        family.add_metric([], faults)
        yield family
        family = CounterMetricFamily("hypic:segment_worker_recomputed_segments",
                                     "Segments of failed segment workers that the engine prefilled itself")
        family.add_metric([], recomputed)
        yield family
        stats = self.engine.segment_cache_stats()
        for field, (name, doc) in _STORE_COUNTERS.items():
            family = CounterMetricFamily(name, doc)
            family.add_metric([], getattr(stats, field))
            yield family
        for field, (name, doc) in _STORE_GAUGES.items():
            family = GaugeMetricFamily(name, doc)
            family.add_metric([], getattr(stats, field))
            yield family


class ServerMetrics:
    def __init__(self, engine: AsyncLLMEngine, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self._label = {"model_name": model_name}
        r = self.registry
        self.prompt_tokens = Counter("hypic:prompt_tokens", "Prompt tokens of finished requests", labels, registry=r)
        self.generation_tokens = Counter("hypic:generation_tokens", "Generated tokens", labels, registry=r)
        self.cached_tokens = Counter("hypic:prompt_cached_tokens",
                                     "Prompt tokens reused from the segment store (segment and prefix hits)",
                                     labels, registry=r)
        # the split of prompt_cached_tokens, as usage.pic reports it per request
        self.segment_hit_tokens = Counter("hypic:prompt_segment_hit_tokens",
                                          "Prompt tokens reused from stored segment entries (any position)",
                                          labels, registry=r)
        self.prefix_hit_tokens = Counter("hypic:prompt_prefix_hit_tokens",
                                         "Prompt tokens reused from prefix-cache checkpoints", labels, registry=r)
        self.request_success = Counter("hypic:request_success", "Finished requests by finish reason",
                                       labels + ["finished_reason"], registry=r)
        self.ttft = Histogram("hypic:time_to_first_token_seconds", "Time to first token", labels,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("hypic:inter_token_latency_seconds", "Time between consecutive output tokens",
                             labels, buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("hypic:e2e_request_latency_seconds", "Arrival to finish", labels,
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.http_errors = Counter("hypic:http_errors", "Requests answered with an error", ["status"], registry=r)
        # every series exists from start-up at zero, so a scrape before the first request (and a
        # rate over the first one) sees it, as vLLM's do
        for family in (self.prompt_tokens, self.generation_tokens, self.cached_tokens, self.segment_hit_tokens,
                       self.prefix_hit_tokens, self.ttft, self.itl, self.e2e):
            family.labels(**self._label)
        for reason in ("stop", "length", "abort"):
            self.request_success.labels(finished_reason=reason, **self._label)
        r.register(_EngineCollector(engine))
        self._last_token_time: dict[str, float] = {}
        engine.add_output_listener(self.on_output)

    def on_output(self, output: RequestOutput, num_new_tokens: int, now: float) -> None:
        """Runs on the engine loop for every output of a step."""
        label = self._label
        rid = output.request_id
        m = output.metrics
        if num_new_tokens > 0:
            self.generation_tokens.labels(**label).inc(num_new_tokens)
            last = self._last_token_time.get(rid)
            if last is None:
                if m.ttft is not None:
                    self.ttft.labels(**label).observe(m.ttft)
            else:
                for _ in range(num_new_tokens):
                    self.itl.labels(**label).observe((now - last) / num_new_tokens)
            self._last_token_time[rid] = now
        if output.finished:
            self._last_token_time.pop(rid, None)
            self.prompt_tokens.labels(**label).inc(m.prompt_tokens)
            self.cached_tokens.labels(**label).inc(m.cached_tokens + m.prefix_hit_tokens)
            self.segment_hit_tokens.labels(**label).inc(m.cached_tokens)
            self.prefix_hit_tokens.labels(**label).inc(m.prefix_hit_tokens)
            reason = output.outputs[0].finish_reason or "abort"
            self.request_success.labels(finished_reason=reason, **label).inc()
            if m.e2e_latency is not None:
                self.e2e.labels(**label).observe(m.e2e_latency)

    def render(self) -> bytes:
        return generate_latest(self.registry)
