"""``hypic bench profile``: where one request's time goes, in one PIC mode.

    hypic bench profile --dummy-config hypic/models/configs/qwen3_5_35b_a3b.json --load-format dummy \\
        --device cuda --dtype bfloat16 --mode hypic --case all_hit --prompt-tokens 32768 \\
        --segment-tokens 512 --store-bytes 36GiB --json profile.json --trace trace.json.gz

The request is built as ``hypic bench ttft`` builds it (``all_hit``: a pool of segments cached
beforehand, then another order of it and a fresh question; ``cold``: fresh segments), through the
same store + keyer + runner (:class:`hypic.bench.ttft_mode.ModeBench`), after two untimed warm-up
requests of the same shape. Then:

* a host-phase timeline over ``--repeats`` requests, without a profiler (the profiler slows
  launches): host clock and (CUDA) event times from the request's start at ``plan`` (planning
  done), ``L<i>`` / ``L<i>end`` (decoder layer i entered / left, from forward hooks) and
  ``return`` (the prefill returned); medians. ``gpu_idle_before_layer0_ms`` is where layer 0
  starts on the GPU, ``gpu_wait_total_ms`` the GPU's idle time between layers (host-bound);
* one request under ``torch.profiler``: every op or kernel with time of its own (device time on
  CUDA, CPU time on the CPU) by that time (``kernels``), the printed table (``--top`` rows) and,
  with ``--trace``, the Chrome trace (``.json`` or ``.json.gz``).
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import shutil
import tempfile
import time
from typing import Dict, List

import torch

from hypic.bench.common import (add_model_arguments, device_name, load_bench_model, median, provenance, synchronize,
                                write_report)
from hypic.bench.floor import WorkModel
from hypic.bench.ttft_mode import ModeBench
from hypic.bench.ttft_report import parse_bytes
from hypic.pic.modes import COLD_POLICIES, MODES, get_mode
from hypic.pic.segments import SegmentedPrompt

CASES = ("all_hit", "cold")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--mode", default="hypic", help=f"PIC mode: {', '.join(MODES)}")
    p.add_argument("--cold-policy", default="inline", choices=list(COLD_POLICIES))
    p.add_argument("--case", default="all_hit", choices=CASES)
    p.add_argument("--seam", default="8", help="hypic seam: int tokens or a fraction in (0, 1]")
    p.add_argument("--prompt-tokens", type=int, default=32768)
    p.add_argument("--segment-tokens", type=int, default=512)
    p.add_argument("--query-tokens", type=int, default=64)
    p.add_argument("--store-bytes", default="none", help="device budget of the store, e.g. 36GiB")
    p.add_argument("--repeats", type=int, default=6, help="requests of the timeline")
    p.add_argument("--top", type=int, default=60, help="rows of the profiler table")
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--trace", default=None, help="write the profiled request's Chrome trace here (.json[.gz])")


class _Prompts:
    """Requests of one shape: ``next()`` gives the next one of the case."""

    def __init__(self, case: str, vocab_size: int, prompt_tokens: int, segment_tokens: int, query_tokens: int,
                 seed: int):
        if prompt_tokens < segment_tokens:
            raise ValueError(f"prompt_tokens {prompt_tokens} < segment_tokens {segment_tokens}")
        self.case, self.vocab = case, vocab_size
        self.num_segments, self.segment_tokens, self.query_tokens = prompt_tokens // segment_tokens, segment_tokens, \
            query_tokens
        self.rng = random.Random(f"profile-{case}-{seed}")
        self.pool = [self._tokens(segment_tokens) for _ in range(self.num_segments)]

    def _tokens(self, n: int):
        return tuple(self.rng.randint(1, self.vocab - 1) for _ in range(n))

    def next(self) -> SegmentedPrompt:
        if self.case == "cold":
            segments = [self._tokens(self.segment_tokens) for _ in range(self.num_segments)]
        else:
            segments = list(self.pool)
            self.rng.shuffle(segments)
        return SegmentedPrompt(tuple(segments), self._tokens(self.query_tokens))


def timeline(bench: ModeBench, prompts: _Prompts, layers, repeats: int) -> Dict:
    """Medians of the host clock and GPU event times at each mark (see the module docstring)."""
    on_gpu = bench.device.type == "cuda"
    marks: List = []  # (name, host seconds, event or None)

    def mark(name: str, event: bool = True) -> None:
        ev = None
        if event and on_gpu:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        marks.append((name, time.perf_counter(), ev))

    hooks = []
    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_pre_hook(lambda m, a, i=i: mark(f"L{i}")))
        hooks.append(layer.register_forward_hook(lambda m, a, o, i=i: mark(f"L{i}end")))
    real_plan, real_prefill = bench.plan, bench.runner.prefill

    def plan(*a, **k):
        out = real_plan(*a, **k)
        mark("plan", event=False)
        return out

    def prefill(*a, **k):
        out = real_prefill(*a, **k)
        mark("return")
        return out

    bench.plan, bench.runner.prefill = plan, prefill  # instance attributes over the methods
    runs = []
    try:
        for _ in range(repeats):
            prompt = prompts.next()
            marks.clear()
            synchronize(bench.device)
            mark("start")
            sample = bench.run(prompt)
            t0, e0 = marks[0][1], marks[0][2]
            runs.append({"ttft_ms": sample.ttft_s * 1e3,
                         "marks": {name: ((t - t0) * 1e3, None if ev is None else e0.elapsed_time(ev))
                                   for name, t, ev in marks}})
    finally:
        del bench.plan, bench.runner.prefill
        for h in hooks:
            h.remove()
    names = list(runs[-1]["marks"])
    out: Dict = {"ttft_ms": median([r["ttft_ms"] for r in runs]), "marks": []}
    prev_end = 0.0
    for name in names:
        host = median([r["marks"][name][0] for r in runs if name in r["marks"]])
        gpu = median([r["marks"][name][1] for r in runs if name in r["marks"] and r["marks"][name][1] is not None])
        item = {"mark": name, "host_ms": host, "gpu_ms": gpu}
        if gpu is not None and name.startswith("L") and not name.endswith("end"):
            item["gpu_wait_ms"] = max(0.0, gpu - prev_end)
        if gpu is not None and name.endswith("end"):
            prev_end = gpu
        out["marks"].append(item)
    out["gpu_wait_total_ms"] = sum(m.get("gpu_wait_ms", 0.0) for m in out["marks"])
    out["gpu_idle_before_layer0_ms"] = next((m["gpu_ms"] for m in out["marks"] if m["mark"] == "L0"), None)
    out["host_before_layer0_ms"] = next((m["host_ms"] for m in out["marks"] if m["mark"] == "L0"), None)
    return out


def timeline_text(tl: Dict) -> str:
    def ms(v):
        return "-" if v is None else f"{v:.2f}"

    lines = [f"ttft p50 {tl['ttft_ms']:.2f} ms; host reaches layer 0 at {ms(tl['host_before_layer0_ms'])} ms, GPU at "
             f"{ms(tl['gpu_idle_before_layer0_ms'])} ms; GPU waiting between layers {tl['gpu_wait_total_ms']:.2f} ms",
             f"{'mark':>8} {'host ms':>9} {'gpu ms':>9} {'gpu wait':>9}"]
    for m in tl["marks"]:
        gpu = "" if m["gpu_ms"] is None else f"{m['gpu_ms']:9.2f}"
        wait = f" {m['gpu_wait_ms']:9.2f}" if "gpu_wait_ms" in m else ""
        lines.append(f"{m['mark']:>8} {m['host_ms']:9.2f} {gpu:>9}{wait}")
    return "\n".join(lines)


def _kernel_rows(prof, on_gpu: bool) -> List[Dict]:
    """Every event with time of its own (device time on CUDA: kernels and copies), by that time."""
    rows = []
    for e in prof.key_averages():
        own_us = e.self_device_time_total if on_gpu else e.self_cpu_time_total
        if own_us > 0:
            rows.append({"name": e.key, "calls": e.count, "ms": own_us / 1e3})
    return sorted(rows, key=lambda r: -r["ms"])


def _export_trace(prof, path: str) -> None:
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    if not path.endswith(".gz"):
        prof.export_chrome_trace(path)
        return
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)


def run(args: argparse.Namespace) -> int:
    get_mode(args.mode)  # unknown -> ValueError, before loading a model
    if args.repeats < 1:
        raise ValueError(f"--repeats: expected >= 1, got {args.repeats}")
    seam = float(args.seam) if "." in args.seam else int(args.seam)
    spec, model, name, device, dtype = load_bench_model(args)
    prompts = _Prompts(args.case, spec.vocab_size, args.prompt_tokens, args.segment_tokens, args.query_tokens,
                       args.seed)
    bench = ModeBench(model, spec, WorkModel(spec, model), device, dtype, args.mode, args.cold_policy, seam,
                      parse_bytes(args.store_bytes), name)
    on_gpu = device.type == "cuda"
    try:
        with torch.no_grad():
            for _ in range(2):  # caches the pool (all_hit); first-call costs at this shape
                bench.run(prompts.next())
            tl = timeline(bench, prompts, model.model.layers, args.repeats)
            print(timeline_text(tl), flush=True)
            activities = [torch.profiler.ProfilerActivity.CPU]
            if on_gpu:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            prompt = prompts.next()
            with torch.profiler.profile(activities=activities) as prof:
                sample = bench.run(prompt)
                synchronize(device)
    finally:
        bench.close()
    sort_by = "self_cuda_time_total" if on_gpu else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=args.top)
    print(table, flush=True)
    kernels = _kernel_rows(prof, on_gpu)
    report = {"device": device_name(device), "model": name, "dtype": str(dtype).replace("torch.", ""),
              **provenance(args),
              "mode": args.mode, "cold_policy": args.cold_policy, "case": args.case, "seam": seam,
              "prompt_tokens": prompts.num_segments * args.segment_tokens + args.query_tokens,
              "segment_tokens": args.segment_tokens, "live_tokens": sample.live_tokens,
              "profiled_ttft_ms": sample.ttft_s * 1e3, "timeline": tl,
              "own_time_total_ms": sum(r["ms"] for r in kernels), "kernels": kernels, "table": table}
    if args.trace:
        _export_trace(prof, args.trace)
        print(f"wrote {args.trace}")
    if args.json:
        write_report(args.json, report)
        print(f"wrote {args.json}")
    return 0


HELP = "profile one request in a PIC mode: host-phase timeline, profiler table and trace"
