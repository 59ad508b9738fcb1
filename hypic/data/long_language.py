"""The long suites' language: events, documents, their meaning in document order, and the questions.

A long document is about one person (its *subject*, named in a head sentence) and holds a few
**events**, in order, among filler sentences (the filler of :mod:`hypic.data.language`, which never
offers a candidate answer):

| event | sentence | meaning, applied in prompt order |
| --- | --- | --- |
| ``code`` (key, n) | ``the code of KEY is N .`` | the code of KEY becomes n (a later record overrides) |
| ``set`` (x, n) | ``var X = N .`` | variable x becomes n |
| ``copy`` (x, y) | ``var X = var Y .`` | x becomes y's value *at that point* (undefined if y has none) |
| ``ring`` (o) | ``the O rings .`` | o's counter goes up by one |
| ``silence`` (o) | ``the O is silenced .`` | o's counter goes back to zero |

Every event is read in prompt order, across documents: the state after a prompt depends on the
order of its documents, and a document read without the documents before it (a copy whose source
is set elsewhere, a ring after a silence elsewhere) means something else. That is what the tasks ask
about (:mod:`hypic.data.long_suites`), and what makes them fail where a cache loses order or context.

The head sentence opens the document after a filler sentence half of the time, so the tokens a
seam window covers are not the same words in every document.

Held-out split: a ``code`` or ``set`` or ``copy`` event is held out iff a fixed hash of it is
``0 mod HELD_OUT_MODULUS``; held-out documents hold only held-out events of those kinds, training
documents only training ones (``ring`` / ``silence`` carry no fact and belong to both).
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from .language import HELD_OUT_MODULUS, SPLITS, check_split, document_id, filler_sentences
from .long_vocab import COUNTER_OBJECTS, NUMBERS, VARIABLES
from .vocab import CITIES, SEP_TOKEN

EVENT_KINDS: Tuple[str, ...] = ("code", "set", "copy", "ring", "silence")
CODE_KEYS: Tuple[str, ...] = CITIES  # the keys of code records: invented place names
_TEMPLATES: Dict[str, str] = {
    "code": "the code of {a} is {b} .",
    "set": "var {a} = {b} .",
    "copy": "var {a} = var {b} .",
    "ring": "the {a} rings .",
    "silence": "the {a} is silenced .",
}
HEAD_TEMPLATE = "this passage is about {s} ."
# Questions (the query segment is ``<sep> question : Q answer :``, as in the short suites).
MULTI_KEY_QUESTION = "what are the codes of {a} and {b} ?"
VARIABLE_QUESTION = "what is the value of var {x} ?"
FOLLOWS_QUESTION = "who follows {s} in order ?"
PRECEDES_QUESTION = "who precedes {s} in order ?"
COUNT_QUESTION = "how many times did the {o} ring since it was last silenced ?"


@dataclass(frozen=True)
class Event:
    kind: str
    a: str
    b: str = ""

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"kind: {self.kind!r} is not one of {EVENT_KINDS}")

    def sentence(self) -> str:
        return _TEMPLATES[self.kind].format(a=self.a, b=self.b)

    @property
    def num_tokens(self) -> int:
        return len(self.sentence().split())


def is_held_out_event(event: Event) -> bool:
    """The fixed split: held out iff crc32("kind|a|b") % HELD_OUT_MODULUS == 0 (code, set, copy)."""
    return zlib.crc32(f"{event.kind}|{event.a}|{event.b}".encode("utf-8")) % HELD_OUT_MODULUS == 0


def event_in_split(event: Event, split: str) -> bool:
    if event.kind in ("ring", "silence"):
        return True
    return is_held_out_event(event) == (split == "held_out")


@dataclass(frozen=True)
class LongDocument:
    """A long-suite document: subject, events in text order, text (``<sep> ...``) and a stable id."""

    subject: str
    events: Tuple[Event, ...]
    text: str
    doc_id: str

    @property
    def num_tokens(self) -> int:
        return len(self.text.split())


# Tokens of the fixed part of a document: "<sep>" and the head sentence.
HEAD_TOKENS = 1 + len(HEAD_TEMPLATE.format(s="x").split())


def make_long_document(rng: random.Random, subject: str, events: Sequence[Event], target_tokens: int) -> LongDocument:
    """``<sep>``, the head (first, or after one filler sentence), then the events in their order with
    filler sentences between them, topped up with filler to ``target_tokens`` (the result has at
    most ``target_tokens`` tokens and at least ``target_tokens - 3``, or just its head and events
    when those alone are longer)."""
    if not isinstance(target_tokens, int) or target_tokens < 1:
        raise ValueError(f"target_tokens: must be an int >= 1, got {target_tokens!r}")
    fixed = HEAD_TOKENS + sum(e.num_tokens for e in events)
    fillers = filler_sentences(rng, fixed, target_tokens, target_tokens)
    # Slots: fillers go into the gaps between events (and before the first / after the last) at
    # random, which keeps the events' order.
    gaps: List[List[List[str]]] = [[] for _ in range(len(events) + 1)]
    for sentence in fillers:
        gaps[rng.randrange(len(gaps))].append(sentence)
    words: List[str] = [SEP_TOKEN]
    head = HEAD_TEMPLATE.format(s=subject).split()
    lead = gaps[0]
    if lead and rng.random() < 0.5:
        words += lead[0] + head
        lead = lead[1:]
    else:
        words += head
    for sentence in lead:
        words += sentence
    for event, gap in zip(events, gaps[1:]):
        words += event.sentence().split()
        for sentence in gap:
            words += sentence
    text = " ".join(words)
    return LongDocument(subject=subject, events=tuple(events), text=text, doc_id=document_id(text))


def random_events(rng: random.Random, split: str, counts: Dict[str, int],
                  keys: Sequence[str] = CODE_KEYS, variables: Sequence[str] = VARIABLES,
                  objects: Sequence[str] = COUNTER_OBJECTS) -> List[Event]:
    """``counts[kind]`` random events of each kind, all in ``split``, in random order. A copy
    between two of ``variables`` is drawn among the pairs of the split; where there is none (a few
    variables), a ``set`` takes its place."""
    check_split(split)
    pairs = [(x, y) for x in variables for y in variables if x != y and event_in_split(Event("copy", x, y), split)]
    events: List[Event] = []
    for kind in EVENT_KINDS:
        for _ in range(counts.get(kind, 0)):
            if kind == "copy" and pairs:
                events.append(Event(kind, *rng.choice(pairs)))
                continue
            for _attempt in range(1000):
                if kind == "code":
                    event = Event(kind, rng.choice(keys), rng.choice(NUMBERS))
                elif kind in ("set", "copy"):
                    event = Event("set", rng.choice(variables), rng.choice(NUMBERS))
                else:
                    event = Event(kind, rng.choice(objects))
                if event_in_split(event, split):
                    events.append(event)
                    break
            else:  # pragma: no cover - every key and variable has about 12 of 100 values in either split
                raise RuntimeError(f"no {kind} event in split {split!r} after 1000 draws")
    rng.shuffle(events)
    return events


# ---- meaning --------------------------------------------------------------------------------


@dataclass
class WorldState:
    """The state after reading events in order. ``variables[x]`` None: x was assigned a copy of an
    undefined variable. ``code_writes[key]``: the values written, in order. ``value_source[x]``:
    the index of the document whose ``set`` gave x its current value."""

    codes: Dict[str, str]
    code_writes: Dict[str, List[str]]
    variables: Dict[str, Optional[str]]
    value_source: Dict[str, Optional[int]]
    copied_across: Dict[str, bool]  # x's current value reached it through a copy from an earlier document
    counters: Dict[str, int]
    silenced: Dict[str, bool]


def read_events(documents: Iterable[Sequence[Event]]) -> WorldState:
    """Apply every document's events in order (the table in the module docstring)."""
    state = WorldState({}, {}, {}, {}, {}, {}, {})
    for index, events in enumerate(documents):
        for e in events:
            if e.kind == "code":
                state.codes[e.a] = e.b
                state.code_writes.setdefault(e.a, []).append(e.b)
            elif e.kind == "set":
                state.variables[e.a] = e.b
                state.value_source[e.a] = index
                state.copied_across[e.a] = False
            elif e.kind == "copy":
                state.variables[e.a] = state.variables.get(e.b)
                source = state.value_source.get(e.b)
                state.value_source[e.a] = source
                state.copied_across[e.a] = state.variables[e.a] is not None and (
                    state.copied_across.get(e.b, False) or (source is not None and source < index))
            elif e.kind == "ring":
                state.counters[e.a] = state.counters.get(e.a, 0) + 1
            else:
                state.counters[e.a] = 0
                state.silenced[e.a] = True
    return state


__all__ = [
    "COUNT_QUESTION", "CODE_KEYS", "EVENT_KINDS", "Event", "FOLLOWS_QUESTION", "HEAD_TEMPLATE", "HEAD_TOKENS",
    "LongDocument", "MULTI_KEY_QUESTION", "PRECEDES_QUESTION", "SPLITS", "VARIABLE_QUESTION", "WorldState",
    "event_in_split", "is_held_out_event", "make_long_document", "random_events", "read_events",
]
