"""``hypic bench segment-parallel``: cold-request TTFT with segment parallelism
(:mod:`hypic.runner.segment_parallel`) over the GPUs of one host.

    hypic bench segment-parallel --dummy-config hypic/models/configs/qwen3_5_35b_a3b.json \\
        --load-format dummy --device cuda --dtype bfloat16 --workers 1,2,4,8 \\
        --traces 64x512,24x256-4096 --assignment lpt,round_robin --json sp.json
    hypic bench segment-parallel --model tiny --device cpu --workers 1,2 --traces 4x16 \\
        --query-tokens 8                                                       # CPU smoke run

The target: a cold request of 64 x 512-token segments + a 64-token question answered by ``hypic``
with the ``standalone`` cold policy at least 1.5x faster than ``full_recompute``, which one GPU
cannot reach. Runs through :class:`hypic.engine.engine.LLMEngine` (planning, the standalone pass
over the workers, the combine forward, the first token): one engine per worker count of
``--workers`` (counts above the GPUs present are left out); on each, every trace of
``--traces`` (:mod:`hypic.bench.segment_trace`: uniform ``NxL`` or uneven ``NxA-B``) under each
assignment of ``--assignment`` (switched on the same workers), ``--requests`` cold requests of
fresh random tokens after ``--warmup`` ones. ``full_recompute`` runs on the one-worker engine.

Per row: TTFT from ``add_request`` to the first token (p50 / p90) and its split: the scatter
phase (the standalone pass, timed on the engine's device) and the combine (the rest); with
workers, the scatter's compute, the transfer of the workers' entries and the part of it that
no compute hid (:class:`hypic.runner.segment_report.ScatterReport`), the estimated imbalance of
the split, and any worker fault. Derived: speedups over ``full_recompute`` and over one worker,
the scatter phase's scaling efficiency, and LPT over round-robin. ``--plot``: TTFT against
workers.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from typing import Dict, List

import torch

from hypic.bench.common import add_model_arguments, median, provenance, write_report
from hypic.bench.segment_trace import derive, format_row, parse_traces, split_p50
from hypic.bench.ttft_report import percentile
from hypic.config import parse_bytes, parse_optional_int
from hypic.engine.engine import LLMEngine, resolve_device
from hypic.engine.sampling import SamplingParams
from hypic.runner.segment_assign import ASSIGNMENTS
from hypic.runner.segment_parallel import SegmentParallelConfig

FIRST_TOKEN = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--workers", default="1,2,4,8", help="comma-separated worker counts (GPUs)")
    p.add_argument("--traces", default="64x512",
                   help="comma-separated cold prompts: NxL (N segments of L tokens) or NxA-B (lengths drawn "
                        "log-uniformly in [A, B], the same per request for every worker count and assignment)")
    p.add_argument("--assignment", default="lpt",
                   help="comma-separated split policies to compare with workers: " + ", ".join(ASSIGNMENTS))
    p.add_argument("--group-tokens", type=parse_optional_int, default=SegmentParallelConfig.group_tokens,
                   help="tokens of one forward on a rank, whose entries are sent together (none: a rank's share "
                        "at once)")
    p.add_argument("--query-tokens", type=int, default=64)
    p.add_argument("--store-bytes", type=parse_bytes, default=None,
                   help="the segment store's device tier (e.g. 40GiB; default unbounded)")
    p.add_argument("--requests", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--plot", default=None, help="write TTFT against workers here (.png)")


def _measure(engine: LLMEngine, segments, mode: str) -> Dict:
    """One cold request: its TTFT, its scatter phase and, with workers, the scatter's split."""
    pool = engine.segment_workers
    engine.pic_runner.last_standalone = None
    batches = pool.num_batches if pool is not None else 0
    faults = engine.stats.num_segment_worker_faults
    start = time.perf_counter()
    engine.add_request({"segments": segments}, FIRST_TOKEN, mode=mode,
                       cold_policy="standalone" if mode == "hypic" else None)
    while engine.has_unfinished_requests():
        engine.step()
    ttft_ms = (time.perf_counter() - start) * 1e3
    timer = engine.pic_runner.last_standalone
    return {"ttft_ms": ttft_ms, "scatter_ms": timer.elapsed_s() * 1e3 if timer is not None else None,
            "split": pool.last_report.summary() if pool is not None and pool.num_batches > batches else None,
            "standalone_batches": pool.num_batches - batches if pool is not None else None,
            "worker_faults": engine.stats.num_segment_worker_faults - faults}


def _model_folder(args: argparse.Namespace, tmp: str) -> str:
    """The engine (and each worker) loads a model by folder: a --dummy-config goes into one."""
    if args.dummy_config is None:
        return args.model
    if args.load_format != "dummy":
        raise ValueError("--dummy-config builds dummy weights: pass --load-format dummy with it")
    if not os.path.isfile(args.dummy_config):
        raise ValueError(f"--dummy-config: no such file {args.dummy_config!r}")
    shutil.copy(args.dummy_config, os.path.join(tmp, "config.json"))
    return tmp


def _plot(path: str, rows: List[Dict], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for trace in dict.fromkeys(r["trace"] for r in rows):
        for assignment in dict.fromkeys(r["assignment"] for r in rows if r["assignment"]):
            hyp = [r for r in rows if r["trace"] == trace and r["mode"] == "hypic"
                   and r["assignment"] in (assignment, None)]
            ax.plot([r["workers"] for r in hyp], [r["ttft_p50_ms"] for r in hyp], "o-", label=f"{trace} {assignment}")
        full = next((r for r in rows if r["trace"] == trace and r["mode"] == "full_recompute"), None)
        if full:
            ax.axhline(full["ttft_p50_ms"], color="gray", ls="--", lw=0.8)
    ax.set_xlabel("segment workers (dashed: full_recompute, 1 worker)")
    ax.set_ylabel("cold TTFT p50 (ms)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _cases(workers: int, assignments: List[str]):
    """``(mode, assignment)`` measured on an engine of ``workers``."""
    if workers == 1:
        return [("full_recompute", None), ("hypic", None)]
    return [("hypic", a) for a in assignments]


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    available = torch.cuda.device_count() if device.type == "cuda" else 2
    counts = [m for m in (int(x) for x in args.workers.split(",") if x.strip()) if 1 <= m <= available]
    if not counts:
        raise ValueError(f"--workers: no count in {args.workers!r} fits the {available} workers available")
    traces = parse_traces(args.traces)
    assignments = [a.strip() for a in args.assignment.split(",") if a.strip()]
    if not assignments or any(a not in ASSIGNMENTS for a in assignments):
        raise ValueError(f"--assignment: {args.assignment!r} is not a list of {', '.join(ASSIGNMENTS)}")
    if args.requests < 1 or args.warmup < 0 or args.query_tokens < 1:
        raise ValueError("--requests and --query-tokens must be >= 1, --warmup >= 0")
    longest = max(t.max_prompt_tokens for t in traces) + args.query_tokens
    rng = random.Random(args.seed)
    rows: List[Dict] = []
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "workers_available": available, "model": args.dummy_config or args.model, **provenance(args),
              "results": rows}
    with tempfile.TemporaryDirectory() as tmp:
        folder = _model_folder(args, tmp)
        for m in counts:
            engine = LLMEngine(folder, dtype=args.dtype, device=str(device), load_format=args.load_format,
                               seed=args.seed, max_num_batched_tokens=2 * longest + 1024,
                               segment_cache_bytes=args.store_bytes, segment_workers=m,
                               segment_assignment=assignments[0], segment_group_tokens=args.group_tokens)
            vocab = engine.spec.vocab_size
            try:
                for trace in traces:
                    for mode, assignment in _cases(m, assignments):
                        if assignment is not None:
                            engine.segment_workers.assignment = assignment
                        samples = []
                        for r in range(args.warmup + args.requests):
                            segments = [[rng.randrange(1, vocab) for _ in range(n)] for n in trace.lengths(args.seed, r)]
                            segments.append([rng.randrange(1, vocab) for _ in range(args.query_tokens)])
                            sample = _measure(engine, segments, mode)
                            sample["prompt_tokens"] = sum(len(s) for s in segments)
                            if r >= args.warmup:
                                samples.append(sample)
                        ttfts = [s["ttft_ms"] for s in samples]
                        rows.append({"trace": trace.name, "mode": mode,
                                     "cold_policy": "standalone" if mode == "hypic" else None, "workers": m,
                                     "assignment": assignment, "group_tokens": args.group_tokens,
                                     "num_segments": trace.num_segments,
                                     "prompt_tokens_mean": sum(s["prompt_tokens"] for s in samples) / len(samples),
                                     "num_requests": len(samples), "ttft_samples_ms": ttfts,
                                     "ttft_p50_ms": median(ttfts), "ttft_p90_ms": percentile(ttfts, 90),
                                     **split_p50(samples),
                                     "worker_faults": sum(s["worker_faults"] for s in samples), "samples": samples})
                        print(f"{trace.name:>14} {mode:>14} workers {m} {assignment or '-'}: "
                              f"p50 {rows[-1]['ttft_p50_ms']:.1f} ms", flush=True)
                        derive(rows)
                        if args.json:  # after every row: a run cut short keeps what it measured
                            write_report(args.json, report)
            finally:
                engine.shutdown()
    for r in rows:
        print(format_row(r))
    if args.json:
        print(f"wrote {args.json}")
    if args.plot:
        try:
            _plot(args.plot, rows, f"cold TTFT, {args.query_tokens}-token question")
            print(f"wrote {args.plot}")
        except ImportError as e:
            print(f"no plot: {e}")
    return 0


HELP = ("cold TTFT with segment parallelism over the GPUs of one host (hypic standalone vs full recompute): "
        "the scatter / transfer / combine split, LPT against round-robin")
