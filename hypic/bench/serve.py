"""``hypic bench serve``: a RAG trace replayed at Poisson arrival rates against an OpenAI-compatible
server, reported under ``vllm bench serve``'s metric names, and the sustainable QPS under a TTFT SLO.

Targets: ``--modes hypic,prefix_cache`` launches ``hypic serve`` once per mode (a fresh process on
127.0.0.1, built from this command's engine options, ``--pic-mode`` set to the mode) and runs
everything against each in turn; ``--base-url URL`` targets a server already running (hypic's or
another engine's; ``--modes`` then names it in the report).

For each target and each ``--prompt-tokens`` trace (:mod:`hypic.bench.serve_trace`):

1. the segment store is flushed (``POST /flush_cache`` where the server has it);
2. **corpus warm-up**: requests that show every document of the corpus once (one output token
   each, one after another), so the store holds what it can of the corpus, as a server in
   service would;
3. **calibration**: ``--calibration-requests`` trace requests one after another; their median
   TTFT is the idle TTFT, and ``0.5 / idle TTFT`` the first rate tried unless ``--rate-start``;
4. **rate points**, each a fresh stretch of the Poisson process: ``--warmup-s`` seconds of
   arrivals whose requests are excluded (they bring the batch and the store to the point's
   occupancy), then ``--measure-s`` seconds of measured arrivals (at least ``--min-requests``),
   then the drain. Steady-state rule: a point counts only when the measured requests' median TTFT
   does not climb through the window (:func:`hypic.bench.serve_metrics.steady_state`).

Rates: ``--request-rates 1,2,4`` runs that ladder; without it the search starts at the first rate,
doubles while points meet the SLO (halves while they miss), then bisects geometrically between
the highest passing and lowest failing rate ``--bisect-steps`` times. The SLO: at least
``--slo-attainment`` (0.9) of the measured requests complete with TTFT <= ``--slo-ttft-ms``
(1000). ``--max-seconds`` bounds each (target, trace)'s points: a point starts only if its
arrivals end within that many seconds of the first point's start (its drain may run past it). A
point where no request completed stops the (target, trace) when the server no longer answers.

Report (``--json``): ``command``, ``commit``, the configuration, the corpus per trace with the
fraction the store's budgets hold (``corpus``), one row per point (``results``: the metrics of
:mod:`hypic.bench.serve_metrics`, the server's ``/metrics`` deltas under ``server_metrics``, and
every request's timings under ``samples``), one ``summary`` per (mode, trace) with the sustainable
rates and peak throughputs (:mod:`hypic.bench.serve_report`), and ``targets`` (server command,
startup time, warm-up and calibration). ``--plot-dir``: TTFT percentiles and goodput against rate.
``--schedule-dir``: each point's requests as AIPerf's ``mooncake_trace`` JSONL (``timestamp`` ms,
``text_input``, ``output_length``), so an external tool can replay the same prompts at the same
instants (text form).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
from dataclasses import asdict
from typing import Optional, Tuple

from hypic.config import add_engine_args

HELP = ("serving load: a RAG trace at Poisson rates against an OpenAI-compatible server (vLLM's metrics, "
        "sustainable QPS under a TTFT SLO)")


# ---- command line -----------------------------------------------------------------------------------


def _ints(text: str, name: str, count: Optional[int] = None) -> Tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{name}: expected comma-separated integers, got {text!r}") from None
    if count is not None and len(values) != count:
        raise ValueError(f"{name}: expected {count} comma-separated integers, got {text!r}")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_engine_args(p)  # the launched servers' options, as `hypic serve` takes them
    p.add_argument("--dummy-config", default=None,
                   help="config.json of a model to serve with dummy weights (with --load-format dummy)")
    t = p.add_argument_group("target")
    t.add_argument("--modes", default="hypic,prefix_cache",
                   help="PIC modes: one launched server each, in turn (with --base-url: the target's name)")
    t.add_argument("--base-url", default=None, help="a server already running (no server is launched)")
    t.add_argument("--api-key", default=None, help="Bearer key of the target server")
    t.add_argument("--prompt-form", default="tokens", choices=("tokens", "text"),
                   help="tokens: token-id segments (hypic's `segments`); text: <<PIC_SEP>>-joined words")
    t.add_argument("--extra-body", default=None, metavar="JSON",
                   help='fields merged into every request body, e.g. \'{"skip_special_tokens": false}\'')
    t.add_argument("--vocab-size", type=int, default=None,
                   help="token ids of the tokens form are drawn below this (default: the model's vocabulary)")
    t.add_argument("--server-start-timeout-s", type=float, default=900.0)
    t.add_argument("--server-log-dir", default=None, help="each launched server's log (default: a temp folder)")
    w = p.add_argument_group("trace")
    w.add_argument("--prompt-tokens", default="8192,32768", help="one trace per prompt length")
    w.add_argument("--segment-tokens", type=int, default=512)
    w.add_argument("--doc-tokens", default="256,2048", help="min,max document tokens")
    w.add_argument("--system-tokens", type=int, default=256)
    w.add_argument("--query-tokens", default="32,64", help="min,max question tokens")
    w.add_argument("--output-tokens", default="64,256", help="min,max output tokens (ignore_eos)")
    w.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of document popularity")
    w.add_argument("--corpus-factor", type=float, default=4.0, help="corpus tokens / document tokens of a request")
    w.add_argument("--num-documents", type=int, default=0, help="corpus size (0: from --corpus-factor)")
    w.add_argument("--trace-seed", type=int, default=0, help="seeds the corpus, the requests and the arrivals")
    s = p.add_argument_group("rates")
    s.add_argument("--request-rates", default=None, help="a fixed ladder, e.g. 0.5,1,2,4 (default: search)")
    s.add_argument("--rate-start", type=float, default=None, help="first rate of the search (default: calibrated)")
    s.add_argument("--rate-factor", type=float, default=2.0)
    s.add_argument("--bisect-steps", type=int, default=2)
    s.add_argument("--max-points", type=int, default=8,
                   help="rate points per (target, trace) at most; 0: only the idle TTFT of the calibration "
                        "requests (one request at a time)")
    s.add_argument("--min-rate", type=float, default=0.01)
    s.add_argument("--warmup-s", type=float, default=5.0, help="seconds of excluded arrivals before a point")
    s.add_argument("--measure-s", type=float, default=20.0, help="seconds of measured arrivals of a point")
    s.add_argument("--min-requests", type=int, default=16, help="measured requests of a point at least")
    s.add_argument("--max-requests", type=int, default=2000, help="measured requests of a point at most")
    s.add_argument("--drain-timeout-s", type=float, default=60.0,
                   help="requests still running this long after a point's last arrival are cancelled (failed)")
    s.add_argument("--no-corpus-warmup", action="store_true")
    s.add_argument("--warmup-max-sampled", type=int, default=2,
                   help="trace requests of the corpus warm-up before those covering the rest of the corpus")
    s.add_argument("--calibration-requests", type=int, default=4)
    s.add_argument("--beside-long-tokens", type=int, default=0,
                   help="after the calibration, requests one at a time while a cold prompt of this many fresh "
                        "tokens prefills: their TTFT against the idle TTFT (0: skipped)")
    s.add_argument("--max-seconds", type=float, default=None,
                   help="a rate point of a (target, trace) starts only if its arrivals end within this many "
                        "seconds of the first point's start")
    s.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    s.add_argument("--slo-attainment", type=float, default=0.9)
    s.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS",
                   help="vLLM's goodput SLOs, e.g. ttft:1000 tpot:50 (default: ttft at --slo-ttft-ms)")
    o = p.add_argument_group("output")
    o.add_argument("--json", default=None)
    o.add_argument("--plot-dir", default=None, help="serve_ttft.png, serve_goodput.png")
    o.add_argument("--schedule-dir", default=None,
                   help="each point's requests as AIPerf mooncake_trace JSONL (text form, for replay elsewhere)")


def config_from_args(args: argparse.Namespace):
    from hypic.bench.serve_metrics import parse_goodput
    from hypic.bench.serve_run import ServeBenchConfig

    rates = None
    if args.request_rates:
        try:
            rates = tuple(float(x) for x in args.request_rates.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"--request-rates: expected comma-separated numbers, got {args.request_rates!r}") \
                from None
    goodput = parse_goodput(args.goodput) if args.goodput else {"ttft": args.slo_ttft_ms}
    return ServeBenchConfig(
        modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
        prompt_tokens=_ints(args.prompt_tokens, "--prompt-tokens"), segment_tokens=args.segment_tokens,
        prompt_form=args.prompt_form, doc_tokens=_ints(args.doc_tokens, "--doc-tokens", 2),
        system_tokens=args.system_tokens, query_tokens=_ints(args.query_tokens, "--query-tokens", 2),
        output_tokens=_ints(args.output_tokens, "--output-tokens", 2), zipf_exponent=args.zipf,
        corpus_factor=args.corpus_factor, num_documents=args.num_documents, trace_seed=args.trace_seed,
        request_rates=rates, rate_start=args.rate_start, rate_factor=args.rate_factor,
        bisect_steps=args.bisect_steps, max_points=args.max_points, min_rate=args.min_rate,
        warmup_s=args.warmup_s, measure_s=args.measure_s, min_requests=args.min_requests,
        max_requests=args.max_requests, drain_timeout_s=args.drain_timeout_s,
        corpus_warmup=not args.no_corpus_warmup, warmup_max_sampled=args.warmup_max_sampled,
        calibration_requests=args.calibration_requests, slo_ttft_ms=args.slo_ttft_ms,
        slo_attainment=args.slo_attainment, goodput_ms=tuple(sorted(goodput.items())), max_seconds=args.max_seconds,
        extra_body=_extra_body(args.extra_body), beside_long_tokens=args.beside_long_tokens)


def _extra_body(text: Optional[str]) -> Tuple[Tuple[str, object], ...]:
    if not text:
        return ()
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--extra-body: not JSON: {e}") from None
    if not isinstance(body, dict):
        raise ValueError("--extra-body: expected a JSON object")
    return tuple(sorted(body.items()))


def _model(args: argparse.Namespace):
    """``(spec, dtype)`` of the served model, or ``(None, None)`` where ``--model`` is not a hypic
    model folder (another engine's name)."""
    from hypic.assets import resolve_model_path
    from hypic.engine.engine import resolve_device, resolve_dtype
    from hypic.models.config import load_spec, spec_from_config

    if args.dummy_config:
        if args.load_format != "dummy":
            raise ValueError("--dummy-config builds dummy weights: pass --load-format dummy with it")
        with open(args.dummy_config, encoding="utf-8") as f:
            spec = spec_from_config(json.load(f))
    else:
        try:
            spec = load_spec(str(resolve_model_path(args.model)))
        except ValueError:
            if args.base_url is None:
                raise
            return None, None
    return spec, resolve_dtype(args.dtype, resolve_device(args.device))


def _device_label(args: argparse.Namespace) -> str:
    """What the launched servers run on, without touching the GPU from this process."""
    if str(args.device).startswith("cpu"):
        return "cpu"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        names = [n.strip() for n in out.stdout.splitlines() if n.strip()]
        return names[0] if names else str(args.device)
    except (OSError, subprocess.SubprocessError):
        return str(args.device)


def run(args: argparse.Namespace) -> int:
    from hypic.bench.common import provenance, write_report
    from hypic.bench.serve_client import served_model
    from hypic.bench.serve_report import format_table, summarize, write_plots
    from hypic.bench.serve_run import ServeBench
    from hypic.bench.serve_server import LaunchedServer, model_label
    from hypic.bench.serve_trace import default_word_vocabulary, text_token_range

    if args.pic_mode is not None:
        raise ValueError("--pic-mode: give the modes with --modes (one server each)")
    config = config_from_args(args)
    spec, dtype = _model(args)
    if args.schedule_dir and config.prompt_form != "text":
        raise ValueError("--schedule-dir writes text prompts: use it with --prompt-form text")
    words = default_word_vocabulary() if config.prompt_form == "text" else None
    if config.prompt_form == "text":
        first, vocab = text_token_range(words)
    else:
        first, vocab = 1, args.vocab_size or (spec.vocab_size if spec is not None else None)
        if vocab is None:
            raise ValueError("--vocab-size: needed for token-id prompts to a model hypic cannot read")
    device = args.segment_cache_bytes
    budgets = {"device": device,
               "device+host": None if device is None else device + args.host_cache_bytes}
    log_dir = args.server_log_dir or tempfile.mkdtemp(prefix="hypic-bench-serve-")
    report = {**provenance(args), "model": model_label(args), "device": _device_label(args),
              "base_url": args.base_url, "config": asdict(config)}

    def checkpoint() -> None:
        report.update(corpus=bench.corpus, targets=bench.targets, results=bench.rows,
                      summary=summarize(bench.rows, config.modes, config.prompt_tokens))
        if args.json:
            write_report(args.json, report)

    bench = ServeBench(config, vocab_size=vocab, first_token_id=first, words=words, spec=spec, dtype=dtype,
                       seam=args.seam, budgets=budgets, api_key=args.api_key, schedule_dir=args.schedule_dir,
                       checkpoint=checkpoint)
    for p in config.prompt_tokens:
        bench.trace(p)  # corpus and store fit up front: a bad trace setting fails before any server starts
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        if args.base_url is not None:
            target = {"mode": config.modes[0], "base_url": args.base_url}
            bench.targets.append(target)
            bench.run_target(config.modes[0], args.base_url, served_model(args.base_url, args.api_key), target)
        else:
            for mode in config.modes:
                target = {"mode": mode}
                bench.targets.append(target)
                log = os.path.join(log_dir, f"server_{mode}.log")
                try:
                    with LaunchedServer(mode, args, log, start_timeout_s=args.server_start_timeout_s) as server:
                        target.update(command="python3 " + " ".join(server.argv[1:]), startup_s=server.startup_s,
                                      log=log)
                        print(f"[{mode}] server ready in {server.startup_s:.1f} s at {server.base_url}", flush=True)
                        bench.run_target(mode, server.base_url, server.served_model_name, target,
                                         alive=server.running)
                except RuntimeError as e:  # the server did not start: recorded, next mode
                    bench.errors += 1
                    target["error"] = str(e)
                    bench.rows.append({"mode": mode, "prompt_tokens": config.prompt_tokens[0], "error": str(e)})
                    print(f"[{mode}] {e}", flush=True)
                checkpoint()
    finally:
        signal.signal(signal.SIGTERM, previous)
    checkpoint()
    print(format_table(bench.rows, report["summary"]), flush=True)
    if args.json:
        print(f"wrote {args.json}")
    if args.plot_dir:
        for path in write_plots(bench.rows, args.plot_dir, title=report["model"]):
            print(f"wrote {path}")
    return 1 if bench.errors else 0


def _exit_on_sigterm(signum, frame):
    # a plan runner's timeout sends SIGTERM: unwind, so the launched server is stopped
    raise SystemExit(128 + signum)
