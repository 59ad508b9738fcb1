"""What the ``hypic bench`` subcommands share: the model options, loading a model for a benchmark,
timing between device synchronisations, and the provenance every JSON report carries."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

from hypic.engine.engine import resolve_device, resolve_dtype
from hypic.models.loader import build_dummy_model, load_model

# The full-size model the GPU numbers are measured at (dummy bf16 weights of its shapes).
QWEN3_5_35B_A3B_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                      "models", "configs", "qwen3_5_35b_a3b.json")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """``--model``, ``--dummy-config``, ``--load-format``, ``--device``, ``--dtype``, ``--seed``."""
    p.add_argument("--model", default="tiny", help="checkpoint folder or 'tiny'")
    p.add_argument("--dummy-config", default=None,
                   help="config.json of a model to build with seeded dummy weights (full-size shapes, no download)")
    p.add_argument("--load-format", default="safetensors", choices=["safetensors", "dummy"])
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)


def load_bench_model(args: argparse.Namespace):
    """``(spec, model, name, device, dtype)`` from --model / --dummy-config / --load-format."""
    from hypic.assets import resolve_model_path

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if args.dummy_config is not None:
        if args.load_format != "dummy":
            raise ValueError("--dummy-config builds dummy weights: pass --load-format dummy with it")
        if not os.path.isfile(args.dummy_config):
            raise ValueError(f"--dummy-config: no such file {args.dummy_config!r}")
        with open(args.dummy_config, encoding="utf-8") as f:
            config = json.load(f)
        spec, model = build_dummy_model(config, dtype=dtype, device=device, seed=args.seed)
        name = os.path.splitext(os.path.basename(args.dummy_config))[0] + "-dummy"
    else:
        folder = str(resolve_model_path(args.model))
        spec, model = load_model(folder, dtype=dtype, device=device, load_format=args.load_format, seed=args.seed)
        name = args.model + ("-dummy" if args.load_format == "dummy" else "")
    return spec, model, name, device, dtype


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def time_calls_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> Tuple[float, List[float]]:
    """``(first call ms, [ms of each of repeats more calls])``. On CUDA each timed call is bracketed
    by events behind a short sleep kernel, so the events time the kernels rather than the host's
    launch latency; on the CPU the wall clock between calls."""
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    first_ms = (time.perf_counter() - t0) * 1e3
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda._sleep(200_000)  # ~0.1 ms of GPU work ahead of the launches
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return first_ms, times


def median(values: List[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def git_commit() -> Optional[str]:
    """The checkout's commit (None outside a git work tree, e.g. an unpacked archive)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        out = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def provenance(args: argparse.Namespace) -> Dict[str, object]:
    """``command`` (the ``hypic`` arguments the CLI parsed, ``args.argv``), ``commit`` and the
    torch version: what a results file needs to be reproduced."""
    argv = getattr(args, "argv", None)
    command = None if argv is None else "python3 -m hypic " + " ".join(shlex.quote(a) for a in argv)
    return {"command": command, "commit": git_commit(), "torch": torch.__version__}


def write_report(path: str, report: Dict) -> None:
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=str)
    os.replace(tmp, path)


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """``--model``, ``--device``, ``--dtype``, ``--seed`` of a benchmark that serves through an
    engine (``hypic.LLM``), CPU by default."""
    p.add_argument("--model", default="tiny", help="checkpoint folder or 'tiny'")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)


def rows_report(args: argparse.Namespace, rows: List[Dict]) -> Dict:
    """The JSON report of a benchmark whose results are ``rows`` (filled as it runs): the device,
    model and thread count, its options, its provenance."""
    return {"device": args.device, "model": args.model, "threads": torch.get_num_threads(),
            "config": {k: v for k, v in vars(args).items() if k not in ("func", "argv")}, **provenance(args),
            "rows": rows}


def report_row(args: argparse.Namespace, report: Dict, row: Dict, line: str) -> None:
    """Add ``row`` to ``report``'s rows, print ``line`` and rewrite ``--json`` (a run cut short
    keeps what it measured)."""
    report["rows"].append(row)
    print(line, flush=True)
    if args.json:
        write_report(args.json, report)
