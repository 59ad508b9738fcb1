"""``hypic bench ttft``: time-to-first-token of every PIC mode on three cases, in one process.

Cases (each swept over ``--prompt-tokens`` x ``--segment-tokens``):

* ``cold``: no cache. ``N = P // S`` fresh segments of ``S`` tokens + a 64-token question, through
  every mode with the ``inline`` cold policy, plus ``hypic`` with the ``standalone`` cold policy as
  its own row (``cold_policy`` key). The ``hypic`` inline row carries ``summary_overhead`` =
  ``(p50 hypic cold - p50 full_recompute cold) / p50 full_recompute cold`` on the same prompts (the
  cost of building the (T, S) summaries and storing the entries); the standalone row carries
  ``speedup_vs_full_recompute``.
* ``all_hit``: a pool of ``N`` segments of ``S`` tokens, cached beforehand by one warm-up request
  in another (shuffled) order, then one untimed all-hit request (a further order); each measured
  request is another random order of the pool + a fresh 64-token question. ``hypic`` then
  computes the seams + the question live, ``transition`` only the question; ``prefix_cache`` only
  hits on shared prefixes (hardly any).
* ``rag``: the synthetic RAG trace of :mod:`hypic.bench.rag_trace`; warm-up requests until every
  document was seen once (``--warmup-requests`` sampled ones, then requests packing the documents
  not yet seen) and one more trace request, then the same measured requests through each mode.
* ``plain_repeat``: one plain prompt of ``P`` tokens (no segments), sent once untimed (cold: it
  writes its prefix-cache checkpoints) and then again for each measured request: every mode but
  ``full_recompute`` finds all of it but its last token in the prefix cache.

Every mode but ``full_recompute`` runs with the automatic prefix cache (as an engine does),
its checkpoints every ``--prefix-block-tokens`` tokens (default: the model's spacing).

Before its measured requests every mode runs the point's warm-up requests untimed (``cold``: one
extra cold prompt of the same shape, sharing no tokens with the measured ones; ``full_recompute``,
which keeps nothing, runs only the first warm-up request), so first-call costs at a new shape are
paid outside the timing by every mode alike. The last warm-up request is one like the measured
ones (all_hit, rag): its TTFT is reported apart as ``first_request_ms``. On the H200 the first
all-hit request of a new prompt size in a process took 0.3-1.2 s more than the next ones, also
when no Triton autotuning or dynamo recompile was logged during it (the cause is not pinned down);
the later requests of that size did not pay it again.

Every mode gets its own :class:`SegmentStore` (``--store-bytes`` device budget; evictions are
reported), keyer and :class:`PicRunner`, warmed with the same requests (``prefix_cache`` too, so
its hits are what shared prefixes give it: the honest baseline). TTFT of a request = planning
(key hashing, store look-ups) + ``PicRunner.prefill`` of that one request, timed with
``time.perf_counter`` between device synchronisations. Each row also has a FLOP count, a byte count
and the floor they imply on an H200 (:mod:`hypic.bench.floor`).

JSON (``--json``): ``{"device", "model", "config", "command", "commit", "results": [row, ...],
"skipped": [...]}``, rows
keyed by (case, mode, cold_policy, prompt_tokens, segment_tokens); written after every sweep point,
so a run cut short still leaves what it measured. Row keys: the required ``case, mode,
prompt_tokens`` (the target P), ``segment_tokens, num_requests, ttft_p50_ms, ttft_p90_ms,
ttft_p99_ms, live_tokens_mean`` (main pass), ``floor_ms`` (mean over requests); and
``cold_policy, ttft_mean_ms, ttft_samples_ms`` (every measured request's TTFT, in the order
they ran: where the tail comes from), ``first_request_ms`` (the last warm-up request's TTFT),
``plan_p50_ms, prompt_tokens_mean, standalone_tokens_mean, token_hit_rate`` (reused tokens /
prompt tokens), ``hit_rate`` (store acquire hits / look-ups during the measured requests; None
without a store), ``flops, bytes`` (means), ``floor_ratio`` (p50 /
floor), ``seam``, ``store_bytes_per_cached_token, store_bytes, store_entries, store_evictions,
store_drops, store_budget_bytes, store_skipped_writes``, ``store_linear_bytes_per_cached_token``
(the linear layers' part of the stored entries: summaries and conv tails, or a checkpoint's
states, per cached token) beside ``kv_bytes_per_token`` (the model's own full-attention K and V
of one token, what a KV cache holds per token); ``summary_overhead`` and ``speedup_vs_full_recompute`` on cold
rows; ``speedup_vs_prefix_cache`` (prefix_cache's p50 / the row's) on all_hit and rag rows of the
other modes when prefix_cache ran; ``corpus_documents, warmup_requests`` on rag rows; ``error`` (a traceback; timings None) when
a mode failed (e.g. out of memory), the run then carrying on and exiting with 1.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from hypic.bench.common import add_model_arguments, device_name, load_bench_model, provenance, synchronize
from hypic.bench.floor import WorkModel, device_peaks
from hypic.bench.rag_trace import RagTrace, RagTraceConfig
from hypic.bench.ttft_mode import ModeBench, Sample
from hypic.bench.ttft_report import (format_table, mean, merge_reports, parse_bytes, percentile, write_json,
                                     write_plots)
from hypic.pic.keys import KIND_SEGMENT
from hypic.pic.modes import COLD_INLINE, COLD_STANDALONE, MODES, get_mode, validate_seam
from hypic.pic.payload import payload_nbytes
from hypic.pic.segments import SegmentedPrompt

CASES = ("cold", "all_hit", "rag", "plain_repeat")
DEFAULT_CASES = ("cold", "all_hit", "rag")


def linear_bytes_per_cached_token(entries) -> Optional[float]:
    """Bytes the store holds for the linear layers of its segment entries (summaries and conv
    tails) per body token: what reusing a segment costs beside its K/V (prefix checkpoints, which
    hold states, are left out); None without segment entries."""
    segments = [e for e in entries if e.key.kind == KIND_SEGMENT]
    tokens = sum(e.num_body_tokens for e in segments)
    if not tokens:
        return None
    return sum(payload_nbytes(p) for e in segments for p in e.linear.values()) / tokens


ALL_MODES = tuple(MODES)  # full_recompute, prefix_cache, addition, transition, transition_rope, hypic


# ---- configuration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TtftConfig:
    cases: Tuple[str, ...] = DEFAULT_CASES
    modes: Tuple[str, ...] = ALL_MODES
    seam: object = 8
    prompt_tokens: Tuple[int, ...] = (8192, 32768, 131072)
    segment_tokens: Tuple[int, ...] = (512, 2048)
    num_requests: int = 8  # measured requests per (case, mode) for all_hit and rag
    cold_requests: int = 3  # measured prompts per mode for cold
    query_tokens: int = 64  # question of the cold and all_hit cases
    store_bytes: Optional[int] = None  # device budget of each mode's store (None: unlimited)
    seed: int = 0
    # rag trace
    doc_tokens_min: int = 256
    doc_tokens_max: int = 2048
    system_tokens: int = 256
    rag_query_tokens_min: int = 32
    rag_query_tokens_max: int = 64
    zipf_exponent: float = 1.0
    corpus_factor: float = 3.0
    warmup_requests: int = 2  # rag: sampled warm-up requests before the corpus-covering ones
    prefix_block_tokens: Optional[int] = None  # the prefix cache's spacing (None: the model's)
    # segments shorter than this run live (0: every segment a seam leaves a body in is cached, so
    # each mode's rows measure its mechanics at any segment size)
    segment_min_tokens: int = 0
    max_seconds: Optional[float] = None  # no new sweep point starts after this
    fail_fast: bool = False
    progress: bool = True
    device_warmup: bool = True  # one small untimed request per mode before everything

    def __post_init__(self):
        for name in ("cases", "modes", "prompt_tokens", "segment_tokens"):
            v = getattr(self, name)
            if not isinstance(v, tuple) or not v:
                raise ValueError(f"{name}: expected a non-empty tuple, got {v!r}")
        for c in self.cases:
            if c not in CASES:
                raise ValueError(f"cases: unknown case {c!r}; valid cases: {', '.join(CASES)}")
        canonical = tuple(get_mode(m).name for m in self.modes)  # unknown -> ValueError
        if len(set(canonical)) != len(canonical):
            raise ValueError(f"modes: repeated mode in {self.modes!r}")
        object.__setattr__(self, "modes", canonical)
        validate_seam(self.seam)
        for name in ("prompt_tokens", "segment_tokens"):
            for v in getattr(self, name):
                if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                    raise ValueError(f"{name}: expected ints > 0, got {v!r}")
        for p in self.prompt_tokens:
            for s in self.segment_tokens:
                if p < s:
                    raise ValueError(f"prompt_tokens {p} < segment_tokens {s}: no whole segment fits")
        for name in ("num_requests", "cold_requests", "query_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected int >= 1, got {v!r}")
        if self.store_bytes is not None and (not isinstance(self.store_bytes, int) or self.store_bytes < 0):
            raise ValueError(f"store_bytes: expected int >= 0 or None, got {self.store_bytes!r}")
        if isinstance(self.warmup_requests, bool) or not isinstance(self.warmup_requests, int) \
                or self.warmup_requests < 0:
            raise ValueError(f"warmup_requests: expected int >= 0, got {self.warmup_requests!r}")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ValueError(f"max_seconds: expected > 0, got {self.max_seconds!r}")

    def rag_trace_config(self, vocab_size: int, prompt_tokens: int, segment_tokens: int) -> RagTraceConfig:
        return RagTraceConfig(
            vocab_size=vocab_size, prompt_tokens=prompt_tokens, segment_tokens=segment_tokens,
            doc_tokens_min=self.doc_tokens_min, doc_tokens_max=self.doc_tokens_max,
            system_tokens=self.system_tokens, query_tokens_min=self.rag_query_tokens_min,
            query_tokens_max=self.rag_query_tokens_max, zipf_exponent=self.zipf_exponent,
            corpus_factor=self.corpus_factor, seed=self.seed,
        )


class _NoProgress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n: int = 1) -> None:
        pass


def _with_prefix_cache_speedup(rows: List[Dict]) -> List[Dict]:
    """``rows`` of one cached-case sweep point, each measured row of another mode given
    ``speedup_vs_prefix_cache`` = prefix_cache's p50 / its p50 (issue 6's RAG ratio) when
    prefix_cache was measured there."""
    base = next((r for r in rows if r["mode"] == "prefix_cache" and r.get("ttft_p50_ms")), None)
    if base is not None:
        for r in rows:
            if r is not base and r.get("ttft_p50_ms"):
                r["speedup_vs_prefix_cache"] = base["ttft_p50_ms"] / r["ttft_p50_ms"]
    return rows


def _random_tokens(rng: random.Random, n: int, vocab_size: int) -> Tuple[int, ...]:
    return tuple(rng.randint(1, vocab_size - 1) for _ in range(n))


class TtftBench:
    def __init__(self, model, spec, config: TtftConfig, *, device, dtype, model_name: str,
                 on_point_done=None, provenance: Optional[Dict] = None):
        if not isinstance(config, TtftConfig):
            raise ValueError(f"config: expected TtftConfig, got {type(config).__name__}")
        self.model, self.spec, self.config = model, spec, config
        self.device, self.dtype = torch.device(device), dtype
        self.model_name = model_name
        self.work = WorkModel(spec, model)
        self.results: List[Dict] = []
        self.skipped: List[Dict] = []
        self.errors = 0
        self._on_point_done = on_point_done
        self.provenance = dict(provenance or {})
        self._t_start = time.perf_counter()

    # -- helpers ---------------------------------------------------------------------------
    def _variants(self, case: str) -> List[Tuple[str, str]]:
        out = [(m, COLD_INLINE) for m in self.config.modes]
        if case == "cold" and "hypic" in self.config.modes:
            out.append(("hypic", COLD_STANDALONE))
        return out

    def _bench(self, mode: str, cold_policy: str) -> ModeBench:
        return ModeBench(self.model, self.spec, self.work, self.device, self.dtype, mode, cold_policy,
                         self.config.seam, self.config.store_bytes, self.model_name,
                         prefix_block_tokens=self.config.prefix_block_tokens,
                         segment_min_tokens=self.config.segment_min_tokens)

    def _progress(self, total: int, desc: str):
        try:
            from tqdm import tqdm
        except ImportError:  # a bare device machine: run without a progress bar
            return _NoProgress()
        return tqdm(total=total, desc=desc, disable=not self.config.progress, leave=False, dynamic_ncols=True)

    def _free(self) -> None:
        # Give the previous mode's store back before the next one fills its own (a full-size store
        # holds tens of GiB). On CPU refcounting frees it already; a gc pass there costs more than
        # it frees.
        if self.device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()

    def device_warmup(self) -> None:
        """One small untimed request through every mode (lazy initialisation, kernel compiles)."""
        rng = random.Random(f"device-warmup-{self.config.seed}")
        seg = min(self.config.segment_tokens)
        vocab = self.spec.vocab_size
        prompt = SegmentedPrompt(tuple(_random_tokens(rng, seg, vocab) for _ in range(2)),
                                 _random_tokens(rng, 16, vocab))
        for mode, cp in self._variants("cold"):
            bench = self._bench(mode, cp)
            try:
                bench.run(prompt)
                bench.run(SegmentedPrompt(tuple(reversed(prompt.segments)), prompt.query))
            finally:
                bench.close()
        self._free()

    # -- rows ------------------------------------------------------------------------------
    def _row(self, case: str, mode: str, cold_policy: str, prompt_tokens: int, segment_tokens: int,
             samples: Sequence[Sample], bench: Optional[ModeBench], stats_before) -> Dict:
        ttft_ms = [s.ttft_s * 1e3 for s in samples]
        row = {
            "case": case, "mode": mode, "cold_policy": cold_policy,
            "prompt_tokens": prompt_tokens, "segment_tokens": segment_tokens, "num_requests": len(samples),
            "ttft_p50_ms": percentile(ttft_ms, 50), "ttft_p90_ms": percentile(ttft_ms, 90),
            "ttft_p99_ms": percentile(ttft_ms, 99),
            "live_tokens_mean": mean([s.live_tokens for s in samples]),
            "floor_ms": mean([s.floor_s * 1e3 for s in samples]),
            "ttft_mean_ms": mean(ttft_ms),
            "ttft_samples_ms": list(ttft_ms),
            "plan_p50_ms": percentile([s.plan_s * 1e3 for s in samples], 50),
            "prompt_tokens_mean": mean([s.prompt_tokens for s in samples]),
            "standalone_tokens_mean": mean([s.standalone_tokens for s in samples]),
            "token_hit_rate": sum(s.reused_tokens for s in samples) / sum(s.prompt_tokens for s in samples),
            "flops": mean([s.flops for s in samples]),
            "bytes": mean([s.bytes for s in samples]),
            "seam": self.config.seam if get_mode(mode).seam_configurable else get_mode(mode).fixed_seam,
        }
        row["floor_ratio"] = row["ttft_p50_ms"] / row["floor_ms"] if row["floor_ms"] > 0 else None
        row["kv_bytes_per_token"] = self.work.kv_bytes_per_token
        if bench is not None and bench.store is not None:
            st = bench.store.stats()
            hits = st.hits - stats_before.hits
            misses = st.misses - stats_before.misses
            row.update({
                "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
                "store_bytes_per_cached_token": st.bytes_per_cached_token,
                "store_linear_bytes_per_cached_token": linear_bytes_per_cached_token(bench.store.snapshot()),
                "store_bytes": st.device_bytes + st.host_bytes,
                "store_entries": st.device_entries + st.host_entries,
                "store_evictions": st.evictions,
                "store_drops": st.drops,
                "store_budget_bytes": st.device_budget_bytes,
                # cold segments the runner did not record because the store could not hold them
                "store_skipped_writes": bench.runner.skipped_writes,
            })
        else:
            row.update({"hit_rate": None, "store_bytes_per_cached_token": None,
                        "store_linear_bytes_per_cached_token": None, "store_bytes": 0,
                        "store_entries": 0, "store_evictions": 0, "store_drops": 0,
                        "store_budget_bytes": None, "store_skipped_writes": 0})
        return row

    def _error_row(self, case, mode, cold_policy, prompt_tokens, segment_tokens, err: str) -> Dict:
        row = {"case": case, "mode": mode, "cold_policy": cold_policy, "prompt_tokens": prompt_tokens,
               "segment_tokens": segment_tokens, "num_requests": 0, "ttft_p50_ms": None,
               "ttft_p90_ms": None, "ttft_p99_ms": None, "live_tokens_mean": None, "floor_ms": None,
               "error": err}
        return row

    def _measure(self, case: str, prompt_tokens: int, segment_tokens: int,
                 warmup: Sequence[SegmentedPrompt], measured: Sequence[SegmentedPrompt]) -> List[Dict]:
        rows = []
        for mode, cp in self._variants(case):
            bench = None
            try:
                bench = self._bench(mode, cp)
                stats_before = None
                uses_store = bench.store is not None
                # A mode without a store keeps nothing, so the warm-up would change nothing for it;
                # it still runs the first warm-up request, untimed, so that first-call costs at
                # this shape (allocator growth, kernel selection) are paid outside the timing by
                # every mode alike.
                todo_warmup = list(warmup) if uses_store else list(warmup[:1])
                label = f"{case} P={prompt_tokens} S={segment_tokens} {mode}" + ("" if cp == COLD_INLINE else f"/{cp}")
                first = None
                with self._progress(len(todo_warmup) + len(measured), label) as bar:
                    for p in todo_warmup:
                        first = bench.run(p)
                        bar.update(1)
                    if uses_store:
                        stats_before = bench.store.stats()
                    samples = []
                    for p in measured:
                        samples.append(bench.run(p))
                        bar.update(1)
                rows.append(self._row(case, mode, cp, prompt_tokens, segment_tokens, samples, bench, stats_before))
                rows[-1]["first_request_ms"] = None if first is None else first.ttft_s * 1e3
            except Exception:  # noqa: BLE001 - record (OOM included) and carry on with the next mode
                if self.config.fail_fast:
                    raise
                self.errors += 1
                rows.append(self._error_row(case, mode, cp, prompt_tokens, segment_tokens, traceback.format_exc()))
            finally:
                if bench is not None:
                    bench.close()
                del bench
                self._free()
        return rows

    # -- cases -----------------------------------------------------------------------------
    def _segment_prompts(self, prompt_tokens: int, segment_tokens: int, stream: str):
        n = prompt_tokens // segment_tokens
        rng = random.Random(f"{stream}-{self.config.seed}-{prompt_tokens}-{segment_tokens}")
        vocab = self.spec.vocab_size
        return rng, [_random_tokens(rng, segment_tokens, vocab) for _ in range(n)]

    def case_cold(self, prompt_tokens: int, segment_tokens: int) -> List[Dict]:
        vocab, q = self.spec.vocab_size, self.config.query_tokens
        prompts = []
        for i in range(self.config.cold_requests + 1):
            rng, segs = self._segment_prompts(prompt_tokens, segment_tokens, f"cold{i}")
            prompts.append(SegmentedPrompt(tuple(segs), _random_tokens(rng, q, vocab)))
        # prompts[0]: an untimed shape warm-up; its entries share no tokens with the measured
        # prompts, which therefore stay all-miss (cold).
        rows = self._measure("cold", prompt_tokens, segment_tokens, prompts[:1], prompts[1:])
        by = {(r["mode"], r["cold_policy"]): r for r in rows if r.get("ttft_p50_ms") is not None}
        full = by.get(("full_recompute", COLD_INLINE))
        if full is not None:
            for (mode, cp), r in by.items():
                if mode == "hypic" and cp == COLD_INLINE:
                    r["summary_overhead"] = (r["ttft_p50_ms"] - full["ttft_p50_ms"]) / full["ttft_p50_ms"]
                if mode != "full_recompute":
                    r["speedup_vs_full_recompute"] = full["ttft_p50_ms"] / r["ttft_p50_ms"]
        return rows

    def case_all_hit(self, prompt_tokens: int, segment_tokens: int) -> List[Dict]:
        vocab, q = self.spec.vocab_size, self.config.query_tokens
        rng, pool = self._segment_prompts(prompt_tokens, segment_tokens, "all_hit")

        def shuffled():
            order = list(range(len(pool)))
            rng.shuffle(order)
            return SegmentedPrompt(tuple(pool[i] for i in order), _random_tokens(rng, q, vocab))

        warmup = [shuffled(), shuffled()]  # caches the pool; then an all-hit request, untimed
        measured = [shuffled() for _ in range(self.config.num_requests)]
        return _with_prefix_cache_speedup(self._measure("all_hit", prompt_tokens, segment_tokens, warmup, measured))

    def case_rag(self, prompt_tokens: int, segment_tokens: int) -> List[Dict]:
        trace = RagTrace(self.config.rag_trace_config(self.spec.vocab_size, prompt_tokens, segment_tokens))
        warmup = [r.prompt for r in trace.warmup_requests(self.config.warmup_requests)]
        # one more like the measured ones, from its own stream, untimed (first-call costs)
        warmup.append(trace.requests(1, stream="first")[0].prompt)
        measured = [r.prompt for r in trace.requests(self.config.num_requests)]
        rows = _with_prefix_cache_speedup(self._measure("rag", prompt_tokens, segment_tokens, warmup, measured))
        for r in rows:
            r["corpus_documents"] = len(trace.documents)
            r["warmup_requests"] = len(warmup)
        return rows

    def case_plain_repeat(self, prompt_tokens: int, segment_tokens: int) -> List[Dict]:
        rng = random.Random(f"plain_repeat-{self.config.seed}-{prompt_tokens}")
        prompt = SegmentedPrompt((), _random_tokens(rng, prompt_tokens, self.spec.vocab_size))
        rows = self._measure("plain_repeat", prompt_tokens, segment_tokens, [prompt],
                             [prompt] * self.config.num_requests)
        return _with_prefix_cache_speedup(rows)

    # -- driver ----------------------------------------------------------------------------
    def run(self) -> List[Dict]:
        cases = {"cold": self.case_cold, "all_hit": self.case_all_hit, "rag": self.case_rag,
                 "plain_repeat": self.case_plain_repeat}
        if self.config.device_warmup:
            self.device_warmup()
        # Segment size outermost, then prompt length, then case: with a time budget the first
        # (most important) sweep points get all their cases before later points start.
        for s in self.config.segment_tokens:
            for p in self.config.prompt_tokens:
                for case in self.config.cases:
                    elapsed = time.perf_counter() - self._t_start
                    if self.config.max_seconds is not None and elapsed > self.config.max_seconds:
                        self.skipped.append({"case": case, "prompt_tokens": p, "segment_tokens": s,
                                             "reason": f"time budget of {self.config.max_seconds} s spent"})
                        continue
                    self.results.extend(cases[case](p, s))
                    if self._on_point_done is not None:
                        self._on_point_done(self)
        return self.results

    def report(self) -> Dict:
        device = device_name(self.device)
        peak_flops, peak_bytes_per_s = device_peaks(device)
        cfg = asdict(self.config)
        return {"device": device, "model": self.model_name, "dtype": str(self.dtype).replace("torch.", ""),
                "torch": torch.__version__, "config": cfg, **self.provenance,
                "peak_flops": peak_flops, "peak_bytes_per_s": peak_bytes_per_s,
                "results": self.results, "skipped": self.skipped}


# ---- command line -------------------------------------------------------------------------------

def _int_list(text: str, name: str) -> Tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{name}: expected comma-separated integers, got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma-separated: " + ",".join(CASES))
    p.add_argument("--modes", default=",".join(ALL_MODES), help="comma-separated PIC modes")
    p.add_argument("--seam", default="8", help="hypic seam: int tokens or a fraction in (0, 1]")
    p.add_argument("--prompt-tokens", default="8192,32768,131072")
    p.add_argument("--segment-tokens", default="512,2048")
    p.add_argument("--num-requests", type=int, default=8, help="measured requests per mode (all_hit, rag)")
    p.add_argument("--cold-requests", type=int, default=3, help="measured prompts per mode (cold)")
    p.add_argument("--query-tokens", type=int, default=64, help="question length of cold and all_hit")
    p.add_argument("--store-bytes", default="none", help="device budget of each mode's store, e.g. 32GiB")
    p.add_argument("--doc-tokens", default="256,2048", help="rag: min,max document tokens")
    p.add_argument("--system-tokens", type=int, default=256, help="rag: system prompt tokens")
    p.add_argument("--rag-query-tokens", default="32,64", help="rag: min,max question tokens")
    p.add_argument("--zipf", type=float, default=1.0, help="rag: Zipf exponent of document popularity")
    p.add_argument("--corpus-factor", type=float, default=3.0,
                   help="rag: corpus tokens / document tokens of one request")
    p.add_argument("--warmup-requests", type=int, default=2,
                   help="rag: trace requests sampled for the warm-up before the requests that cover the rest "
                        "of the corpus")
    p.add_argument("--prefix-block-tokens", type=int, default=None,
                   help="the prefix cache's checkpoint spacing (default: the model's)")
    p.add_argument("--segment-min-tokens", type=int, default=0,
                   help="segments shorter than this run live (default 0: every segment cached)")
    p.add_argument("--max-seconds", type=float, default=None, help="start no new sweep point after this")
    p.add_argument("--fail-fast", action="store_true", help="raise on the first error instead of recording it")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-device-warmup", action="store_true",
                   help="skip the small untimed request per mode at start (each sweep point still warms up)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--plot-dir", default=None, help="write ttft_<case>.png here")
    p.add_argument("--merge-json", nargs="+", default=None, metavar="PART",
                   help="load no model: merge the results of earlier runs (same device and model) into "
                        "--json, print the table and write the plots")


def config_from_args(args: argparse.Namespace) -> TtftConfig:
    seam = float(args.seam) if "." in args.seam else int(args.seam)
    doc = _int_list(args.doc_tokens, "--doc-tokens")
    rq = _int_list(args.rag_query_tokens, "--rag-query-tokens")
    if len(doc) != 2 or len(rq) != 2:
        raise ValueError("--doc-tokens and --rag-query-tokens take 'min,max'")
    return TtftConfig(
        cases=tuple(c.strip() for c in args.cases.split(",") if c.strip()),
        modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
        seam=seam,
        prompt_tokens=_int_list(args.prompt_tokens, "--prompt-tokens"),
        segment_tokens=_int_list(args.segment_tokens, "--segment-tokens"),
        num_requests=args.num_requests, cold_requests=args.cold_requests, query_tokens=args.query_tokens,
        store_bytes=parse_bytes(args.store_bytes), seed=args.seed,
        doc_tokens_min=doc[0], doc_tokens_max=doc[1], system_tokens=args.system_tokens,
        rag_query_tokens_min=rq[0], rag_query_tokens_max=rq[1], zipf_exponent=args.zipf,
        corpus_factor=args.corpus_factor, warmup_requests=args.warmup_requests,
        prefix_block_tokens=args.prefix_block_tokens, segment_min_tokens=args.segment_min_tokens,
        max_seconds=args.max_seconds, fail_fast=args.fail_fast,
        progress=not args.no_progress, device_warmup=not args.no_device_warmup,
    )


def _finish(report: Dict, args: argparse.Namespace, title: str) -> None:
    print(format_table(report["results"]), flush=True)
    for s in report.get("skipped", []):
        print(f"skipped {s['case']} P={s['prompt_tokens']} S={s['segment_tokens']}: {s['reason']}")
    if args.json:
        write_json(args.json, report)
        print(f"wrote {args.json}")
    if args.plot_dir:
        try:
            paths = write_plots(report["results"], args.plot_dir, title=title)
        except ImportError as e:  # no matplotlib where it ran: the JSON has everything
            print(f"no plots: {e}")
            paths = []
        for path in paths:
            print(f"wrote {path}")


def run(args: argparse.Namespace) -> int:
    if args.merge_json:
        reports = []
        for path in args.merge_json:
            if not os.path.isfile(path):
                raise ValueError(f"--merge-json: no such file {path!r}")
            with open(path, encoding="utf-8") as f:
                reports.append(json.load(f))
        report = merge_reports(reports)
        # the merge's own command and checkout; each row keeps the command and commit that measured it
        made = provenance(args)
        report.update(command=made["command"], commit=made["commit"])
        _finish(report, args, title=f"{report['model']} on {report['device']}")
        return 1 if any("error" in r for r in report["results"]) else 0
    config = config_from_args(args)  # validate everything before loading a 35B model
    t0 = time.perf_counter()
    spec, model, name, device, dtype = load_bench_model(args)
    synchronize(device)
    print(f"loaded {name} ({sum(p.numel() for p in model.parameters()) / 1e9:.3f} B params, {dtype}, "
          f"{device}) in {time.perf_counter() - t0:.1f} s", flush=True)

    def checkpoint(bench: TtftBench) -> None:
        last = bench.results[-1] if bench.results else None
        if last is not None:
            print(f"[{time.perf_counter() - t0:7.1f} s] done {last['case']} P={last['prompt_tokens']} "
                  f"S={last['segment_tokens']} ({len(bench.results)} rows, {bench.errors} errors)", flush=True)
        if args.json:
            write_json(args.json, bench.report())

    bench = TtftBench(model, spec, config, device=device, dtype=dtype, model_name=name, on_point_done=checkpoint,
                      provenance=provenance(args))
    bench.run()
    report = bench.report()
    _finish(report, args, title=f"{name} on {report['device']}")
    if bench.errors:
        print(f"{bench.errors} measurement(s) failed; see the 'error' fields")
        return 1
    return 0


HELP = "TTFT of every PIC mode: cold, all-hit and RAG-trace cases (JSON, table, plots)"
