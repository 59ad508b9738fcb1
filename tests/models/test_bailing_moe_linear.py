"""Ring-linear-2.0 (``BailingMoeLinearV2ForCausalLM``): a tiny checkpoint in the published key
layout loads, and hypic's greedy generation and logits equal an independent token-by-token
reference written from the layer equations (tests/models/_lightning.py: float64 per-token loops,
no hypic module)."""

from __future__ import annotations

import pytest
import torch

from hypic.engine.context import PlainContext, SequenceCache
from hypic.models.bailing_moe_linear import BailingMoeLinearV2ForCausalLM
from hypic.models.lightning import alibi_slopes, bailing_decay_rates
from hypic.models.loader import build_dummy_model, load_model
from tests.models._hf import hypic_greedy, write_checkpoint
from tests.models._lightning import RING_CONFIG, VOCAB, RingReference, ring_tensors, save_ring_checkpoint

pytestmark = pytest.mark.usefixtures("single_thread_torch")

PROMPTS = [[5, 17, 40, 3, 88, 21, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [77, 12, 60, 60, 31]]


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    path = tmp_path_factory.mktemp("ring")
    tensors = save_ring_checkpoint(path)
    spec, model = load_model(str(path), dtype=torch.float32)
    return path, tensors, spec, model


def test_published_layout_loads(ring):
    path, tensors, spec, model = ring
    assert isinstance(model, BailingMoeLinearV2ForCausalLM)
    assert spec.layer_types == ("linear_attention", "linear_attention", "full_attention") * 2
    params = dict(model.named_parameters())
    # routed experts assembled from the per-expert tensors; the router bias kept as stored
    gate_up = params["model.layers.2.mlp.experts.gate_up_proj"]
    assert torch.equal(gate_up[3, :32], tensors["model.layers.2.mlp.experts.3.gate_proj.weight"])
    assert torch.equal(gate_up[3, 32:], tensors["model.layers.2.mlp.experts.3.up_proj.weight"])
    assert torch.equal(params["model.layers.4.mlp.gate.expert_bias"], tensors["model.layers.4.mlp.gate.expert_bias"])
    assert torch.equal(params["model.word_embeddings.weight"], tensors["model.word_embeddings.weight"])
    # the multi-token-prediction layer after the last decoder layer is not loaded
    assert not any(name.startswith("model.layers.6.") for name in params)
    # in bf16 the routing bias stays fp32 (its values pick the experts)
    spec16, model16 = load_model(str(path), dtype=torch.bfloat16)
    bias16 = dict(model16.named_parameters())["model.layers.4.mlp.gate.expert_bias"]
    assert bias16.dtype == torch.float32 and model16.lm_head.weight.dtype == torch.bfloat16


def test_a_missing_tensor_is_named(tmp_path):
    tensors = ring_tensors(RING_CONFIG)
    del tensors["model.layers.1.attention.g_norm.weight"]
    write_checkpoint(tmp_path, RING_CONFIG, tensors)
    with pytest.raises(ValueError, match="g_norm"):
        load_model(str(tmp_path), dtype=torch.float32)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_the_recurrent_reference(ring, prompt):
    path, tensors, spec, model = ring
    want = RingReference(RING_CONFIG, tensors).greedy(prompt, 10)
    assert hypic_greedy(spec, model, prompt, 10) == want
    assert len(set(want)) > 2  # a generation that moves, so equal sequences say something


def test_logits_equal_the_reference_at_every_position(ring):
    path, tensors, spec, model = ring
    ids = PROMPTS[1] + [44, 45, 46] * 30  # past a 64-token chunk
    ref = RingReference(RING_CONFIG, tensors)
    want = torch.stack([ref.step(t) for t in ids]).float()
    cache = SequenceCache.allocate(spec, "cpu", torch.float32)
    ctx = PlainContext(spec, [cache], [len(ids)], logits_rows="all")
    with torch.no_grad():
        got = model(torch.tensor(ids), ctx.positions, ctx)
    scale = float(want.abs().max())
    assert float((got - want).abs().max()) < 2e-5 * scale
    # a wrong decay (one layer's rates doubled) moves them far more than that
    layer = model.model.layers[0].attention
    saved = layer.decay
    try:
        from hypic.models.lightning import LogDecay

        layer.decay = LogDecay(saved.rates * 2)
        cache = SequenceCache.allocate(spec, "cpu", torch.float32)
        ctx = PlainContext(spec, [cache], [len(ids)], logits_rows="all")
        with torch.no_grad():
            wrong = model(torch.tensor(ids), ctx.positions, ctx)
        assert float((wrong - want).abs().max()) > 1e-3 * scale
    finally:
        layer.decay = saved


def test_decay_rates_are_alibi_slopes_scaled_by_depth():
    assert alibi_slopes(8) == [2 ** (-i) for i in range(1, 9)]
    # not a power of two: the 4-head slopes, then every other slope of the 8-head ones
    assert alibi_slopes(6) == alibi_slopes(4) + alibi_slopes(8)[0::2][:2]
    rates = bailing_decay_rates(16, 3, 20)
    torch.testing.assert_close(rates, torch.tensor(alibi_slopes(16)) * (1 - 3 / 19 + 1e-5))
    torch.testing.assert_close(bailing_decay_rates(4, 0, 1), torch.tensor(alibi_slopes(4)) * (1 + 1e-5))


def test_dummy_weights_make_norms_identity_and_run():
    spec, model = build_dummy_model(RING_CONFIG, dtype=torch.float32, seed=0)
    params = dict(model.named_parameters())
    assert torch.equal(params["model.layers.0.attention.g_norm.weight"], torch.ones(64))
    assert torch.equal(params["model.layers.4.mlp.gate.expert_bias"], torch.zeros(8))
    assert len(hypic_greedy(spec, model, [1, 2, 3], 3)) == 3
    assert model.fuse_projections() > 0  # [query_key_value | g_proj] and the shared experts
    assert all(0 <= t < VOCAB for t in hypic_greedy(spec, model, [1, 2, 3], 3))
