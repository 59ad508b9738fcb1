"""The embedded tiny model: the trained checkpoint of training/train_tiny.py, small, with the suite
tokenizer, a valid Qwen3.5 checkpoint for transformers (same logits and greedy tokens as hypic), and
a language model that answers held-out suite questions (a random model would not)."""

import json

import pytest
import torch

from hypic.assets import TINY_MODEL_DIR, resolve_model_path
from hypic.data import SuiteConfig, generate_suite
from hypic.data.vocab import SPECIAL_TOKENS, build_tokenizer, vocabulary

FILES = {"README.md", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _short_requests(task, n):
    """Held-out suite requests at a short shape (2-3 documents of 36-64 tokens): fast on CPU."""
    return generate_suite(SuiteConfig(task, min_docs=2, max_docs=3, min_doc_tokens=36, max_doc_tokens=64), n)


def test_folder_files_and_size():
    assert {p.name for p in TINY_MODEL_DIR.iterdir()} == FILES
    total = sum(p.stat().st_size for p in TINY_MODEL_DIR.iterdir())
    assert total < 30 * 2**20
    card = (TINY_MODEL_DIR / "README.md").read_text()
    assert "train_tiny.py" in card and "3,097" in card and "<unk>" in card


def test_config_matches_the_suite_tokenizer():
    config = json.loads((TINY_MODEL_DIR / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text" and config["num_hidden_layers"] == 8
    assert [i for i, t in enumerate(config["layer_types"]) if t == "full_attention"] == [3, 7]
    assert config["hidden_size"] == 256 and config["linear_num_key_heads"] == 4
    assert config["rope_parameters"]["partial_rotary_factor"] < 1
    # The tokenizer is exactly the suite tokenizer of hypic.data.vocab, and the model's vocabulary is its size.
    vocab = vocabulary()
    assert json.loads((TINY_MODEL_DIR / "tokenizer.json").read_text()) == json.loads(build_tokenizer().to_str())
    assert config["vocab_size"] == len(vocab) == 665
    # bos / eos / pad agree across config.json, generation_config.json and tokenizer_config.json.
    generation = json.loads((TINY_MODEL_DIR / "generation_config.json").read_text())
    tokenizer_config = json.loads((TINY_MODEL_DIR / "tokenizer_config.json").read_text())
    for key in ("bos", "eos", "pad"):
        token_id = vocab[tokenizer_config[f"{key}_token"]]
        assert config[f"{key}_token_id"] == generation[f"{key}_token_id"] == token_id, key
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 0)
    assert SPECIAL_TOKENS[:3] == ("<pad>", "<bos>", "<eos>")
    assert "chat_template" not in tokenizer_config and not (TINY_MODEL_DIR / "chat_template.jinja").exists()


def test_seeded_test_model_is_deterministic(tmp_path):
    """make_seeded_tiny (the tests' byte-level, ChatML stand-in) writes the same bytes every time."""
    from hypic.assets.make_seeded_tiny import write_tiny_model

    write_tiny_model(tmp_path / "a")
    write_tiny_model(tmp_path / "b")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_seeded_generator_never_overwrites_the_trained_model():
    from hypic.assets.make_seeded_tiny import write_tiny_model

    before = (TINY_MODEL_DIR / "model.safetensors").stat().st_mtime_ns
    with pytest.raises(ValueError, match="shipped trained model"):
        write_tiny_model(TINY_MODEL_DIR)
    assert (TINY_MODEL_DIR / "model.safetensors").stat().st_mtime_ns == before


def test_resolve_model_path(tmp_path):
    assert resolve_model_path("tiny") == TINY_MODEL_DIR
    assert resolve_model_path(str(TINY_MODEL_DIR)) == TINY_MODEL_DIR
    with pytest.raises(ValueError, match="no such folder"):
        resolve_model_path(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model_path(tmp_path)
    with pytest.raises(ValueError, match="str or Path"):
        resolve_model_path(3)


def test_loader_builds_the_checkpoint():
    from safetensors.torch import load_file

    from hypic.models.loader import load_model

    spec, model = load_model(str(TINY_MODEL_DIR), dtype=torch.float32, device="cpu")
    assert spec.vocab_size == 665 and spec.num_layers == 8 and spec.tie_word_embeddings
    assert not hasattr(model, "lm_head")  # tied: the output head is the embedding matrix
    stored = load_file(str(TINY_MODEL_DIR / "model.safetensors"))
    assert stored["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert torch.equal(model.output_weight(), stored["model.embed_tokens.weight"].float())


@pytest.mark.parametrize("task, max_tokens", [("single_hop", 6), ("two_hop", 8)])
def test_answers_held_out_lookup_questions(task, max_tokens):
    """The trained model reads facts from its context (held-out facts, short shape); a random or
    untrained model scores ~0 here. Two-hop answers spell out the bridge, then the fact (``palan
    lives in santon``): both hops must be right (7 of 8 on this shape at step 3,962)."""
    from hypic import LLM, SamplingParams

    llm = LLM("tiny", dtype="float32", device="cpu", seed=0)
    requests = _short_requests(task, 8)
    outputs = llm.generate([r.prompt() for r in requests], SamplingParams(temperature=0, max_tokens=max_tokens),
                           use_tqdm=False)
    correct = sum(o.outputs[0].text == r.answers[0] for o, r in zip(outputs, requests))
    assert correct >= 6, [(o.outputs[0].text, r.answers[0]) for o, r in zip(outputs, requests)]
    # Answers end with <eos>: generation stops by itself.
    assert all(o.outputs[0].finish_reason == "stop" for o in outputs)


def test_transformers_loads_tiny_with_same_logits_and_greedy_tokens():
    transformers = pytest.importorskip("transformers")
    from hypic.engine.context import PlainContext, SequenceCache
    from hypic.engine.tokenizer import Tokenizer
    from hypic.entrypoints.llm import LLM
    from hypic.engine.sampling_params import SamplingParams

    request = _short_requests("single_hop", 1)[0]
    prompt = request.plain_text()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    ids = hf_tokenizer(prompt).input_ids
    assert ids == Tokenizer(TINY_MODEL_DIR).encode(prompt)
    assert hf_tokenizer.unk_token_id not in ids and len(ids) == len(prompt.split())

    hf = transformers.AutoModelForCausalLM.from_pretrained(TINY_MODEL_DIR, dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3_5ForCausalLM"
    with torch.no_grad():
        ref_logits = hf(torch.tensor([ids])).logits[0]
        # transformers stops at generation_config's eos (2) and returns it; hypic stops there too.
        ref_tokens = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
        ref_long = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                               eos_token_id=None, min_new_tokens=8)[0, len(ids):].tolist()
    assert ref_tokens[-1] == hf.generation_config.eos_token_id == 2
    assert hf_tokenizer.decode(ref_tokens, skip_special_tokens=True) == request.answers[0]

    llm = LLM("tiny", dtype="float32", device="cpu")
    engine = llm.llm_engine
    cache = SequenceCache.allocate(engine.spec, "cpu", torch.float32)
    ctx = PlainContext(engine.spec, [cache], [len(ids)], logits_rows="all")
    with torch.inference_mode():
        logits = engine.model(torch.tensor(ids), ctx.positions, ctx)
    assert ref_logits.std() > 1.0  # logits with real spread, so the comparison means something
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=0)

    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == ref_tokens and out.finish_reason == "stop"
    assert out.text == request.answers[0]
    past_eos = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert past_eos[0].outputs[0].token_ids == ref_long
