"""``hypic bench quality``: task quality of each caching mode, and its gap to full recompute.

    hypic bench quality --model DIR --num-requests 50 --modes full_recompute,addition,hypic \\
        --seams 0,1,2,4,8,16,32 --cold-policies inline,standalone --json out.json --plot out.png
    hypic bench quality --model DIR --longbench hotpotqa.jsonl --modes full_recompute,hypic
    hypic bench quality --bounds-only --tasks multi_key,counting --num-requests 500 --json bounds.json

Requests come from the synthetic suites of :mod:`hypic.data` (held-out split by default:
``single_hop``, ``two_hop``, ``summary``; the long order-sensitive tasks ``multi_key``,
``variable_tracking``, ``doc_order``, ``counting`` of :mod:`hypic.data.long_suites` with
``--tasks``, each reported with the best score a reader blind to document order can reach) or from
a LongBench-format jsonl file. Every
configuration runs on the SAME requests, each tokenised segment by segment exactly once, so the
modes differ only in what they reuse. Decoding is greedy, up to the task's longest reference answer
plus one token, stopping at the tokenizer's end-of-sequence tokens; each prediction is scored with
its task's metric (0-100). How the segment store is warmed and when requests are batched:
:mod:`hypic.bench.quality_run`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Tuple

from hypic.bench.quality_report import (
    QualityResult, format_table, merge_json_files, plot_results, summarize, write_json,
)
from hypic.bench.quality_run import (
    ALL_MODES, Configuration, PromptEncoder, RequestRecord, encode_requests,
    expand_configurations, parse_cold_policies, parse_modes, parse_seam_specs, run_task, write_records,
)
from hypic.bench.common import provenance, write_report
from hypic.data.long_oracle import oracle_score, order_blind_bound
from hypic.data.long_suites import LONG_TASKS, LongSuiteConfig, generate_long_suite
from hypic.data.suites import SUITE_TASKS, TASKS, SuiteConfig, generate_suite
from hypic.pic.modes import COLD_POLICIES

DEFAULT_SEAMS = "0,1,2,4,8,16,32"


@dataclass(frozen=True)
class QualityRun:
    """Everything one benchmark run produced."""

    model: str
    config: dict
    results: Tuple[QualityResult, ...]
    records: Tuple[Tuple[str, Configuration, Tuple[RequestRecord, ...]], ...]  # (task, config, per request)


ALL_SUITE_TASKS: Tuple[str, ...] = SUITE_TASKS + LONG_TASKS


def parse_tasks(text: Optional[str]) -> Tuple[str, ...]:
    names = [t.strip() for t in str(text or "").split(",") if t.strip()]
    if not names:
        raise ValueError(f"tasks: none given; valid tasks: {', '.join(ALL_SUITE_TASKS)}")
    for name in names:
        if name not in ALL_SUITE_TASKS:
            raise ValueError(f"tasks: unknown task {name!r}; valid tasks: {', '.join(ALL_SUITE_TASKS)}")
    return tuple(dict.fromkeys(names))


def suite_requests(args: argparse.Namespace, task: str) -> list:
    """``args.num_requests`` requests of one synthetic task, the suite's shape overridden by the
    document-count and (long tasks) context-size options that were given."""
    sizes = {}
    if args.min_docs is not None:
        sizes["min_docs"] = args.min_docs
    if task in LONG_TASKS:
        if args.max_docs is not None:
            sizes["max_docs"] = args.max_docs
            sizes.setdefault("min_docs", min(LongSuiteConfig.min_docs, args.max_docs))
        for name in ("min_context_tokens", "max_context_tokens", "pool_size"):
            if getattr(args, name) is not None:
                sizes[name] = getattr(args, name)
        return generate_long_suite(LongSuiteConfig(task=task, split=args.split, seed=args.seed, **sizes),
                                   args.num_requests)
    if args.max_docs is not None:
        sizes["max_docs"] = args.max_docs
        sizes.setdefault("min_docs", min(SuiteConfig.min_docs, args.max_docs))
    return generate_suite(SuiteConfig(task=task, split=args.split, seed=args.seed, **sizes), args.num_requests)


def suite_bounds(by_task: dict) -> dict:
    """Per long task: the text oracle's score (100: the documents determine every answer) and the
    best mean score a reader blind to document order can reach (:func:`order_blind_bound`), 0-100."""
    return {task: {"oracle": oracle_score(rs),
                   "order_blind_bound": 100.0 * sum(order_blind_bound(r) for r in rs) / len(rs)}
            for task, rs in by_task.items() if task in LONG_TASKS and rs}


def build_requests(args: argparse.Namespace) -> Tuple[dict, bool]:
    """task -> requests (suite or LongBench file), and whether they are the synthetic suites."""
    if args.longbench:
        from hypic.data.longbench import load_longbench

        path = Path(args.longbench)
        if not path.is_file():
            raise ValueError(f"longbench: no such file {str(path)!r}")
        # --num-requests caps the rows per dataset, so read the file whole and cut per task.
        rows = load_longbench(str(path), max_segments=args.max_docs)
        wanted = None if args.tasks is None else {t.strip() for t in args.tasks.split(",") if t.strip()}
        by_task: dict = {}
        for r in rows:
            if wanted is None or r.task in wanted:
                by_task.setdefault(r.task, [])
                if len(by_task[r.task]) < args.num_requests:
                    by_task[r.task].append(r)
        if wanted is not None and not wanted <= set(by_task):
            raise ValueError(f"tasks: {sorted(wanted - set(by_task))} not in {path} (datasets: "
                             f"{sorted({r.task for r in rows})})")
        if not by_task:
            raise ValueError(f"longbench: {path} holds no requests")
        return by_task, False
    tasks = parse_tasks(args.tasks if args.tasks is not None else ",".join(TASKS))
    return {task: suite_requests(args, task) for task in tasks}, True


def run_quality(args: argparse.Namespace) -> QualityRun:
    """Validate the options, build and check the requests, run every configuration."""
    from hypic.assets import resolve_model_path
    from hypic.models.config import load_spec

    if not isinstance(args.num_requests, int) or args.num_requests < 1:
        raise ValueError(f"num_requests: must be an int >= 1, got {args.num_requests!r}")
    if not isinstance(args.batch_size, int) or args.batch_size < 1:
        raise ValueError(f"batch_size: must be an int >= 1, got {args.batch_size!r}")
    if args.max_tokens is not None and (not isinstance(args.max_tokens, int) or args.max_tokens < 1):
        raise ValueError(f"max_tokens: must be an int >= 1, got {args.max_tokens!r}")
    modes = parse_modes(args.modes)
    seams = parse_seam_specs(args.seams)
    policies = parse_cold_policies(args.cold_policies)
    configurations = expand_configurations(modes, seams, policies)
    by_task, synthetic = build_requests(args)
    model_path = resolve_model_path(args.model)
    spec = load_spec(str(model_path))
    encoder = PromptEncoder(model_path, spec.vocab_size)
    if synthetic:
        encoder.check_word_level([r for rs in by_task.values() for r in rs])
    bos_id = encoder.bos_token_id() if args.bos else None
    encoded = {task: encode_requests(encoder, rs, bos_id) for task, rs in by_task.items()}
    # One decoding budget per task (never per request: that would leak the answer length).
    max_tokens = {
        task: args.max_tokens if args.max_tokens is not None else max(e.answer_tokens for e in es) + 1
        for task, es in encoded.items()
    }
    config = {
        "source": str(args.longbench) if args.longbench else "synthetic",
        "split": None if args.longbench else args.split,
        "tasks": list(encoded), "num_requests": {t: len(es) for t, es in encoded.items()},
        "modes": list(modes), "seams": [s.label for s in seams], "cold_policies": list(policies),
        "seed": args.seed, "device": str(args.device), "dtype": str(args.dtype),
        "min_docs": args.min_docs, "max_docs": args.max_docs, "batch_size": args.batch_size,
        "max_tokens": max_tokens, "bos": bool(args.bos), "decoding": "greedy, stop at eos",
        "store_warming": "fresh engine and store per (configuration, task); requests in suite order",
    }
    if synthetic and any(t in LONG_TASKS for t in by_task):
        config.update(min_context_tokens=args.min_context_tokens, max_context_tokens=args.max_context_tokens,
                      pool_size=args.pool_size, suite_bounds=suite_bounds(by_task))
    total = len(configurations) * sum(len(es) for es in encoded.values())
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="bench quality", unit="req", dynamic_ncols=True, disable=args.no_progress)
    runs = []
    try:
        for configuration in configurations:
            for task, es in encoded.items():
                bar.set_postfix_str(f"{task} | {configuration.label}", refresh=False)
                records = run_task(model_path, configuration, es, max_tokens=max_tokens[task], device=args.device,
                                   dtype=args.dtype, seed=args.seed, batch_size=args.batch_size,
                                   on_request_done=lambda: bar.update(1))
                runs.append((task, configuration, records))
                if args.json:
                    # A long run killed by a time limit keeps every finished cell ("complete": false).
                    write_json(args.json, str(args.model), {**config, "complete": False},
                               summarize(_by_task(runs, encoded)), provenance(args))
    finally:
        bar.close()
    runs = _by_task(runs, encoded)
    return QualityRun(str(args.model), {**config, "complete": True}, summarize(runs), tuple(runs))


def _by_task(runs: list, encoded: dict) -> list:
    """Rows grouped by task (in the order the tasks were asked for), then in configuration order."""
    order = list(encoded)
    return sorted(runs, key=lambda run: order.index(run[0]))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny", help="checkpoint folder or 'tiny' (embedded model)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16 | float64")
    parser.add_argument("--num-requests", type=int, default=20, help="requests per task (default 20)")
    parser.add_argument("--tasks", default=None,
                        help=f"comma-separated suite tasks among {','.join(ALL_SUITE_TASKS)} "
                             f"(default {','.join(TASKS)}); "
                             "with --longbench: datasets")
    parser.add_argument("--modes", default=",".join(ALL_MODES), help=f"comma-separated among {', '.join(ALL_MODES)}")
    parser.add_argument("--seams", default=DEFAULT_SEAMS,
                        help=f"hypic seam widths: int tokens or fractions in (0, 1], each optionally with a floor "
                             f"and a cap in tokens (0.1:8, 0.1:8:24) (default {DEFAULT_SEAMS})")
    parser.add_argument("--cold-policies", default=",".join(COLD_POLICIES), help="comma-separated among " + ",".join(COLD_POLICIES))
    parser.add_argument("--seed", type=int, default=0, help="suite seed (and engine seed)")
    parser.add_argument("--split", default="held_out", choices=["held_out", "train"], help="suite split")
    parser.add_argument("--min-docs", type=int, default=None, help="suite override: fewest documents per request")
    parser.add_argument("--max-docs", type=int, default=None,
                        help="suite override: most documents per request (LongBench: merge into at most this many)")
    parser.add_argument("--min-context-tokens", type=int, default=None,
                        help="long tasks: fewest document tokens per request (default 4096)")
    parser.add_argument("--max-context-tokens", type=int, default=None,
                        help="long tasks: most document tokens per request (default 8192)")
    parser.add_argument("--pool-size", type=int, default=None,
                        help="long tasks: documents in the suite's pool (default 1024)")
    parser.add_argument("--longbench", default=None, metavar="FILE.jsonl", help="run a LongBench-format file instead")
    parser.add_argument("--batch-size", type=int, default=8,
                        help="most requests per engine run; 1 = strictly sequential (same hits and misses)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="decoding budget (default: the task's longest answer in tokens + 1)")
    parser.add_argument("--bos", action="store_true",
                        help="start every prompt with the tokenizer's bos_token (a one-token segment of its own)")
    parser.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON")
    parser.add_argument("--records", default=None, metavar="FILE", help="write per-request predictions as jsonl")
    parser.add_argument("--plot", default=None, metavar="FILE.png", help="plot score against seam width")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    parser.add_argument("--merge", nargs="+", default=None, metavar="FILE.json",
                        help="run nothing: merge the JSON files of earlier runs (disjoint cells, same model, "
                             "requests and decoding) into one table, --json and --plot")
    parser.add_argument("--bounds-only", action="store_true",
                        help="run no model: the long tasks' text-oracle score and order-blind bound (the best "
                             "score of a reader blind to document order), --json")


def run_bounds(args: argparse.Namespace) -> dict:
    """``--bounds-only``: the long tasks' text-oracle score and order-blind bound, no model."""
    if args.longbench or args.merge:
        raise ValueError("bounds-only: the bounds are of the synthetic long tasks; --longbench and --merge take none")
    if not isinstance(args.num_requests, int) or args.num_requests < 1:
        raise ValueError(f"num_requests: must be an int >= 1, got {args.num_requests!r}")
    tasks = parse_tasks(args.tasks if args.tasks is not None else ",".join(LONG_TASKS))
    if any(t not in LONG_TASKS for t in tasks):
        raise ValueError(f"bounds-only: the bounds are of the long tasks {', '.join(LONG_TASKS)}, "
                         f"got {', '.join(tasks)}")
    by_task = {task: suite_requests(args, task) for task in tasks}
    config = {"source": "synthetic", "split": args.split, "seed": args.seed,
              "num_requests": {t: len(rs) for t, rs in by_task.items()}, "min_docs": args.min_docs,
              "max_docs": args.max_docs, "min_context_tokens": args.min_context_tokens,
              "max_context_tokens": args.max_context_tokens, "pool_size": args.pool_size}
    return {"config": config, "suite_bounds": suite_bounds(by_task), **provenance(args)}


def format_bounds(report: dict) -> str:
    lines = [f"{'task':<18}  {'n':>4}  {'oracle':>6}  {'order-blind bound':>17}"]
    for task, b in report["suite_bounds"].items():
        n = report["config"]["num_requests"][task]
        lines.append(f"{task:<18}  {n:>4}  {b['oracle']:>6.1f}  {b['order_blind_bound']:>17.1f}")
    lines.append("oracle: score of a solver reading the documents' text in order (100: the documents determine every "
                 "answer); order-blind bound: the best mean score of a reader blind to the documents' order")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.bounds_only:
        report = run_bounds(args)
        print(format_bounds(report))
        if args.json:
            write_report(args.json, report)
            print(f"wrote {args.json}")
        return 0
    if args.merge:
        model, config, results = merge_json_files(args.merge)
        records = None
    else:
        result = run_quality(args)
        model, config, results, records = result.model, result.config, result.results, result.records
    print(format_table(results))
    if args.json:
        write_json(args.json, model, config, results, provenance(args))
        print(f"wrote {args.json}")
    if args.records and records is not None:
        write_records(args.records, ((c, r) for _, c, rs in records for r in rs))
        print(f"wrote {args.records}")
    if args.plot:
        plot_results(args.plot, results, title=f"{model} ({config['source']})")
        print(f"wrote {args.plot}")
    return 0


HELP = "task quality per caching mode and seam width, and the gap to full recompute"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``hypic bench quality`` options (for callers that skip the CLI)."""
    parser = argparse.ArgumentParser(prog="hypic bench quality")
    add_arguments(parser)
    return parser.parse_args(list(argv))
