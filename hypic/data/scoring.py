"""Scoring functions on a 0-100 scale: exact match, token F1, ROUGE-L F1.

Normalisation follows the SQuAD / LongBench convention: lower-case, drop punctuation, drop the
articles a/an/the, collapse whitespace. ROUGE-L here is the LCS-based F1 (beta = 1) over the
normalised tokens, so it is sensitive to order (a summary listing the right entities in the wrong
order scores lower). With several references, the best score is kept.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Callable, Dict, List, Sequence

from .request import Request

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower-case, remove punctuation and articles, collapse whitespace."""
    if not isinstance(text, str):
        raise ValueError(f"text: must be a string, got {type(text).__name__}")
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _tokens(text: str) -> List[str]:
    return normalize_answer(text).split()


def exact_match(prediction: str, reference: str) -> float:
    """100 if the normalised strings are equal, else 0."""
    return 100.0 if normalize_answer(prediction) == normalize_answer(reference) else 0.0


def token_f1(prediction: str, reference: str) -> float:
    """Bag-of-tokens F1 (SQuAD). Two empty strings score 100; one empty side scores 0."""
    pred, ref = _tokens(prediction), _tokens(reference)
    if not pred and not ref:
        return 100.0
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 100.0 * 2 * precision * recall / (precision + recall)


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence (O(len(a)·len(b)) dynamic programme, one row)."""
    if not a or not b:
        return 0
    row = [0] * (len(b) + 1)
    for x in a:
        diagonal = 0  # row[j-1] of the previous row
        for j, y in enumerate(b, start=1):
            above = row[j]
            row[j] = diagonal + 1 if x == y else max(above, row[j - 1])
            diagonal = above
    return row[-1]


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F1: LCS precision/recall over normalised tokens. Two empty strings score 100."""
    pred, ref = _tokens(prediction), _tokens(reference)
    if not pred and not ref:
        return 100.0
    lcs = lcs_length(pred, ref)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(pred), lcs / len(ref)
    return 100.0 * 2 * precision * recall / (precision + recall)


METRIC_FUNCTIONS: Dict[str, Callable[[str, str], float]] = {
    "exact_match": exact_match,
    "token_f1": token_f1,
    "rouge_l": rouge_l,
}


def best_score(metric: str, prediction: str, references: Sequence[str]) -> float:
    """The best score of ``prediction`` against any of ``references`` under ``metric``."""
    if metric not in METRIC_FUNCTIONS:
        raise ValueError(f"metric: {metric!r} is not one of {tuple(METRIC_FUNCTIONS)}")
    if isinstance(references, str) or not references:
        raise ValueError("references: must be a non-empty sequence of strings")
    return max(METRIC_FUNCTIONS[metric](prediction, ref) for ref in references)


def score_request(request: Request, prediction: str) -> float:
    """Score a prediction for ``request`` with its own metric and references (0-100)."""
    if not isinstance(request, Request):
        raise ValueError(f"request: must be a Request, got {type(request).__name__}")
    return best_score(request.metric, prediction, request.answers)
