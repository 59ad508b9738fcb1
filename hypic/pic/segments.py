"""Prompt segmentation for position-independent caching (PIC).

A prompt is an ordered list of cacheable **segments** followed by a **query** (never cached).
Two input forms:

* a text prompt split on :data:`PIC_SEP` (``"<<PIC_SEP>>"``, the separator clients of the
  published system send): every piece but the last is a segment, the last is the query;
* a structured prompt: a list whose items are segment strings or token-id lists, last = query.

Each segment is tokenised **on its own** (``encode(text)`` without special tokens), so a
document has the same token ids wherever it appears; that is what makes its cache entry reusable.
Text is kept verbatim (no stripping): ``"a <<PIC_SEP>> b"`` gives segments ``"a "`` and ``" b"``.

Chat templates. A template wraps the user content as ``prefix + content + suffix``. Rendering the
whole prompt and re-tokenising would merge tokens across segment seams, so instead the template is
split once around a sentinel (:func:`split_chat_template`) and applied at token level:

* the template **prefix** (system block, ``<|im_start|>user\\n``, BOS, ...) becomes its **own
  segment** in front of the first one (``prefix_policy="own_segment"``, default: it is identical in
  every request, so it is always a hit at position 0), or is prepended to the first segment's
  tokens (``"merge_first"``; the first segment's entry then only matches behind the same template);
* the template **suffix** (``<|im_end|>\\n<|im_start|>assistant\\n``) is appended to the query.

Error policy (all ``ValueError``):
* an empty segment (zero characters, or zero tokens after encoding);
* a prompt that is only separators (or only whitespace/nothing);
* an **empty query** is an error too: generation needs at least one live token after the last
  cached segment, and a trailing separator is almost always a client bug. Send the question as the
  last piece, or an explicit query string.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple, Union

PIC_SEP = "<<PIC_SEP>>"

TokenIds = Tuple[int, ...]
Encode = Callable[[str], Sequence[int]]
PromptPiece = Union[str, Sequence[int]]

_PREFIX_POLICIES = ("own_segment", "merge_first")
_TEMPLATE_SENTINEL = "\uE000hypic-content\uE001"


def _check_token_ids(ids, what: str, vocab_size: Optional[int]) -> TokenIds:
    if type(ids) is tuple and _plain_ids(ids, vocab_size):
        # Already what the loop below builds: kept as it is rather than copied, so a caller that
        # hands the same tuples again (a server holding its documents tokenized) lets the key
        # memo match them by identity (hypic.pic.keys.Keyer.segment_keys) instead of comparing
        # every token: ~3.5 us a 512-token segment on this CPU, 64 of them in a 32k prompt.
        return ids
    if isinstance(ids, (str, bytes)):
        raise ValueError(f"{what}: expected a sequence of token ids, got {type(ids).__name__}")
    try:
        items = tuple(ids)
    except TypeError:
        raise ValueError(f"{what}: expected a sequence of token ids, got {type(ids).__name__}") from None
    out = []
    for t in items:
        # bool is an int subclass, but a list of bools is never a token list.
        if isinstance(t, bool):
            raise ValueError(f"{what}: token ids must be ints, got bool")
        try:
            t = operator.index(t)  # ints, numpy / torch integer scalars
        except TypeError:
            raise ValueError(f"{what}: token ids must be ints, got {type(t).__name__}") from None
        if t < 0:
            raise ValueError(f"{what}: token id {t} is negative")
        if vocab_size is not None and t >= vocab_size:
            raise ValueError(f"{what}: token id {t} is out of range for vocab_size {vocab_size}")
        out.append(t)
    return tuple(out)


def _plain_ids(ids: tuple, vocab_size: Optional[int]) -> bool:
    """Every item a Python int (bools and integer scalars of other types excluded: they take the
    checking loop) in ``[0, vocab_size)``."""
    if not ids:
        return True
    if set(map(type, ids)) != {int}:
        return False
    return min(ids) >= 0 and (vocab_size is None or max(ids) < vocab_size)


@dataclass(frozen=True)
class ChatTemplateParts:
    """Token ids a chat template puts around the user content.

    ``prefix_ids`` go in front of the segments (own segment or merged into the first, per
    ``prefix_policy``); ``suffix_ids`` (end of the user turn + assistant header) follow the query.
    """

    prefix_ids: TokenIds = ()
    suffix_ids: TokenIds = ()
    prefix_policy: str = "own_segment"

    def __post_init__(self):
        object.__setattr__(self, "prefix_ids", _check_token_ids(self.prefix_ids, "prefix_ids", None))
        object.__setattr__(self, "suffix_ids", _check_token_ids(self.suffix_ids, "suffix_ids", None))
        if self.prefix_policy not in _PREFIX_POLICIES:
            raise ValueError(
                f"prefix_policy must be one of {_PREFIX_POLICIES}, got {self.prefix_policy!r}"
            )


def split_chat_template(
    render: Callable[[str], str], encode: Encode, *, prefix_policy: str = "own_segment"
) -> ChatTemplateParts:
    """Split a chat template into prefix / suffix token ids.

    ``render(content)`` must return the full templated text for one user message with that
    content (for HF tokenisers: ``lambda c: tok.apply_chat_template([{"role": "user", "content": c}],
    tokenize=False, add_generation_prompt=True)``, optionally with a system message). The content is
    replaced by a private-use sentinel that must appear exactly once in the rendered text.
    """
    text = render(_TEMPLATE_SENTINEL)
    if not isinstance(text, str):
        raise ValueError(f"render: must return str, got {type(text).__name__}")
    if text.count(_TEMPLATE_SENTINEL) != 1:
        raise ValueError(
            "render: the template must contain the user content exactly once "
            f"(found {text.count(_TEMPLATE_SENTINEL)} copies)"
        )
    prefix, suffix = text.split(_TEMPLATE_SENTINEL)
    return ChatTemplateParts(
        prefix_ids=tuple(encode(prefix)) if prefix else (),
        suffix_ids=tuple(encode(suffix)) if suffix else (),
        prefix_policy=prefix_policy,
    )


@dataclass(frozen=True)
class SegmentedPrompt:
    """Token ids of a prompt: cacheable segments in order, then the query (never cached)."""

    segments: Tuple[TokenIds, ...]
    query: TokenIds

    def __post_init__(self):
        segs = tuple(_check_token_ids(s, f"segments[{i}]", None) for i, s in enumerate(self.segments))
        for i, s in enumerate(segs):
            if not s:
                raise ValueError(f"segments[{i}] is empty (0 tokens); every segment needs >= 1 token")
        query = _check_token_ids(self.query, "query", None)
        if not query:
            raise ValueError("query is empty (0 tokens); the prompt needs a non-empty query")
        object.__setattr__(self, "segments", segs)
        object.__setattr__(self, "query", query)

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.segments) + len(self.query)

    @property
    def token_ids(self) -> TokenIds:
        """The whole prompt, as a full-recompute run would see it."""
        out: list = []
        for s in self.segments:
            out.extend(s)
        out.extend(self.query)
        return tuple(out)

    @property
    def segment_starts(self) -> Tuple[int, ...]:
        """Absolute start position of each segment, then of the query."""
        return tuple(itertools.accumulate(map(len, self.segments), initial=0))  # no Python loop per segment


def split_text_prompt(text: str, sep: str = PIC_SEP) -> Tuple[str, ...]:
    """Split ``text`` on ``sep``; returns the pieces (last = query). Validates emptiness."""
    if not isinstance(text, str):
        raise ValueError(f"text: expected str, got {type(text).__name__}")
    if not isinstance(sep, str) or not sep:
        raise ValueError("sep: must be a non-empty string")
    pieces = text.split(sep)
    if all(p.strip() == "" for p in pieces):
        if len(pieces) > 1:
            raise ValueError(f"prompt is only separators ({sep!r}) and whitespace; no content")
        raise ValueError("prompt is empty")
    for i, p in enumerate(pieces[:-1]):
        if p == "":
            raise ValueError(
                f"segment {i} is empty (two adjacent separators, or the prompt starts with {sep!r})"
            )
    if pieces[-1] == "":
        raise ValueError(
            f"query is empty: the prompt ends with the separator {sep!r}; put the question after it"
        )
    return tuple(pieces)


def build_segmented_prompt(
    prompt: Union[str, Sequence[PromptPiece]],
    *,
    encode: Optional[Encode] = None,
    template: Optional[ChatTemplateParts] = None,
    sep: str = PIC_SEP,
    vocab_size: Optional[int] = None,
) -> SegmentedPrompt:
    """Turn a text or structured prompt into :class:`SegmentedPrompt`.

    ``encode`` tokenises one piece of text without special tokens; it is required when any piece
    is a string. Token-id pieces are used as given. ``template`` wraps the prompt at token level
    (see the module docstring). ``vocab_size`` (optional) range-checks every id.
    """
    if isinstance(prompt, str):
        pieces: Sequence[PromptPiece] = split_text_prompt(prompt, sep)
    else:
        try:
            pieces = list(prompt)
        except TypeError:
            raise ValueError(
                f"prompt: expected str or a list of segments, got {type(prompt).__name__}"
            ) from None
        if not pieces:
            raise ValueError("prompt: the segment list is empty (need at least a query)")
    token_pieces = []
    for i, piece in enumerate(pieces):
        what = "query" if i == len(pieces) - 1 else f"segment {i}"
        if isinstance(piece, str):
            if encode is None:
                raise ValueError(f"{what} is text but no encode function (tokeniser) was given")
            if piece == "":
                raise ValueError(f"{what} is empty")
            ids = _check_token_ids(encode(piece), what, vocab_size)
            if not ids:
                raise ValueError(f"{what} encodes to 0 tokens ({piece!r})")
        else:
            ids = _check_token_ids(piece, what, vocab_size)
            if not ids:
                raise ValueError(f"{what} is empty (0 token ids)")
        token_pieces.append(ids)
    segments, query = token_pieces[:-1], token_pieces[-1]
    if template is not None:
        if not isinstance(template, ChatTemplateParts):
            raise ValueError(f"template: expected ChatTemplateParts, got {type(template).__name__}")
        if template.prefix_ids:
            if template.prefix_policy == "own_segment" or not segments:
                segments = [template.prefix_ids] + segments
            else:
                segments = [template.prefix_ids + segments[0]] + segments[1:]
        query = query + template.suffix_ids
    return SegmentedPrompt(segments=tuple(segments), query=query)
