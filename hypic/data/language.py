"""The templated language of the synthetic suites: facts, documents, questions, and the held-out split.

A document is about one person (its *subject*). It opens with a head sentence naming the subject,
then holds one fact per relation (where the subject lives, their job, colour, animal, and mentor)
interleaved in random order with filler sentences that use only filler words (so they never offer
a second candidate answer). Every word is separated by one space; punctuation is its own word.

Held-out split: a fact ``(subject, relation, value)`` is *held out* iff a fixed hash of it is
``0 mod HELD_OUT_MODULUS``. Held-out documents contain only held-out facts and training documents
only training facts, so no held-out fact (hence no held-out document) can ever appear in training,
for any seed. Names and values are shared: every token of a held-out request is trained.
"""

from __future__ import annotations

import hashlib
import random
import zlib
from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence, Tuple

from .vocab import (
    ANIMALS, CITIES, COLORS, FILLER_ADJECTIVES, FILLER_GROUPS, FILLER_NOUNS, FILLER_TIMES,
    FILLER_VERBS, JOBS, NAMES, SEP_TOKEN,
)

SPLITS: Tuple[str, ...] = ("train", "held_out")
HELD_OUT_MODULUS = 8

RELATIONS: Tuple[str, ...] = ("lives", "job", "color", "animal", "mentor")
# Relations whose value is an attribute (not a person): the second hop of a bridge question.
ATTRIBUTE_RELATIONS: Tuple[str, ...] = ("lives", "job", "color", "animal")
RELATION_VALUES: Mapping[str, Tuple[str, ...]] = {
    "lives": CITIES, "job": JOBS, "color": COLORS, "animal": ANIMALS, "mentor": NAMES,
}
_FACT_TEMPLATES: Mapping[str, str] = {
    "lives": "{s} lives in {v} .",
    "job": "{s} works as a {v} .",
    "color": "{s} likes the color {v} .",
    "animal": "{s} owns a {v} .",
    "mentor": "the mentor of {s} is {v} .",
}
# {s} is a subject phrase: a name, or "the mentor of NAME" for a two-hop question.
_QUESTION_TEMPLATES: Mapping[str, str] = {
    "lives": "where does {s} live ?",
    "job": "what is the job of {s} ?",
    "color": "what color does {s} like ?",
    "animal": "what animal does {s} own ?",
    "mentor": "who is the mentor of {s} ?",
}
_HEAD_TEMPLATE = SEP_TOKEN + " this passage is about {s} ."
_QUERY_TEMPLATE = SEP_TOKEN + " question : {q} answer :"
SUMMARY_QUESTION = "list the people of the passages in order ?"
COPY_QUESTION = "repeat the sequence ?"
RECALL_QUESTION = "what follows {key} ?"
# The ordered lookup: the subject of the passage right after the one about {s}.
ORDER_QUESTION = "who follows {s} in order ?"

# Filler sentences (word lists of vocab.FILLER_*). The last one is 4 words long, used to top a
# document up to its minimum length when a longer filler would overflow the maximum.
_FILLER_TEMPLATES: Tuple[Tuple[str, ...], ...] = (
    ("the", "N", "was", "A", "in", "the", "T", "."),
    ("G", "V", "the", "A", "N", "."),
    ("it", "was", "a", "A", "T", "near", "the", "N", "."),
    ("many", "G", "V", "the", "N", "during", "the", "T", "."),
    ("the", "N", "and", "the", "N", "were", "A", "."),
    ("nobody", "V", "the", "N", "that", "T", "."),
)
_SHORT_FILLER: Tuple[str, ...] = ("it", "was", "A", ".")
_SLOTS: Mapping[str, Tuple[str, ...]] = {
    "N": FILLER_NOUNS, "A": FILLER_ADJECTIVES, "T": FILLER_TIMES, "V": FILLER_VERBS, "G": FILLER_GROUPS,
}


def is_held_out_fact(subject: str, relation: str, value: str) -> bool:
    """The fixed split of facts: held out iff crc32("subject|relation|value") % 8 == 0."""
    if relation not in RELATIONS:
        raise ValueError(f"relation: {relation!r} is not one of {RELATIONS}")
    return zlib.crc32(f"{subject}|{relation}|{value}".encode("utf-8")) % HELD_OUT_MODULUS == 0


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split: {split!r} is not one of {SPLITS}")


def fact_sentence(subject: str, relation: str, value: str) -> str:
    return _FACT_TEMPLATES[relation].format(s=subject, v=value)


def question_text(relation: str, subject_phrase: str) -> str:
    """The query segment for a question (ends with ``answer :``; the answer follows it)."""
    if relation not in _QUESTION_TEMPLATES:
        raise ValueError(f"relation: {relation!r} is not one of {RELATIONS}")
    return query_segment(_QUESTION_TEMPLATES[relation].format(s=subject_phrase))


def query_segment(question: str) -> str:
    return _QUERY_TEMPLATE.format(q=question)


def bridge_phrase(subject: str) -> str:
    """The subject phrase of a two-hop question: the person found through the first hop."""
    return f"the mentor of {subject}"


def bridge_answer(mentor: str, relation: str, value: str) -> str:
    """The reference answer of a two-hop question: the bridge spelled out, then the fact.

    ``"<mentor> lives in <city>"`` -- the fact sentence about the mentor without its full stop. The
    answer names the person found by the first hop before the attribute found by the second (an
    explicit reasoning step, as a chat model would answer), and exact match needs both right: a
    7 M-parameter model does not compose two lookups latently within one token (17% held-out
    exact match after 3,100 training steps when the answer was the attribute alone), while each hop alone is a single in-context lookup.
    """
    if relation not in ATTRIBUTE_RELATIONS:
        raise ValueError(f"relation: {relation!r} is not one of {ATTRIBUTE_RELATIONS}")
    sentence = fact_sentence(mentor, relation, value)
    return sentence[: -len(" .")] if sentence.endswith(" .") else sentence


@dataclass(frozen=True)
class Document:
    """A generated document: its subject, its facts (relation -> value), its text and a stable id."""

    subject: str
    facts: Tuple[Tuple[str, str], ...]
    text: str
    doc_id: str

    def fact(self, relation: str) -> str:
        for rel, value in self.facts:
            if rel == relation:
                return value
        raise ValueError(f"relation: document about {self.subject} has no {relation!r} fact")

    @property
    def num_tokens(self) -> int:
        return len(self.text.split())


def document_id(text: str) -> str:
    """Stable id from the text: equal ids iff equal documents (up to hash collisions)."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def choose_value(
    rng: random.Random, subject: str, relation: str, candidates: Sequence[str], split: str
) -> str:
    """A random value from ``candidates`` whose fact with ``subject`` falls in ``split``."""
    check_split(split)
    want_held_out = split == "held_out"
    eligible = [v for v in candidates if v != subject and is_held_out_fact(subject, relation, v) == want_held_out]
    if not eligible:
        raise ValueError(
            f"candidates: no value for ({subject}, {relation}) falls in split {split!r}; "
            f"offer more candidates"
        )
    return rng.choice(eligible)


def filler_sentence(rng: random.Random, template: Sequence[str]) -> List[str]:
    return [rng.choice(_SLOTS[w]) if w in _SLOTS else w for w in template]


def filler_sentences(rng: random.Random, num_tokens: int, target_tokens: int, max_tokens: int) -> List[List[str]]:
    """Whole filler sentences (word lists) that take a text of ``num_tokens`` tokens to at least
    ``target_tokens`` without passing ``max_tokens``: a random template while it fits, the short
    filler where only that fits, and no more once neither does."""
    sentences: List[List[str]] = []
    while num_tokens < target_tokens:
        template = rng.choice(_FILLER_TEMPLATES)
        if num_tokens + len(template) > max_tokens:
            template = _SHORT_FILLER
            if num_tokens + len(template) > max_tokens:
                break
        sentences.append(filler_sentence(rng, template))
        num_tokens += len(template)
    return sentences


BASE_DOCUMENT_TOKENS = len(_HEAD_TEMPLATE.format(s="x").split()) + sum(
    len(t.format(s="x", v="y").split()) for t in _FACT_TEMPLATES.values()
)
_SHORT_FILLER_TOKENS = len(_SHORT_FILLER)


def check_document_lengths(min_doc_tokens: int, max_doc_tokens: int) -> None:
    """Validate a document length range (tokens): reachable with facts + whole filler sentences."""
    if not isinstance(min_doc_tokens, int) or not isinstance(max_doc_tokens, int):
        raise ValueError("min_doc_tokens, max_doc_tokens: must be ints")
    if max_doc_tokens < BASE_DOCUMENT_TOKENS:
        raise ValueError(
            f"max_doc_tokens: {max_doc_tokens} is below the {BASE_DOCUMENT_TOKENS} tokens of a "
            f"document's head and facts"
        )
    if min_doc_tokens > max_doc_tokens:
        raise ValueError(f"min_doc_tokens: {min_doc_tokens} exceeds max_doc_tokens {max_doc_tokens}")
    if min_doc_tokens > BASE_DOCUMENT_TOKENS and max_doc_tokens - min_doc_tokens < _SHORT_FILLER_TOKENS - 1:
        raise ValueError(
            f"min_doc_tokens/max_doc_tokens: the range [{min_doc_tokens}, {max_doc_tokens}] must be "
            f"at least {_SHORT_FILLER_TOKENS - 1} wide to be reachable with whole filler sentences"
        )


def make_document(
    rng: random.Random,
    subject: str,
    facts: Mapping[str, str],
    min_doc_tokens: int,
    max_doc_tokens: int,
) -> Document:
    """Head sentence, then the facts and filler sentences in random order.

    The length is drawn uniformly in [min_doc_tokens, max_doc_tokens]; whole filler sentences are added
    until it is reached without passing the maximum, so the result lies in the range.
    """
    check_document_lengths(min_doc_tokens, max_doc_tokens)
    if set(facts) != set(RELATIONS):
        raise ValueError(f"facts: must give exactly the relations {RELATIONS}, got {sorted(facts)}")
    target = rng.randint(max(min_doc_tokens, BASE_DOCUMENT_TOKENS), max_doc_tokens)
    body: List[List[str]] = [fact_sentence(subject, rel, facts[rel]).split() for rel in RELATIONS]
    body += filler_sentences(rng, BASE_DOCUMENT_TOKENS, target, max_doc_tokens)
    rng.shuffle(body)
    words = _HEAD_TEMPLATE.format(s=subject).split()
    for sentence in body:
        words.extend(sentence)
    text = " ".join(words)
    ordered_facts = tuple((rel, facts[rel]) for rel in RELATIONS)
    return Document(subject=subject, facts=ordered_facts, text=text, doc_id=document_id(text))


def supports_split(subject: str, split: str) -> bool:
    """True if every attribute relation has at least one value whose fact with ``subject`` is in ``split``."""
    check_split(split)
    want_held_out = split == "held_out"
    return all(
        any(is_held_out_fact(subject, rel, v) == want_held_out for v in RELATION_VALUES[rel])
        for rel in ATTRIBUTE_RELATIONS
    )


def split_subjects(split: str) -> Tuple[str, ...]:
    """The names usable as document subjects in ``split`` (see :func:`supports_split`), fixed."""
    return _SPLIT_SUBJECTS[split]


def random_facts(
    rng: random.Random, subject: str, mentor_candidates: Sequence[str], split: str
) -> Dict[str, str]:
    """One value per relation, each fact falling in ``split``; the mentor comes from ``mentor_candidates``."""
    facts = {rel: choose_value(rng, subject, rel, RELATION_VALUES[rel], split) for rel in ATTRIBUTE_RELATIONS}
    facts["mentor"] = choose_value(rng, subject, "mentor", mentor_candidates, split)
    return facts


def copy_document(words: Sequence[str]) -> str:
    """The single document of a copy task: ``<sep> sequence : w1 ... wn .``"""
    return " ".join([SEP_TOKEN, "sequence", ":", *words, "."])


def recall_document(pairs: Sequence[Tuple[str, str]]) -> str:
    """The single document of an associative-recall task: ``<sep> pairs : k1 v1 ... kn vn .``"""
    return " ".join([SEP_TOKEN, "pairs", ":", *(w for pair in pairs for w in pair), "."])


_SPLIT_SUBJECTS = {split: tuple(n for n in NAMES if supports_split(n, split)) for split in SPLITS}
