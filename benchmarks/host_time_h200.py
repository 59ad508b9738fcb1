"""Where the host time of a cached (all-hit) ``hypic`` request goes on one GPU, without a profiler
(CUPTI's tracing of kernels and graph nodes slows launches several-fold, so the profile tables of
``allhit_ab_h200.py`` overstate host costs).

Qwen3.5-35B-A3B shapes, dummy bf16 weights, 512-token segments plus a 64-token question, after a
cold request cached every segment (in another order). Per prompt size, medians over ``--repeats``
requests of:

* ``ttft_ms``: plan + prefill between device syncs (as the TTFT benchmark);
* ``enqueue_ms``: host time of the prefill call alone (it has no host-device sync, so this is the
  time the host needs to queue the request's GPU work: when it is close to ``ttft_ms``, the
  request is host-bound);
* per ``HYPIC_LAYER_GRAPHS`` value (``--layer-graphs``; 1: the linear cores replayed from
  per-forward graphs, hypic.graphs.layer_graphs), each value in turn in one process;
* per forward-context method (``token_wise`` = CUDA-graph phases with their input copies,
  ``short_conv``, ``linear_attention``, ``attention``), and inside them ``CUDAGraph.replay`` and
  Triton launches (``JITFunction.run`` outermost calls), their summed host ms per request and
  call counts (wall-clock wrappers around the calls, perf_counter).

    python3 benchmarks/host_time_h200.py --out OUT   # -> OUT/host_time.json, a table
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from hypic.bench.floor import WorkModel  # noqa: E402
from hypic.bench.ttft_mode import ModeBench  # noqa: E402
from hypic.runner import pic_runner  # noqa: E402
from hypic.engine.context import ForwardContext  # noqa: E402
from hypic.runner.pic_context import PicContext  # noqa: E402
from hypic.models.loader import build_dummy_model  # noqa: E402
from hypic.pic.segments import SegmentedPrompt  # noqa: E402

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hypic", "models", "configs",
                      "qwen3_5_35b_a3b.json")

totals = collections.defaultdict(float)
counts = collections.Counter()
_depth = collections.Counter()


def timed(name, fn, outermost_only=False):
    def wrapper(*args, **kwargs):
        if outermost_only and _depth[name]:
            return fn(*args, **kwargs)
        _depth[name] += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - t0
            counts[name] += 1
            _depth[name] -= 1
    return wrapper


def install(triton_too: bool):
    for name in ("short_conv", "linear_attention", "attention", "select_logits_rows"):
        setattr(PicContext, name, timed(name, getattr(PicContext, name)))
    ForwardContext.token_wise = timed("token_wise", ForwardContext.token_wise)
    torch.cuda.CUDAGraph.replay = timed("graph.replay", torch.cuda.CUDAGraph.replay)
    pic_runner.PicRunner.prefill = timed("prefill (enqueue)", pic_runner.PicRunner.prefill)
    if triton_too:
        from triton.runtime.jit import JITFunction

        from triton.runtime.autotuner import Autotuner

        JITFunction.run = timed("triton launch", JITFunction.run, outermost_only=True)
        Autotuner.run = timed("triton autotuner.run", Autotuner.run, outermost_only=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--prompts", default="8192,32768")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--layer-graphs", default="1,0",
                    help="HYPIC_LAYER_GRAPHS values to run, each in turn per prompt size (an A/B in one process)")
    ap.add_argument("--smoke", action="store_true", help="CPU, the embedded tiny config (checks the script)")
    args = ap.parse_args()
    device, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)
    config = CONFIG if not args.smoke else os.path.join(os.path.dirname(CONFIG), "..", "..", "assets", "tiny",
                                                        "config.json")
    seg_tokens = 32 if args.smoke else 512
    with open(config) as f:
        spec, model = build_dummy_model(json.load(f), dtype=dtype, device=device, seed=0)
    work = WorkModel(spec, model)
    install(triton_too=not args.smoke)
    rows = []
    for prompt_tokens, variant in [(int(p), v) for p in args.prompts.split(",") for v in args.layer_graphs.split(",")]:
        os.environ["HYPIC_LAYER_GRAPHS"] = variant
        n = prompt_tokens // 512
        rng = random.Random(prompt_tokens)
        segs = [tuple(rng.randrange(spec.vocab_size) for _ in range(seg_tokens)) for _ in range(n)]
        query = tuple(rng.randrange(spec.vocab_size) for _ in range(64))
        bench = ModeBench(model, spec, work, device, dtype, "hypic", "inline", 8, None, "host-time")
        bench.run(SegmentedPrompt(tuple(reversed(segs)), query))
        prompt = SegmentedPrompt(tuple(segs), query)
        bench.run(prompt)
        bench.run(prompt)
        per = collections.defaultdict(list)
        ttft = []
        for _ in range(args.repeats):
            totals.clear()
            counts.clear()
            s = bench.run(prompt)
            ttft.append(s.ttft_s * 1e3)
            for k, v in totals.items():
                per[k].append((v * 1e3, counts[k]))
        replays = bench.runner._replays
        row = {"prompt_tokens": prompt_tokens, "segments": n, "live_tokens": s.live_tokens,
               "layer_graphs": variant,
               "layer_replays": None if replays is None else {
                   "captures": replays.num_captures, "replays": replays.num_replays,
                   "failures": replays.failures()},
               "ttft_ms": ttft, "ttft_p50_ms": statistics.median(ttft),
               "host_ms": {k: statistics.median(x[0] for x in v) for k, v in per.items()},
               "calls": {k: v[-1][1] for k, v in per.items()}}
        rows.append(row)
        bench.close()
        print(f"\n== all-hit {prompt_tokens} ({n} x 512 + 64), HYPIC_LAYER_GRAPHS={variant}: "
              f"TTFT p50 {row['ttft_p50_ms']:.1f} ms; core graphs {row['layer_replays']} ==")
        print(f"{'host (no profiler)':28s} {'ms/request':>10s} {'calls':>7s} {'us/call':>8s}")
        for k, v in sorted(row["host_ms"].items(), key=lambda kv: -kv[1]):
            c = row["calls"][k]
            print(f"{k:28s} {v:10.2f} {c:7d} {1e3 * v / max(c, 1):8.1f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host_time.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
