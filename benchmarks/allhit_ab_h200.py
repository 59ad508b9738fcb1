"""All-hit TTFT of ``hypic`` (w = 8) on one GPU, for an A/B of two versions of the package.

Qwen3.5-35B-A3B shapes, dummy bf16 weights; per prompt size: cache every segment in another
order (one cold request), then time ``--repeats`` all-hit requests (plan + prefill between device
syncs, hypic.bench.ttft_mode.ModeBench); the host-device syncs of one request
(``torch.cuda.set_sync_debug_mode``) and a profile table of another. Run it once per version with
``PYTHONPATH`` pointing at each package:

    PYTHONPATH=OLD python3 benchmarks/allhit_ab_h200.py --tag old --out OUT
    PYTHONPATH=.   python3 benchmarks/allhit_ab_h200.py --tag new --out OUT

Writes OUT/allhit_ab_TAG.json and OUT/allhit_ab_TAG_profile.txt. ``--smoke``: CPU, tiny config.

``--ab-env NAME --ab-values A,B``: an A/B of a switch read at every call (e.g.
``HYPIC_CHAIN_FUSE_SEAMS``) in this one process: after the timed requests, ``--repeats`` rounds
of one request per value, interleaved, so that drift between processes and machines (~4 ms of
TTFT between H200 hosts) does not enter the comparison. Its medians are ``ab`` in the row.

``--timeline``: per request of ``--repeats`` more, without a profiler (CUPTI slows launches), the
host clock and a CUDA event at the request's start, after planning, after the layout build and
around every decoder layer; the medians say, per layer, when the host queued it and when the GPU
ran it, so where the GPU waited for the host (``gpu_wait_ms``: its idle time between the
previous layer's end and this layer's start) and how far ahead the host was.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import warnings

import torch

import hypic
from hypic.bench.floor import WorkModel
from hypic.bench.ttft_mode import ModeBench
from hypic.models.loader import build_dummy_model
from hypic.pic.segments import SegmentedPrompt

from _gaps import gaps_text, gpu_gaps  # benchmarks/, the script's folder
from _timing import CaptureSets, env_vars

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hypic", "models", "configs",
                      "qwen3_5_35b_a3b.json")


def op_census(fn, top: int = 70) -> str:
    """Run ``fn`` under a dispatch mode that counts every non-view aten op (on GPU each is one or
    more kernel launches) by the innermost hypic source line on the Python stack. Triton and fla
    kernels launch outside the dispatcher and are not counted."""
    import collections
    import sys

    from torch.utils._python_dispatch import TorchDispatchMode

    root = os.path.dirname(os.path.dirname(os.path.abspath(hypic.__file__)))
    by_line, by_op = collections.Counter(), collections.Counter()

    class Census(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                frame = sys._getframe(1)
                while frame is not None and "/hypic/" not in frame.f_code.co_filename:
                    frame = frame.f_back
                where = "?" if frame is None else f"{os.path.relpath(frame.f_code.co_filename, root)}:{frame.f_lineno}"
                by_line[where] += 1
                by_op[func.name()] += 1
            return func(*args, **(kwargs or {}))

    with Census():
        fn()
    lines = [f"{sum(by_line.values())} non-view aten ops"]
    lines += [f"{n:6d}  {where}" for where, n in by_line.most_common(top)]
    lines += ["", "by op:"] + [f"{n:6d}  {op}" for op, n in by_op.most_common(30)]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tag", required=True)
    ap.add_argument("--prompts", default="32768,8192", help="prompt token counts, 512-token segments")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--no-profile", action="store_true", help="timings only (no sync check, profiles)")
    ap.add_argument("--timeline", action="store_true",
                    help="per-layer host and GPU clocks of --repeats more requests (no profiler)")
    ap.add_argument("--ab-env", default=None, help="an environment switch to A/B in this process")
    ap.add_argument("--ab-values", default="1,0", help="its values, one request each per round")
    ap.add_argument("--ab-fixed", default="",
                    help="NAME=VALUE[,NAME=VALUE]: also set during the A/B rounds (e.g. HYPIC_KEPT_LAYOUTS=0, "
                         "so that no value replays core graphs captured under another)")
    ap.add_argument("--fresh-graphs-profile", action="store_true",
                    help="also profile the Python functions of one request whose layout's core graphs are not "
                         "kept (HYPIC_KEPT_LAYOUTS=0: its first layers run eagerly, then are captured, as for "
                         "every request of a new shape), by cumulative time")
    ap.add_argument("--ab-settings", default=None,
                    help="instead of --ab-env: settings separated by ';', each of space-separated NAME=VALUE "
                         "switches (rag_ab_h200.py's form), interleaved as --ab-env's values")
    ap.add_argument("--ab-capture", action="store_true",
                    help="--ab-env is read when CUDA graphs are captured (HYPIC_GRAPH_GLUE): each value gets its own "
                         "row-wise and core graphs, captured under it (_timing.CaptureSets)")
    ap.add_argument("--trace", action="store_true",
                    help="also write the profiled request's Chrome trace (gzipped) to --out")
    ap.add_argument("--census", action="store_true",
                    help="also count the non-view aten ops of one request by the hypic line that issued them")
    args = ap.parse_args()
    device, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)
    config_path = CONFIG if not args.smoke else os.path.join(os.path.dirname(CONFIG), "..", "..", "assets", "tiny", "config.json")
    with open(config_path) as f:
        spec, model = build_dummy_model(json.load(f), dtype=dtype, device=device, seed=0)
    work = WorkModel(spec, model)
    seg_tokens = 32 if args.smoke else 512
    res = {"tag": args.tag, "package": os.path.dirname(hypic.__file__),
           "compile_glue_env": os.environ.get("HYPIC_COMPILE_GLUE"), "device": device, "rows": []}
    texts = []

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    # An A/B of environment switches (HYPIC_MOE_IMPL, ...) takes one process per value: the
    # row-wise CUDA graphs are shared per device and captured once, with the first value.
    for prompt_tokens in [int(x) for x in args.prompts.split(",")]:
        n = prompt_tokens // 512
        rng = random.Random(prompt_tokens)
        segs = [tuple(rng.randrange(spec.vocab_size) for _ in range(seg_tokens)) for _ in range(n)]
        query = tuple(rng.randrange(spec.vocab_size) for _ in range(64 if not args.smoke else 8))
        bench = ModeBench(model, spec, work, device, dtype, "hypic", "inline", 8, None, f"ab-{args.tag}")
        bench.run(SegmentedPrompt(tuple(reversed(segs)), query))  # cold: caches every segment
        prompt = SegmentedPrompt(tuple(segs), query)
        first = bench.run(prompt)  # first all-hit (compiles what this shape needs): reported apart
        samples = [bench.run(prompt) for _ in range(args.repeats)]
        ttft = [s.ttft_s * 1e3 for s in samples]
        row = {"prompt_tokens": prompt_tokens, "moe_impl": os.environ.get("HYPIC_MOE_IMPL"), "segments": n,
               "live_tokens": samples[-1].live_tokens, "first_allhit_ms": first.ttft_s * 1e3,
               "ttft_ms": ttft, "ttft_p50_ms": statistics.median(ttft),
               "plan_p50_ms": statistics.median(s.plan_s * 1e3 for s in samples)}
        if args.ab_env or args.ab_settings:
            from rag_ab_h200 import parse_settings

            fixed = dict(kv.split("=", 1) for kv in args.ab_fixed.split(",") if kv)
            row["ab_fixed"] = fixed
            settings = parse_settings(args.ab_env, args.ab_values, args.ab_settings)
            row["ab_settings"] = settings
            with env_vars(**fixed):
                row["ab"] = interleaved_ab(bench, prompt, settings, args.repeats,
                                           CaptureSets(bench.runner) if args.ab_capture else None)
            print(f"{args.ab_env or 'setting'}: " + ", ".join(f"{v} {r['ttft_p50_ms']:.2f} ms"
                                                            for v, r in row["ab"].items()), flush=True)
        if args.timeline:
            row["timeline"] = timeline(bench, prompt, model, args.repeats)
            texts.append(f"== {args.tag}: all-hit {prompt_tokens}, timeline ==\n" + timeline_text(row["timeline"]))
            print(texts[-1], flush=True)
        if device == "cuda" and not args.no_profile:
            sync()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    bench.run(prompt)
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            where = {}
            for w in caught:
                key = f"{os.path.relpath(w.filename)}:{w.lineno}"
                where[key] = where.get(key, 0) + 1
            row["syncs"] = {"count": len(caught), "where": where}
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                bench.run(prompt)
                sync()
            row["kernels"] = kernel_rows(prof)
            if args.trace:  # every launch with its grid and time: read apart (per-launch costs, gaps)
                import gzip
                import tempfile

                os.makedirs(args.out, exist_ok=True)
                with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
                    prof.export_chrome_trace(tmp.name)
                    with open(tmp.name, "rb") as src, gzip.open(
                            os.path.join(args.out, f"allhit_trace_{args.tag}_{prompt_tokens}.json.gz"), "wb") as dst:
                        dst.write(src.read())
            texts.append(f"== {args.tag}: all-hit {prompt_tokens} ({n} x 512 + 64) ==\n"
                         + prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=60))
            texts.append(f"== {args.tag}: all-hit {prompt_tokens}, by host time ==\n"
                         + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
            # GPU idle gaps, with the hypic line running at each (a second traced run, with stacks)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
                bench.run(prompt)
                sync()
            row["gaps"] = gpu_gaps(prof)
            texts.append(f"== {args.tag}: all-hit {prompt_tokens}, GPU idle gaps ==\n" + gaps_text(row["gaps"]))
            # Where the host time goes at the Python level (the request is host-bound).
            texts.append(f"== {args.tag}: all-hit {prompt_tokens}, Python functions by own time ==\n"
                         + python_profile(bench, prompt, sync, "tottime", 45))
        if args.fresh_graphs_profile:
            texts.append(f"== {args.tag}: all-hit {prompt_tokens}, graphs not kept, Python by cumulative time ==\n"
                         + fresh_graphs_profile(bench, prompt, sync))
            print(texts[-1][:6000], flush=True)
        if args.census:
            texts.append(f"== {args.tag}: all-hit {prompt_tokens}, aten ops by issuing hypic line ==\n"
                         + op_census(lambda: (bench.run(prompt), sync())))
        bench.close()
        res["rows"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "ttft_ms"}), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"allhit_ab_{args.tag}.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(args.out, f"allhit_ab_{args.tag}_profile.txt"), "w") as f:
        f.write("\n\n".join(texts))


def kernel_rows(prof) -> list:
    """Every event of a profile with GPU time of its own (kernels, copies), by that time: name,
    calls and total milliseconds, so the whole request's GPU time can be split (the printed table
    keeps only the top rows)."""
    rows = []
    for e in prof.key_averages():
        own_us = getattr(e, "self_device_time_total", None)
        if own_us is None:
            own_us = e.self_cuda_time_total
        if own_us > 0:
            rows.append({"name": e.key, "calls": e.count, "ms": own_us / 1e3})
    return sorted(rows, key=lambda r: -r["ms"])


def python_profile(bench, prompt, sync, sort: str, top: int) -> str:
    """cProfile of one request, its ``top`` functions by ``sort``."""
    import cProfile
    import io
    import pstats

    py_prof = cProfile.Profile()
    py_prof.enable()
    bench.run(prompt)
    sync()
    py_prof.disable()
    buf = io.StringIO()
    pstats.Stats(py_prof, stream=buf).sort_stats(sort).print_stats(top)
    return buf.getvalue()


def fresh_graphs_profile(bench, prompt, sync, top: int = 70) -> str:
    """cProfile of one request under ``HYPIC_KEPT_LAYOUTS=0`` (after one untimed such request):
    what a request of a layout whose core graphs are not kept spends host time on."""
    with env_vars(HYPIC_KEPT_LAYOUTS="0"):
        bench.run(prompt)
        sync()
        return python_profile(bench, prompt, sync, "cumulative", top)


def interleaved_ab(bench, prompt, settings, repeats: int, captures=None) -> dict:
    """TTFT of ``prompt`` under each of ``settings`` (``{label: {NAME: VALUE}}``) in turn,
    ``repeats`` rounds of one request per setting (a first round not counted: it compiles what a
    setting needs); the variables are restored afterwards. ``captures`` (a
    :class:`_timing.CaptureSets`): each setting runs on graphs of its own, captured under it."""
    samples = {v: [] for v in settings}
    for r in range(repeats + 1):
        for v, setting in settings.items():
            with env_vars(**setting), (captures.use(v) if captures else contextlib.nullcontext()):
                ttft = bench.run(prompt).ttft_s * 1e3
            if r:
                samples[v].append(ttft)
    return {v: {"ttft_ms": t, "ttft_p50_ms": statistics.median(t)} for v, t in samples.items()}


def timeline(bench, prompt, model, repeats: int) -> dict:
    """Medians over ``repeats`` requests of the host clock and GPU event times (ms from the
    request's start) at each mark: ``plan``, ``layout`` (host only), ``L<i>`` / ``L<i>end``
    around decoder layer i, ``return`` (the prefill call returned). GPU times come from events
    recorded at those points, relative to one recorded when the request starts on an idle GPU."""
    import time

    from hypic.runner import pic_runner

    marks = []  # (name, host seconds, event or None)

    on_gpu = bench.device.type == "cuda"

    def mark(name, event=True):
        ev = None
        if event and on_gpu:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        marks.append((name, time.perf_counter(), ev))

    layers = model.model.layers
    hooks = []
    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_pre_hook(lambda m, a, i=i: mark(f"L{i}")))
        hooks.append(layer.register_forward_hook(lambda m, a, o, i=i: mark(f"L{i}end")))
    real_build, real_prefill, real_plan = pic_runner.build_layout, bench.runner.prefill, bench.plan

    def build_layout(*a, **k):
        out = real_build(*a, **k)
        mark("layout", event=False)
        return out

    def plan(*a, **k):
        out = real_plan(*a, **k)
        mark("plan", event=False)
        return out

    def prefill(*a, **k):
        out = real_prefill(*a, **k)
        mark("return")
        return out

    pic_runner.build_layout, bench.runner.prefill, bench.plan = build_layout, prefill, plan
    runs = []
    try:
        for _ in range(repeats):
            marks.clear()
            if on_gpu:
                torch.cuda.synchronize()
            mark("start")
            sample = bench.run(prompt)
            t0, e0 = marks[0][1], marks[0][2]
            runs.append({"ttft_ms": sample.ttft_s * 1e3,
                         **{name: ((t - t0) * 1e3, None if ev is None else e0.elapsed_time(ev))
                            for name, t, ev in marks}})
    finally:
        del bench.runner.prefill, bench.plan  # the instance attributes: the class methods again
        pic_runner.build_layout = real_build
        for h in hooks:
            h.remove()
    replays = bench.runner._replays  # the last forward's core graphs (None: ran eagerly)
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    names = [name for name, _, _ in marks]
    out = {"ttft_ms": med([r["ttft_ms"] for r in runs]), "marks": [],
           "core_graphs": None if replays is None else {
               "captures": replays.num_captures, "replays": replays.num_replays, "failures": replays.failures()}}
    prev_end = 0.0
    for name in names:
        host = med([r[name][0] for r in runs])
        gpu = med([r[name][1] for r in runs if r[name][1] is not None])
        item = {"mark": name, "host_ms": host, "gpu_ms": gpu}
        if gpu is not None and name.startswith("L") and not name.endswith("end"):
            item["gpu_wait_ms"] = max(0.0, gpu - prev_end)
        if gpu is not None and name.endswith("end"):
            prev_end = gpu
        out["marks"].append(item)
    waits = [m.get("gpu_wait_ms", 0.0) for m in out["marks"]]
    out["gpu_wait_total_ms"] = sum(waits)
    out["gpu_first_layer_ms"] = next((m["gpu_ms"] for m in out["marks"] if m["mark"] == "L0"), None)
    return out


def timeline_text(tl: dict) -> str:
    lines = [f"ttft p50 {tl['ttft_ms']:.2f} ms; GPU idle before layer 0 {tl['gpu_first_layer_ms']} ms, "
             f"waiting between layers {tl['gpu_wait_total_ms']:.2f} ms; core graphs {tl['core_graphs']}",
             f"{'mark':>8} {'host ms':>8} {'gpu ms':>8} {'gpu-host':>8} {'gpu wait':>8}"]
    for m in tl["marks"]:
        gpu = "" if m["gpu_ms"] is None else f"{m['gpu_ms']:8.2f} {m['gpu_ms'] - m['host_ms']:8.2f}"
        wait = f" {m['gpu_wait_ms']:8.2f}" if "gpu_wait_ms" in m else ""
        lines.append(f"{m['mark']:>8} {m['host_ms']:8.2f} {gpu:>17}{wait}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
