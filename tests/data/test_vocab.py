import json

import pytest

from hypic.data.vocab import (
    NAMES, CITIES, SPECIAL_TOKENS, build_tokenizer, encode_words, save_tokenizer, special_token_ids, vocabulary,
)


def test_special_token_ids_fixed():
    vocab = vocabulary()
    assert [vocab[t] for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert special_token_ids()["<eos>"] == 2


def test_vocabulary_size_and_uniqueness():
    vocab = vocabulary()
    assert len(set(vocab.values())) == len(vocab)
    assert sorted(vocab.values()) == list(range(len(vocab)))
    assert 300 <= len(vocab) <= 2000
    assert len(set(NAMES)) == len(NAMES) and not set(NAMES) & set(CITIES)


def test_tokenizer_matches_vocab_and_recognises_specials():
    tok = build_tokenizer()
    vocab = vocabulary()
    text = f"<sep> this passage is about {NAMES[3]} . {NAMES[3]} lives in {CITIES[5]} . <eos>"
    enc = tok.encode(text)
    assert enc.ids == encode_words(text.split(), vocab)
    assert vocab["<unk>"] not in enc.ids
    assert tok.encode("zzzz").ids == [vocab["<unk>"]]


def test_encode_words_rejects_unknown():
    with pytest.raises(ValueError, match="words"):
        encode_words(["nonword"], vocabulary())


def test_save_tokenizer_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    save_tokenizer(str(tmp_path))
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<eos>"
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    text = f"<sep> {NAMES[0]} owns a cat ."
    assert hf(text)["input_ids"] == build_tokenizer().encode(text).ids
