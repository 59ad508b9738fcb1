"""Host (Python and dispatch) cost of the PIC paths, on the CPU, with the 40-layer layout of
Qwen3.5-35B-A3B at tiny widths: the tensor math is then negligible and what remains is the per-op
and per-object work that the GPU path pays on its host thread too.

Measures, for a prompt of 64 segments x 16 tokens + an 8-token query:

* ``write_ms``: recording the 64 cold segments' store entries (``PicRunner._write_entries``,
  store inserts included) after a cold ``hypic`` prefill;
* ``cold_ms`` / ``all_hit_ms``: the whole cold and all-hit ``hypic`` requests (plan + prefill);
* ``plan_512_ms``: planning an all-hit request of 64 segments x 512 tokens + a 64-token query (the
  TTFT benchmark's 32k shape; keys, store lookups, spans), after one cold request cached them:
  host time spent before any kernel of the request runs.

Run once per version of the package (``PYTHONPATH`` picks it) and compare:

    PYTHONPATH=. python3 benchmarks/pic_host_cost_cpu.py --tag new --json OUT.json

Medians over ``--repeats`` fresh stores; one torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch

import hypic
from hypic.bench.floor import WorkModel
from hypic.bench.ttft_mode import ModeBench
from hypic.runner import pic_runner
from hypic.models.loader import build_dummy_model
from hypic.pic.segments import SegmentedPrompt

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hypic", "models", "configs",
                      "qwen3_5_35b_a3b.json")
NARROW = dict(vocab_size=512, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
              num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)


def timed(owner, name: str, into: list) -> None:
    """Replace ``owner.name`` by a wrapper appending each call's wall seconds to ``into``."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - start)

    setattr(owner, name, wrapper)


def narrow_model():
    """The 40-layer Qwen3.5-35B-A3B layout at tiny widths, fp32 on the CPU, one torch thread."""
    torch.set_num_threads(1)
    with open(CONFIG) as f:
        config = json.load(f)
    config["text_config"].update(NARROW)
    return build_dummy_model(config, dtype=torch.float32, device="cpu", seed=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--plan-repeats", type=int, default=20)
    args = ap.parse_args()
    spec, model = narrow_model()
    work = WorkModel(spec, model)

    write_s = []
    timed(pic_runner.PicRunner, "_write_entries", write_s)
    cold, all_hit, writes = [], [], []
    for rep in range(args.repeats):
        rng = random.Random(rep)
        segs = [tuple(rng.randrange(spec.vocab_size) for _ in range(16)) for _ in range(64)]
        query = tuple(rng.randrange(spec.vocab_size) for _ in range(8))
        bench = ModeBench(model, spec, work, "cpu", torch.float32, "hypic", "inline", 8, None, "host")
        write_s.clear()
        cold.append(bench.run(SegmentedPrompt(tuple(reversed(segs)), query)).ttft_s)
        writes.append(sum(write_s))
        all_hit.append(bench.run(SegmentedPrompt(tuple(segs), query)).ttft_s)
        bench.close()
    plans = plan_times(model, spec, work, args.plan_repeats)
    row = {"tag": args.tag, "package": os.path.dirname(hypic.__file__), "segments": 64, "layers": spec.num_layers,
           "write_ms": statistics.median(writes) * 1e3, "cold_ms": statistics.median(cold) * 1e3,
           "all_hit_ms": statistics.median(all_hit) * 1e3, "plan_512_ms": statistics.median(plans) * 1e3,
           "all": {"write_ms": [x * 1e3 for x in writes], "cold_ms": [x * 1e3 for x in cold],
                   "all_hit_ms": [x * 1e3 for x in all_hit], "plan_512_ms": [x * 1e3 for x in plans]}}
    print(f"{args.tag:6s} write {row['write_ms']:8.1f} ms  cold {row['cold_ms']:8.1f} ms  all-hit {row['all_hit_ms']:8.1f} ms"
          f"  plan (64 x 512) {row['plan_512_ms']:6.2f} ms")
    with open(args.json, "w") as f:
        json.dump(row, f, indent=1)


def plan_times(model, spec, work, repeats: int):
    """Seconds to plan each of ``repeats`` all-hit requests of 64 x 512 tokens (fresh tuples each
    time, as a new request brings), after one cold request of the same segments."""
    rng = random.Random(1)
    segs = [tuple(rng.randrange(spec.vocab_size) for _ in range(512)) for _ in range(64)]
    query = tuple(rng.randrange(spec.vocab_size) for _ in range(64))
    bench = ModeBench(model, spec, work, "cpu", torch.float32, "hypic", "inline", 8, None, "plan")
    bench.run(SegmentedPrompt(tuple(reversed(segs)), query))
    out = []
    for _ in range(repeats):
        prompt = SegmentedPrompt(tuple(tuple(list(s)) for s in segs), query)
        start = time.perf_counter()
        plan = bench.plan(prompt)
        out.append(time.perf_counter() - start)
        with plan:
            assert plan.cached_tokens > 0
    bench.close()
    return out


if __name__ == "__main__":
    main()
