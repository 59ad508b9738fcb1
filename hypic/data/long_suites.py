"""Long multi-document suites (RULER-style): 16-64 documents, 4-8k tokens, answers that depend on order.

Tasks (exact match each; the events are those of :mod:`hypic.data.long_language`):

- ``multi_key``: "what are the codes of A and B ?" -- each key is recorded in several documents with
  different values among records of other keys (distractors); the answer is each key's *last*
  value in prompt order (``"57 12"``).
- ``variable_tracking``: "what is the value of var X ?" -- X got its value through a chain of
  ``var X = var Y`` copies whose source was set in an earlier document, while the variables on the
  chain are reassigned elsewhere; a copy reads the source's value at that point of the prompt.
- ``doc_order``: "who follows S in order ?" / "who precedes S in order ?" -- the subject of the
  passage right after / before the one about S.
- ``counting``: "how many times did the O ring since it was last silenced ?" -- rings of one of the
  counters, over every document after the last one that silences it.

Every request is built so that reversing the order of its documents changes its answer (or leaves
none): no reader that ignores the documents' order or reads each without its predecessors can be
right on all of them. :func:`hypic.data.long_oracle.order_blind_bound` measures how often such a
reader can be right at best.

Evaluation suites draw documents from a fixed pool (seed and split) with Zipf popularity, so the
same documents recur across requests in other orders and positions; a request of ``n`` documents
and ``T`` context tokens takes documents of about ``T / n`` tokens. Training requests
(:func:`fresh_long_request`) build new documents every time.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .language import check_split, query_segment, split_subjects
from .long_language import (
    CODE_KEYS, COUNT_QUESTION, FOLLOWS_QUESTION, MULTI_KEY_QUESTION, PRECEDES_QUESTION, VARIABLE_QUESTION,
    LongDocument, make_long_document, random_events, read_events,
)
from .long_vocab import COUNTER_OBJECTS, VARIABLES
from .request import Request
from .suites import check_task, zipf_sample

LONG_TASKS: Tuple[str, ...] = ("multi_key", "variable_tracking", "doc_order", "counting")
# Keys, variables and counters a pool's documents use: few enough that a request of 16 documents
# records most keys more than once (the multi-key and variable questions need repeated writes).
POOL_KEYS = 24
POOL_VARIABLES = 24
POOL_OBJECTS = 4
# Event counts per document: (low, high) of each kind.
EVENT_COUNTS: Dict[str, Tuple[int, int]] = {"code": (1, 2), "set": (0, 2), "copy": (0, 2), "ring": (0, 2),
                                            "silence": (0, 1)}
# A document takes length within this factor of T / n (a request of n documents, T tokens).
LENGTH_TOLERANCE = 1.25
_QUERY_TRIES = 30


@dataclass(frozen=True)
class LongSuiteConfig:
    """Shape of a long evaluation suite. Lengths are in tokens of the word-level tokenizer."""

    task: str
    split: str = "held_out"
    min_docs: int = 16
    max_docs: int = 64
    min_context_tokens: int = 4096
    max_context_tokens: int = 8192
    pool_size: int = 1024
    zipf_exponent: float = 0.8
    seed: int = 0

    def __post_init__(self) -> None:
        check_task(self.task, LONG_TASKS)
        check_split(self.split)
        if not isinstance(self.min_docs, int) or self.min_docs < 3:
            raise ValueError(f"min_docs: must be an int >= 3 (an order question needs a passage on each side), "
                             f"got {self.min_docs!r}")
        if not isinstance(self.max_docs, int) or self.max_docs < self.min_docs:
            raise ValueError(f"max_docs: must be an int >= min_docs={self.min_docs}, got {self.max_docs!r}")
        if not isinstance(self.min_context_tokens, int) or self.min_context_tokens < 32 * self.min_docs:
            raise ValueError(f"min_context_tokens: must be an int >= 32 * min_docs = {32 * self.min_docs}, "
                             f"got {self.min_context_tokens!r}")
        if not isinstance(self.max_context_tokens, int) or self.max_context_tokens < self.min_context_tokens:
            raise ValueError(f"max_context_tokens: must be an int >= min_context_tokens, "
                             f"got {self.max_context_tokens!r}")
        if not isinstance(self.pool_size, int) or self.pool_size < 4 * self.max_docs:
            raise ValueError(f"pool_size: must be an int >= 4 * max_docs = {4 * self.max_docs}, got {self.pool_size!r}")
        if not isinstance(self.zipf_exponent, (int, float)) or self.zipf_exponent < 0:
            raise ValueError(f"zipf_exponent: must be a number >= 0, got {self.zipf_exponent!r}")
        if not isinstance(self.seed, int):
            raise ValueError(f"seed: must be an int, got {self.seed!r}")

    @property
    def doc_token_range(self) -> Tuple[int, int]:
        """Document lengths the pool spans: every request's T / n within the tolerance."""
        low = self.min_context_tokens / self.max_docs / LENGTH_TOLERANCE
        high = self.max_context_tokens / self.min_docs * LENGTH_TOLERANCE
        return max(1, math.floor(low)), math.ceil(high)


@dataclass(frozen=True)
class Namespace:
    """The keys, variables and counters documents may use."""

    keys: Tuple[str, ...]
    variables: Tuple[str, ...]
    objects: Tuple[str, ...]


def pool_namespace() -> Namespace:
    return Namespace(CODE_KEYS[:POOL_KEYS], VARIABLES[:POOL_VARIABLES], COUNTER_OBJECTS[:POOL_OBJECTS])


def _event_counts(rng: random.Random) -> Dict[str, int]:
    return {kind: rng.randint(low, high) for kind, (low, high) in EVENT_COUNTS.items()}


def _document(rng: random.Random, subject: str, split: str, namespace: Namespace, target_tokens: int) -> LongDocument:
    events = random_events(rng, split, _event_counts(rng), namespace.keys, namespace.variables, namespace.objects)
    return make_long_document(rng, subject, events, target_tokens)


class LongDocumentPool:
    """Documents about distinct subjects with lengths log-uniform over ``doc_token_range``; index 0
    is the most popular (Zipf rank 1)."""

    def __init__(self, config: LongSuiteConfig):
        self.config = config
        low, high = config.doc_token_range
        rng = random.Random(f"long-pool|{config.split}|{config.seed}|{config.pool_size}|{low}|{high}")
        subjects = list(split_subjects(config.split))
        if config.pool_size > len(subjects):
            # Subjects repeat across documents beyond the name list; a request never holds two
            # documents about one subject (order questions name passages by subject).
            subjects = subjects * math.ceil(config.pool_size / len(subjects))
        rng.shuffle(subjects)
        namespace = pool_namespace()
        documents = []
        for i in range(config.pool_size):
            target = round(math.exp(rng.uniform(math.log(low), math.log(high))))
            documents.append(_document(rng, subjects[i], config.split, namespace, target))
        self.documents: Tuple[LongDocument, ...] = tuple(documents)
        self._lengths = [d.num_tokens for d in documents]

    def __len__(self) -> int:
        return len(self.documents)

    def pick(self, rng: random.Random, num_docs: int, context_tokens: int, exponent: float) -> List[LongDocument]:
        """``num_docs`` documents about distinct subjects, of about ``context_tokens / num_docs``
        tokens each, drawn by popularity; the tolerance widens until enough documents qualify."""
        per_doc = context_tokens / num_docs
        tolerance = LENGTH_TOLERANCE
        while True:
            eligible = [i for i, n in enumerate(self._lengths) if per_doc / tolerance <= n <= per_doc * tolerance]
            if len(eligible) >= 2 * num_docs or tolerance > 8:
                break
            tolerance *= 1.25
        excluded = set(range(len(self.documents))) - set(eligible)
        picked: List[LongDocument] = []
        subjects: set = set()
        for index in zipf_sample(rng, len(self.documents), len(eligible), exponent, excluded):
            doc = self.documents[index]
            if doc.subject not in subjects:
                picked.append(doc)
                subjects.add(doc.subject)
            if len(picked) == num_docs:
                return picked
        raise ValueError(f"pool: too few documents of about {per_doc:.0f} tokens about distinct subjects")


# ---- questions ------------------------------------------------------------------------------


def _multi_key(rng: random.Random, docs: Sequence[LongDocument]) -> Optional[Tuple[str, str]]:
    state, reverse = read_events(d.events for d in docs), read_events(d.events for d in reversed(docs))
    candidates = sorted(k for k, writes in state.code_writes.items()
                        if len(writes) >= 2 and state.codes[k] != reverse.codes[k])
    if len(candidates) < 2:
        return None
    a, b = rng.sample(candidates, 2)
    return MULTI_KEY_QUESTION.format(a=a, b=b), f"{state.codes[a]} {state.codes[b]}"


def _variable_tracking(rng: random.Random, docs: Sequence[LongDocument]) -> Optional[Tuple[str, str]]:
    state, reverse = read_events(d.events for d in docs), read_events(d.events for d in reversed(docs))
    candidates = sorted(x for x, value in state.variables.items()
                        if value is not None and state.copied_across.get(x) and reverse.variables.get(x) != value)
    if not candidates:
        return None
    x = rng.choice(candidates)
    return VARIABLE_QUESTION.format(x=x), str(state.variables[x])


def _doc_order(rng: random.Random, docs: Sequence[LongDocument]) -> Optional[Tuple[str, str]]:
    if len(docs) < 3:
        return None
    i = rng.randrange(1, len(docs) - 1)
    if rng.random() < 0.5:
        return FOLLOWS_QUESTION.format(s=docs[i].subject), docs[i + 1].subject
    return PRECEDES_QUESTION.format(s=docs[i].subject), docs[i - 1].subject


def _counting(rng: random.Random, docs: Sequence[LongDocument]) -> Optional[Tuple[str, str]]:
    state, reverse = read_events(d.events for d in docs), read_events(d.events for d in reversed(docs))
    candidates = sorted(o for o in state.counters
                        if state.silenced.get(o) and state.counters[o] != reverse.counters.get(o)
                        and state.counters[o] < 100)
    if not candidates:
        return None
    o = rng.choice(candidates)
    return COUNT_QUESTION.format(o=o), str(state.counters[o])


QUESTIONS: Dict[str, Callable[[random.Random, Sequence[LongDocument]], Optional[Tuple[str, str]]]] = {
    "multi_key": _multi_key, "variable_tracking": _variable_tracking, "doc_order": _doc_order, "counting": _counting,
}


def _request(task: str, docs: Sequence[LongDocument], question: str, answer: str, request_id: str) -> Request:
    return Request(documents=tuple(d.text for d in docs), query=query_segment(question), answers=(answer,),
                   task=task, metric="exact_match", doc_ids=tuple(d.doc_id for d in docs), joiner=" ",
                   request_id=request_id)


def ask(task: str, rng: random.Random, docs: List[LongDocument]) -> Optional[Tuple[str, str]]:
    """A question of ``task`` about ``docs`` in their order, shuffling them (in place) until one
    exists; None after :data:`_QUERY_TRIES` orders."""
    if task not in QUESTIONS:
        raise ValueError(f"task: {task!r} is not one of {LONG_TASKS}")
    for _ in range(_QUERY_TRIES):
        asked = QUESTIONS[task](rng, docs)
        if asked is not None:
            return asked
        rng.shuffle(docs)
    return None


def generate_long_suite(config: LongSuiteConfig, num_requests: int) -> List[Request]:
    """``num_requests`` requests of ``config.task``; the same config always gives the same list.
    All tasks of one (split, seed, pool size, lengths) share one pool."""
    if not isinstance(config, LongSuiteConfig):
        raise ValueError(f"config: must be a LongSuiteConfig, got {type(config).__name__}")
    if not isinstance(num_requests, int) or num_requests < 0:
        raise ValueError(f"num_requests: must be an int >= 0, got {num_requests!r}")
    pool = LongDocumentPool(config)
    rng = random.Random(f"long-requests|{config.task}|{config.split}|{config.seed}|{config.min_docs}|"
                        f"{config.max_docs}|{config.min_context_tokens}|{config.max_context_tokens}|"
                        f"{config.zipf_exponent}")
    requests = []
    while len(requests) < num_requests:
        num_docs = rng.randint(config.min_docs, config.max_docs)
        context = rng.randint(config.min_context_tokens, config.max_context_tokens)
        docs = pool.pick(rng, num_docs, context, config.zipf_exponent)
        if not config.min_context_tokens <= sum(d.num_tokens for d in docs) <= config.max_context_tokens:
            continue  # lengths drawn at the edge of the range: draw again, the range is a promise
        rng.shuffle(docs)
        asked = ask(config.task, rng, docs)
        if asked is None:
            continue  # these documents hold no such question in any order tried: draw others
        request_id = f"{config.task}-{config.split}-{config.seed}-{len(requests)}"
        requests.append(_request(config.task, docs, asked[0], asked[1], request_id))
    return requests


def fresh_namespace(rng: random.Random, num_docs: int) -> Namespace:
    """Keys, variables and counters for a request of ``num_docs`` new documents: about as many keys
    and variables as documents (so repeats are common at every size), two to four counters."""
    size = max(2, min(len(CODE_KEYS), num_docs))
    variables = max(3, min(len(VARIABLES), size))
    return Namespace(tuple(rng.sample(CODE_KEYS, size)), tuple(rng.sample(VARIABLES, variables)),
                     tuple(rng.sample(COUNTER_OBJECTS, rng.randint(2, 4))))


def fresh_long_request(rng: random.Random, task: str, num_docs: int, context_tokens: int, split: str = "train",
                       request_id: str = "") -> Request:
    """A request of ``task`` over ``num_docs`` new documents of about ``context_tokens`` tokens in
    all (training data; never reused). New documents are drawn until the task has a question."""
    check_task(task, LONG_TASKS)
    if not isinstance(num_docs, int) or num_docs < 3:
        raise ValueError(f"num_docs: must be an int >= 3, got {num_docs!r}")
    if not isinstance(context_tokens, int) or context_tokens < num_docs:
        raise ValueError(f"context_tokens: must be an int >= num_docs, got {context_tokens!r}")
    check_split(split)
    per_doc = context_tokens / num_docs
    subjects = split_subjects(split)
    for _ in range(1000):
        namespace = fresh_namespace(rng, num_docs)
        docs = [_document(rng, subject, split, namespace,
                          max(1, round(per_doc * rng.uniform(1 / LENGTH_TOLERANCE, LENGTH_TOLERANCE))))
                for subject in rng.sample(subjects, num_docs)]
        asked = ask(task, rng, docs)
        if asked is not None:
            return _request(task, docs, asked[0], asked[1], request_id)
    raise RuntimeError(f"no {task} question over {num_docs} new documents after 1000 draws")  # pragma: no cover
