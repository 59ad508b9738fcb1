"""A solver of the long suites that reads only the text, and the bound it gives on order-blind readers.

:func:`solve` answers a long-suite request from its documents' text and its question, sentence by
sentence in prompt order (the meaning table of :mod:`hypic.data.long_language`, written again here
from the text, not from the generator's events): the suites' answers are determined by the
documents exactly when it scores 100 on them.

:func:`order_blind_bound` is the best score any reader can reach that sees which documents a request
holds but not their order (the ``addition`` baseline is such a reader: its linear states are sums and
its cached keys sit where they were made, so only the last document's conv tail tells it anything
about order): for each request, over random orders of its documents, the share of orders whose
answer is the most common one.
"""

from __future__ import annotations

import random
import re
from typing import Dict, List, Optional, Sequence

from .request import Request
from .scoring import score_request

_QUESTIONS = (
    ("multi_key", re.compile(r"what are the codes of (\S+) and (\S+) \?")),
    ("variable_tracking", re.compile(r"what is the value of var (\S+) \?")),
    ("follows", re.compile(r"who follows (\S+) in order \?")),
    ("precedes", re.compile(r"who precedes (\S+) in order \?")),
    ("counting", re.compile(r"how many times did the (\S+) ring since it was last silenced \?")),
)


def _sentences(text: str) -> List[List[str]]:
    out, current = [], []
    for word in text.split():
        if word == "<sep>":
            continue
        current.append(word)
        if word == ".":
            out.append(current)
            current = []
    return out


def _subject(text: str) -> Optional[str]:
    for s in _sentences(text):
        if s[:4] == ["this", "passage", "is", "about"] and len(s) == 6:
            return s[4]
    return None


def solve(documents: Sequence[str], query: str) -> Optional[str]:
    """The answer the documents (in this order) give to ``query``, or None when they give none."""
    for name, pattern in _QUESTIONS:
        match = pattern.search(query)
        if match:
            break
    else:
        raise ValueError(f"query: not a long-suite question: {query!r}")
    if name in ("follows", "precedes"):
        subjects = [_subject(d) for d in documents]
        if subjects.count(match.group(1)) != 1:
            return None
        i = subjects.index(match.group(1)) + (1 if name == "follows" else -1)
        return subjects[i] if 0 <= i < len(subjects) else None
    codes: Dict[str, str] = {}
    variables: Dict[str, Optional[str]] = {}
    counts: Dict[str, int] = {}
    silenced = set()
    for document in documents:
        for s in _sentences(document):
            if s[:3] == ["the", "code", "of"] and len(s) == 7:  # the code of K is N .
                codes[s[3]] = s[5]
            elif s[0] == "var" and len(s) == 5:  # var X = N .
                variables[s[1]] = s[3]
            elif s[0] == "var" and len(s) == 6:  # var X = var Y .
                variables[s[1]] = variables.get(s[4])
            elif s[0] == "the" and len(s) == 4 and s[2] == "rings":  # the O rings .
                counts[s[1]] = counts.get(s[1], 0) + 1
            elif s[0] == "the" and len(s) == 5 and s[2:4] == ["is", "silenced"]:  # the O is silenced .
                counts[s[1]] = 0
                silenced.add(s[1])
    if name == "multi_key":
        a, b = codes.get(match.group(1)), codes.get(match.group(2))
        return None if a is None or b is None else f"{a} {b}"
    if name == "variable_tracking":
        return variables.get(match.group(1))
    obj = match.group(1)
    return str(counts.get(obj, 0)) if obj in silenced else None


def oracle_score(requests: Sequence[Request]) -> float:
    """Mean score (0-100) of :func:`solve` on ``requests`` (an undetermined answer scores 0)."""
    if not requests:
        raise ValueError("requests: empty")
    return sum(score_request(r, solve(r.documents, r.query) or "") for r in requests) / len(requests)


def order_blind_bound(request: Request, orders: int = 64, seed: int = 0) -> float:
    """The share (0-1) of ``orders`` random orders of the request's documents whose answer is the
    most common answer (an order without one counts as no answer): the chance that a reader which
    cannot tell the orders apart, answering the best it can, is right on a random order."""
    if not isinstance(orders, int) or orders < 1:
        raise ValueError(f"orders: must be an int >= 1, got {orders!r}")
    rng = random.Random(f"order-blind|{request.request_id}|{seed}")
    docs = list(request.documents)
    tally: Dict[Optional[str], int] = {}
    for _ in range(orders):
        rng.shuffle(docs)
        answer = solve(docs, request.query)
        tally[answer] = tally.get(answer, 0) + 1
    best = max((count for answer, count in tally.items() if answer is not None), default=0)
    return best / orders
