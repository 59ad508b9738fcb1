"""The recipe of the long-context embedded model: its shape, its curriculum, and its batches.

Shape (Qwen3.5 layout, :class:`tiny_model.ModelShape`): 12 layers, 3 Gated DeltaNet : 1 full gated
attention (layers 4, 8, 12), hidden 256, MLP 512, GDN 4 x 64 heads, attention 4 x 64 heads with 2
K/V heads, partial RoPE, tied embeddings over the extended word-level vocabulary
(:func:`hypic.data.long_vocab.extended_vocabulary`, 855 words: ``tiny``'s 665 with the same ids,
then the long tasks' words): 8.73 M parameters, 17.5 MB in bf16 to ship. The size is set by what a
device call carries: the exact training checkpoint (fp32 weights and the optimiser's factored
second moments, :mod:`long_checkpoint`) is 35 MB, which with the 18 MB working tree stays under the
64 MiB a call carries, in three files of at most 15 MiB (the 16 MiB a returned file may have).

Curriculum (``hypic.data`` tasks; a stage moves on once every task's running training exact match
reaches its threshold after ``min_steps``, or after ``max_steps``): induction first (copy and
associative recall, one-token keys, short fact-only documents: the phase transition a naive recipe
never reached, ../shared/reference/embedded-model-training.md), then the four long tasks over 3-4
short documents, then more and longer documents up to the evaluation shape (16-64 documents,
4-8k tokens). A recall share stays in every stage.

Batches are a pure function of (seed, stage, batch index): a resumed run draws exactly the batches
an uninterrupted one would, whatever the number of data-loading workers.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from hypic.data.language import BASE_DOCUMENT_TOKENS
from hypic.data.long_suites import LENGTH_TOLERANCE, LONG_TASKS, fresh_long_request
from hypic.data.request import Request
from hypic.data.suites import ALL_TASKS, fresh_request
from hypic.data.training import TrainingSample, encode_request
from tiny_model import TINY_SMOKE_SHAPE, ModelShape

LONG_SHAPE = ModelShape(hidden_size=256, num_layers=12, intermediate_size=512, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=4,
                        linear_head_dim=64, full_attention_interval=4, partial_rotary_factor=0.25,
                        max_position_embeddings=16384)
SMOKE_SHAPE = TINY_SMOKE_SHAPE
SHORT_TASKS: Tuple[str, ...] = tuple(t for t in ALL_TASKS if t not in LONG_TASKS)


@dataclass(frozen=True)
class LongStage:
    """One curriculum stage. Long tasks take ``min_docs..max_docs`` documents and
    ``min_context_tokens..max_context_tokens`` document tokens; short tasks (copy, recall,
    single_hop, ...) ``min_docs..max_docs`` documents of ``short_doc_tokens``."""

    name: str
    task_weights: Tuple[Tuple[str, float], ...]
    min_docs: int
    max_docs: int
    min_context_tokens: int
    max_context_tokens: int
    advance_accuracy: Optional[float]
    min_steps: int
    max_steps: Optional[int] = None
    short_doc_tokens: Tuple[int, int] = (BASE_DOCUMENT_TOKENS, BASE_DOCUMENT_TOKENS)

    def __post_init__(self) -> None:
        for task, weight in self.task_weights:
            if task not in LONG_TASKS + SHORT_TASKS or not weight > 0:
                raise ValueError(f"task_weights: ({task!r}, {weight}) is not a known task with weight > 0")
        if not 1 <= self.min_docs <= self.max_docs:
            raise ValueError(f"min_docs/max_docs: need 1 <= min_docs <= max_docs, got {self.min_docs}, {self.max_docs}")
        if any(t in LONG_TASKS for t, _ in self.task_weights) and self.min_docs < 3:
            raise ValueError("min_docs: long tasks need at least 3 documents")
        if not 0 < self.min_context_tokens <= self.max_context_tokens:
            raise ValueError("min_context_tokens/max_context_tokens: need 0 < min <= max")
        if self.advance_accuracy is not None and not 0 < self.advance_accuracy <= 1:
            raise ValueError(f"advance_accuracy: must be None or in (0, 1], got {self.advance_accuracy}")
        if self.max_steps is not None and self.max_steps < self.min_steps:
            raise ValueError("max_steps: must be None or >= min_steps")

    @property
    def tasks(self) -> Tuple[str, ...]:
        return tuple(t for t, _ in self.task_weights)


_LONG_MIX = (("multi_key", 0.22), ("variable_tracking", 0.22), ("doc_order", 0.22), ("counting", 0.22),
             ("recall", 0.12))
LONG_CURRICULUM: Tuple[LongStage, ...] = (
    LongStage("induction", (("copy", 0.2), ("recall", 0.45), ("single_hop", 0.35)), 1, 3, 36, 108, 0.9, 300, 6000),
    LongStage("order_short", _LONG_MIX, 3, 4, 120, 400, 0.8, 500, 8000),
    LongStage("order_medium", _LONG_MIX, 4, 8, 400, 1500, 0.8, 500, 6000),
    LongStage("order_long", _LONG_MIX, 8, 16, 1500, 4000, 0.75, 500, 6000),
    LongStage("full", _LONG_MIX, 16, 64, 4096, 8192, None, 0),
)
# The same stages at CPU-test sizes (a smoke run passes through two of them in a few steps).
SMOKE_CURRICULUM: Tuple[LongStage, ...] = (
    LongStage("induction", (("copy", 0.5), ("recall", 0.5)), 1, 1, 36, 36, 0.9, 0, 2),
    LongStage("order_short", _LONG_MIX, 3, 3, 60, 90, None, 0),
)


def sample_request(rng: random.Random, task: str, stage: LongStage, split: str = "train") -> Request:
    """One fresh request of ``task`` at ``stage``'s shape."""
    num_docs = rng.randint(stage.min_docs, stage.max_docs)
    if task in LONG_TASKS:
        return fresh_long_request(rng, task, num_docs, rng.randint(stage.min_context_tokens, stage.max_context_tokens),
                                  split=split)
    low, high = stage.short_doc_tokens
    return fresh_request(rng, task, max(num_docs, 2) if task == "two_hop" else num_docs, low, high, split=split)


def stage_max_tokens(stage: LongStage) -> int:
    """The longest sample a stage can draw: its documents (a long request's documents run up to
    ``LENGTH_TOLERANCE`` over their share) plus a question, an answer and ``<bos>``."""
    short = stage.max_docs * stage.short_doc_tokens[1]
    long = math.ceil(stage.max_context_tokens * LENGTH_TOLERANCE) + 4 * stage.max_docs
    return max(short, long if any(t in LONG_TASKS for t in stage.tasks) else 0) + 64


def stage_batch_size(stage: LongStage, batch_tokens: int, max_batch: int) -> int:
    """Samples per batch of a stage: as many of its longest samples as fit ``batch_tokens`` (a
    fixed count, so no sample length is more likely to be left out than another)."""
    return max(1, min(max_batch, batch_tokens // stage_max_tokens(stage)))


def stage_batch(seed: int, stage_index: int, stage: LongStage, batch_index: int, vocab: Dict[str, int],
                batch_size: int) -> List[TrainingSample]:
    """Batch ``batch_index`` of a stage: ``batch_size`` samples from one RNG seeded by (seed, stage,
    index)."""
    rng = random.Random(f"long-batch|{seed}|{stage_index}|{stage.name}|{batch_index}")
    tasks, weights = list(stage.tasks), [w for _, w in stage.task_weights]
    return [encode_request(sample_request(rng, rng.choices(tasks, weights)[0], stage), vocab,
                           add_bos=rng.random() < 0.5) for _ in range(batch_size)]


def eval_requests(stage: LongStage, count: int, seed: int) -> Dict[str, List[Request]]:
    """Held-out requests of each task of ``stage`` at its shape (fixed per stage and seed)."""
    rng = random.Random(f"long-eval|{stage.name}|{seed}")
    return {task: [sample_request(rng, task, stage, split="held_out") for _ in range(count)] for task in stage.tasks}


def check_curriculum(stages: Sequence[LongStage]) -> None:
    if not stages or stages[-1].advance_accuracy is not None:
        raise ValueError("curriculum: the last stage must have advance_accuracy None (it is final)")
