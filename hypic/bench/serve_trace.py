"""The workload of ``hypic bench serve``: RAG requests with output lengths, Poisson arrivals, the
two wire forms of a prompt, and how much of the corpus a store can hold.

Prompts come from :class:`~hypic.bench.rag_trace.RagTrace` (the TTFT benchmark's trace: a corpus
with Zipf popularity, a fixed system prompt, k documents per request in relevance order, a short
question). Each request here adds its output length, drawn uniformly from
``output_tokens_min..output_tokens_max`` and sent with ``ignore_eos`` so the server generates
exactly that many tokens.

A rate point's requests and arrival times are a function of the trace seed and the rate alone,
so every mode (every server) measured at one rate gets the same prompts at the same instants.

Wire forms (:func:`request_body`):

* ``tokens``: hypic's structured ``segments`` field, each segment a token-id list, the question
  last. Works with a model that has no tokenizer (dummy weights).
* ``text``: one ``prompt`` string, segments joined with ``<<PIC_SEP>>`` (what HYPIC and CacheBlend
  clients send; another engine reads the separator as text). Token id ``t`` is written as word
  ``t`` of a word-level vocabulary (:func:`word_vocabulary`, by default the embedded ``tiny``
  model's), so on ``tiny`` the text form is exactly the token form; a sub-word tokenizer splits the
  words further, and the report's prompt tokens are the server's count.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from hypic.bench.rag_trace import RagTrace, RagTraceConfig, chunk
from hypic.models.config import ModelSpec
from hypic.pic.modes import SeamSetting, seam_tokens
from hypic.pic.segments import PIC_SEP
from hypic.runner.pic_runner import entry_nbytes

TokenIds = Tuple[int, ...]
PROMPT_FORMS = ("tokens", "text")


@dataclass(frozen=True)
class ServeRequest:
    segments: Tuple[TokenIds, ...]  # system prompt and documents, chunked; cached by the server
    query: TokenIds  # the question, never cached
    output_tokens: int  # max_tokens, generated in full (ignore_eos)
    doc_ids: Tuple[int, ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(s) for s in self.segments) + len(self.query)


def request_stream(trace: RagTrace, num_requests: int, stream: str, output_tokens_min: int,
                   output_tokens_max: int) -> List[ServeRequest]:
    """``num_requests`` requests of the named trace stream, each with its output length."""
    if not 1 <= output_tokens_min <= output_tokens_max:
        raise ValueError(f"output tokens: need 1 <= min <= max, got {output_tokens_min}, {output_tokens_max}")
    rng = random.Random(f"serve-output-{stream}-{trace.config.seed}")
    return [ServeRequest(r.prompt.segments, r.prompt.query, rng.randint(output_tokens_min, output_tokens_max),
                         r.doc_ids)
            for r in trace.requests(num_requests, stream=stream)]


def rate_stream_name(rate_rps: float) -> str:
    """The trace stream of a rate point: the same rate gives the same requests in every mode."""
    return f"rate-{rate_rps:.6g}"


def poisson_arrivals_s(num_requests: int, rate_rps: float, seed: str) -> List[float]:
    """Arrival offsets (seconds) of a Poisson process of ``rate_rps`` from 0: the first request at
    0, exponential gaps after it (``rate_rps`` = inf: all at 0). Not rescaled to ``n / rate``, so
    the offered load varies from point to point as a real Poisson process does."""
    if not rate_rps > 0:
        raise ValueError(f"rate_rps: expected > 0, got {rate_rps!r}")
    if math.isinf(rate_rps):
        return [0.0] * num_requests
    rng = random.Random(f"poisson-{seed}")
    out, t = [], 0.0
    for _ in range(num_requests):
        out.append(t)
        t += rng.expovariate(rate_rps)
    return out


# ---- wire forms --------------------------------------------------------------------------------


def word_vocabulary(tokenizer_json: str) -> List[str]:
    """The words of a word-level tokenizer (``tokenizer.json`` of model type ``WordLevel``) by id;
    special tokens (``<...>``) become ``""`` so a trace never sends them."""
    with open(tokenizer_json, encoding="utf-8") as f:
        model = json.load(f)["model"]
    if model.get("type") != "WordLevel":
        raise ValueError(f"{tokenizer_json}: the text form needs a word-level vocabulary, found {model.get('type')!r}")
    words = [""] * (max(model["vocab"].values()) + 1)
    for word, i in model["vocab"].items():
        words[i] = "" if word.startswith("<") and word.endswith(">") else word
    return words


def default_word_vocabulary() -> List[str]:
    from hypic.assets import resolve_model_path

    return word_vocabulary(str(Path(resolve_model_path("tiny")) / "tokenizer.json"))


def text_token_range(words: Sequence[str]) -> Tuple[int, int]:
    """``(first id, vocab size)`` of the contiguous run of real words a text-form trace draws from."""
    first = next((i for i, w in enumerate(words) if w), None)
    if first is None or not all(words[first:]):
        raise ValueError("the word vocabulary must end in a contiguous run of words")
    return first, len(words)


def request_body(req: ServeRequest, form: str, *, model: str, words: Optional[Sequence[str]] = None,
                 stream: bool = True) -> Dict:
    """The ``/v1/completions`` body of ``req``: greedy, ``ignore_eos``, streamed with usage."""
    body: Dict = {"model": model, "max_tokens": req.output_tokens, "temperature": 0.0, "ignore_eos": True,
                  "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if form == "tokens":
        body["segments"] = [list(s) for s in req.segments] + [list(req.query)]
        body["return_token_ids"] = True
    elif form == "text":
        if words is None:
            raise ValueError("the text form needs a word vocabulary")
        body["prompt"] = PIC_SEP.join(" ".join(words[t] for t in piece) for piece in (*req.segments, req.query))
    else:
        raise ValueError(f"prompt form: expected one of {PROMPT_FORMS}, got {form!r}")
    return body


# ---- corpus and store ----------------------------------------------------------------------------


def corpus_fit(trace: RagTrace, spec: ModelSpec, dtype: torch.dtype, seam: SeamSetting,
               budgets_bytes: Dict[str, Optional[int]]) -> Dict:
    """How much of the corpus a segment store holds. The corpus's entries are the system prompt's
    and every document's chunks as ``hypic`` stores them (per linear layer the (T, S) summary and
    conv tail, per attention layer the body's K/V after the seam window:
    :func:`~hypic.runner.pic_runner.entry_nbytes`). Per named budget (None: unbounded): the
    fraction of the corpus's entry bytes that fits, and the fraction of document retrievals served
    by the most popular documents that fit beside the system prompt (the hit-rate ceiling of a
    popularity-ordered store; an LRU store under Zipf traffic comes near it)."""
    size = trace.config.segment_tokens

    def nbytes(tokens: TokenIds) -> int:
        return sum(entry_nbytes(spec, dtype, len(c) - seam_tokens(seam, len(c)), checkpoint=False)
                   for c in chunk(tokens, size))

    system_bytes = nbytes(trace.system_prompt) if trace.system_prompt else 0
    per_doc = [nbytes(d) for d in trace.documents]  # popularity order: document i has rank i + 1
    total = system_bytes + sum(per_doc)
    num_entries = sum(len(chunk(d, size)) for d in (trace.system_prompt, *trace.documents) if d)
    out = {"corpus_documents": len(trace.documents), "corpus_tokens": sum(len(d) for d in trace.documents),
           "corpus_entries": num_entries, "corpus_entry_bytes": total,
           "entry_bytes_full_segment": entry_nbytes(spec, dtype, size - seam_tokens(seam, size), checkpoint=False),
           "budgets": {}}
    for name, budget in budgets_bytes.items():
        if budget is None:
            out["budgets"][name] = {"budget_bytes": None, "fits_bytes_fraction": 1.0,
                                    "fits_popularity_fraction": 1.0}
            continue
        room, served = budget - system_bytes, 0.0
        for doc_bytes, weight in zip(per_doc, trace.popularity):
            if doc_bytes > room:
                break
            room -= doc_bytes
            served += weight
        out["budgets"][name] = {"budget_bytes": budget, "fits_bytes_fraction": min(1.0, budget / total),
                                "fits_popularity_fraction": served / sum(trace.popularity)}
    return out


def build_trace(vocab_size: int, prompt_tokens: int, segment_tokens: int, *, first_token_id: int,
                doc_tokens: Tuple[int, int], system_tokens: int, query_tokens: Tuple[int, int],
                zipf_exponent: float, corpus_factor: float, num_documents: int, seed: int) -> RagTrace:
    return RagTrace(RagTraceConfig(
        vocab_size=vocab_size, prompt_tokens=prompt_tokens, segment_tokens=segment_tokens,
        doc_tokens_min=doc_tokens[0], doc_tokens_max=doc_tokens[1], system_tokens=system_tokens,
        query_tokens_min=query_tokens[0], query_tokens_max=query_tokens[1], zipf_exponent=zipf_exponent,
        corpus_factor=corpus_factor, num_documents=num_documents, seed=seed, first_token_id=first_token_id))
