"""The ``hypic`` command line.

    hypic generate --model tiny --prompt "the mentor of kolton is" [--max-tokens 32 --temperature 0 ...]
    hypic serve tiny [--host 127.0.0.1 --port 8000 ...]   (hypic.entrypoints.openai)
    hypic bench <name> ...

The embedded ``tiny`` model reads only the synthetic suites' vocabulary (hypic/assets/tiny/README.md).

``bench`` is a subcommand group filled from a registry: a module ``hypic/bench/<x>.py`` that
defines ``BENCH_COMMAND = BenchCommand(name, help, add_arguments, run)`` is discovered
automatically (modules are imported only when ``hypic bench`` is invoked), and code can also
call :func:`register_bench_command` before :func:`main`.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

from hypic.pic.modes import COLD_POLICIES
from hypic.pic.segments import PIC_SEP


@dataclass(frozen=True)
class BenchCommand:
    """``add_arguments(parser)`` declares the options; ``run(args)`` returns an exit code
    (None = 0)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]


_BENCH_COMMANDS: dict[str, BenchCommand] = {}


def register_bench_command(command: BenchCommand) -> None:
    if not isinstance(command, BenchCommand):
        raise ValueError(f"command must be a BenchCommand, got {type(command).__name__}")
    existing = _BENCH_COMMANDS.get(command.name)
    if existing is not None and existing is not command:
        raise ValueError(f"bench command {command.name!r} is already registered")
    _BENCH_COMMANDS[command.name] = command


def bench_commands() -> dict[str, BenchCommand]:
    return dict(_BENCH_COMMANDS)


def discover_bench_commands() -> None:
    """Import ``hypic.bench`` submodules and register their ``BENCH_COMMAND``s. A module that
    fails to import is reported and skipped, so one broken benchmark does not break the rest."""
    import hypic.bench

    for info in pkgutil.iter_modules(hypic.bench.__path__):
        if info.name.startswith("_"):
            continue
        name = f"hypic.bench.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - report and skip this module only
            warnings.warn(f"hypic bench: skipping {name}: {type(e).__name__}: {e}", stacklevel=2)
            continue
        command = getattr(module, "BENCH_COMMAND", None)
        if isinstance(command, BenchCommand):
            register_bench_command(command)


# ---- generate -------------------------------------------------------------------------------


def _add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny", help="checkpoint folder or 'tiny' (embedded model)")
    parser.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16 | float64")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--load-format", default="safetensors", choices=["safetensors", "dummy"])


def _add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    _add_engine_arguments(parser)
    parser.add_argument("--prompt", action="append", required=True,
                        help="prompt text (repeat for several prompts)")
    parser.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template as a user turn")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")
    _add_pic_arguments(parser)


def _add_pic_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", default=None,
                        help="segment-caching mode for every prompt: full_recompute | prefix_cache | addition | "
                             "transition | transition_rope | hypic (default: hypic for prompts with <<PIC_SEP>>)")
    parser.add_argument("--seam", default="8", help="seam window: int tokens or a fraction in (0, 1] (default 8)")
    parser.add_argument("--cold-policy", default="inline", choices=list(COLD_POLICIES),
                        help="cold segments: inline (exact, context-bound entries), standalone (canonical "
                             "entries first, then all-HIT) or canonical (exact now, canonical entries after)")
    parser.add_argument("--segment-workers", type=int, default=1,
                        help="processes (one device each) that prefill standalone cold segments in parallel")


def _run_generate(args: argparse.Namespace) -> int:
    from hypic.engine.sampling import SamplingParams
    from hypic.entrypoints.llm import LLM

    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
        seed=args.seed,
    )
    t0 = time.perf_counter()
    seam = float(args.seam) if "." in args.seam else int(args.seam)
    llm = LLM(
        model=args.model, dtype=args.dtype, device=args.device, seed=args.seed,
        max_model_len=args.max_model_len, load_format=args.load_format,
        pic_mode=args.mode, seam=seam, cold_policy=args.cold_policy, segment_workers=args.segment_workers,
    )
    try:
        return _generate_and_print(llm, args, params, time.perf_counter() - t0)
    finally:
        llm.shutdown()


def _generate_and_print(llm, args: argparse.Namespace, params, load_s: float) -> int:
    t1 = time.perf_counter()
    if args.chat:
        conversations = [[{"role": "user", "content": p}] for p in args.prompt]
        outputs = llm.chat(conversations, params, use_tqdm=False)
    elif args.mode is not None or any(PIC_SEP in p for p in args.prompt):
        # Segmented prompts run one after another, so later ones reuse what earlier ones cached.
        outputs = [llm.generate(p, params, use_tqdm=False)[0] for p in args.prompt]
    else:
        outputs = llm.generate(args.prompt, params, use_tqdm=False)
    gen_s = time.perf_counter() - t1
    for out in outputs:
        completion = out.outputs[0]
        print(f"=== prompt: {out.prompt!r}")
        print(completion.text)
        ttft = out.metrics.ttft
        ttft_text = "n/a" if ttft is None else f"{ttft * 1000:.1f} ms"
        print(
            f"--- prompt_tokens={out.metrics.prompt_tokens} output_tokens={len(completion.token_ids)} "
            f"finish_reason={completion.finish_reason} ttft={ttft_text}"
        )
        m = out.metrics
        if m.live_tokens is not None:
            print(f"--- segment cache: cached_tokens={m.cached_tokens} prefix_hit_tokens={m.prefix_hit_tokens} "
                  f"live_tokens={m.live_tokens}")
    engine = llm.llm_engine
    st = engine.segment_cache_stats()
    if st.hits or st.misses:
        print(f"--- segment store: hits={st.hits} misses={st.misses} entries={st.device_entries} "
              f"bytes={st.device_bytes} evictions={st.evictions}")
    num_out = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(
        f"--- model={engine.model_path} dtype={str(engine.dtype).removeprefix('torch.')} device={engine.device} "
        f"load={load_s:.2f} s generate={gen_s:.2f} s output_tokens={num_out} "
        f"({num_out / gen_s if gen_s > 0 else 0.0:.1f} tok/s)"
    )
    return 0


# ---- serve ----------------------------------------------------------------------------------


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="checkpoint folder or 'tiny' (the same as --model)")
    _add_engine_arguments(parser)
    _add_pic_arguments(parser)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget of a prefill step")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="requests holding a cache at once")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None, help="the name clients pass as `model` (default: MODEL)")
    parser.add_argument("--max-waiting-requests", type=int, default=256,
                        help="requests queued without a first token beyond which the server answers 503")
    parser.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` (401 without it)")
    parser.add_argument("--shutdown-timeout", type=float, default=30.0,
                        help="seconds running requests may take to finish on shutdown")


def _run_serve(args: argparse.Namespace) -> int:
    from hypic.entrypoints.openai.serve import run_server

    if args.model_tag is not None:
        args.model = args.model_tag
    run_server(args)
    return 0


# ---- entry point ----------------------------------------------------------------------------


def build_parser(with_bench_discovery: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hypic", description="hypic: serving engine for hybrid-attention LLMs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    gen = sub.add_parser("generate", help="generate text for one or more prompts")
    _add_generate_arguments(gen)
    gen.set_defaults(func=_run_generate)
    serve = sub.add_parser("serve", help="OpenAI- and SGLang-compatible HTTP server")
    _add_serve_arguments(serve)
    serve.set_defaults(func=_run_serve)
    bench = sub.add_parser("bench", help="benchmarks (see `hypic bench -h`)")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    bench_sub.required = True
    if with_bench_discovery:
        discover_bench_commands()
    for command in sorted(_BENCH_COMMANDS.values(), key=lambda c: c.name):
        p = bench_sub.add_parser(command.name, help=command.help)
        command.add_arguments(p)
        p.set_defaults(func=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Importing every benchmark module costs time: only do it when a bench command is asked for.
    parser = build_parser(with_bench_discovery=bool(argv) and argv[0] == "bench")
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except ValueError as e:
        # Input errors (missing folder, bad sampling settings, too-long prompt): a message, not a trace.
        print(f"hypic: error: {e}", file=sys.stderr)
        return 2
    return 0 if code is None else int(code)


if __name__ == "__main__":
    # Run through the imported module so bench commands register in the one registry.
    from hypic.entrypoints.cli import main as _main

    sys.exit(_main())
