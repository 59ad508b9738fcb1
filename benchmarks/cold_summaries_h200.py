"""Cold PIC prefill on one GPU: what the written bodies' linear summaries cost (issue 6's summary
cost), the ``hypic`` mode's scan path (every live span's zero-start summary, a chain scan for each
span's incoming state, then a varlen state pass per span) beside ``full_recompute`` (each request
as one fla run, no summaries), for 64 segments of 512 and of 500 tokens plus a 64-token question.
Qwen3.5-35B-A3B shapes, dummy bf16 weights, a fresh store per request.

Until session 10 it also timed a ``states`` variant (``HYPIC_COLD_SUMMARIES=states``: each request
as one fla run, each body's summary composed from the run's chunk states) and compared its written
summaries with the scan path's. It was removed after the session-10 measurement
(benchmarks/results/session10/call1/cold_summaries.json): at 64 x 512-token segments it took
781.7 ms against 767.9 ms for ``scan`` and 685.1 ms for ``full_recompute``, and its written
summaries differed from the scan path's by 0.51 (T) and 0.78 (S) relative on the GPU.

    python3 benchmarks/cold_summaries_h200.py --out OUT   # -> OUT/cold_summaries.json, a table
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from hypic.bench.floor import WorkModel  # noqa: E402
from hypic.bench.ttft_mode import ModeBench  # noqa: E402
from hypic.models.loader import build_dummy_model  # noqa: E402
from hypic.pic.segments import SegmentedPrompt  # noqa: E402

CONFIG = os.path.join(os.path.dirname(__file__), "..", "hypic", "models", "configs", "qwen3_5_35b_a3b.json")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--segment-tokens", default="512,500")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="CPU, the embedded tiny config, short segments")
    args = ap.parse_args()
    device, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)
    config = CONFIG if not args.smoke else os.path.join(os.path.dirname(CONFIG), "..", "..", "assets", "tiny",
                                                        "config.json")
    with open(config) as f:
        spec, model = build_dummy_model(json.load(f), dtype=dtype, device=device, seed=0)
    work = WorkModel(spec, model)
    rows = []
    for seg in [int(x) for x in args.segment_tokens.split(",")]:
        seg = seg // 16 if args.smoke else seg
        rng = random.Random(seg)
        segs = [tuple(rng.randrange(spec.vocab_size) for _ in range(seg)) for _ in range(64)]
        prompt = SegmentedPrompt(tuple(segs), tuple(rng.randrange(spec.vocab_size) for _ in range(64)))
        row = {"segment_tokens": seg, "segments": 64, "prompt_tokens": 64 * seg + 64}
        for variant, mode in (("full_recompute", "full_recompute"), ("scan", "hypic")):
            times = []
            for i in range(args.repeats + 1):  # the first compiles what the shape needs
                if device == "cuda":
                    torch.cuda.empty_cache()
                bench = ModeBench(model, spec, work, device, dtype, mode, "inline", 8, None, f"cold-{variant}")
                sample = bench.run(prompt)
                bench.close()
                if i:
                    times.append((sample.ttft_s - sample.plan_s) * 1e3)
            row[f"{variant}_ms"] = statistics.median(times)
            row[f"{variant}_all_ms"] = times
        row["scan_overhead_pct"] = 100.0 * (row["scan_ms"] / row["full_recompute_ms"] - 1.0)
        rows.append(row)
        print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cold_summaries.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "rows": rows}, f, indent=1)
    print(f"{'segment':>8} {'prompt':>7} {'full ms':>9} {'scan ms':>9} {'scan +%':>8}")
    for r in rows:
        print(f"{r['segment_tokens']:>8} {r['prompt_tokens']:>7} {r['full_recompute_ms']:>9.1f} {r['scan_ms']:>9.1f} "
              f"{r['scan_overhead_pct']:>8.1f}")


if __name__ == "__main__":
    main()
