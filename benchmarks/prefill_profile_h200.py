"""Where the prefill time goes on one GPU: Qwen3.5-35B-A3B shapes, dummy bf16 weights (issue 6).

1. plain prefill of 8k and 32k tokens under each (MoE, attention) implementation pair
   (``HYPIC_MOE_IMPL`` / ``HYPIC_ATTENTION_IMPL``), time and MFU by hypic.bench.flops;
2. PIC on a 32k prompt (64 x 512-token segments + 64-token query): cold ``full_recompute``,
   cold ``hypic`` inline and standalone, and the all-hit ``hypic`` w=8 request after the segments
   were cached in another order;
3. a torch.profiler table (CUDA time per op, top rows) of the fastest plain 32k prefill and of the
   all-hit request.

    python3 benchmarks/prefill_profile_h200.py --out OUT_DIR

Writes OUT_DIR/prefill_profile_h200.json and OUT_DIR/prefill_profile_h200.txt (the profiles).
Every part records its error and carries on, and the JSON is rewritten after each part.
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

import _timing  # noqa: E402  (benchmarks/, the script's folder)
from hypic.bench.flops import flop_model  # noqa: E402
from hypic.engine.context import PlainContext, SequenceCache  # noqa: E402
from hypic.bench.floor import WorkModel  # noqa: E402
from hypic.bench.ttft_mode import ModeBench  # noqa: E402
from hypic.models.loader import build_dummy_model  # noqa: E402
from hypic.pic.segments import SegmentedPrompt  # noqa: E402

PEAK_BF16_FLOPS = 790e12
CONFIG = os.path.join(os.path.dirname(__file__), "..", "hypic", "models", "configs", "qwen3_5_35b_a3b.json")
# "moe+attention" or "moe+attention+glue" (the last: HYPIC_COMPILE_GLUE=1, hypic.ops.fused).
IMPL_PAIRS = tuple(tuple(p.split("+")) for p in os.environ.get("PROFILE_IMPL_PAIRS", "grouped+flash,grouped+flex,reference+reference").split(","))
for _pair in IMPL_PAIRS:
    if len(_pair) not in (2, 3) or (len(_pair) == 3 and _pair[2] != "glue"):
        raise ValueError(f"PROFILE_IMPL_PAIRS: entries are moe+attention[+glue], got {'+'.join(_pair)!r}")


def log(*a):
    print(*a, flush=True)


DEV = "cuda"
DTYPE = torch.bfloat16


def sync():
    _timing.sync(DEV)


def timed(fn):
    return _timing.timed(fn, DEV)


def plain_prefill(spec, model, ids):
    cache = SequenceCache.allocate(spec, DEV, DTYPE)
    with torch.inference_mode():
        ctx = PlainContext(spec, [cache], [len(ids)])
        return model(torch.tensor(ids, device=DEV), ctx.positions, ctx)


def profile_table(fn, rows=30, host_rows=0):
    """Ops by GPU time; with ``host_rows``, also the ops with the most host (self CPU) time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    averages = prof.key_averages()
    text = averages.table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=60)
    if host_rows:
        text += "\n-- by host time --\n" + averages.table(sort_by="self_cpu_time_total", row_limit=host_rows,
                                                       max_name_column_width=60)
    return text


# PROFILE_COLD=1 adds a profile table and a host-sync census of every cold PIC run.
PROFILE_COLD = os.environ.get("PROFILE_COLD", "0") == "1"
# PROFILE_PIC=mode:policy,... picks the PIC runs (default: full_recompute, hypic inline, standalone).
PIC_RUNS = tuple(tuple(x.split(":")) for x in os.environ.get(
    "PROFILE_PIC", "full_recompute:inline,hypic:inline,hypic:standalone").split(","))


def sync_census(fn):
    """Host-device synchronisations during ``fn`` (``torch.cuda.set_sync_debug_mode("warn")``):
    their count and the Python lines (outside torch) that triggered them."""
    import warnings

    if DEV != "cuda":
        return None
    sync()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    sync()
    where = {}
    for w in caught:
        key = f"{os.path.relpath(w.filename)}:{w.lineno}"
        where[key] = where.get(key, 0) + 1
    return {"count": len(caught), "where": dict(sorted(where.items(), key=lambda kv: -kv[1])[:20])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--max-seconds", type=float, default=480.0)
    ap.add_argument("--smoke", action="store_true", help="CPU, fp32, the embedded tiny config, short prompts")
    args = ap.parse_args()
    global DEV, DTYPE
    scale = 1
    if args.smoke:
        DEV, DTYPE, scale = "cpu", torch.float32, 64
    t_start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    res = {"device": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu", "torch": torch.__version__, "errors": {}}
    texts = []

    def save():
        with open(os.path.join(args.out, "prefill_profile_h200.json"), "w") as f:
            json.dump(res, f, indent=1)
        with open(os.path.join(args.out, "prefill_profile_h200.txt"), "w") as f:
            f.write("\n\n".join(texts))

    def left():
        return args.max_seconds - (time.perf_counter() - t_start)

    config_path = CONFIG if not args.smoke else os.path.join(os.path.dirname(CONFIG), "..", "..", "assets", "tiny", "config.json")
    with open(config_path) as f:
        config = json.load(f)
    spec, model = build_dummy_model(config, dtype=DTYPE, device=DEV, seed=0)
    sync()
    fm = flop_model(spec)
    work = WorkModel(spec, model)
    rng = random.Random(0)
    vocab = spec.vocab_size
    n32, seg = 32768 // scale, 512 // scale
    ids32 = [rng.randrange(vocab) for _ in range(n32)]

    # ---- 1. plain prefill per implementation pair ----
    runs = []
    reference_logits = None
    for moe, attn, *flags in IMPL_PAIRS:
        if left() < 120:
            break
        os.environ["HYPIC_MOE_IMPL"], os.environ["HYPIC_ATTENTION_IMPL"] = moe, attn
        os.environ["HYPIC_COMPILE_GLUE"] = "1" if "glue" in flags else "0"
        try:
            logits_2k, first = timed(lambda: plain_prefill(spec, model, ids32[:2048 // scale]))
            # every pair against the first one on the same 2k prompt: a wrong fast path shows here
            if reference_logits is None:
                reference_logits = logits_2k.float()
            rel_vs_first = float((logits_2k.float() - reference_logits).norm() / reference_logits.norm())
            for n in (8192 // scale, n32):
                if DEV == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                times = [timed(lambda: plain_prefill(spec, model, ids32[:n]))[1] for _ in range(2)]
                best = min(times)
                flops = fm.causal_prefill(n)
                row = {"moe": moe, "attention": attn, "compile_glue": "glue" in flags, "tokens": n, "prefill_s": best, "all_s": times,
                       "first_2k_s": first, "logits_2k_rel_vs_first_pair": rel_vs_first, "tokens_per_s": n / best, "tflop": flops / 1e12,
                       "mfu": flops / best / PEAK_BF16_FLOPS,
                       "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if DEV == "cuda" else None}
                runs.append(row)
                log(f"{moe:9s} {attn:9s} {'+'.join(flags):5s} {n:6d}: {best * 1e3:8.1f} ms  {n / best:8.0f} tok/s  MFU {row['mfu']:.1%}")
        except Exception:
            name = "_".join(["plain", moe, attn, *flags])
            res["errors"][name] = traceback.format_exc()
            log(res["errors"][name])
        res["plain_prefill"] = runs
        save()
    ok = [r for r in runs if r["tokens"] == n32]
    best_pair = (min(ok, key=lambda r: r["prefill_s"]) if ok
                 else {"moe": "grouped", "attention": "flex", "compile_glue": False})
    os.environ["HYPIC_MOE_IMPL"], os.environ["HYPIC_ATTENTION_IMPL"] = best_pair["moe"], best_pair["attention"]
    os.environ["HYPIC_COMPILE_GLUE"] = "1" if best_pair["compile_glue"] else "0"
    res["best_pair"] = [best_pair["moe"], best_pair["attention"]] + (["glue"] if best_pair["compile_glue"] else [])
    try:
        texts.append(f"== plain prefill 32k, moe={best_pair['moe']} attention={best_pair['attention']} "
                     f"compile_glue={best_pair['compile_glue']} ==\n"
                     + profile_table(lambda: plain_prefill(spec, model, ids32)))
    except Exception:
        res["errors"]["profile_plain"] = traceback.format_exc()
    save()

    # ---- 2. PIC on 64 x 512 + 64 ----
    segs = [tuple(ids32[i * seg:(i + 1) * seg]) for i in range(64)]
    query = tuple(rng.randrange(vocab) for _ in range(64))
    order = list(range(64))
    rng.shuffle(order)
    pic = []
    for mode, cold in PIC_RUNS:
        if left() < 60:
            break
        try:
            # hypic.bench.ttft_mode.ModeBench: one store + keyer + runner per (mode, cold policy),
            # timing plan + prefill between syncs; prefill time = ttft_s - plan_s.
            def fresh():
                if DEV == "cuda":
                    torch.cuda.empty_cache()
                return ModeBench(model, spec, work, DEV, DTYPE, mode, cold, 8, None, "profile")

            def prefill_s(sample):
                return sample.ttft_s - sample.plan_s

            prompt = SegmentedPrompt(tuple(segs), query)
            cold_times, bench = [], None
            for _ in range(2):
                if bench is not None:
                    bench.close()
                bench = fresh()  # an empty store: every segment is cold
                cold_times.append(prefill_s(bench.run(prompt)))
            row = {"mode": mode, "cold_policy": cold, "cold_s": cold_times, "cold_tflop": fm.causal_prefill(n32 + 64) / 1e12}
            if PROFILE_COLD and left() > 120:
                bench.close()
                bench = fresh()
                texts.append(f"== cold {mode} ({cold}), 64 x 512 + 64 ==\n"
                             + profile_table(lambda: bench.run(prompt), rows=40, host_rows=25))
                bench.close()
                bench = fresh()
                row["sync_cold"] = sync_census(lambda: bench.run(prompt))
            if mode == "hypic":
                reordered = SegmentedPrompt(tuple(segs[i] for i in order), query)
                bench.run(reordered)  # cached in another order
                samples = [bench.run(prompt) for _ in range(6)]
                row.update({"all_hit_s": [prefill_s(x) for x in samples[:5]],
                            "all_hit_live_tokens": samples[-1].live_tokens,
                            "all_hit_cached_tokens": samples[-1].reused_tokens,
                            "store_bytes": bench.store.stats().device_bytes})
                if cold == "inline":
                    texts.append("== all-hit hypic w=8, 64 x 512 + 64 ==\n" + profile_table(lambda: bench.run(prompt), rows=40))
                    row["sync_all_hit"] = sync_census(lambda: bench.run(prompt))
            pic.append(row)
            log(json.dumps(row))
            bench.close()
            if DEV == "cuda":
                torch.cuda.empty_cache()
        except Exception:
            res["errors"][f"pic_{mode}_{cold}"] = traceback.format_exc()
            log(res["errors"][f"pic_{mode}_{cold}"])
        res["pic_32k"] = pic
        save()
    res["elapsed_s"] = time.perf_counter() - t_start
    save()
    log("\n\n".join(texts)[:12000])


if __name__ == "__main__":
    main()
