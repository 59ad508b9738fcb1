"""Cold-request TTFT with segment parallelism (hypic.runner.segment_parallel) on the GPUs of one
host: issue 6's ``standalone`` target (64 x 512-token segments + a 64-token question, at least
1.5x faster than ``full_recompute``), which one GPU cannot reach (at most ~1.24x, session 23).

Qwen3.5-35B-A3B shapes, dummy bf16 weights, through :class:`hypic.engine.engine.LLMEngine` (the
engine path a user runs: planning, the standalone pass over the workers, the combine forward, the
first token). For ``--workers 1,2,4,8`` (each at most the GPUs present) one engine per worker
count; each measures ``--requests`` cold requests of fresh random segments after
``--warmup`` ones (compiles, graphs, every worker's first share): TTFT from ``add_request`` to
the first token, p50 / p90. ``full_recompute`` runs on the one-worker engine. Writes OUT/
segment_parallel.json, prints a table and plots TTFT against workers.

    python3 benchmarks/segment_parallel_h200.py --out OUT                         # GPUs present
    python3 benchmarks/segment_parallel_h200.py --smoke --out OUT                 # CPU, tiny, gloo
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time

import torch

from hypic.engine.engine import LLMEngine
from hypic.engine.sampling import SamplingParams

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hypic", "models", "configs",
                      "qwen3_5_35b_a3b.json")
FIRST_TOKEN = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def ttft_ms(engine: LLMEngine, segments, mode: str) -> float:
    start = time.perf_counter()
    engine.add_request({"segments": segments}, FIRST_TOKEN, mode=mode,
                       cold_policy="standalone" if mode == "hypic" else None)
    while engine.has_unfinished_requests():
        engine.step()
    return (time.perf_counter() - start) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--segments", type=int, default=64)
    ap.add_argument("--segment-tokens", type=int, default=512)
    ap.add_argument("--query-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="CPU, the embedded tiny model, gloo")
    args = ap.parse_args()
    if args.smoke:
        model, device, dtype, load_format, available = "tiny", "cpu", "float32", "safetensors", 2
        args.segments, args.segment_tokens, args.query_tokens = min(args.segments, 6), min(args.segment_tokens, 32), 8
    else:
        folder = tempfile.mkdtemp()
        shutil.copy(CONFIG, os.path.join(folder, "config.json"))  # the workers load it by folder
        model, device, dtype, load_format, available = folder, "cuda", "bfloat16", "dummy", torch.cuda.device_count()
    counts = [m for m in (int(x) for x in args.workers.split(",")) if m <= available]
    prompt_tokens = args.segments * args.segment_tokens + args.query_tokens
    rng = random.Random(0)
    rows = []
    for m in counts:
        engine = LLMEngine(model, dtype=dtype, device=device, load_format=load_format, seed=0,
                           max_num_batched_tokens=2 * prompt_tokens + 1024, segment_cache_bytes=None,
                           segment_workers=m)
        vocab = engine.spec.vocab_size
        try:
            for mode in (("full_recompute", "hypic") if m == 1 else ("hypic",)):
                samples = []
                for r in range(args.warmup + args.requests):
                    segments = [[rng.randrange(vocab) for _ in range(args.segment_tokens)] for _ in range(args.segments)]
                    segments.append([rng.randrange(vocab) for _ in range(args.query_tokens)])
                    ms = ttft_ms(engine, segments, mode)
                    if r >= args.warmup:
                        samples.append(ms)
                samples.sort()
                rows.append({"mode": mode, "cold_policy": "standalone" if mode == "hypic" else None, "workers": m,
                             "prompt_tokens": prompt_tokens, "segment_tokens": args.segment_tokens,
                             "num_requests": len(samples), "ttft_ms": samples,
                             "ttft_p50_ms": statistics.median(samples),
                             "ttft_p90_ms": samples[min(len(samples) - 1, int(0.9 * len(samples)))]})
                print(f"{mode:>15} workers {m}: p50 {rows[-1]['ttft_p50_ms']:.1f} ms", flush=True)
        finally:
            engine.shutdown()
    full = next((r["ttft_p50_ms"] for r in rows if r["mode"] == "full_recompute"), None)
    print(f"{'mode':>15} {'workers':>7} {'p50 ms':>9} {'p90 ms':>9} {'vs full':>8}")
    for r in rows:
        r["speedup_vs_full_recompute"] = full / r["ttft_p50_ms"] if full else None
        sp = f"{r['speedup_vs_full_recompute']:8.2f}" if full else ""
        print(f"{r['mode']:>15} {r['workers']:7d} {r['ttft_p50_ms']:9.1f} {r['ttft_p90_ms']:9.1f} {sp}")
    os.makedirs(args.out, exist_ok=True)
    device_name = "cpu" if args.smoke else torch.cuda.get_device_name()
    with open(os.path.join(args.out, "segment_parallel.json"), "w") as f:
        json.dump({"device": device_name, "gpus": available, "model": "tiny" if args.smoke else "qwen3_5_35b_a3b",
                   "results": rows}, f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        hyp = [r for r in rows if r["mode"] == "hypic"]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([r["workers"] for r in hyp], [r["ttft_p50_ms"] for r in hyp], "o-", label="hypic standalone")
        if full:
            ax.axhline(full, color="gray", ls="--", label="full_recompute (1 GPU)")
        ax.set_xlabel("segment workers")
        ax.set_ylabel("cold TTFT p50 (ms)")
        ax.set_title(f"{prompt_tokens} tokens, {args.segments} x {args.segment_tokens}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "segment_parallel.png"), dpi=120)
    except ImportError:
        print("matplotlib missing: no plot")


if __name__ == "__main__":
    main()
