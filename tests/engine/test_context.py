"""PlainContext / SequenceCache bookkeeping (model-level behaviour is in tests/models)."""

import pytest
import torch

from hypic.engine.context import AttentionLayerCache, LinearLayerCache, PlainContext, SequenceCache
from hypic.models.config import spec_from_config
from hypic.models.loader import build_dummy_model

CFG = {
    "model_type": "qwen3_next", "vocab_size": 50, "hidden_size": 32, "intermediate_size": 48,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
    "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16, "full_attention_interval": 2,
}
SPEC = spec_from_config(CFG)


def test_allocate_shapes_and_state_dtypes():
    cache = SequenceCache.allocate(SPEC, "cpu", torch.bfloat16)
    lin, att = cache.layers[0], cache.layers[1]
    assert isinstance(lin, LinearLayerCache) and isinstance(att, AttentionLayerCache)
    assert lin.recurrent_state.shape == (4, 8, 8) and lin.recurrent_state.dtype == torch.float32
    assert lin.conv_state.shape == (SPEC.conv_dim, 3) and lin.conv_state.dtype == torch.float32
    assert att.keys.shape == (0, 2, 16) and att.keys.dtype == torch.bfloat16
    assert cache.num_tokens == 0 and cache.nbytes == 2 * (4 * 8 * 8 * 4 + SPEC.conv_dim * 3 * 4)


def test_attention_cache_grows_and_clone_is_independent():
    att = AttentionLayerCache(2, 4, torch.float32, torch.device("cpu"))
    for i in range(40):
        att.append(torch.full((1, 2, 4), float(i)), torch.zeros(1, 2, 4), torch.tensor([i]))
    assert att.length == 40 and att.keys[:, 0, 0].tolist() == [float(i) for i in range(40)]
    assert att.positions.tolist() == list(range(40))
    copy = att.clone()
    att.append(torch.zeros(2, 2, 4), torch.zeros(2, 2, 4), torch.tensor([40, 41]))
    assert copy.length == 40 and att.length == 42
    with pytest.raises(ValueError, match="keys/values"):
        att.append(torch.zeros(1, 3, 4), torch.zeros(1, 3, 4), torch.tensor([0]))


def test_adopted_attention_cache_holds_the_tensors_and_grows_away_from_them():
    keys, values = torch.randn(5, 2, 4), torch.randn(5, 2, 4)
    positions = torch.arange(5)
    att = AttentionLayerCache.adopt(keys, values, positions)
    same = lambda a, b: a.data_ptr() == b.data_ptr() and a.shape == b.shape  # noqa: E731 - no copy made
    assert same(att.keys, keys) and same(att.values, values) and same(att.positions, positions)
    assert att.num_tokens == 5
    kept = keys.clone(), values.clone(), positions.clone()
    att.append(torch.ones(1, 2, 4), torch.ones(1, 2, 4), torch.tensor([9]))
    assert att.length == 6 and att.positions.tolist() == [0, 1, 2, 3, 4, 9]
    assert torch.equal(att.keys[:5], kept[0]) and torch.equal(att.keys[5], torch.ones(2, 4))
    # the adopted tensors themselves were never written
    assert torch.equal(keys, kept[0]) and torch.equal(values, kept[1]) and torch.equal(positions, kept[2])
    with pytest.raises(ValueError, match="keys/values"):
        AttentionLayerCache.adopt(keys, values[:4], positions)
    with pytest.raises(ValueError, match="positions"):
        AttentionLayerCache.adopt(keys, values, positions[:4])


def test_positions_and_logits_rows():
    caches = [SequenceCache.allocate(SPEC, "cpu") for _ in range(2)]
    ctx = PlainContext(SPEC, caches, [3, 2])
    assert ctx.positions.tolist() == [0, 1, 2, 0, 1] and ctx.cu_seqlens.tolist() == [0, 3, 5]
    hidden = torch.arange(5.0)[:, None]
    assert ctx.select_logits_rows(hidden).flatten().tolist() == [2.0, 4.0]
    ctx = PlainContext(SPEC, caches, [3, 2], logits_rows=torch.tensor([0, 4]))
    assert ctx.select_logits_rows(hidden).flatten().tolist() == [0.0, 4.0]
    assert PlainContext(SPEC, caches, [3, 2], logits_rows="all").select_logits_rows(hidden).shape == (5, 1)


@torch.no_grad()
def test_caches_advance_and_clone_forks():
    spec, model = build_dummy_model(CFG, dtype=torch.float32, seed=0)
    cache = SequenceCache.allocate(spec, "cpu")
    ctx = PlainContext(spec, [cache], [6])
    model(torch.arange(6), ctx.positions, ctx)
    assert cache.num_tokens == 6 and all(layer.num_tokens == 6 for layer in cache.layers)
    fork = cache.clone()
    outs = []
    for c in (cache, fork):
        ctx = PlainContext(spec, [c], [1])
        assert ctx.positions.tolist() == [6]
        outs.append(model(torch.tensor([7]), ctx.positions, ctx))
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)


@pytest.mark.parametrize(
    "args, message",
    [
        (dict(num_tokens_per_seq=[3]), "1 entries for 2 caches"),
        (dict(num_tokens_per_seq=[3, 0]), ">= 1"),
        (dict(positions=torch.tensor([0, 2, 1, 0, 1])), "strictly increasing"),
        (dict(positions=torch.tensor([0, 1, 2])), "shape \\[5\\]"),
        (dict(logits_rows="first"), "logits_rows"),
        (dict(logits_rows=torch.tensor([5])), "rows in \\[0, 5\\)"),
    ],
)
def test_validation(args, message):
    caches = [SequenceCache.allocate(SPEC, "cpu") for _ in range(2)]
    kwargs = dict(num_tokens_per_seq=[3, 2])
    kwargs.update(args)
    with pytest.raises(ValueError, match=message):
        PlainContext(SPEC, caches, **kwargs)


def test_same_cache_twice_rejected():
    cache = SequenceCache.allocate(SPEC, "cpu")
    with pytest.raises(ValueError, match="twice"):
        PlainContext(SPEC, [cache, cache], [1, 1])


def test_lightning_caches_have_no_conv_state_and_chunked_prefill_equals_one_pass():
    """A conv-less family (Ring-linear): the linear caches hold the state alone, and a prompt
    prefilled in chunks (several contexts over one cache), then decoded, equals one pass."""
    from tests.models._lightning import RING_CONFIG

    spec, model = build_dummy_model(RING_CONFIG, dtype=torch.float32, seed=0)
    cache = SequenceCache.allocate(spec, "cpu", torch.float32)
    lin = cache.layers[0]
    assert lin.conv_state is None and lin.recurrent_state.shape == (4, 16, 16)
    assert lin.nbytes == 4 * 16 * 16 * 4 and lin.clone().conv_state is None
    ids = torch.randint(1, 90, (70,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = SequenceCache.allocate(spec, "cpu", torch.float32)
        ctx = PlainContext(spec, [whole], [70])
        want = model(ids, ctx.positions, ctx)
        parts = SequenceCache.allocate(spec, "cpu", torch.float32)
        for a, b in ((0, 30), (30, 69)):
            ctx = PlainContext(spec, [parts], [b - a])
            model(ids[a:b], ctx.positions, ctx)
        ctx = PlainContext(spec, [parts], [1])  # the last token: a decode step
        got = model(ids[69:], ctx.positions, ctx)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(parts.layers[0].recurrent_state, whole.layers[0].recurrent_state, atol=1e-5, rtol=0)
