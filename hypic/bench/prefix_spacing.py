"""``hypic bench prefix-spacing``: the prefix cache's checkpoint spacing, memory against hit
granularity, on the suites' documents.

    hypic bench prefix-spacing --model tiny --device cpu --block-tokens 64,128,256,512,1024 --json spacing.json

One engine per spacing (``prefix_block_tokens``; ``default``: the model's own, where a
checkpoint costs at most the K/V of its block), each serving the same three workloads of plain
prompts (documents of ``hypic.data``'s held-out pool, word-level tokens):

* ``shared``: ``--systems`` shared prefixes of 3 to 30 documents (about 130 to 1,400 tokens),
  each followed by ``--followers`` + 1 different questions; the first request of each writes,
  the others can find the shared part, up to the last checkpoint within it (a spine boundary:
  the granularity the spacing buys);
* ``repeat``: ``--repeats`` prompts of 10 to 25 documents, each sent twice (the second finds all
  but its last token: the prompt's end is a checkpoint whatever the spacing);
* ``chat``: ``--chats`` conversations of ``--turns`` turns, each turn the previous prompt, its
  answer and a new question (a turn finds the previous turn's prompt: its end is a checkpoint).

Row keys per spacing: ``block_tokens``; ``shared_hit_fraction`` (prefix-hit tokens of the
followers over their tokens shared with their first request), ``repeat_hit_fraction``,
``chat_hit_fraction`` (hits over the previous turn's prompt tokens); ``prefix_entries,
prefix_bytes`` after all of them, ``stored_tokens`` (the K/V rows the checkpoints hold),
``state_bytes`` (their linear states), ``bytes_ratio`` (prefix bytes over the stored tokens' K/V
plus one state per request: 1 = a state at every prompt's end only), ``state_share``;
``hit_ttft_ms`` and ``cold_ttft_ms`` (means over the shared workload's followers and first
requests) and ``follower_live_tokens`` (mean tokens a follower computed).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Dict, List, Optional

from hypic.bench.common import add_engine_arguments, report_row, rows_report
from hypic.data.language import question_text
from hypic.data.suites import DocumentPool
from hypic.engine.sampling import SamplingParams
from hypic.entrypoints.llm import LLM
from hypic.pic.keys import KIND_PREFIX

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
HELP = "prefix-cache checkpoint spacing: store bytes against hit granularity (shared prefixes, repeats, chats)"
RELATIONS = ("lives", "job", "color", "animal")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_engine_arguments(p)  # a --model whose tokenizer reads the suites (the embedded tiny)
    p.add_argument("--block-tokens", default="64,128,256,512,1024,default",
                   help="comma-separated spacings ('default': the model's)")
    p.add_argument("--systems", type=int, default=6, help="shared prefixes")
    p.add_argument("--followers", type=int, default=2, help="requests after the first on each shared prefix")
    p.add_argument("--repeats", type=int, default=3, help="prompts sent twice")
    p.add_argument("--chats", type=int, default=2)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--json", default=None, help="write the rows here")


def _common_prefix(a: List[int], b: List[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class _Workloads:
    """The prompts of every workload, the same for every spacing."""

    def __init__(self, args: argparse.Namespace) -> None:
        pool = DocumentPool("held_out", seed=args.seed, pool_size=64, min_doc_tokens=36, max_doc_tokens=48)
        rng = random.Random(f"prefix-spacing-{args.seed}")
        docs, subjects = [d.text for d in pool.documents], [d.subject for d in pool.documents]

        def question() -> str:
            return question_text(rng.choice(RELATIONS), rng.choice(subjects))

        def documents(lo: int, hi: int) -> str:
            return " ".join(rng.sample(docs, rng.randint(lo, hi)))

        self.shared = []
        for _ in range(args.systems):
            system = documents(3, 30)
            self.shared.append([f"{system} {question()}" for _ in range(args.followers + 1)])
        self.repeats = [f"{documents(10, 25)} {question()}" for _ in range(args.repeats)]
        self.chats = [(documents(4, 12), [question() for _ in range(args.turns)]) for _ in range(args.chats)]


def _generate(llm: LLM, prompt: str):
    return llm.generate(prompt, GREEDY, use_tqdm=False)[0]


def measure(llm: LLM, work: _Workloads) -> Dict[str, object]:
    hits = {"shared": [0, 0], "repeat": [0, 0], "chat": [0, 0]}  # [hit tokens, reusable tokens]
    hit_ttft, cold_ttft, follower_live = [], [], []
    requests = 0
    for prompts in work.shared:
        first = _generate(llm, prompts[0])
        cold_ttft.append(first.metrics.ttft * 1e3)
        requests += 1
        for prompt in prompts[1:]:
            out = _generate(llm, prompt)
            requests += 1
            shared = _common_prefix(first.prompt_token_ids, out.prompt_token_ids)
            hits["shared"][0] += min(out.metrics.prefix_hit_tokens, shared)
            hits["shared"][1] += shared
            hit_ttft.append(out.metrics.ttft * 1e3)
            follower_live.append(out.metrics.live_tokens)
    for prompt in work.repeats:
        _generate(llm, prompt)
        out = _generate(llm, prompt)
        requests += 2
        hits["repeat"][0] += out.metrics.prefix_hit_tokens
        hits["repeat"][1] += len(out.prompt_token_ids) - 1
    for context, questions in work.chats:
        prompt, previous = f"{context} {questions[0]}", None
        for turn, q in enumerate(questions):
            out = _generate(llm, prompt)
            requests += 1
            if previous is not None:
                hits["chat"][0] += out.metrics.prefix_hit_tokens
                hits["chat"][1] += previous - 1
            previous = len(out.prompt_token_ids)
            if turn + 1 < len(questions):
                prompt = f"{prompt} {out.outputs[0].text} {questions[turn + 1]}"
    engine = llm.llm_engine
    entries = [e for e in engine.store.snapshot() if e.key.kind == KIND_PREFIX]
    runner = engine.pic_runner
    state = runner.entry_nbytes(0, checkpoint=True)
    kv_per_token = runner.entry_nbytes(1, checkpoint=True) - state
    stored = sum(e.num_tokens for e in entries)
    prefix_bytes = sum(e.nbytes for e in entries)
    return {
        **{f"{name}_hit_fraction": (h / n if n else None) for name, (h, n) in hits.items()},
        "prefix_entries": len(entries), "prefix_bytes": prefix_bytes, "stored_tokens": stored,
        "state_bytes": state * len(entries),
        "bytes_ratio": prefix_bytes / (kv_per_token * stored + state * requests) if entries else None,
        "state_share": state * len(entries) / prefix_bytes if prefix_bytes else None,
        "hit_ttft_ms": statistics.mean(hit_ttft) if hit_ttft else None,
        "cold_ttft_ms": statistics.mean(cold_ttft) if cold_ttft else None,
        "follower_live_tokens": statistics.mean(follower_live) if follower_live else None,
        "requests": requests,
    }


def run(args: argparse.Namespace) -> Optional[int]:
    spacings: List[Optional[int]] = []
    for part in (x.strip() for x in args.block_tokens.split(",") if x.strip()):
        spacings.append(None if part == "default" else int(part))
    if not spacings or any(s is not None and s < 1 for s in spacings):
        raise ValueError(f"--block-tokens: expected ints >= 1 or 'default', got {args.block_tokens!r}")
    work = _Workloads(args)
    report = rows_report(args, [])
    for block in spacings:
        t0 = time.perf_counter()
        llm = LLM(args.model, device=args.device, dtype=args.dtype, seed=args.seed, segment_cache_bytes=None,
                  prefix_block_tokens=block)
        try:
            row = {"block_tokens": llm.llm_engine.prefix_block_tokens, "default": block is None}
            row.update(measure(llm, work))
        finally:
            llm.shutdown()
        report_row(args, report, row,
                   f"block {row['block_tokens']:5d}{' (default)' if block is None else '':10s} shared "
                   f"{row['shared_hit_fraction']:.3f} repeat {row['repeat_hit_fraction']:.3f} chat "
                   f"{row['chat_hit_fraction']:.3f}  bytes {row['bytes_ratio']:.2f}x  hit ttft "
                   f"{row['hit_ttft_ms']:.1f} ms [{time.perf_counter() - t0:.0f} s]")
    return 0
