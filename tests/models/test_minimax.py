"""MiniMax (transformers' ``minimax``): tiny random checkpoints made by transformers and saved with
``save_pretrained`` load in hypic, and greedy generation and logits in float32 equal transformers'."""

from __future__ import annotations

import pytest
import torch

from hypic.engine.context import PlainContext, SequenceCache
from hypic.models.lightning import minimax_decay_rates
from hypic.models.loader import load_model
from hypic.models.minimax import MiniMaxForCausalLM
from tests.models._hf import hf_greedy, hypic_greedy
from tests.models._lightning import VOCAB, build_minimax

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("single_thread_torch")

PROMPTS = [[3, 17, 90, 5, 42, 7, 1, 88, 23], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [64, 2, 64, 9, 50]]
# second config: several lightning blocks per prompt (block_size 2), softmax layers in the middle,
# an 8-layer depth for the decay
VARIANTS = {
    "base": {},
    "deep": dict(num_hidden_layers=8, block_size=2,
                 layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention",
                              "full_attention", "linear_attention", "linear_attention", "full_attention"]),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def pair(request, tmp_path_factory):
    hf = build_minimax(seed=2, **VARIANTS[request.param])
    path = tmp_path_factory.mktemp("minimax_" + request.param)
    hf.save_pretrained(str(path))
    spec, model = load_model(str(path), dtype=torch.float32)
    return hf, spec, model


def test_saved_checkpoint_loads_under_transformers_names(pair):
    hf, spec, model = pair
    assert isinstance(model, MiniMaxForCausalLM)
    ours = dict(model.named_parameters())
    for name, param in hf.named_parameters():  # transformers' module names are hypic's parameter names
        assert torch.equal(ours[name], param.detach()), name


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_generation_equals_transformers(pair, prompt):
    hf, spec, model = pair
    want = hf_greedy(hf, prompt, 12)
    assert hypic_greedy(spec, model, prompt, 12) == want
    assert len(set(want)) > 2


def test_logits_equal_transformers(pair):
    hf, spec, model = pair
    ids = list(range(1, 60))
    with torch.no_grad():
        want = hf(input_ids=torch.tensor([ids])).logits[0].float()
        cache = SequenceCache.allocate(spec, "cpu", torch.float32)
        ctx = PlainContext(spec, [cache], [len(ids)], logits_rows="all")
        got = model(torch.tensor(ids), ctx.positions, ctx)
    assert float((got - want).abs().max()) < 2e-5 * float(want.abs().max())


def test_decay_rates_equal_transformers(pair):
    hf, spec, model = pair
    for i, layer in enumerate(hf.model.layers):
        if spec.layer_types[i] == "linear_attention":
            want = layer.self_attn.slope_rate.flatten()
            assert torch.equal(minimax_decay_rates(spec.num_attention_heads, i, spec.num_layers), want)
            assert torch.equal(model.model.layers[i].self_attn.decay.rates, want)


def test_partial_rotary_matches_transformers_rotating_the_same_dims(tmp_path, monkeypatch):
    """With ``partial_rotary_factor`` 0.5 hypic rotates the first half of each head (as the
    published MiniMax models do); transformers 5.25's default RoPE for ``minimax`` rotates the
    whole head. With transformers' rotation restricted to the same dims (its tables built on the
    rotary dims, the rest passed through, as its other partial-RoPE models do) the two agree."""
    from transformers.models.minimax import modeling_minimax as mm

    hf = build_minimax(seed=3, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                "partial_rotary_factor": 0.5})
    hf.save_pretrained(str(tmp_path))
    spec, model = load_model(str(tmp_path), dtype=torch.float32)
    assert spec.rotary_dim == 8
    prompt = PROMPTS[0]
    full_rope = hf_greedy(hf, prompt, 12)

    def partial_tables(config, **kwargs):
        dim = int(config.head_dim * config.rope_parameters["partial_rotary_factor"])
        base = config.rope_parameters["rope_theta"]
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0

    def partial_apply(q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        rot = cos.shape[-1]

        def one(x):
            r, rest = x[..., :rot], x[..., rot:]
            return torch.cat([r * cos + mm.rotate_half(r) * sin, rest], dim=-1)

        return one(q), one(k)

    monkeypatch.setattr(mm.MiniMaxRotaryEmbedding, "compute_default_rope_parameters", staticmethod(partial_tables))
    partial = build_minimax(seed=3, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 0.5})
    partial.load_state_dict(hf.state_dict())
    monkeypatch.setattr(mm, "apply_rotary_pos_emb", partial_apply)
    want = hf_greedy(partial, prompt, 12)
    assert hypic_greedy(spec, model, prompt, 12) == want
    assert want != full_rope  # the rotated dims matter: the check can fail


def test_checkpoint_key_maps_the_saved_expert_and_router_names():
    from hypic.models.config import spec_from_config
    from hypic.models.loader import build_empty_model

    cfg = dict(model_type="minimax", vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
               layer_types=["linear_attention", "full_attention"])
    model = build_empty_model(spec_from_config(cfg), torch.float32, "meta")
    key = model.checkpoint_key
    assert key("model.layers.1.block_sparse_moe.experts.3.w1.weight") == "model.layers.1.mlp.experts.3.gate_proj.weight"
    assert key("model.layers.1.block_sparse_moe.experts.3.w3.weight") == "model.layers.1.mlp.experts.3.up_proj.weight"
    assert key("model.layers.1.block_sparse_moe.experts.3.w2.weight") == "model.layers.1.mlp.experts.3.down_proj.weight"
    assert key("model.layers.0.block_sparse_moe.gate.weight") == "model.layers.0.mlp.gate.weight"
    assert key("model.layers.0.self_attn.slope_rate") is None
    assert key("model.layers.0.self_attn.qkv_proj.weight") == "model.layers.0.self_attn.qkv_proj.weight"
