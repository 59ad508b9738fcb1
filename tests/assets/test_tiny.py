"""The embedded tiny model: reproducible from its generator, small, and a valid Qwen3.5 checkpoint
for transformers (same logits and greedy tokens as hypic)."""

import json

import pytest
import torch

from hypic.assets import TINY_MODEL_DIR, resolve_model_path
from hypic.assets.make_seeded_tiny import write_tiny_model

PROMPT = "The model reads the answer quickly."


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_committed_folder_matches_generator(tmp_path):
    write_tiny_model(tmp_path)
    names = sorted(p.name for p in TINY_MODEL_DIR.iterdir())
    assert names == sorted(p.name for p in tmp_path.iterdir())
    for name in names:
        assert (tmp_path / name).read_bytes() == (TINY_MODEL_DIR / name).read_bytes(), name


def test_size_and_config():
    total = sum(p.stat().st_size for p in TINY_MODEL_DIR.iterdir())
    assert total < 8.5 * 2**20
    config = json.loads((TINY_MODEL_DIR / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text" and config["num_hidden_layers"] == 8
    assert [i for i, t in enumerate(config["layer_types"]) if t == "full_attention"] == [3, 7]
    assert config["hidden_size"] == 256 and config["linear_num_key_heads"] == 4
    assert config["linear_key_head_dim"] == 64
    assert config["rope_parameters"]["partial_rotary_factor"] < 1


def test_resolve_model_path(tmp_path):
    assert resolve_model_path("tiny") == TINY_MODEL_DIR
    assert resolve_model_path(str(TINY_MODEL_DIR)) == TINY_MODEL_DIR
    with pytest.raises(ValueError, match="no such folder"):
        resolve_model_path(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model_path(tmp_path)
    with pytest.raises(ValueError, match="str or Path"):
        resolve_model_path(3)


def test_transformers_loads_tiny_with_same_logits_and_greedy_tokens():
    transformers = pytest.importorskip("transformers")
    from hypic.engine.context import PlainContext, SequenceCache
    from hypic.engine.tokenizer import Tokenizer
    from hypic.entrypoints.llm import LLM
    from hypic.engine.sampling_params import SamplingParams

    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    ids = hf_tokenizer(PROMPT).input_ids
    assert ids == Tokenizer(TINY_MODEL_DIR).encode(PROMPT)

    hf = transformers.Qwen3_5ForCausalLM.from_pretrained(TINY_MODEL_DIR, dtype=torch.float32).eval()
    with torch.no_grad():
        ref_logits = hf(torch.tensor([ids])).logits[0]
        ref_tokens = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()

    llm = LLM("tiny", dtype="float32", device="cpu")
    engine = llm.llm_engine
    cache = SequenceCache.allocate(engine.spec, "cpu", torch.float32)
    ctx = PlainContext(engine.spec, [cache], [len(ids)], logits_rows="all")
    with torch.inference_mode():
        logits = engine.model(torch.tensor(ids), ctx.positions, ctx)
    assert ref_logits.std() > 1.0  # logits with real spread, so the comparison means something
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=0)

    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert out[0].outputs[0].token_ids == ref_tokens
