"""Cold PIC prefill on one GPU, the two ways the linear layers can get the written bodies'
summaries (issue 6's summary cost), by ``HYPIC_COLD_SUMMARIES``:

* ``scan`` (the default): every live span's zero-start summary, a chain scan for each span's
  incoming state, then a varlen state pass per span;
* ``states``: each request as one fla run (full_recompute's forward), each body's summary
  composed from the run's chunk states, a T-only summary kernel and the body's partial first
  chunk (:mod:`hypic.ops.linear.span_summaries`),

beside ``full_recompute`` (no summaries), for 64 segments of 512 tokens (every body ends on a
chunk boundary: ``states`` applies) and of 500 tokens (bodies end inside chunks: ``states``
falls back to ``scan``, so the two rows should match), plus a 64-token question. Qwen3.5-35B-A3B
shapes, dummy bf16 weights, a fresh store per request. Also the largest difference between the
two paths' written summaries (the first segment's, every linear layer).

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
from hypic.engine import pic_runner  # noqa: E402
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
    # the written entries of the last request of each variant (to compare the two paths' summaries)
    captured = {}
    real_write = pic_runner.PicRunner._write_entries

    def keep(self, ctx, insert=True):
        captured["entries"] = real_write(self, ctx, insert)
        return captured["entries"]

    pic_runner.PicRunner._write_entries = keep
    rows = []
    for seg in [int(x) for x in args.segment_tokens.split(",")]:
        seg = seg // 16 if args.smoke else seg
        rng = random.Random(seg)
        segs = [tuple(rng.randrange(spec.vocab_size) for _ in range(seg)) for _ in range(64)]
        prompt = SegmentedPrompt(tuple(segs), tuple(rng.randrange(spec.vocab_size) for _ in range(64)))
        row = {"segment_tokens": seg, "segments": 64, "prompt_tokens": 64 * seg + 64}
        first_entry = {}
        for variant, mode in (("full_recompute", "full_recompute"), ("states", "hypic"), ("scan", "hypic")):
            os.environ["HYPIC_COLD_SUMMARIES"] = "scan" if variant == "full_recompute" else variant
            times = []
            for i in range(args.repeats + 1):  # the first compiles what the shape needs
                if device == "cuda":
                    torch.cuda.empty_cache()
                bench = ModeBench(model, spec, work, device, dtype, mode, "inline", 8, None, f"cold-{variant}")
                sample = bench.run(prompt)
                if i == args.repeats and captured.get("entries"):
                    entry = captured.pop("entries")[0]
                    first_entry[variant] = {layer: (c.summary.transition.float().cpu(), c.summary.state.float().cpu())
                                            for layer, c in entry.linear.items()}
                captured.clear()
                bench.close()
                if i:
                    times.append((sample.ttft_s - sample.plan_s) * 1e3)
            row[f"{variant}_ms"] = statistics.median(times)
            row[f"{variant}_all_ms"] = times
        os.environ.pop("HYPIC_COLD_SUMMARIES", None)
        if len(first_entry) == 2:
            rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
            a, b = first_entry["states"], first_entry["scan"]
            row["entry_t_rel_max"] = max(rel(a[l][0], b[l][0]) for l in a)
            row["entry_s_rel_max"] = max(rel(a[l][1], b[l][1]) for l in a)
        for variant in ("states", "scan"):
            row[f"{variant}_overhead_pct"] = 100.0 * (row[f"{variant}_ms"] / row["full_recompute_ms"] - 1.0)
        rows.append(row)
        print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cold_summaries.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "rows": rows}, f, indent=1)
    print(f"{'segment':>8} {'prompt':>7} {'full ms':>9} {'states ms':>10} {'states +%':>10} {'scan ms':>9} "
          f"{'scan +%':>8} {'T rel':>8} {'S rel':>8}")
    for r in rows:
        print(f"{r['segment_tokens']:>8} {r['prompt_tokens']:>7} {r['full_recompute_ms']:>9.1f} {r['states_ms']:>10.1f} "
              f"{r['states_overhead_pct']:>10.1f} {r['scan_ms']:>9.1f} {r['scan_overhead_pct']:>8.1f} "
              f"{r.get('entry_t_rel_max', float('nan')):>8.1e} {r.get('entry_s_rel_max', float('nan')):>8.1e}")


if __name__ == "__main__":
    main()
