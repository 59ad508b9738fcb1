"""Loader for LongBench-format files: jsonl rows with ``context``, ``input``, ``answers``.

Optional fields: ``_id``, ``dataset``, ``length`` (and anything else, ignored).

Segmentation rule (``split_mode="auto"``), in order of preference:
1. **passages** — if the context has at least two lines that start with ``Passage N:`` (LongBench's
   HotpotQA / 2WikiMQA / MuSiQue layout), each segment runs from one header to the next; non-blank
   text before the first header is its own segment.
2. **paragraphs** — else if it has blank lines (a line holding only whitespace), each paragraph
   between blank lines is a segment.
3. **windows** — else consecutive windows of ``window_words`` whitespace-separated words.
Segments are stripped of surrounding whitespace; empty ones are dropped. The request's ``joiner`` is
``"\\n\\n"`` so that :meth:`Request.plain_text` reproduces the context with normalised paragraph breaks.
``max_segments`` (optional) merges neighbouring segments evenly so that no request exceeds it.
"""

from __future__ import annotations

import json
import re
from typing import Dict, List, Optional

from .language import document_id
from .request import PIC_SEP, Request

SPLIT_MODES = ("auto", "passages", "paragraphs", "windows")
_PASSAGE_HEADER = re.compile(r"^[ \t]*Passage \d+:", re.MULTILINE)
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
# LongBench's metric per dataset (qa_f1 -> token F1, rouge -> ROUGE-L); unknown datasets use token F1.
DATASET_METRICS: Dict[str, str] = {
    "hotpotqa": "token_f1", "2wikimqa": "token_f1", "musique": "token_f1", "narrativeqa": "token_f1",
    "qasper": "token_f1", "multifieldqa_en": "token_f1", "triviaqa": "token_f1",
    "multi_news": "rouge_l", "gov_report": "rouge_l", "qmsum": "rouge_l", "samsum": "rouge_l",
}
DEFAULT_QUERY_TEMPLATE = "Question: {input}\nAnswer:"


def split_passages(context: str) -> List[str]:
    starts = [m.start() for m in _PASSAGE_HEADER.finditer(context)]
    bounds = ([0] if starts and starts[0] > 0 else []) + starts + [len(context)]
    pieces = [context[a:b].strip() for a, b in zip(bounds[:-1], bounds[1:])]
    return [p for p in pieces if p]


def split_paragraphs(context: str) -> List[str]:
    return [p.strip() for p in _BLANK_LINE.split(context) if p.strip()]


def split_windows(context: str, window_words: int) -> List[str]:
    if not isinstance(window_words, int) or window_words < 1:
        raise ValueError(f"window_words: must be an int >= 1, got {window_words!r}")
    words = context.split()
    return [" ".join(words[i:i + window_words]) for i in range(0, len(words), window_words)]


def _merge_to(segments: List[str], max_segments: int) -> List[str]:
    """Merge neighbours into at most ``max_segments`` groups of (nearly) equal segment counts."""
    if len(segments) <= max_segments:
        return segments
    groups, count = [], len(segments)
    for g in range(max_segments):
        lo, hi = g * count // max_segments, (g + 1) * count // max_segments
        groups.append("\n\n".join(segments[lo:hi]))
    return groups


def split_context(
    context: str, split_mode: str = "auto", window_words: int = 200, max_segments: Optional[int] = None
) -> List[str]:
    """Split a LongBench context into segments by the rule in the module docstring."""
    if not isinstance(context, str):
        raise ValueError(f"context: must be a string, got {type(context).__name__}")
    if split_mode not in SPLIT_MODES:
        raise ValueError(f"split_mode: {split_mode!r} is not one of {SPLIT_MODES}")
    if max_segments is not None and (not isinstance(max_segments, int) or max_segments < 1):
        raise ValueError(f"max_segments: must be None or an int >= 1, got {max_segments!r}")
    mode = split_mode
    if mode == "auto":
        if len(_PASSAGE_HEADER.findall(context)) >= 2:
            mode = "passages"
        elif _BLANK_LINE.search(context.strip()):
            mode = "paragraphs"
        else:
            mode = "windows"
    if mode == "passages":
        segments = split_passages(context)
    elif mode == "paragraphs":
        segments = split_paragraphs(context)
    else:
        segments = split_windows(context, window_words)
    # The separator string must not survive inside a segment: it would re-split the prompt.
    segments = [s.replace(PIC_SEP, " ") for s in segments]
    if max_segments is not None:
        segments = _merge_to(segments, max_segments)
    return segments


def request_from_row(
    row: Dict,
    line_number: int = 0,
    split_mode: str = "auto",
    window_words: int = 200,
    max_segments: Optional[int] = None,
    query_template: str = DEFAULT_QUERY_TEMPLATE,
) -> Request:
    """One LongBench row -> :class:`Request` (documents = context segments, query = templated input)."""
    if not isinstance(row, dict):
        raise ValueError(f"row: line {line_number} is not a JSON object")
    for field in ("context", "input", "answers"):
        if field not in row:
            raise ValueError(f"row: line {line_number} lacks the field {field!r}")
    answers = row["answers"]
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise ValueError(f"row: line {line_number}: 'answers' must be a non-empty list of strings")
    if not isinstance(row["input"], str):
        raise ValueError(f"row: line {line_number}: 'input' must be a string")
    if "{input}" not in query_template:
        raise ValueError("query_template: must contain '{input}'")
    segments = split_context(row["context"], split_mode, window_words, max_segments)
    if not segments:
        raise ValueError(f"row: line {line_number}: 'context' is empty")
    dataset = str(row.get("dataset", "longbench"))
    row_id = str(row.get("_id", f"line{line_number}"))
    query = query_template.format(input=row["input"]).replace(PIC_SEP, " ")
    if not query.strip():
        raise ValueError(f"row: line {line_number}: the query is empty")
    return Request(
        documents=tuple(segments),
        query=query,
        answers=tuple(answers),
        task=dataset,
        metric=DATASET_METRICS.get(dataset, "token_f1"),
        doc_ids=tuple(document_id(s) for s in segments),
        joiner="\n\n",
        request_id=row_id,
    )


def load_longbench(
    path: str,
    split_mode: str = "auto",
    window_words: int = 200,
    max_segments: Optional[int] = None,
    query_template: str = DEFAULT_QUERY_TEMPLATE,
    limit: Optional[int] = None,
) -> List[Request]:
    """Read a LongBench-format jsonl file (blank lines skipped) into requests, in file order."""
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit: must be None or an int >= 0, got {limit!r}")
    requests: List[Request] = []
    with open(path, "r", encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if limit is not None and len(requests) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"path: line {line_number} of {path} is not valid JSON: {err}") from None
            requests.append(request_from_row(row, line_number, split_mode, window_words, max_segments, query_template))
    return requests
