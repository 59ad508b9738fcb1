"""Host time of an all-hit request before its first decoder layer starts, on the CPU with the
40-layer layout of Qwen3.5-35B-A3B at tiny widths (``pic_host_cost_cpu.narrow_model``): on the
GPU that time is idle (session 21 call 2b's timeline: ~2.9 ms at the 32k shape), so it adds to TTFT
one for one. Marks (medians over ``--repeats`` requests, ``allhit_ab_h200.timeline``): planning
done, ``build_layout`` done, layer 0's pre-hook; and the medians of the pieces inside, each wrapped
on its own: ``_request_layout``, ``build_layout``, ``IndexBuffer.finish``, ``fill_ranges``.

Prompt: 64 segments x 512 tokens + a 64-token query (the TTFT benchmark's 32k shape), after one
cold request cached the segments; one torch thread. ``--shuffle``: every measured request the
segments in a new order with a new query, as the TTFT benchmark's all-hit case sends them
(``hypic/bench/ttft.py``, ``case_all_hit``), instead of one prompt again and again.

    cd benchmarks && PYTHONPATH=.. python3 pre_layer0_host_cpu.py --json OUT.json
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import statistics
import time

import torch

from allhit_ab_h200 import timeline
from hypic.bench.floor import WorkModel
from hypic.bench.ttft_mode import ModeBench
from hypic.runner import index_buffer, pic_runner
from hypic.pic.segments import SegmentedPrompt
from pic_host_cost_cpu import narrow_model

PIECES = ((pic_runner.PicRunner, "_request_layout"), (pic_runner, "build_layout"),
          (index_buffer.IndexBuffer, "finish"), (index_buffer, "fill_ranges"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--shuffle", action="store_true", help="a new segment order and query per request")
    ap.add_argument("--fresh-tuples", action="store_true",
                    help="with --shuffle: every prompt's segments as new tuples (as a server tokenising each "
                         "request passes them) instead of the same tuple objects again")
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec, model = narrow_model()
    rng = random.Random(0)
    segs = [tuple(rng.randrange(spec.vocab_size) for _ in range(512)) for _ in range(64)]
    query = tuple(rng.randrange(spec.vocab_size) for _ in range(64))
    bench = ModeBench(model, spec, WorkModel(spec, model), "cpu", torch.float32, "hypic", "inline", 8, None, "pre-l0")
    bench.run(SegmentedPrompt(tuple(reversed(segs)), query))  # cold: caches every segment
    prompt = SegmentedPrompt(tuple(segs), query)
    for _ in range(2):
        bench.run(prompt)
    if args.shuffle:
        # every prompt made before the measurements (not on any clock), handed out by run()
        # new int objects too (parsed, as from a request), so no comparison finds them identical
        fresh = (lambda seg: tuple(int(str(t)) for t in seg)) if args.fresh_tuples else (lambda seg: seg)  # noqa: E731
        prompts = iter([SegmentedPrompt(tuple(map(fresh, rng.sample(segs, len(segs)))),
                                        tuple(rng.randrange(spec.vocab_size) for _ in query))
                        for _ in range(2 * args.repeats)])
        real_run = bench.run
        bench.run = lambda _prompt: real_run(next(prompts))
    marks = {m["mark"]: m["host_ms"] for m in timeline(bench, prompt, model, args.repeats)["marks"]}
    spent = collections.defaultdict(list)
    originals = []
    for owner, name in PIECES:
        real = getattr(owner, name)
        originals.append((owner, name, real))

        def wrapped(*a, _real=real, _name=name, **k):
            start = time.perf_counter()
            try:
                return _real(*a, **k)
            finally:
                spent[_name].append(time.perf_counter() - start)

        setattr(owner, name, wrapped)
    try:
        for _ in range(args.repeats):
            bench.run(prompt)
    finally:
        for owner, name, real in originals:
            setattr(owner, name, real)
    row = {"shuffle": args.shuffle, "fresh_tuples": args.fresh_tuples, "host_ms_at": {k: marks[k] for k in ("plan", "layout", "L0")},
           "pieces_ms": {name: statistics.median(v) * 1e3 for name, v in spent.items()}}
    print(json.dumps(row, indent=1))
    with open(args.json, "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
