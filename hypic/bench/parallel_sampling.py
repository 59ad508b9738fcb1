"""``hypic bench parallel-sampling``: what ``n`` completions of one prompt cost, as ``hypic``
submits them and as N separate requests would.

    hypic bench parallel-sampling --model tiny --device cpu --prompt-tokens 1454 --n 1,4 --json n.json

Two prompts of random token ids from an empty cache (``LLM.reset_prefix_cache`` before every
measurement, so each one prefills from scratch): ``plain`` (``--prompt-tokens`` ids, no
separators) and ``segmented`` (the same ids cut into ``--segment-tokens`` segments, then a
``--query-tokens`` question). For each N of ``--n``, two submissions, both in one
``LLM.generate`` call:

* ``n``: ``SamplingParams(n=N)``, the engine's way: for a plain prompt completion 0 prefills
  alone and completions 1..N-1 start once it has its first token, resuming from its prefix-cache
  checkpoints (``LLMEngine.add_request(start_after=...)``); a segmented prompt's completions all
  start at once (they share the cold segments' stages);
* ``separate``: N requests of the same prompt with ``n=1`` (what a client that sends N requests
  gets): all start at once and each prefills the whole prompt.

Sampled at temperature 1 (``--max-tokens`` tokens, ``ignore_eos``), completion k seeded
``--seed`` + k in both. Row keys: ``prompt, n, submission, prompt_tokens``, ``wall_ms`` (the
call's wall time, the median over ``--repeats``) and ``wall_samples_ms``, ``ratio_to_n1`` (over
the same prompt's N = 1 median), ``prefix_checkpoint_hits`` and ``segment_hits`` (the store's
hits during the call, last repeat: completions that resumed from completion 0's checkpoints, or
reused its segments).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from typing import Dict, List, Optional

import torch

from hypic.bench.common import add_engine_arguments, report_row, rows_report
from hypic.engine.sampling import SamplingParams
from hypic.entrypoints.llm import LLM

HELP = "n completions of one prompt: the engine's submission (completion 0 first) against n separate requests"
SUBMISSIONS = ("n", "separate")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_engine_arguments(p)
    p.add_argument("--prompt-tokens", type=int, default=1454, help="token ids of the plain prompt and the segments")
    p.add_argument("--segment-tokens", type=int, default=128, help="tokens per segment of the segmented prompt")
    p.add_argument("--query-tokens", type=int, default=16, help="the segmented prompt's question")
    p.add_argument("--n", default="1,4", help="comma-separated completion counts")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None, help="write the rows here")


def _prompts(vocab_size: int, args: argparse.Namespace) -> Dict[str, object]:
    rng = random.Random(f"parallel-sampling-{args.seed}")
    ids = [rng.randrange(4, vocab_size) for _ in range(args.prompt_tokens)]
    query = [rng.randrange(4, vocab_size) for _ in range(args.query_tokens)]
    step = args.segment_tokens
    segments = [ids[i:i + step] for i in range(0, len(ids), step)]
    return {"plain": ids, "segmented": {"segments": segments + [query]}}


def _call(llm: LLM, prompt, n: int, submission: str, args: argparse.Namespace):
    """One timed ``generate`` from an empty cache: (wall ms, outputs, prefix-checkpoint hits,
    segment hits)."""
    params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True, seed=args.seed)
    llm.reset_prefix_cache()
    before = llm.segment_cache_stats()
    start = time.perf_counter()
    if submission == "n":
        outs = llm.generate(prompt, dataclasses.replace(params, n=n), use_tqdm=False)
    else:
        outs = llm.generate([prompt] * n, [dataclasses.replace(params, seed=args.seed + k) for k in range(n)],
                            use_tqdm=False)
    ms = (time.perf_counter() - start) * 1e3
    after = llm.segment_cache_stats()
    return ms, outs, after.prefix_hits - before.prefix_hits, after.hits - before.hits


def measure(llm: LLM, prompt, n: int, submission: str, args: argparse.Namespace) -> Dict[str, object]:
    samples: List[float] = []
    for _ in range(args.repeats):
        ms, outs, prefix_hits, segment_hits = _call(llm, prompt, n, submission, args)
        samples.append(ms)
    completions = sum(len(o.outputs) for o in outs)
    if completions != n or any(len(c.token_ids) != args.max_tokens for o in outs for c in o.outputs):
        raise RuntimeError(f"{submission} n={n}: {completions} completions, not {n} of {args.max_tokens} tokens")
    return {"wall_ms": statistics.median(samples), "wall_samples_ms": samples,
            "prefix_checkpoint_hits": prefix_hits, "segment_hits": segment_hits}


def run(args: argparse.Namespace) -> Optional[int]:
    counts = [int(x) for x in args.n.split(",") if x.strip()]
    if not counts or min(counts) < 1 or args.repeats < 1 or args.prompt_tokens < 1 or args.segment_tokens < 1:
        raise ValueError("--n must be ints >= 1; --repeats, --prompt-tokens, --segment-tokens >= 1")
    torch.manual_seed(args.seed)
    llm = LLM(args.model, device=args.device, dtype=args.dtype, seed=args.seed)
    report = rows_report(args, [])
    try:
        prompts = _prompts(llm.llm_engine.spec.vocab_size, args)
        _call(llm, prompts["plain"], 1, "n", args)  # first-call costs, outside the timing
        for name, prompt in prompts.items():
            base = None
            for n in counts:
                for submission in SUBMISSIONS if n > 1 else ("n",):
                    row = {"prompt": name, "n": n, "submission": submission,
                           "prompt_tokens": args.prompt_tokens + (args.query_tokens if name == "segmented" else 0)}
                    row.update(measure(llm, prompt, n, submission, args))
                    if n == 1:
                        base = row["wall_ms"]
                    row["ratio_to_n1"] = row["wall_ms"] / base if base else None
                    ratio = f"{row['ratio_to_n1']:.2f}x n=1" if row["ratio_to_n1"] else "-"
                    report_row(args, report, row, f"{name:9s} n={n:3d} {submission:8s} {row['wall_ms']:9.1f} ms  {ratio}")
    finally:
        llm.shutdown()
    return 0
