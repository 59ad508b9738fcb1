"""Runtime smoke and timing on one GPU: Qwen3.5-35B-A3B shapes with dummy weights.

1. load (dummy weights, bf16, built on the GPU) and its time;
2. plain prefill of a 32k-token prompt (issue 3): time, tokens/s, FLOP-based MFU;
3. PIC smoke (issue 4): a 16-segment prompt (16 x 512 + 64-token query) through every mode after
   the segments were cached in another order; TTFT and live tokens per mode.

    python3 benchmarks/runtime_h200.py --out OUT_DIR [--tokens 32768] [--segments 16]

Writes OUT_DIR/runtime_h200.json and prints a table. Each part records its error and carries on.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _timing import sync, timed  # noqa: E402  (benchmarks/, the script's folder)
from hypic.bench.flops import flop_model  # noqa: E402
from hypic.engine.context import PlainContext, SequenceCache  # noqa: E402
from hypic.runner.pic_runner import PicRunner  # noqa: E402
from hypic.models.loader import build_dummy_model  # noqa: E402
from hypic.pic.keys import Keyer, KeyNamespace  # noqa: E402
from hypic.pic.modes import PICConfig  # noqa: E402
from hypic.pic.plan import plan_request  # noqa: E402
from hypic.pic.segments import SegmentedPrompt  # noqa: E402
from hypic.pic.store import SegmentStore  # noqa: E402

PEAK_BF16_FLOPS = 790e12
CONFIG = os.path.join(os.path.dirname(__file__), "..", "hypic", "models", "configs", "qwen3_5_35b_a3b.json")


def log(*a):
    print(*a, flush=True)


def plain_prefill(spec, model, ids, split_at=None):
    """Plain prefill; ``split_at`` runs it as two spans with carried state (same maths, other
    kernel shapes), which measures the bf16 noise floor the PIC modes are compared against."""
    cache = SequenceCache.allocate(spec, "cuda", torch.bfloat16)
    bounds = [0, len(ids)] if split_at is None else [0, split_at, len(ids)]
    with torch.inference_mode():
        for a, b in zip(bounds[:-1], bounds[1:]):
            ctx = PlainContext(spec, [cache], [b - a])
            out = model(torch.tensor(ids[a:b], device="cuda"), ctx.positions, ctx)
    return out


def logprob_diff(a, b):
    d = (torch.log_softmax(a.float(), -1) - torch.log_softmax(b.float(), -1)).abs()
    return float(d.max()), float(d.mean())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--segments", type=int, default=16)
    ap.add_argument("--segment-tokens", type=int, default=512)
    args = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "errors": {}}
    with open(CONFIG) as f:
        config = json.load(f)
    t0 = time.perf_counter()
    spec, model = build_dummy_model(config, dtype=torch.bfloat16, device="cuda", seed=0)
    sync()
    res["load_s"] = time.perf_counter() - t0
    res["params_b"] = sum(p.numel() for p in model.parameters()) / 1e9
    res["gpu_mem_after_load_gib"] = torch.cuda.memory_allocated() / 2**30
    log(f"loaded {res['params_b']:.2f} B params in {res['load_s']:.1f} s")
    fm = flop_model(spec)
    vocab = spec.vocab_size
    rng = random.Random(0)

    # ---- plain prefill ----
    try:
        plain_prefill(spec, model, [rng.randrange(vocab) for _ in range(2048)])  # warm-up / compile
        runs = []
        for n in (8192, args.tokens):
            ids = [rng.randrange(vocab) for _ in range(n)]
            torch.cuda.reset_peak_memory_stats()
            times = []
            for _ in range(2):
                _, dt = timed(lambda: plain_prefill(spec, model, ids))
                times.append(dt)
            best = min(times)
            flops = fm.causal_prefill(n)
            runs.append({"tokens": n, "prefill_s": best, "all_s": times, "tokens_per_s": n / best,
                         "tflop": flops / 1e12, "mfu": flops / best / PEAK_BF16_FLOPS,
                         "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30})
            log(f"prefill {n}: {best * 1e3:.0f} ms  {n / best:.0f} tok/s  MFU {flops / best / PEAK_BF16_FLOPS:.1%}")
        res["plain_prefill"] = runs
    except Exception:
        res["errors"]["plain_prefill"] = traceback.format_exc()
        log(res["errors"]["plain_prefill"])

    # ---- PIC smoke ----
    try:
        segs = [[rng.randrange(vocab) for _ in range(args.segment_tokens)] for _ in range(args.segments)]
        query = [rng.randrange(vocab) for _ in range(64)]
        order = list(range(len(segs)))
        rng.shuffle(order)
        ids = [t for s in segs for t in s] + query
        ref = plain_prefill(spec, model, ids)[-1]
        split = plain_prefill(spec, model, ids, split_at=len(ids) // 2 + 7)[-1]
        floor_max, floor_mean = logprob_diff(split, ref)
        res["bf16_noise_floor_plain_split"] = {"logprob_max_abs_diff": floor_max, "logprob_mean_abs_diff": floor_mean}
        log(f"bf16 noise floor (plain prefill split in two spans vs one): max {floor_max:.3f} mean {floor_mean:.4f}")
        smoke = []
        for mode in ("full_recompute", "prefix_cache", "addition", "transition", "transition_rope", "hypic"):
            for cold in (("inline", "standalone") if mode == "hypic" else ("inline",)):
                store = SegmentStore(None, 0, device="cuda")
                keyer = Keyer(KeyNamespace("qwen3_5_35b_a3b-dummy", "bfloat16"))
                runner = PicRunner(model, spec, store, torch.device("cuda"), torch.bfloat16)
                cfg = PICConfig(mode=mode, cold_policy=cold)

                def run(segments, q):
                    plan = plan_request(SegmentedPrompt(tuple(map(tuple, segments)), tuple(q)), cfg.resolve(),
                                        store=store, keyer=keyer)
                    with plan:
                        (r,), dt = timed(lambda: runner.prefill([plan]))
                    return plan, r, dt

                _, _, cold_s = run(segs, query)  # cold: fills the store
                if mode == "prefix_cache":
                    warm = segs  # prefix cache only helps in the same order
                else:
                    warm = [segs[i] for i in order]
                run(warm, query)
                plan, r, dt = run(segs, query)
                ref = plain_prefill(spec, model, [t for s in segs for t in s] + query)[-1].float()
                err, err_mean = logprob_diff(r.logits, ref)
                row = {"mode": mode, "cold_policy": cold, "cold_s": cold_s, "ttft_s": dt,
                       "live_tokens": plan.live_tokens, "cached_tokens": plan.cached_tokens,
                       "prefix_hit_tokens": plan.prefix_hit_tokens, "logprob_max_abs_diff_vs_full": err,
                       "logprob_mean_abs_diff_vs_full": err_mean,
                       "store_bytes": store.stats().device_bytes, "store_entries": len(store)}
                smoke.append(row)
                log(f"{mode:16s} {cold:10s} cold {cold_s * 1e3:7.0f} ms  ttft {dt * 1e3:7.1f} ms  live {plan.live_tokens:5d}"
                    f"  cached {plan.cached_tokens:5d}  prefix {plan.prefix_hit_tokens:5d}  dlogp {err:.3f}")
                del store, runner
                torch.cuda.empty_cache()
        res["pic_smoke"] = smoke
    except Exception:
        res["errors"]["pic_smoke"] = traceback.format_exc()
        log(res["errors"]["pic_smoke"])

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "runtime_h200.json"), "w") as f:
        json.dump(res, f, indent=1)
    log(json.dumps({k: v for k, v in res.items() if k != "errors"}, indent=1)[:3000])


if __name__ == "__main__":
    main()
