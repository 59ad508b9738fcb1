"""hypic.engine.tokenizer.Tokenizer on two folders: the seeded test model of make_seeded_tiny (a
byte-level BPE with a ChatML template: any text, chat) and the embedded trained tiny model (the
word-level suite tokenizer: no template, unknown words become <unk>)."""

import json
import shutil

import pytest

from hypic.assets import TINY_MODEL_DIR
from hypic.assets.make_seeded_tiny import write_tiny_model
from hypic.data import SuiteConfig, generate_suite
from hypic.engine.tokenizer import Tokenizer

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Why is the sky blue? ünïcödé"},
]


@pytest.fixture(scope="module")
def seeded_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("seeded")
    write_tiny_model(folder)
    return folder


@pytest.fixture(scope="module")
def tok(seeded_dir):
    return Tokenizer(seeded_dir)


@pytest.fixture(scope="module")
def tiny_tok():
    return Tokenizer(TINY_MODEL_DIR)


def test_special_ids_and_roundtrip(tok):
    eos_text, end_text = "<|im_end|>", "<|endoftext|>"
    assert tok.eos_token == eos_text
    # generation_config lists [im_end, endoftext]; config.json repeats endoftext: no duplicates
    assert tok.eos_token_ids == (tok.token_to_id(eos_text), tok.token_to_id(end_text))
    assert tok.pad_token_id == tok.token_to_id(end_text) and tok.bos_token_id is None
    assert tok.vocab_size == 1024
    text = "Hello wörld, 123 times!\n\ttabs"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    with_special = tok.encode("hi" + eos_text)
    assert with_special[-1] == tok.token_to_id(eos_text)
    assert tok.decode(with_special) == "hi"
    assert tok.decode(with_special, skip_special_tokens=False) == "hi" + eos_text
    with pytest.raises(ValueError, match="text must be a str"):
        tok.encode(["x"])


def test_chat_template(tok):
    text = tok.apply_chat_template(MESSAGES)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhy is the sky blue? ünïcödé<|im_end|>\n<|im_start|>assistant\n"
    )
    assert not tok.apply_chat_template(MESSAGES, add_generation_prompt=False).endswith("assistant\n")
    with pytest.raises(ValueError, match="role"):
        tok.apply_chat_template([{"content": "x"}])


def test_matches_transformers(tok, seeded_dir):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(seeded_dir)
    for text in ["The model reads the answer quickly.", "  odd   spacing\n\nü 42<|im_start|>"]:
        assert tok.encode(text) == hf(text).input_ids
    ids = tok.encode("A story of 999 tokens!")
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    expected = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert tok.apply_chat_template(MESSAGES) == expected


def _folder_with(tmp_path, tokenizer_config, extra_files=None):
    shutil.copy(TINY_MODEL_DIR / "tokenizer.json", tmp_path / "tokenizer.json")  # <sep> is its special id 4
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    for name, content in (extra_files or {}).items():
        (tmp_path / name).write_text(content)
    return tmp_path


def test_template_file_vars_and_errors(tmp_path):
    template = (
        "{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}"
        "{{ bos_token }}{{ messages[0]['content'] | tojson }}{% if enable_thinking %}<think>{% endif %}"
    )
    folder = _folder_with(
        tmp_path,
        {"bos_token": {"content": "<sep>"}, "chat_template": "ignored"},
        {"chat_template.jinja": template, "config.json": json.dumps({"text_config": {"eos_token_id": [5, 6]}})},
    )
    tok = Tokenizer(folder)
    assert tok.bos_token_id == tok.token_to_id("<sep>") == 4
    assert tok.eos_token_ids == (5, 6)
    msg = [{"role": "user", "content": "ü"}]
    assert tok.apply_chat_template(msg) == '<sep>"ü"'
    assert tok.apply_chat_template(msg, template_vars={"enable_thinking": True}).endswith("<think>")
    with pytest.raises(Exception, match="one message only"):
        tok.apply_chat_template(msg * 2)


def test_missing_template_and_files(tmp_path):
    tok = Tokenizer(_folder_with(tmp_path, {}))
    assert tok.eos_token_ids == () and tok.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template(MESSAGES)
    with pytest.raises(ValueError, match="no tokenizer.json"):
        Tokenizer(tmp_path / "nothing")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(ValueError, match="eos_token_id"):
        Tokenizer(tmp_path)


# ---- the embedded trained model: word-level suite tokenizer -------------------------------------------


def _suite_prompt():
    request = generate_suite(SuiteConfig("two_hop", min_docs=2, max_docs=3, min_doc_tokens=36, max_doc_tokens=64), 1)[0]
    return request.prompt().replace("<<PIC_SEP>>", " ")


def test_tiny_special_ids_and_suite_roundtrip(tiny_tok):
    assert tiny_tok.vocab_size == 665
    assert (tiny_tok.bos_token, tiny_tok.eos_token, tiny_tok.pad_token) == ("<bos>", "<eos>", "<pad>")
    assert (tiny_tok.bos_token_id, tiny_tok.pad_token_id) == (1, 0)
    # generation_config, config.json and the tokenizer all name <eos>: one id, no duplicates
    assert tiny_tok.eos_token_ids == (2,)
    assert tiny_tok.special_token_ids == frozenset(range(5))
    text = _suite_prompt()
    ids = tiny_tok.encode(text)
    assert len(ids) == len(text.split()) and 3 not in ids  # one token per word, no <unk>
    # <sep> is a special token: kept by skip_special_tokens=False only
    assert tiny_tok.decode(ids, skip_special_tokens=False) == text
    assert tiny_tok.decode(ids) == text.replace("<sep> ", "")
    assert tiny_tok.encode("<bos> kolton lives in santon . <eos>")[0] == 1


def test_tiny_unknown_words_become_unk(tiny_tok):
    """The word-level vocabulary is closed: words outside it map to <unk> (id 3), they do not raise."""
    ids = tiny_tok.encode("hello kolton Lives in santon")
    unk = tiny_tok.token_to_id("<unk>")
    assert unk == 3 and ids[0] == unk and ids[2] == unk  # unknown word; case matters ("Lives")
    assert ids[1] == tiny_tok.token_to_id("kolton") and ids[3:] == tiny_tok.encode("in santon")
    assert tiny_tok.decode(ids) == "kolton in santon"  # <unk> is special: dropped on decode
    assert tiny_tok.encode("") == []


def test_tiny_has_no_chat_template(tiny_tok):
    assert tiny_tok.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        tiny_tok.apply_chat_template(MESSAGES)


def test_tiny_matches_transformers(tiny_tok):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    for text in [_suite_prompt(), "hello kolton  lives\nin santon ."]:
        assert tiny_tok.encode(text) == hf(text).input_ids
        ids = tiny_tok.encode(text)
        assert tiny_tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert hf.unk_token_id == tiny_tok.token_to_id("<unk>")
