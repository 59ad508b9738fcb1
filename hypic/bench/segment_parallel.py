"""``hypic bench segment-parallel``: cold-request TTFT with segment parallelism
(:mod:`hypic.runner.segment_parallel`) over the GPUs of one host.

    hypic bench segment-parallel --dummy-config hypic/models/configs/qwen3_5_35b_a3b.json \\
        --load-format dummy --device cuda --dtype bfloat16 --workers 1,2,4,8 --json sp.json
    hypic bench segment-parallel --model tiny --device cpu --workers 1 --segments 4 \\
        --segment-tokens 16 --query-tokens 8                                   # CPU smoke run

The target: a cold request of 64 x 512-token segments + a 64-token question answered by ``hypic``
with the ``standalone`` cold policy at least 1.5x faster than ``full_recompute``, which one GPU
cannot reach. Runs through :class:`hypic.engine.engine.LLMEngine` (planning, the standalone pass
over the workers, the combine forward, the first token): one engine per worker count of
``--workers`` (counts above the GPUs present are left out); each measures ``--requests`` cold
requests of fresh random segments after ``--warmup`` ones. TTFT from ``add_request`` to the first
token, p50 / p90; ``full_recompute`` runs on the one-worker engine. ``--plot``: TTFT against
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
from hypic.bench.ttft_report import percentile
from hypic.engine.engine import LLMEngine, resolve_device
from hypic.engine.sampling import SamplingParams

FIRST_TOKEN = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--workers", default="1,2,4,8", help="comma-separated worker counts (GPUs)")
    p.add_argument("--segments", type=int, default=64)
    p.add_argument("--segment-tokens", type=int, default=512)
    p.add_argument("--query-tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--plot", default=None, help="write TTFT against workers here (.png)")


def _ttft_ms(engine: LLMEngine, segments, mode: str) -> float:
    start = time.perf_counter()
    engine.add_request({"segments": segments}, FIRST_TOKEN, mode=mode,
                       cold_policy="standalone" if mode == "hypic" else None)
    while engine.has_unfinished_requests():
        engine.step()
    return (time.perf_counter() - start) * 1e3


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


def _plot(path: str, rows: List[Dict], full_ms, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hyp = [r for r in rows if r["mode"] == "hypic"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["workers"] for r in hyp], [r["ttft_p50_ms"] for r in hyp], "o-", label="hypic standalone")
    if full_ms:
        ax.axhline(full_ms, color="gray", ls="--", label="full_recompute (1 worker)")
    ax.set_xlabel("segment workers")
    ax.set_ylabel("cold TTFT p50 (ms)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    available = torch.cuda.device_count() if device.type == "cuda" else 2
    counts = [m for m in (int(x) for x in args.workers.split(",") if x.strip()) if 1 <= m <= available]
    if not counts:
        raise ValueError(f"--workers: no count in {args.workers!r} fits the {available} workers available")
    prompt_tokens = args.segments * args.segment_tokens + args.query_tokens
    rng = random.Random(args.seed)
    rows: List[Dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = _model_folder(args, tmp)
        for m in counts:
            engine = LLMEngine(folder, dtype=args.dtype, device=str(device), load_format=args.load_format,
                               seed=args.seed, max_num_batched_tokens=2 * prompt_tokens + 1024,
                               segment_cache_bytes=None,
                               segment_workers=m)
            vocab = engine.spec.vocab_size
            try:
                for mode in (("full_recompute", "hypic") if m == 1 else ("hypic",)):
                    samples = []
                    for r in range(args.warmup + args.requests):
                        segments = [[rng.randrange(1, vocab) for _ in range(args.segment_tokens)]
                                    for _ in range(args.segments)]
                        segments.append([rng.randrange(1, vocab) for _ in range(args.query_tokens)])
                        ms = _ttft_ms(engine, segments, mode)
                        if r >= args.warmup:
                            samples.append(ms)
                    rows.append({"mode": mode, "cold_policy": "standalone" if mode == "hypic" else None,
                                 "workers": m, "prompt_tokens": prompt_tokens, "segment_tokens": args.segment_tokens,
                                 "num_requests": len(samples), "ttft_samples_ms": samples,
                                 "ttft_p50_ms": median(samples), "ttft_p90_ms": percentile(samples, 90)})
                    print(f"{mode:>15} workers {m}: p50 {rows[-1]['ttft_p50_ms']:.1f} ms", flush=True)
            finally:
                engine.shutdown()
    full = next((r["ttft_p50_ms"] for r in rows if r["mode"] == "full_recompute"), None)
    for r in rows:
        r["speedup_vs_full_recompute"] = full / r["ttft_p50_ms"] if full else None
        print(f"{r['mode']:>15} {r['workers']:3d} workers  p50 {r['ttft_p50_ms']:9.1f}  p90 {r['ttft_p90_ms']:9.1f}"
              f"  x{r['speedup_vs_full_recompute'] or 0:.2f} vs full_recompute")
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "workers_available": available, "model": args.dummy_config or args.model, **provenance(args),
              "results": rows}
    if args.json:
        write_report(args.json, report)
        print(f"wrote {args.json}")
    if args.plot:
        try:
            _plot(args.plot, rows, full, f"{prompt_tokens} tokens, {args.segments} x {args.segment_tokens}")
            print(f"wrote {args.plot}")
        except ImportError as e:
            print(f"no plot: {e}")
    return 0


HELP = "cold TTFT with segment parallelism over the GPUs of one host (hypic standalone vs full recompute)"
