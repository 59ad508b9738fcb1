"""Training data for the embedded model: a curriculum of task mixes and tokenised samples.

Each sample is one full, unsegmented sequence ``[<bos>] plain_text answer <eos>`` (the same text a
full-recompute prompt has, followed by the reference answer) with a mask marking the answer tokens
and the final ``<eos>``: the trainer puts the LM loss on every token and extra weight on those.
``<bos>`` is prepended to a random half of the samples, so the model works whether or not a serving
engine adds one.

The curriculum (after ../shared/reference/embedded-model-training.md: a naive recipe never learned
in-context retrieval) starts with copying, associative recall and one to three fact-only documents,
then adds filler, more documents, two-hop bridges and summaries; it keeps some earlier tasks.
A first GPU try (2,300 steps) showed why the subject binding needs pressure: with 1-2 fact-only
documents the model reached 100% on one document but ~64% on two (the right relation, a random
document), so stage 1 now has up to 3 documents and a stage advances only when every task is good.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Dict, Iterator, List, Sequence, Tuple

from .language import BASE_DOCUMENT_TOKENS, check_document_lengths
from .request import Request
from .suites import ALL_TASKS, fresh_request
from .vocab import BOS_TOKEN, EOS_TOKEN, vocabulary


@dataclass(frozen=True)
class CurriculumStage:
    """One training stage: a task mix and request shape, and when to move on.

    task_weights: (task, weight) pairs, weights > 0.
    advance_accuracy: move to the next stage once the running answer exact match on training batches
        reaches this (0-1) for *every* task of the mix and at least ``min_steps`` steps were spent
        here; None = final stage.
    max_steps: move on after this many steps even if the accuracy is not reached (None = never), so
        a time-limited run cannot stall in one stage.
    """

    name: str
    task_weights: Tuple[Tuple[str, float], ...]
    min_docs: int
    max_docs: int
    min_doc_tokens: int
    max_doc_tokens: int
    advance_accuracy: float | None
    min_steps: int
    max_steps: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name: must be non-empty")
        if not self.task_weights:
            raise ValueError("task_weights: must name at least one task")
        for task, weight in self.task_weights:
            if task not in ALL_TASKS:
                raise ValueError(f"task_weights: task {task!r} is not one of {ALL_TASKS}")
            if not weight > 0:
                raise ValueError(f"task_weights: weight of {task!r} must be > 0, got {weight}")
        if not isinstance(self.min_docs, int) or not 1 <= self.min_docs <= self.max_docs:
            raise ValueError(f"min_docs/max_docs: need 1 <= min_docs <= max_docs, got {self.min_docs}, {self.max_docs}")
        check_document_lengths(self.min_doc_tokens, self.max_doc_tokens)
        if self.advance_accuracy is not None and not 0 < self.advance_accuracy <= 1:
            raise ValueError(f"advance_accuracy: must be None or in (0, 1], got {self.advance_accuracy}")
        if not isinstance(self.min_steps, int) or self.min_steps < 0:
            raise ValueError(f"min_steps: must be an int >= 0, got {self.min_steps!r}")
        if self.max_steps is not None and (not isinstance(self.max_steps, int) or self.max_steps < self.min_steps):
            raise ValueError(f"max_steps: must be None or an int >= min_steps, got {self.max_steps!r}")


CURRICULUM: Tuple[CurriculumStage, ...] = (
    # Copying, associative recall and fact-only documents: the format and induction-style lookup.
    # 1-3 documents, so that most lookups need the subject, not just the relation, to be bound.
    CurriculumStage("copy_and_lookup", (("copy", 0.15), ("recall", 0.35), ("single_hop", 0.5)), 1, 3,
                    BASE_DOCUMENT_TOKENS, BASE_DOCUMENT_TOKENS, 0.9, 300, 8000),
    # A few short documents with filler: lookup among distractors.
    CurriculumStage("short_lookup", (("copy", 0.05), ("recall", 0.1), ("single_hop", 0.65), ("summary", 0.2)),
                    2, 4, BASE_DOCUMENT_TOKENS, 96, 0.9, 300, 8000),
    # Bridges and more documents. Capped at 2,000 steps: the evaluation shape (next stage) is what
    # the model must master, and a device budget of a few calls cannot wait for the ordered summary
    # (16% after the first 90 steps here) to pass 85% first.
    CurriculumStage("bridge", (("recall", 0.05), ("single_hop", 0.4), ("two_hop", 0.4), ("summary", 0.15)),
                    2, 8, 48, 160, 0.85, 500, 2000),
    # The evaluation shape: 4-16 documents of 64-256 tokens. (Adding order_lookup
    # at 0.3 from step 3,962 gave 7% training exact match after 490 steps, and the other tasks slipped;
    # those weights were not kept. See training/README.md.)
    CurriculumStage("full", (("single_hop", 0.35), ("two_hop", 0.45), ("summary", 0.2)), 4, 16,
                    64, 256, None, 0),
)


@dataclass(frozen=True)
class TrainingSample:
    """A tokenised sequence and its answer mask (True where the token is part of the answer or the
    final ``<eos>``; the model's prediction of token i comes from position i-1)."""

    input_ids: Tuple[int, ...]
    answer_mask: Tuple[bool, ...]
    task: str

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.answer_mask):
            raise ValueError(
                f"answer_mask: length {len(self.answer_mask)} differs from input_ids length {len(self.input_ids)}"
            )
        if not any(self.answer_mask):
            raise ValueError("answer_mask: marks no token")


def encode_request(request: Request, vocab: Dict[str, int], add_bos: bool) -> TrainingSample:
    """``[<bos>] plain_text answers[0] <eos>`` as ids (word-level: split on whitespace).

    Equal to the word-level tokenizer's ids for the same text (a test checks it); mapping words with
    a dict is faster than the tokenizer in the data-loading loop.
    """
    if not isinstance(request, Request):
        raise ValueError(f"request: must be a Request, got {type(request).__name__}")
    prompt_words = request.plain_text().split()
    answer_words = request.answers[0].split() + [EOS_TOKEN]
    if add_bos:
        prompt_words = [BOS_TOKEN] + prompt_words
    try:
        ids = [vocab[w] for w in prompt_words + answer_words]
    except KeyError as err:
        raise ValueError(f"request: word {err.args[0]!r} is not in the vocabulary") from None
    mask = [False] * len(prompt_words) + [True] * len(answer_words)
    return TrainingSample(input_ids=tuple(ids), answer_mask=tuple(mask), task=request.task)


class TrainingStream:
    """An endless, seeded stream of training samples for one curriculum stage (train split only)."""

    def __init__(self, stage: CurriculumStage, seed: int, bos_probability: float = 0.5):
        if not isinstance(stage, CurriculumStage):
            raise ValueError(f"stage: must be a CurriculumStage, got {type(stage).__name__}")
        if not 0.0 <= bos_probability <= 1.0:
            raise ValueError(f"bos_probability: must be in [0, 1], got {bos_probability}")
        self.stage = stage
        self.bos_probability = bos_probability
        self._rng = random.Random(f"train|{stage.name}|{seed}")
        self._vocab = vocabulary()
        self._tasks = [t for t, _ in stage.task_weights]
        self._weights = [w for _, w in stage.task_weights]
        self._count = 0

    def next_request(self) -> Request:
        rng, stage = self._rng, self.stage
        task = rng.choices(self._tasks, self._weights)[0]
        num_docs = rng.randint(stage.min_docs, stage.max_docs)
        if task in ("two_hop", "order_lookup"):
            num_docs = max(num_docs, 2)
        self._count += 1
        return fresh_request(rng, task, num_docs, stage.min_doc_tokens, stage.max_doc_tokens,
                             split="train", request_id=f"train-{stage.name}-{self._count}")

    def next_sample(self) -> TrainingSample:
        request = self.next_request()
        return encode_request(request, self._vocab, add_bos=self._rng.random() < self.bos_probability)

    def __iter__(self) -> Iterator[TrainingSample]:
        while True:
            yield self.next_sample()

    def take(self, count: int) -> List[TrainingSample]:
        if not isinstance(count, int) or count < 0:
            raise ValueError(f"count: must be an int >= 0, got {count!r}")
        return [self.next_sample() for _ in range(count)]


def stage_by_name(name: str, stages: Sequence[CurriculumStage] = CURRICULUM) -> int:
    for i, stage in enumerate(stages):
        if stage.name == name:
            return i
    raise ValueError(f"name: no curriculum stage {name!r}; stages are {[s.name for s in stages]}")
