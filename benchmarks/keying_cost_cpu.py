#!/usr/bin/env python3
"""Host time to key one PIC prompt's segments (hypic.pic.plan.segment_keys): what a request paid
twice before the engine kept its keys for the plan (session 6).

    PYTHONPATH=. python3 benchmarks/keying_cost_cpu.py --json benchmarks/results/session6/cpu/keying_cost_cpu.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from hypic.pic.keys import Keyer, KeyNamespace
from hypic.pic.modes import PICConfig
from hypic.pic.plan import segment_keys
from hypic.pic.segments import SegmentedPrompt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--segments", type=int, default=64)
    ap.add_argument("--segment-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = random.Random(0)
    prompt = SegmentedPrompt(
        segments=tuple(tuple(rng.randrange(248_000) for _ in range(args.segment_tokens)) for _ in range(args.segments)),
        query=tuple(rng.randrange(248_000) for _ in range(64)))
    keyer = Keyer(KeyNamespace("qwen3_5_35b_a3b", "bfloat16"))
    policy = PICConfig().resolve(mode="hypic", seam=8, cold_policy="inline")
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        segment_keys(prompt, policy, keyer)
        times.append((time.perf_counter() - t0) * 1e3)
    row = {"segments": args.segments, "segment_tokens": args.segment_tokens, "keying_ms_p50": statistics.median(times),
           "keying_ms_min": min(times), "keying_ms_max": max(times)}
    print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
