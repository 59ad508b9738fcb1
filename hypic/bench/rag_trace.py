"""A synthetic RAG trace for the TTFT benchmark: a corpus with Zipf popularity, fixed system prompt,
k retrieved documents per request in relevance order, and a short question.

Model of a request (what a RAG server sends to the engine):

* segment 0..: the **system prompt** (identical in every request, so always first);
* then k **documents** in relevance order, each document chunked into segments of at most
  ``segment_tokens`` tokens (a chunk is the unit a PIC store caches, so a document always yields
  the same chunks wherever it is placed);
* the **question** (the query, never cached): ``query_tokens_min..query_tokens_max`` fresh tokens.

Retrieval: documents are sampled **without replacement** with probability proportional to the
Zipf weight ``1 / rank**zipf_exponent`` (document ``i`` has popularity rank ``i + 1``); the sampling
order is the relevance order. It uses the Efraimidis-Spirakis keys ``u ** (1 / weight)`` (sorted
descending), which is exactly sequential weighted sampling without replacement.

Prompt length: documents are added in relevance order while they fit in the target
``prompt_tokens`` (system + documents + the longest possible question never exceed it); a document
that does not fit is skipped and the next one tried, until the gap left is smaller than the
shortest document. So k follows from the target and the document sizes, and every prompt is within
``doc_tokens_max`` tokens of the target (asserted by the tests).

Everything is a function of ``seed`` (``random.Random``; no global RNG), so the same config gives
the same corpus and requests in every process and for every mode.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import List, Sequence, Set, Tuple

from hypic.pic.segments import SegmentedPrompt

TokenIds = Tuple[int, ...]


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected int >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class RagTraceConfig:
    vocab_size: int
    prompt_tokens: int  # target prompt length (system + documents + question)
    segment_tokens: int  # documents are chunked into segments of at most this many tokens
    doc_tokens_min: int = 256
    doc_tokens_max: int = 2048
    system_tokens: int = 256
    query_tokens_min: int = 32
    query_tokens_max: int = 64
    zipf_exponent: float = 1.0
    corpus_factor: float = 3.0  # corpus tokens ~= corpus_factor * document tokens per request
    num_documents: int = 0  # 0: derived from corpus_factor
    seed: int = 0
    first_token_id: int = 1  # token ids are drawn from [first_token_id, vocab_size)

    def __post_init__(self):
        _check_int("vocab_size", self.vocab_size, 2)
        _check_int("prompt_tokens", self.prompt_tokens, 1)
        _check_int("segment_tokens", self.segment_tokens, 1)
        _check_int("doc_tokens_min", self.doc_tokens_min, 1)
        _check_int("doc_tokens_max", self.doc_tokens_max, self.doc_tokens_min)
        _check_int("system_tokens", self.system_tokens, 0)
        _check_int("query_tokens_min", self.query_tokens_min, 1)
        _check_int("query_tokens_max", self.query_tokens_max, self.query_tokens_min)
        _check_int("num_documents", self.num_documents, 0)
        _check_int("seed", self.seed, 0)
        _check_int("first_token_id", self.first_token_id, 0)
        if self.first_token_id >= self.vocab_size:
            raise ValueError(f"first_token_id: {self.first_token_id} >= vocab_size {self.vocab_size}")
        if not (isinstance(self.zipf_exponent, (int, float)) and self.zipf_exponent >= 0):
            raise ValueError(f"zipf_exponent: expected a number >= 0, got {self.zipf_exponent!r}")
        if not (isinstance(self.corpus_factor, (int, float)) and self.corpus_factor >= 1):
            raise ValueError(f"corpus_factor: expected a number >= 1, got {self.corpus_factor!r}")
        if self.doc_budget_tokens < self.doc_tokens_max:
            raise ValueError(
                f"prompt_tokens={self.prompt_tokens} leaves {self.doc_budget_tokens} tokens for documents "
                f"after the system prompt ({self.system_tokens}) and question (<= {self.query_tokens_max}); "
                f"need at least doc_tokens_max={self.doc_tokens_max}"
            )

    @property
    def doc_budget_tokens(self) -> int:
        """Tokens available to documents in one request."""
        return self.prompt_tokens - self.system_tokens - self.query_tokens_max

    @property
    def corpus_num_documents(self) -> int:
        if self.num_documents:
            return self.num_documents
        mean_doc = (self.doc_tokens_min + self.doc_tokens_max) / 2
        per_request = max(1.0, self.doc_budget_tokens / mean_doc)
        return max(4, math.ceil(self.corpus_factor * per_request))


@dataclass(frozen=True)
class RagRequest:
    doc_ids: Tuple[int, ...]  # retrieved documents, relevance order
    prompt: SegmentedPrompt


def chunk(tokens: Sequence[int], segment_tokens: int) -> Tuple[TokenIds, ...]:
    """Split ``tokens`` into consecutive segments of ``segment_tokens`` (the last may be shorter)."""
    _check_int("segment_tokens", segment_tokens, 1)
    toks = tuple(tokens)
    return tuple(toks[i:i + segment_tokens] for i in range(0, len(toks), segment_tokens))


class RagTrace:
    """The corpus and a deterministic stream of requests for one :class:`RagTraceConfig`."""

    def __init__(self, config: RagTraceConfig):
        if not isinstance(config, RagTraceConfig):
            raise ValueError(f"config: expected RagTraceConfig, got {type(config).__name__}")
        self.config = config
        rng = random.Random(f"rag-corpus-{config.seed}")
        lo, hi = config.first_token_id, config.vocab_size - 1
        self.system_prompt: TokenIds = tuple(rng.randint(lo, hi) for _ in range(config.system_tokens))
        docs = []
        for _ in range(config.corpus_num_documents):
            n = rng.randint(config.doc_tokens_min, config.doc_tokens_max)
            docs.append(tuple(rng.randint(lo, hi) for _ in range(n)))
        self.documents: Tuple[TokenIds, ...] = tuple(docs)
        self.popularity: Tuple[float, ...] = tuple(
            1.0 / (rank ** config.zipf_exponent) for rank in range(1, len(docs) + 1)
        )
        self._system_segments = chunk(self.system_prompt, config.segment_tokens) if self.system_prompt else ()
        self._doc_segments = tuple(chunk(d, config.segment_tokens) for d in self.documents)

    # -----------------------------------------------------------------------------------------
    def retrieve(self, rng: random.Random) -> Tuple[int, ...]:
        """Documents for one request, relevance order: Zipf-weighted sampling without replacement,
        keeping those that fit the prompt budget."""
        keyed = sorted(range(len(self.documents)),
                       key=lambda i: rng.random() ** (1.0 / self.popularity[i]), reverse=True)
        return self._pack(keyed)

    def _pack(self, candidates: Sequence[int]) -> Tuple[int, ...]:
        budget = self.config.doc_budget_tokens
        chosen = []
        for i in candidates:
            n = len(self.documents[i])
            if n <= budget:
                chosen.append(i)
                budget -= n
            if budget < self.config.doc_tokens_min:
                break
        return tuple(chosen)

    def _request(self, doc_ids: Sequence[int], rng: random.Random) -> RagRequest:
        cfg = self.config
        q = rng.randint(cfg.query_tokens_min, cfg.query_tokens_max)
        query = tuple(rng.randint(cfg.first_token_id, cfg.vocab_size - 1) for _ in range(q))
        segments: List[TokenIds] = list(self._system_segments)
        for i in doc_ids:
            segments.extend(self._doc_segments[i])
        return RagRequest(tuple(doc_ids), SegmentedPrompt(tuple(segments), query))

    def requests(self, num_requests: int, stream: str = "measure") -> List[RagRequest]:
        """``num_requests`` requests of the named stream (different streams are independent)."""
        _check_int("num_requests", num_requests, 0)
        rng = random.Random(f"rag-{stream}-{self.config.seed}")
        return [self._request(self.retrieve(rng), rng) for _ in range(num_requests)]

    def warmup_requests(self, max_sampled: int) -> List[RagRequest]:
        """Requests that leave every document seen at least once: up to ``max_sampled`` requests
        drawn from the trace (stopping early once the corpus is covered), then requests packing the
        still-unseen documents in popularity order."""
        _check_int("max_sampled", max_sampled, 0)
        rng = random.Random(f"rag-warmup-{self.config.seed}")
        seen: Set[int] = set()
        out: List[RagRequest] = []
        while len(out) < max_sampled and len(seen) < len(self.documents):
            req = self._request(self.retrieve(rng), rng)
            seen.update(req.doc_ids)
            out.append(req)
        unseen = [i for i in range(len(self.documents)) if i not in seen]
        while unseen:
            ids = self._pack(unseen)
            if not ids:  # cannot happen: every document fits an empty budget (config check)
                raise AssertionError("a document does not fit the prompt budget")
            out.append(self._request(ids, rng))
            taken = set(ids)
            unseen = [i for i in unseen if i not in taken]
        return out
