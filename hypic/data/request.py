"""The request type shared by the synthetic suites and the LongBench-format loader."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from hypic.pic.segments import PIC_SEP  # the separator clients put between segments (query last)

METRICS: Tuple[str, ...] = ("exact_match", "token_f1", "rouge_l")


@dataclass(frozen=True)
class Request:
    """One multi-document request.

    documents: the context segments, in prompt order (each a cacheable segment).
    query: the question, always the last segment.
    answers: reference answers; a prediction is scored against each and the best score is kept.
    task: suite name (``single_hop``, ``two_hop``, ``summary``, ``copy``, or a LongBench dataset).
    metric: one of :data:`METRICS`, the task's scoring function.
    doc_ids: a stable id per document (equal ids = the same document text), for reuse statistics.
    joiner: the text placed between segments in the unsegmented prompt (:meth:`plain_text`).
    request_id: a stable id of this request.
    """

    documents: Tuple[str, ...]
    query: str
    answers: Tuple[str, ...]
    task: str
    metric: str
    doc_ids: Tuple[str, ...]
    joiner: str = " "
    request_id: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.documents, tuple) or not all(isinstance(d, str) for d in self.documents):
            raise ValueError("documents: must be a tuple of strings")
        if not self.documents:
            raise ValueError("documents: a request needs at least one document")
        for i, doc in enumerate(self.documents):
            if not doc.strip():
                raise ValueError(f"documents[{i}]: is empty")
            if PIC_SEP in doc:
                raise ValueError(f"documents[{i}]: contains the segment separator {PIC_SEP!r}")
        if not isinstance(self.query, str) or not self.query.strip():
            raise ValueError("query: must be a non-empty string")
        if PIC_SEP in self.query:
            raise ValueError(f"query: contains the segment separator {PIC_SEP!r}")
        if not isinstance(self.answers, tuple) or not self.answers:
            raise ValueError("answers: must be a non-empty tuple of strings")
        if not all(isinstance(a, str) for a in self.answers):
            raise ValueError("answers: must contain only strings")
        if self.metric not in METRICS:
            raise ValueError(f"metric: {self.metric!r} is not one of {METRICS}")
        if not isinstance(self.doc_ids, tuple) or len(self.doc_ids) != len(self.documents):
            raise ValueError(
                f"doc_ids: must be a tuple with one id per document ({len(self.documents)}), "
                f"got {self.doc_ids!r:.80}"
            )
        if not isinstance(self.joiner, str):
            raise ValueError("joiner: must be a string")

    @property
    def num_documents(self) -> int:
        return len(self.documents)

    def prompt(self) -> str:
        """The segmented prompt: documents then the query, separated by :data:`PIC_SEP`."""
        return PIC_SEP.join(self.documents + (self.query,))

    def plain_text(self) -> str:
        """The unsegmented prompt for full recompute: ``prompt().replace(PIC_SEP, joiner)``."""
        return self.joiner.join(self.documents + (self.query,))

    def segments(self) -> Tuple[str, ...]:
        """Documents followed by the query (the pieces of :meth:`prompt`)."""
        return self.documents + (self.query,)
