"""The long suites' vocabulary: the embedded ``tiny`` vocabulary plus the words of the long tasks.

The plan: one word-level vocabulary grows by appending lists, never by reordering, so every word of
``hypic.data.vocab`` keeps its id (``tiny``'s tokenizer is a prefix of this one: the long suites'
model can also be trained and scored on the short suites, and an id means the same word in both).
The new words are the long tasks' own (:mod:`hypic.data.long_language`):

* ``NUMBERS`` ``0`` .. ``99``: code values, variable values and counts, one token each;
* ``VARIABLES``: invented variable names ``x`` + consonant + vowel (``xba``), a shape no other list has;
* ``COUNTER_OBJECTS``: what the counting task counts (``the bell rings .``);
* ``LONG_FUNCTION_WORDS``: the new templates' other words.

Every list is fixed (no seed), disjoint from every other list of either vocabulary (checked at
import), so an answer token is never also a filler or another answer type.
"""

from __future__ import annotations

import itertools
from typing import Dict, Tuple

from .vocab import WORD_LISTS, vocabulary

NUMBERS: Tuple[str, ...] = tuple(str(i) for i in range(100))
VARIABLES: Tuple[str, ...] = tuple("x" + c + v for c, v in itertools.product("bdfgklmnprstvz", "aeiou"))
COUNTER_OBJECTS: Tuple[str, ...] = ("bell", "drum", "horn", "gong", "whistle", "chime")
LONG_FUNCTION_WORDS: Tuple[str, ...] = (
    "code", "codes", "var", "=", "value", "rings", "ring", "silenced", "since", "times", "did", "how",
    "last", "precedes",
)
LONG_WORD_LISTS: Tuple[Tuple[str, ...], ...] = (NUMBERS, VARIABLES, COUNTER_OBJECTS, LONG_FUNCTION_WORDS)


def extended_vocabulary() -> Dict[str, int]:
    """Word -> id: :func:`hypic.data.vocab.vocabulary` unchanged (ids 0 .. len-1), then every word of
    :data:`LONG_WORD_LISTS` once, in order."""
    vocab = vocabulary()
    for words in LONG_WORD_LISTS:
        for word in words:
            if word not in vocab:
                vocab[word] = len(vocab)
    return vocab


def _check_disjoint() -> None:
    seen: Dict[str, int] = {}
    for index, words in enumerate(WORD_LISTS + LONG_WORD_LISTS):
        for word in words:
            if seen.setdefault(word, index) != index:
                raise RuntimeError(f"word {word!r} is in two word lists ({seen[word]} and {index})")


_check_disjoint()
