"""The ``hypic`` command line.

    hypic generate --model tiny --prompt "the mentor of kolton is" [--max-tokens 32 --temperature 0 ...]
    hypic serve tiny [--host 127.0.0.1 --port 8000 ...]   (hypic.entrypoints.openai)
    hypic bench <name> ...

Every command that builds an engine takes the engine's options one-to-one
(:func:`hypic.config.add_engine_args`: ``--max-num-seqs``, ``--enforce-eager``, ...) and builds its
config with :meth:`hypic.config.EngineConfig.from_cli_args`.

The embedded ``tiny`` model reads only the synthetic suites' vocabulary (hypic/assets/tiny/README.md).

``bench`` is a subcommand group: one subcommand per entry of
:data:`hypic.bench.commands.BENCH_COMMANDS` (docs/performance.md lists them).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Mapping, Optional, Sequence

from hypic.bench.commands import BENCH_COMMANDS, BenchCommand
from hypic.config import EngineConfig, add_engine_args


# ---- generate -------------------------------------------------------------------------------


def _add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser)
    parser.add_argument("--prompt", action="append", required=True,
                        help="prompt text (repeat for several prompts)")
    parser.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template as a user turn")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--presence-penalty", type=float, default=0.0)
    parser.add_argument("--frequency-penalty", type=float, default=0.0)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--min-tokens", type=int, default=0, help="tokens generated before any stop may end a prompt")
    parser.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--cache-salt", default=None,
                        help="tenant of every prompt: cache entries written under one salt never serve another")


def _run_generate(args: argparse.Namespace) -> int:
    from hypic.engine.sampling import SamplingParams
    from hypic.entrypoints.llm import LLM

    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        repetition_penalty=args.repetition_penalty,
        min_tokens=args.min_tokens,
        max_tokens=args.max_tokens,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
        seed=args.seed,
    )
    t0 = time.perf_counter()
    llm = LLM(EngineConfig.from_cli_args(args))
    try:
        return _generate_and_print(llm, args, params, time.perf_counter() - t0)
    finally:
        llm.shutdown()


def _generate_and_print(llm, args: argparse.Namespace, params, load_s: float) -> int:
    t1 = time.perf_counter()
    salt = args.cache_salt
    if args.chat:
        conversations = [[{"role": "user", "content": p}] for p in args.prompt]
        outputs = llm.chat(conversations, params, use_tqdm=False, cache_salt=salt)
    else:
        # One after another, so later prompts reuse what earlier ones cached (segments, prefixes).
        outputs = [llm.generate(p, params, use_tqdm=False, cache_salt=salt)[0] for p in args.prompt]
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
    if st.hits or st.misses or st.prefix_hits or st.prefix_misses:
        print(f"--- segment store: hits={st.hits} misses={st.misses} prefix_hits={st.prefix_hits} "
              f"entries={st.device_entries} bytes={st.device_bytes} evictions={st.evictions}"
              + (f" disk_entries={st.disk_entries} disk_hits={st.disk_hits}" if st.disk_budget_bytes is not None
                 else ""))
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
    add_engine_args(parser)
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


def build_parser(bench_commands: Optional[Mapping[str, BenchCommand]] = None) -> argparse.ArgumentParser:
    """``bench_commands``: the ``hypic bench`` subcommands (default :data:`BENCH_COMMANDS`)."""
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
    for name, command in sorted((BENCH_COMMANDS if bench_commands is None else bench_commands).items()):
        p = bench_sub.add_parser(name, help=command.help)
        command.add_arguments(p)
        p.set_defaults(func=command.run)
    return parser


def main(argv: Sequence[str] | None = None, bench_commands: Optional[Mapping[str, BenchCommand]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(bench_commands)
    args = parser.parse_args(argv)
    args.argv = argv  # a benchmark's report records the command that made it
    try:
        code = args.func(args)
    except ValueError as e:
        # Input errors (missing folder, bad sampling settings, too-long prompt): a message, not a trace.
        print(f"hypic: error: {e}", file=sys.stderr)
        return 2
    return 0 if code is None else int(code)


if __name__ == "__main__":
    sys.exit(main())
