"""``hypic bench op-count``: tensor ops one all-hit request issues, by the package area that issued
them, for several numbers of cached segments.

    hypic bench op-count --model tiny --device cpu --segments 4,12 --json op_count.json

Per-segment work must be batched: the ops that engine, runner, graphs and model code issue for an
all-hit request over 12 cached segments must equal those over 4 (the test
``tests/runner/test_pic_runner.py::test_engine_issues_no_tensor_op_per_cached_segment`` holds the
engine and model code to it). The ``ops`` kernels are counted apart: their CPU references loop over
chain steps by design (the GPU paths batch them). Every aten op is attributed to the innermost
frame under ``hypic/``; the areas are its first folder (``engine``, ``runner``, ``models``,
``ops``, ...). Each request: the segments cached first by a request in another order, then the
counted all-hit request of a fresh question.
"""

from __future__ import annotations

import argparse
import random
import traceback
from collections import Counter
from typing import Dict, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hypic.bench.common import add_model_arguments, device_name, load_bench_model, provenance, write_report
from hypic.bench.floor import WorkModel
from hypic.bench.ttft_mode import ModeBench
from hypic.pic.modes import MODES, get_mode
from hypic.pic.segments import SegmentedPrompt


class AreaCounter(TorchDispatchMode):
    """Counts aten ops by the package area of their innermost ``hypic/`` frame."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        frames = [f.filename.replace("\\", "/") for f in traceback.extract_stack()]
        inside = [f for f in frames if "/hypic/" in f and "/hypic/bench/" not in f]
        if inside:
            self.counts[inside[-1].split("/hypic/")[-1].split("/")[0]] += 1
        return func(*args, **(kwargs or {}))


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--mode", default="hypic", help=f"PIC mode: {', '.join(MODES)}")
    p.add_argument("--segments", default="4,12", help="comma-separated numbers of cached segments")
    p.add_argument("--segment-tokens", type=int, default=40)
    p.add_argument("--query-tokens", type=int, default=5)
    p.add_argument("--json", default=None, help="write the counts here")


def count_ops(bench: ModeBench, vocab_size: int, num_segments: int, segment_tokens: int, query_tokens: int,
              seed: int) -> Dict[str, int]:
    rng = random.Random(f"op-count-{seed}-{num_segments}")

    def tokens(n: int):
        return tuple(rng.randint(1, vocab_size - 1) for _ in range(n))

    segments = [tokens(segment_tokens) for _ in range(num_segments)]
    bench.run(SegmentedPrompt(tuple(reversed(segments)), tokens(query_tokens)))  # caches every segment
    counter = AreaCounter()
    with counter:
        bench.run(SegmentedPrompt(tuple(segments), tokens(query_tokens)))
    return dict(sorted(counter.counts.items()))


def run(args: argparse.Namespace) -> int:
    get_mode(args.mode)
    sizes = [int(x) for x in args.segments.split(",") if x.strip()]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--segments: expected positive integers, got {args.segments!r}")
    spec, model, name, device, dtype = load_bench_model(args)
    work = WorkModel(spec, model)
    rows: List[Dict] = []
    with torch.no_grad():
        for n in sizes:
            bench = ModeBench(model, spec, work, device, dtype, args.mode, "inline", 8, None, name)
            try:
                counts = count_ops(bench, spec.vocab_size, n, args.segment_tokens, args.query_tokens, args.seed)
            finally:
                bench.close()
            outside_ops = sum(v for k, v in counts.items() if k != "ops")
            rows.append({"cached_segments": n, "ops_by_area": counts, "ops_outside_kernels": outside_ops,
                         "total": sum(counts.values())})
            print(f"{n:3d} cached segments: {outside_ops} ops outside ops/ ({counts})", flush=True)
    per_segment_flat = len({r["ops_outside_kernels"] for r in rows}) == 1
    report = {"device": device_name(device), "model": name, "mode": args.mode, **provenance(args),
              "segment_tokens": args.segment_tokens, "rows": rows, "flat_in_segments": per_segment_flat}
    if args.json:
        write_report(args.json, report)
        print(f"wrote {args.json}")
    return 0


HELP = "tensor ops of one all-hit request by package area, for several numbers of cached segments"
