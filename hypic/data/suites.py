"""Deterministic multi-document suites: single-hop lookup, two-hop bridge, ordered summary.

Evaluation suites draw their documents from a fixed *pool* (built from the seed and split), with
Zipf-like popularity, so the same documents recur across requests in different orders and
positions — what a segment cache exploits. Training requests (``fresh_request``) build new documents
every time, so the model cannot memorise facts and must read them from the context.

Tasks:
- ``single_hop`` (TriviaQA-like): one fact of one document's subject; exact match.
- ``two_hop`` (HotpotQA-like): an attribute of the *mentor* of a subject: the mentor is named in the
  subject's document, the attribute in the mentor's own document. The answer spells out the bridge
  (``"<mentor> lives in <city>"``, see ``language.bridge_answer``); exact match needs both hops.
- ``order_lookup`` (a lookup that depends on document order): the subject of the passage right
  after the one about a given subject; exact match. Unlike ``single_hop`` its answer changes when
  the documents are reordered, so a cache that loses where a segment sits cannot answer it.
- ``summary`` (MultiNews/GovReport-like): the subjects of all documents in document order; ROUGE-L F1.
- ``copy`` (curriculum only): repeat a short word sequence; exact match.
- ``recall`` (curriculum only): associative recall over ``key value`` pairs of one document ("what
  follows KEY ?"), the induction-head pattern that single-hop lookup builds on; exact match.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from .language import (
    ATTRIBUTE_RELATIONS, COPY_QUESTION, RELATIONS, SUMMARY_QUESTION, Document, bridge_answer, bridge_phrase,
    check_document_lengths, check_split, copy_document, document_id, is_held_out_fact, ORDER_QUESTION,
    RECALL_QUESTION,
    recall_document,
    make_document, query_segment, question_text, random_facts, split_subjects,
)
from .request import Request
from .vocab import ANIMALS, CITIES, COLORS, JOBS, NAMES

# The default evaluation tasks (what `hypic bench quality` runs unless told otherwise, and what the
# embedded model is trained and evaluated on).
TASKS: Tuple[str, ...] = ("single_hop", "two_hop", "summary")
# Every evaluation task a suite can generate: order_lookup is opt-in (``--tasks``) because the
# embedded model does not solve it (490 training steps with it in the mix reached 7% training exact match).
SUITE_TASKS: Tuple[str, ...] = TASKS + ("order_lookup",)
ALL_TASKS: Tuple[str, ...] = SUITE_TASKS + ("copy", "recall")
TASK_METRICS = {
    "single_hop": "exact_match", "two_hop": "exact_match", "order_lookup": "exact_match", "summary": "rouge_l",
    "copy": "exact_match", "recall": "exact_match",
}
_RECALL_VALUES: Tuple[str, ...] = CITIES + JOBS + COLORS + ANIMALS
_COPY_WORDS: Tuple[str, ...] = NAMES + CITIES + JOBS + COLORS + ANIMALS


def check_task(task: str, allowed: Sequence[str]) -> None:
    """ValueError unless ``task`` is one of ``allowed``."""
    if task not in allowed:
        raise ValueError(f"task: {task!r} is not one of {tuple(allowed)}")


@dataclass(frozen=True)
class SuiteConfig:
    """Shape of an evaluation suite. Lengths are in tokens of the word-level tokenizer."""

    task: str
    split: str = "held_out"
    min_docs: int = 4
    max_docs: int = 16
    min_doc_tokens: int = 64
    max_doc_tokens: int = 256
    pool_size: int = 128
    zipf_exponent: float = 0.8
    seed: int = 0

    def __post_init__(self) -> None:
        check_task(self.task, SUITE_TASKS)
        check_split(self.split)
        if not isinstance(self.min_docs, int) or self.min_docs < 2:
            raise ValueError(f"min_docs: must be an int >= 2 (two-hop needs two documents), got {self.min_docs!r}")
        if not isinstance(self.max_docs, int) or self.max_docs < self.min_docs:
            raise ValueError(f"max_docs: must be an int >= min_docs={self.min_docs}, got {self.max_docs!r}")
        check_document_lengths(self.min_doc_tokens, self.max_doc_tokens)
        limit = len(split_subjects(self.split))
        if not isinstance(self.pool_size, int) or not (2 * self.max_docs <= self.pool_size <= limit):
            raise ValueError(
                f"pool_size: must be an int in [2*max_docs={2 * self.max_docs}, {limit}] "
                f"(subjects usable in split {self.split!r}), got {self.pool_size!r}"
            )
        if not isinstance(self.zipf_exponent, (int, float)) or self.zipf_exponent < 0:
            raise ValueError(f"zipf_exponent: must be a number >= 0, got {self.zipf_exponent!r}")
        if not isinstance(self.seed, int):
            raise ValueError(f"seed: must be an int, got {self.seed!r}")


class DocumentPool:
    """A fixed set of documents about distinct subjects; index 0 is the most popular (Zipf rank 1)."""

    def __init__(self, split: str, seed: int, pool_size: int, min_doc_tokens: int, max_doc_tokens: int):
        check_split(split)
        check_document_lengths(min_doc_tokens, max_doc_tokens)
        if not isinstance(pool_size, int) or pool_size < 2:
            raise ValueError(f"pool_size: must be an int >= 2, got {pool_size!r}")
        # A string seed is hashed with SHA-512 by random.Random: stable across runs and platforms.
        rng = random.Random(f"pool|{split}|{seed}|{pool_size}|{min_doc_tokens}|{max_doc_tokens}")
        eligible = split_subjects(split)
        if pool_size > len(eligible):
            raise ValueError(f"pool_size: {pool_size} exceeds the {len(eligible)} subjects usable in split {split!r}")
        subjects = rng.sample(eligible, pool_size)
        in_pool = set(subjects)
        documents: List[Document] = []
        want_held_out = split == "held_out"
        for subject in subjects:
            # Prefer a mentor inside the pool (a usable bridge); fall back to any name if no pool
            # subject gives a fact of this split.
            pool_mentors = [
                s for s in subjects if s != subject and is_held_out_fact(subject, "mentor", s) == want_held_out
            ]
            facts = random_facts(rng, subject, pool_mentors or NAMES, split)
            documents.append(make_document(rng, subject, facts, min_doc_tokens, max_doc_tokens))
        self.split = split
        self.documents: Tuple[Document, ...] = tuple(documents)
        self._index = {doc.subject: i for i, doc in enumerate(documents)}
        # Documents whose mentor has a document in the pool: possible first hops.
        self.bridge_sources: Tuple[int, ...] = tuple(
            i for i, doc in enumerate(documents) if doc.fact("mentor") in in_pool
        )
        if not self.bridge_sources:
            raise ValueError("pool_size: too small, no document's mentor is in the pool")

    def __len__(self) -> int:
        return len(self.documents)

    def index_of(self, subject: str) -> int:
        return self._index[subject]


def zipf_sample(
    rng: random.Random, pool_size: int, count: int, exponent: float, exclude: Sequence[int] = ()
) -> List[int]:
    """``count`` distinct pool indices, index i drawn with weight (i+1)^-exponent (Efraimidis-Spirakis)."""
    excluded = set(exclude)
    if count > pool_size - len(excluded):
        raise ValueError(f"count: {count} exceeds the {pool_size - len(excluded)} available documents")
    keys = []
    for i in range(pool_size):
        if i in excluded:
            continue
        weight = (i + 1) ** (-exponent)
        keys.append((rng.random() ** (1.0 / weight), i))
    keys.sort(reverse=True)
    return [i for _, i in keys[:count]]


def _request(task: str, docs: Sequence[Document], query: str, answer: str, request_id: str) -> Request:
    return Request(
        documents=tuple(d.text for d in docs),
        query=query,
        answers=(answer,),
        task=task,
        metric=TASK_METRICS[task],
        doc_ids=tuple(d.doc_id for d in docs),
        joiner=" ",
        request_id=request_id,
    )


def _single_hop(rng: random.Random, docs: List[Document], request_id: str) -> Request:
    target = rng.choice(docs)
    relation = rng.choice(RELATIONS)
    return _request("single_hop", docs, question_text(relation, target.subject), target.fact(relation), request_id)


def _two_hop(rng: random.Random, docs: List[Document], source: Document, bridge: Document, request_id: str) -> Request:
    if source.fact("mentor") != bridge.subject:
        raise ValueError("bridge: its subject must be the mentor named in the source document")
    relation = rng.choice(ATTRIBUTE_RELATIONS)
    query = question_text(relation, bridge_phrase(source.subject))
    return _request("two_hop", docs, query, bridge_answer(bridge.subject, relation, bridge.fact(relation)), request_id)


def _order_lookup(rng: random.Random, docs: List[Document], request_id: str) -> Request:
    if len(docs) < 2:
        raise ValueError("order_lookup: needs at least two documents")
    i = rng.randrange(len(docs) - 1)
    query = query_segment(ORDER_QUESTION.format(s=docs[i].subject))
    return _request("order_lookup", docs, query, docs[i + 1].subject, request_id)


def _one_set_request(task: str, rng: random.Random, docs: List[Document], request_id: str) -> Request:
    """A request of a task asked about an already drawn document set (every task but two-hop,
    whose set is drawn around its source and bridge)."""
    if task == "single_hop":
        return _single_hop(rng, docs, request_id)
    if task == "order_lookup":
        return _order_lookup(rng, docs, request_id)
    return _summary(docs, request_id)


def _summary(docs: List[Document], request_id: str) -> Request:
    answer = " ".join(d.subject for d in docs)
    return _request("summary", docs, query_segment(SUMMARY_QUESTION), answer, request_id)


def generate_suite(config: SuiteConfig, num_requests: int) -> List[Request]:
    """``num_requests`` requests of ``config.task``; the same config always gives the same list.

    All tasks of one (split, seed, pool size, document lengths) share one pool, so documents recur
    across tasks as well as across requests.
    """
    if not isinstance(config, SuiteConfig):
        raise ValueError(f"config: must be a SuiteConfig, got {type(config).__name__}")
    if not isinstance(num_requests, int) or num_requests < 0:
        raise ValueError(f"num_requests: must be an int >= 0, got {num_requests!r}")
    pool = DocumentPool(config.split, config.seed, config.pool_size, config.min_doc_tokens, config.max_doc_tokens)
    rng = random.Random(
        f"requests|{config.task}|{config.split}|{config.seed}|{config.min_docs}|{config.max_docs}|"
        f"{config.zipf_exponent}"
    )
    size = len(pool)
    sources = set(pool.bridge_sources)
    non_sources = [i for i in range(size) if i not in sources]
    requests = []
    for r in range(num_requests):
        request_id = f"{config.task}-{config.split}-{config.seed}-{r}"
        num_docs = rng.randint(config.min_docs, config.max_docs)
        if config.task == "two_hop":
            # The source is drawn by popularity among documents with an in-pool mentor.
            source_idx = zipf_sample(rng, size, 1, config.zipf_exponent, exclude=non_sources)[0]
            bridge_idx = pool.index_of(pool.documents[source_idx].fact("mentor"))
            others = zipf_sample(rng, size, num_docs - 2, config.zipf_exponent, exclude=[source_idx, bridge_idx])
            picked = [source_idx, bridge_idx] + others
            rng.shuffle(picked)
            docs = [pool.documents[i] for i in picked]
            requests.append(_two_hop(rng, docs, pool.documents[source_idx], pool.documents[bridge_idx], request_id))
            continue
        if config.task == "order_lookup":
            num_docs = max(num_docs, 2)
        picked = zipf_sample(rng, size, num_docs, config.zipf_exponent)
        rng.shuffle(picked)
        docs = [pool.documents[i] for i in picked]
        requests.append(_one_set_request(config.task, rng, docs, request_id))
    return requests


def fresh_request(
    rng: random.Random,
    task: str,
    num_docs: int,
    min_doc_tokens: int,
    max_doc_tokens: int,
    split: str = "train",
    copy_length: Tuple[int, int] = (2, 8),
    recall_pairs: Tuple[int, int] = (2, 8),
    request_id: str = "",
) -> Request:
    """A request over newly generated documents (training data; never reused across calls).

    Each document's mentor is another subject of the request half of the time (so bridges and
    look-alike bridges both occur), otherwise any name. ``copy`` and ``recall`` ignore the document
    arguments: one document of ``copy_length`` random words, or of ``recall_pairs`` (distinct name,
    random attribute) pairs.
    """
    check_task(task, ALL_TASKS)
    check_split(split)
    if task == "recall":
        low, high = recall_pairs
        if not 1 <= low <= high <= len(NAMES):
            raise ValueError(f"recall_pairs: must satisfy 1 <= low <= high <= {len(NAMES)}, got {recall_pairs}")
        keys = rng.sample(NAMES, rng.randint(low, high))
        pairs = [(k, rng.choice(_RECALL_VALUES)) for k in keys]
        key, value = rng.choice(pairs)
        text = recall_document(pairs)
        return Request(
            documents=(text,), query=query_segment(RECALL_QUESTION.format(key=key)), answers=(value,),
            task="recall", metric="exact_match", doc_ids=(document_id(text),), joiner=" ", request_id=request_id,
        )
    if task == "copy":
        low, high = copy_length
        if not 1 <= low <= high:
            raise ValueError(f"copy_length: must satisfy 1 <= low <= high, got {copy_length}")
        words = [rng.choice(_COPY_WORDS) for _ in range(rng.randint(low, high))]
        text = copy_document(words)
        return Request(
            documents=(text,), query=query_segment(COPY_QUESTION), answers=(" ".join(words),),
            task="copy", metric="exact_match", doc_ids=(document_id(text),), joiner=" ", request_id=request_id,
        )
    min_needed = 2 if task in ("two_hop", "order_lookup") else 1
    limit = len(split_subjects(split))
    if not isinstance(num_docs, int) or not min_needed <= num_docs <= limit:
        raise ValueError(f"num_docs: must be an int in [{min_needed}, {limit}] for {task}, got {num_docs!r}")
    subjects = rng.sample(split_subjects(split), num_docs)
    want_held_out = split == "held_out"
    bridge_pair: Optional[Tuple[int, int]] = None
    if task == "two_hop":
        source = 0
        candidates = [j for j in range(1, num_docs)
                      if is_held_out_fact(subjects[0], "mentor", subjects[j]) == want_held_out]
        if not candidates:
            # Swap in a different name for document 1 until the bridge fact falls in the split.
            in_use = set(subjects)
            for name in rng.sample(split_subjects(split), len(split_subjects(split))):
                if name not in in_use and is_held_out_fact(subjects[0], "mentor", name) == want_held_out:
                    subjects[1] = name
                    break
            candidates = [1]
        bridge_pair = (source, rng.choice(candidates))
    docs: List[Document] = []
    for i, subject in enumerate(subjects):
        others = [s for s in subjects if s != subject]
        if bridge_pair is not None and i == bridge_pair[0]:
            mentor_pool: Sequence[str] = [subjects[bridge_pair[1]]]
        elif others and rng.random() < 0.5 and any(
            is_held_out_fact(subject, "mentor", s) == want_held_out for s in others
        ):
            mentor_pool = others
        else:
            mentor_pool = NAMES
        facts = random_facts(rng, subject, mentor_pool, split)
        docs.append(make_document(rng, subject, facts, min_doc_tokens, max_doc_tokens))
    if task == "two_hop":
        source_doc, bridge_doc = docs[bridge_pair[0]], docs[bridge_pair[1]]
        rng.shuffle(docs)
        return _two_hop(rng, docs, source_doc, bridge_doc, request_id)
    rng.shuffle(docs)
    return _one_set_request(task, rng, docs, request_id)
