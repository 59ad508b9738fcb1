"""Where a cold ``hypic`` request's time over ``full_recompute`` goes, kernel by kernel (issue 6).

Qwen3.5-35B-A3B shapes, dummy bf16 weights, one GPU. The cold 32k prompt of ``hypic bench ttft``
(64 fresh 512-token segments + a 64-token question) through ``full_recompute`` and ``hypic``
(inline cold policy: the request's own forward records every segment's entry), each in a fresh
store: two untimed requests (compiles, autotunes), ``--repeats`` timed ones (plan + prefill
between device syncs), then one under ``torch.profiler``. The two profiles are set side by side
by kernel name: GPU time in each, and the difference, largest first, so the summary-building
overhead is split into the kernels that make it (the write op's, the store-write copies, ...).
Also the GPU idle time (wall time of the profiled request minus its summed kernel time).

    cd benchmarks && python3 cold_diff_h200.py --out OUT [--prompt-tokens 32768]

Writes OUT/cold_diff.json (per mode: TTFT samples, per-kernel GPU ms; the diff rows) and prints
the table. ``--smoke``: CPU, the embedded tiny config, short prompts (checks the script runs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from hypic.bench.floor import WorkModel  # noqa: E402
from hypic.bench.ttft_mode import ModeBench  # noqa: E402
from hypic.models.loader import build_dummy_model  # noqa: E402
from hypic.pic.segments import SegmentedPrompt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "..", "hypic", "models", "configs", "qwen3_5_35b_a3b.json")
TINY = os.path.join(HERE, "..", "hypic", "assets", "tiny", "config.json")


def kernel_times(prof, device: str) -> dict:
    """GPU ms per kernel name (the device-side events: kernels, copies) of a finished profile; on
    the CPU (``--smoke``) host ms per op, its own time."""
    out = defaultdict(float)
    if device != "cuda":
        for avg in prof.key_averages():
            out[avg.key] += avg.self_cpu_time_total / 1e3
        return dict(out)
    for ev in prof.events():
        if str(getattr(ev, "device_type", "")).endswith("CUDA"):
            out[ev.name] += ev.device_time_total / 1e3
    return dict(out)


def profiled(bench, prompt, device):
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        bench.run(prompt)
        wall_ms = (time.perf_counter() - t0) * 1e3
    return kernel_times(prof, device), wall_ms


def cold_ab(model, spec, work, device, dtype, prompt, name: str, values, rounds: int) -> dict:
    """Cold TTFT of ``full_recompute`` and of ``hypic`` under each value of ``os.environ[name]``,
    one request each per round, interleaved (a first round not counted: it compiles what a value
    needs), each hypic value in a store of its own; medians and each value's overhead over
    full_recompute's median."""
    from _timing import env_vars

    benches = {"full_recompute": ModeBench(model, spec, work, device, dtype, "full_recompute", "inline", 8, None,
                                           "cold-ab-fr")}
    for v in values:
        benches[v] = ModeBench(model, spec, work, device, dtype, "hypic", "inline", 8, None, f"cold-ab-{v}")
    samples = {k: [] for k in benches}
    for r in range(rounds + 1):
        for k, bench in benches.items():
            if bench.store is not None:
                bench.store.clear()  # every request cold, and the stores from filling the device
            with env_vars(**({} if k == "full_recompute" else {name: k})):
                ms = bench.run(prompt()).ttft_s * 1e3
            if r:
                samples[k].append(ms)
    full = statistics.median(samples["full_recompute"])
    out = {"env": name, "rounds": rounds, "ttft_ms": samples,
           "ttft_p50_ms": {k: statistics.median(v) for k, v in samples.items()},
           "overhead_vs_full_recompute": {k: statistics.median(v) / full - 1 for k, v in samples.items()
                                          if k != "full_recompute"}}
    print(f"cold A/B of {name}: full_recompute {full:.2f} ms; " + ", ".join(
        f"{k} {out['ttft_p50_ms'][k]:.2f} ms ({out['overhead_vs_full_recompute'][k]:+.1%})" for k in values), flush=True)
    for bench in benches.values():
        bench.close()
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--prompt-tokens", type=int, default=32768)
    ap.add_argument("--segment-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--ab-env", default=None,
                    help="an environment switch to A/B on the cold hypic request in this process (e.g. HYPIC_ENTRY_WRITES)")
    ap.add_argument("--ab-values", default="side,after", help="its values")
    ap.add_argument("--ab-rounds", type=int, default=4)
    ap.add_argument("--no-profile", action="store_true", help="the A/B only (no per-kernel diff)")
    args = ap.parse_args()
    device, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)
    with open(TINY if args.smoke else CONFIG) as f:
        spec, model = build_dummy_model(json.load(f), dtype=dtype, device=device, seed=0)
    work = WorkModel(spec, model)
    seg = 32 if args.smoke else args.segment_tokens
    num_segments = max(1, (256 if args.smoke else args.prompt_tokens) // seg)
    rng = random.Random(0)

    def prompt():
        segs = tuple(tuple(rng.randrange(spec.vocab_size) for _ in range(seg)) for _ in range(num_segments))
        return SegmentedPrompt(segs, tuple(rng.randrange(spec.vocab_size) for _ in range(8 if args.smoke else 64)))

    res = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "prompt_tokens": args.prompt_tokens,
           "segment_tokens": seg, "num_segments": num_segments, "modes": {}}
    if args.ab_env:
        res["ab"] = cold_ab(model, spec, work, device, dtype, prompt, args.ab_env, args.ab_values.split(","),
                            args.ab_rounds)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "cold_diff.json"), "w") as f:
            json.dump(res, f, indent=1)
        if args.no_profile:
            return
    for mode in ("full_recompute", "hypic"):
        bench = ModeBench(model, spec, work, device, dtype, mode, "inline", 8, None, f"cold-diff-{mode}")
        for _ in range(2):
            bench.run(prompt())  # every prompt is fresh: a cold request each time
        ttft = [bench.run(prompt()).ttft_s * 1e3 for _ in range(args.repeats)]
        kernels, wall_ms = profiled(bench, prompt(), device)
        res["modes"][mode] = {"ttft_ms": ttft, "ttft_p50_ms": statistics.median(ttft), "profiled_wall_ms": wall_ms,
                              "kernel_ms": kernels, "kernel_total_ms": sum(kernels.values())}
        print(f"{mode}: ttft p50 {statistics.median(ttft):.2f} ms, profiled wall {wall_ms:.2f} ms, "
              f"kernels {sum(kernels.values()):.2f} ms", flush=True)
        bench.close()
        if device == "cuda":
            torch.cuda.empty_cache()
    a, b = res["modes"]["full_recompute"]["kernel_ms"], res["modes"]["hypic"]["kernel_ms"]
    rows = sorted(({"kernel": k, "full_recompute_ms": a.get(k, 0.0), "hypic_ms": b.get(k, 0.0),
                    "diff_ms": b.get(k, 0.0) - a.get(k, 0.0)} for k in set(a) | set(b)),
                  key=lambda r: -abs(r["diff_ms"]))
    res["diff"] = rows
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cold_diff.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"{'kernel':70s} {'full_rec':>9s} {'hypic':>9s} {'diff':>9s}")
    for r in rows[:args.rows]:
        print(f"{r['kernel'][:70]:70s} {r['full_recompute_ms']:9.3f} {r['hypic_ms']:9.3f} {r['diff_ms']:+9.3f}")
    total = res["modes"]["hypic"]["kernel_total_ms"] - res["modes"]["full_recompute"]["kernel_total_ms"]
    print(f"{'all kernels':70s} {res['modes']['full_recompute']['kernel_total_ms']:9.3f} "
          f"{res['modes']['hypic']['kernel_total_ms']:9.3f} {total:+9.3f}")


if __name__ == "__main__":
    main()
