"""``hypic bench small-segments``: what many short segments cost, against full recompute, by
segment length and caching threshold (``pic_segment_min_tokens``).

    hypic bench small-segments --model tiny --device cpu --prompt-tokens 6219 \\
        --segment-tokens 9,16,24,32,48,64,96,128 --min-tokens 0,default --repeats 3 --json small.json
    hypic bench small-segments --model tiny --device cpu --prompt-tokens 6144 --segment-tokens 64,512 \\
        --min-tokens 0 --cold-policies inline,canonical,standalone --json policies.json

For each segment length L and threshold: a prompt of ``--prompt-tokens // L`` segments of L random
token ids and a ``--query-tokens`` question, through one engine (``hypic.LLM``, no store budget),
each repeat in this order: ``full_recompute``; ``hypic`` cold (the store emptied first: the
segments are written under the cold policy, ``--cold-policies``, default the engine's); ``hypic``
on the segments in reverse order (warm: every segment long enough is reused, after a prefix
that is no longer cached). TTFT from arrival to
the first token (``RequestOutput.metrics.ttft``), the median over ``--repeats``. Threshold 0
caches every segment its seam leaves a body in; ``default`` is the engine's default.

Row keys: ``segment_tokens, num_segments, prompt_tokens, min_tokens, cold_policy``; ``full_recompute_ms,
cold_ms, warm_ms`` and their ratios ``cold_ratio, warm_ratio`` (to full recompute, the same
repeat's); ``cold_equal`` (the cold greedy token equals full recompute's: inline cold is exact);
after the cold request: ``segment_entries, segment_bytes, prefix_bytes`` and ``ideal_bytes`` (the
prompt's full-attention K/V plus one linear-state checkpoint) and ``bytes_ratio`` (segment and
prefix bytes over it); ``warm_cached_tokens`` (tokens the warm request reused).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Dict, List, Optional

import torch

from hypic.bench.common import add_engine_arguments, report_row, rows_report
from hypic.engine.sampling import SamplingParams
from hypic.entrypoints.llm import LLM
from hypic.pic.keys import KIND_PREFIX
from hypic.pic.modes import DEFAULT_SEGMENT_MIN_TOKENS, validate_cold_policy

FIRST_TOKEN = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
HELP = "many short segments against full recompute: TTFT and store bytes by segment length and threshold"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_engine_arguments(p)
    p.add_argument("--prompt-tokens", type=int, default=6219, help="segment tokens per prompt (691 x 9 by default)")
    p.add_argument("--segment-tokens", default="9,16,24,32,48,64,96,128", help="comma-separated segment lengths")
    p.add_argument("--min-tokens", default="0,default",
                   help="comma-separated pic_segment_min_tokens values ('default': the engine's)")
    p.add_argument("--cold-policies", default="default",
                   help="comma-separated cold policies of the hypic requests ('default': the engine's)")
    p.add_argument("--query-tokens", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None, help="write the rows here")


def _thresholds(text: str) -> List[int]:
    out = []
    for part in (x.strip() for x in text.split(",") if x.strip()):
        out.append(DEFAULT_SEGMENT_MIN_TOKENS if part == "default" else int(part))
    if not out or min(out) < 0:
        raise ValueError(f"--min-tokens: expected ints >= 0 or 'default', got {text!r}")
    return out


def _ttft(llm: LLM, segments, query, mode: str, cold_policy: Optional[str] = None):
    out = llm.generate({"segments": list(segments) + [query]}, FIRST_TOKEN, pic_mode=mode,
                       cold_policy=None if mode == "full_recompute" else cold_policy, use_tqdm=False)[0]
    return out.metrics.ttft * 1e3, out


def measure(llm: LLM, segment_tokens: int, num_segments: int, query_tokens: int, repeats: int,
            seed: int, cold_policy: Optional[str] = None) -> Dict[str, object]:
    engine = llm.llm_engine
    vocab = engine.spec.vocab_size
    rng = random.Random(f"small-segments-{seed}-{segment_tokens}-{num_segments}")
    segments = [[rng.randrange(4, vocab) for _ in range(segment_tokens)] for _ in range(num_segments)]
    query = [rng.randrange(4, vocab) for _ in range(query_tokens)]
    # first-call costs at this shape, outside the timing
    _ttft(llm, segments[:2], query, "full_recompute")
    full, cold, warm = [], [], []
    row: Dict[str, object] = {}
    for _ in range(repeats):
        ms, ref = _ttft(llm, segments, query, "full_recompute")
        full.append(ms)
        engine.store.clear()
        ms, out = _ttft(llm, segments, query, "hypic", cold_policy)
        cold.append(ms)
        row["cold_equal"] = out.outputs[0].token_ids == ref.outputs[0].token_ids
        entries = engine.store.snapshot()
        seg = [e for e in entries if e.key.kind != KIND_PREFIX]
        row.update(segment_entries=len(seg), segment_bytes=sum(e.nbytes for e in seg),
                   prefix_bytes=sum(e.nbytes for e in entries if e.key.kind == KIND_PREFIX))
        ms, out = _ttft(llm, segments[::-1], query, "hypic", cold_policy)
        warm.append(ms)
        row["warm_cached_tokens"] = out.metrics.cached_tokens
    prompt_tokens = num_segments * segment_tokens + query_tokens
    runner = engine.pic_runner
    state = runner.entry_nbytes(0, checkpoint=True)
    ideal = prompt_tokens * (runner.entry_nbytes(1, checkpoint=True) - state) + state
    med = statistics.median
    row.update(
        full_recompute_ms=med(full), cold_ms=med(cold), warm_ms=med(warm),
        cold_ratio=med([c / f for c, f in zip(cold, full)]), warm_ratio=med([w / f for w, f in zip(warm, full)]),
        full_recompute_samples_ms=full, cold_samples_ms=cold, warm_samples_ms=warm,
        ideal_bytes=ideal, bytes_ratio=(row["segment_bytes"] + row["prefix_bytes"]) / ideal,
    )
    return row


def run(args: argparse.Namespace) -> Optional[int]:
    lengths = [int(x) for x in args.segment_tokens.split(",") if x.strip()]
    thresholds = _thresholds(args.min_tokens)
    policies = [None if p.strip() == "default" else validate_cold_policy(p.strip())
                for p in args.cold_policies.split(",") if p.strip()]
    if not lengths or min(lengths) < 1 or args.prompt_tokens < max(lengths) or args.repeats < 1:
        raise ValueError("--segment-tokens must be ints in [1, --prompt-tokens], --repeats >= 1")
    torch.manual_seed(args.seed)
    report = rows_report(args, [])
    for threshold in thresholds:
        llm = LLM(args.model, device=args.device, dtype=args.dtype, seed=args.seed, segment_cache_bytes=None,
                  max_num_batched_tokens=args.prompt_tokens + args.query_tokens,
                  pic_segment_min_tokens=threshold)
        try:
            for length, policy in ((n, p) for n in lengths for p in policies):
                t0 = time.perf_counter()
                row = {"segment_tokens": length, "num_segments": args.prompt_tokens // length,
                       "prompt_tokens": (args.prompt_tokens // length) * length + args.query_tokens,
                       "min_tokens": threshold, "cold_policy": policy or llm.llm_engine.pic.cold_policy}
                row.update(measure(llm, length, args.prompt_tokens // length, args.query_tokens, args.repeats,
                                   args.seed, policy))
                report_row(args, report, row,
                           f"L={length:4d} min={threshold:4d} {row['cold_policy']:10s} full "
                           f"{row['full_recompute_ms']:8.1f} ms  cold {row['cold_ms']:8.1f} ({row['cold_ratio']:.2f}x)"
                           f"  warm {row['warm_ms']:8.1f} ({row['warm_ratio']:.2f}x)  bytes {row['bytes_ratio']:.2f}x "
                           f"ideal [{time.perf_counter() - t0:.0f} s]")
        finally:
            llm.shutdown()
    return 0
