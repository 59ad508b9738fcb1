"""Host time of the pieces of an all-hit ``hypic`` request that run the same Python on every
device, on the CPU with the 40-layer layout of Qwen3.5-35B-A3B at tiny widths (as
``pic_host_cost_cpu.py``): planning, building the packed layout, the conv initial tails of each
linear layer (median per layer, and their sum per forward), and the decode caches built after the
forward. The tensor maths of the forward is not what is timed here (on the CPU it is the
reference kernels').

Prompt: 64 segments x 512 tokens + a 64-token query (the TTFT benchmark's 32k shape), after one
cold request cached the segments. Run once per version of the package and compare:

    PYTHONPATH=. python3 benchmarks/pic_host_phases_cpu.py --tag new --json OUT.json

Medians over ``--repeats`` all-hit requests; one torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics

import torch

import hypic
from hypic.bench.floor import WorkModel
from hypic.bench.ttft_mode import ModeBench
from hypic.runner import pic_context, pic_runner
from hypic.pic.segments import SegmentedPrompt
from pic_host_cost_cpu import narrow_model, timed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    spec, model = narrow_model()
    layout_s, tails_s, caches_s = [], [], []
    timed(pic_runner, "build_layout", layout_s)
    timed(pic_runner.PicRunner, "_decode_caches", caches_s)
    timed(pic_context.PicContext, "_run_initial_conv_states", tails_s)
    rng = random.Random(0)
    segs = [tuple(rng.randrange(spec.vocab_size) for _ in range(512)) for _ in range(64)]
    query = tuple(rng.randrange(spec.vocab_size) for _ in range(64))
    bench = ModeBench(model, spec, WorkModel(spec, model), "cpu", torch.float32, "hypic", "inline", 8, None, "phases")
    bench.run(SegmentedPrompt(tuple(reversed(segs)), query))
    plans, layouts, tails, tails_sum, caches = [], [], [], [], []
    for _ in range(args.repeats):
        for t in (layout_s, tails_s, caches_s):
            t.clear()
        sample = bench.run(SegmentedPrompt(tuple(segs), query))
        plans.append(sample.plan_s)
        layouts.append(sum(layout_s))
        tails.append(statistics.median(tails_s))
        tails_sum.append(sum(tails_s))  # a forward's layers: the first may do them all
        caches.append(sum(caches_s))
    bench.close()
    ms = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
    row = {"tag": args.tag, "package": os.path.dirname(hypic.__file__), "segments": 64, "segment_tokens": 512,
           "linear_layers": len(spec.linear_layer_ids), "plan_ms": ms(plans), "build_layout_ms": ms(layouts),
           "conv_tails_per_layer_ms": ms(tails), "conv_tails_per_forward_ms": ms(tails_sum),
           "decode_caches_ms": ms(caches),
           "all": {"plan_ms": [x * 1e3 for x in plans], "build_layout_ms": [x * 1e3 for x in layouts],
                   "conv_tails_per_layer_ms": [x * 1e3 for x in tails],
                   "conv_tails_per_forward_ms": [x * 1e3 for x in tails_sum],
                   "decode_caches_ms": [x * 1e3 for x in caches]}}
    print(f"{args.tag:6s} plan {row['plan_ms']:6.2f} ms  layout {row['build_layout_ms']:6.2f} ms  "
          f"conv tails {row['conv_tails_per_layer_ms']:6.3f} ms/layer {row['conv_tails_per_forward_ms']:6.2f} ms/forward  decode caches {row['decode_caches_ms']:6.2f} ms")
    with open(args.json, "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
