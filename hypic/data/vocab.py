"""The closed vocabulary of the synthetic suites and its word-level tokenizer.

The language is deliberately small (about 700 words) so that a ~5-10 M-parameter model can learn it:
every word list below is fixed (independent of any seed), and the vocabulary is exactly the union
of these lists plus the special tokens. Every generator emits only these words, so any request of
any split tokenizes without ``<unk>`` (the vocabulary-closure property the tests check).

Invented names (people, cities) are built from consonant-vowel syllables, picked by a fixed RNG;
the lists are computed once at import and never change.
"""

from __future__ import annotations

import itertools
import json
import os
import random
from typing import Dict, List, Sequence, Tuple

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SEP_TOKEN = "<sep>"
# Order fixes the ids: <pad>=0, <bos>=1, <eos>=2, <unk>=3, <sep>=4.
SPECIAL_TOKENS: Tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, SEP_TOKEN)

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
NUM_NAMES = 384
NUM_CITIES = 64


def _invented_words() -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """People names (CVCV + optional final consonant) and city names (CVC + suffix), fixed forever."""
    syllables = [c + v for c, v in itertools.product(_CONSONANTS, _VOWELS)]
    # A fixed seed: the vocabulary must be identical for every run and every suite seed.
    rng = random.Random(20261130)
    name_pool = [a + b + e for a, b in itertools.product(syllables, syllables) for e in ("", "n", "l", "r")]
    names = sorted(rng.sample(name_pool, NUM_NAMES))
    city_pool = [
        s + c + suffix
        for s in syllables
        for c in "nrlm"
        for suffix in ("ton", "dale", "ford", "mouth", "burg", "wick")
    ]
    cities = sorted(rng.sample(city_pool, NUM_CITIES))
    return tuple(names), tuple(cities)


NAMES, CITIES = _invented_words()

JOBS: Tuple[str, ...] = (
    "baker", "pilot", "farmer", "doctor", "teacher", "painter", "sailor", "miner",
    "tailor", "singer", "dancer", "lawyer", "writer", "nurse", "hunter", "fisher",
    "potter", "weaver", "smith", "cook", "judge", "guard", "clerk", "driver",
    "builder", "gardener", "priest", "soldier", "merchant", "banker", "poet", "scholar",
)
COLORS: Tuple[str, ...] = (
    "red", "blue", "green", "yellow", "purple", "orange", "white", "black",
    "brown", "gray", "pink", "gold", "silver", "violet", "amber", "teal",
)
ANIMALS: Tuple[str, ...] = (
    "cat", "dog", "horse", "goat", "sheep", "cow", "pig", "duck",
    "goose", "owl", "hawk", "fox", "wolf", "bear", "rabbit", "mouse",
    "frog", "snake", "lizard", "turtle", "parrot", "donkey", "camel", "llama",
)

# Filler vocabulary: disjoint from every answer type, so fillers never create a second candidate answer.
FILLER_ADJECTIVES: Tuple[str, ...] = (
    "quiet", "cold", "warm", "long", "short", "bright", "dark", "busy",
    "calm", "wet", "dry", "old", "new", "small", "large", "soft",
    "loud", "slow", "fast", "heavy", "clean", "empty", "crowded", "narrow",
)
FILLER_NOUNS: Tuple[str, ...] = (
    "river", "road", "market", "bridge", "garden", "field", "tower", "wall",
    "harbor", "forest", "hill", "lake", "square", "school", "library", "station",
    "castle", "village", "valley", "mill", "barn", "well", "gate", "street",
    "farm", "shop", "chapel", "inn", "park", "port", "temple", "orchard",
)
FILLER_TIMES: Tuple[str, ...] = (
    "morning", "evening", "night", "winter", "summer", "spring",
    "autumn", "week", "day", "season", "year", "festival",
)
FILLER_VERBS: Tuple[str, ...] = (
    "visited", "crossed", "watched", "painted", "cleaned", "repaired", "built", "passed",
    "left", "found", "opened", "closed", "guarded", "sold", "bought", "praised",
)
FILLER_GROUPS: Tuple[str, ...] = (
    "travelers", "children", "workers", "traders", "neighbors", "strangers", "monks", "pilgrims",
)

# Every word a template (fact, filler, question, copy / recall task) can emit besides the lists above.
FUNCTION_WORDS: Tuple[str, ...] = (
    ".", ":", "?", ",", "a", "about", "and", "animal", "answer", "are", "as", "color", "does",
    "during", "follows", "is", "it", "job", "like", "likes", "list", "live", "lives", "many", "mentor",
    "near", "nobody", "of", "order", "own", "owns", "pairs", "passage", "passages", "people", "question",
    "repeat", "sequence", "that", "the", "this", "was", "were", "what", "where", "who", "works", "in",
)

WORD_LISTS: Tuple[Tuple[str, ...], ...] = (
    NAMES, CITIES, JOBS, COLORS, ANIMALS, FILLER_ADJECTIVES, FILLER_NOUNS, FILLER_TIMES,
    FILLER_VERBS, FILLER_GROUPS, FUNCTION_WORDS,
)


def vocabulary() -> Dict[str, int]:
    """Word -> id: special tokens first (ids 0-4), then every word of :data:`WORD_LISTS` once, in order."""
    vocab: Dict[str, int] = {}
    for word in SPECIAL_TOKENS:
        vocab[word] = len(vocab)
    for words in WORD_LISTS:
        for word in words:
            if word not in vocab:
                vocab[word] = len(vocab)
    return vocab


def _check_lists_disjoint() -> None:
    """Answer types must not overlap each other or filler words (an answer must be unambiguous)."""
    seen: Dict[str, str] = {}
    named = {
        "NAMES": NAMES, "CITIES": CITIES, "JOBS": JOBS, "COLORS": COLORS, "ANIMALS": ANIMALS,
        "FILLER_ADJECTIVES": FILLER_ADJECTIVES, "FILLER_NOUNS": FILLER_NOUNS,
        "FILLER_TIMES": FILLER_TIMES, "FILLER_VERBS": FILLER_VERBS, "FILLER_GROUPS": FILLER_GROUPS,
        "FUNCTION_WORDS": FUNCTION_WORDS,
    }
    for list_name, words in named.items():
        for word in words:
            if word in seen:
                raise RuntimeError(f"word {word!r} is in both {seen[word]} and {list_name}")
            seen[word] = list_name


_check_lists_disjoint()


def build_tokenizer(vocab: Dict[str, int] | None = None):
    """A ``tokenizers.Tokenizer``: WordLevel over ``vocab`` (default :func:`vocabulary`; the long
    suites' model passes :func:`hypic.data.long_vocab.extended_vocabulary`), whitespace-split
    pre-tokenizer.

    Words are separated by single spaces in every generated text (punctuation is its own word), so
    tokenizing segments one by one and concatenating gives the same ids as tokenizing the joined text.
    No post-processor: callers add ``<bos>``/``<eos>`` explicitly.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders

    tokenizer = Tokenizer(models.WordLevel(vocab=dict(vocab or vocabulary()), unk_token=UNK_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Word-level decode: join tokens with single spaces.
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def save_tokenizer(directory: str, vocab: Dict[str, int] | None = None) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (loadable by transformers'
    ``PreTrainedTokenizerFast`` / ``AutoTokenizer``) of ``vocab`` (default :func:`vocabulary`)
    into ``directory``."""
    if not isinstance(directory, str) or not directory:
        raise ValueError("directory: must be a non-empty path string")
    os.makedirs(directory, exist_ok=True)
    build_tokenizer(vocab).save(os.path.join(directory, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": UNK_TOKEN,
        "pad_token": PAD_TOKEN,
        "sep_token": SEP_TOKEN,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 65536,
    }
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2)
        handle.write("\n")


def special_token_ids() -> Dict[str, int]:
    """Ids of the special tokens (fixed by :data:`SPECIAL_TOKENS` order)."""
    return {token: i for i, token in enumerate(SPECIAL_TOKENS)}


def encode_words(words: Sequence[str], vocab: Dict[str, int]) -> List[int]:
    """Map pre-split words to ids; raises ValueError on a word outside the vocabulary."""
    try:
        return [vocab[w] for w in words]
    except KeyError as err:
        raise ValueError(f"words: {err.args[0]!r} is not in the vocabulary") from None
