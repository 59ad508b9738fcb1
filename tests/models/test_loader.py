"""Checkpoint loading (single file, sharded index, VLM key layout, stacked or per-expert MoE),
dummy weights, and the errors users see."""

import json
import math

import pytest
import torch

from hypic.engine.context import PlainContext, SequenceCache
from hypic.models.config import spec_from_config
from hypic.models.loader import build_dummy_model, build_empty_model, load_model
from tests.models._hf import write_checkpoint
from tests.models.test_config import QWEN3_NEXT_80B, QWEN35_35B_TEXT

TINY = {
    "model_type": "qwen3_5_moe_text", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
    "shared_expert_intermediate_size": 16, "full_attention_interval": 2,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
}


def _hf_state_dict(model, prefix="model.", per_expert=True):
    """Our parameters under Hugging Face checkpoint names."""
    out = {}
    for name, p in model.state_dict().items():
        key = prefix + name[len("model."):] if name.startswith("model.") else name
        if per_expert and name.endswith("mlp.experts.gate_up_proj"):
            base = key[: -len(".gate_up_proj")]
            inter = p.shape[1] // 2
            for e in range(p.shape[0]):
                out[f"{base}.{e}.gate_proj.weight"] = p[e, :inter].clone()
                out[f"{base}.{e}.up_proj.weight"] = p[e, inter:].clone()
        elif per_expert and name.endswith("mlp.experts.down_proj"):
            base = key[: -len(".down_proj")]
            for e in range(p.shape[0]):
                out[f"{base}.{e}.down_proj.weight"] = p[e].clone()
        else:
            out[key] = p.clone()
    return out


@torch.no_grad()
def _logits(spec, model, ids):
    dtype = model.model.embed_tokens.weight.dtype
    cache = SequenceCache.allocate(spec, "cpu", dtype)
    ctx = PlainContext(spec, [cache], [len(ids)], logits_rows="all")
    return model(torch.tensor(ids), ctx.positions, ctx)


@pytest.fixture(scope="module")
def reference():
    return build_dummy_model(TINY, dtype=torch.float32, seed=3)


def test_roundtrip_single_file_per_expert(tmp_path, reference):
    spec, model = reference
    write_checkpoint(tmp_path / "m", TINY, _hf_state_dict(model))
    spec2, loaded = load_model(str(tmp_path / "m"), dtype=torch.float32)
    assert spec2 == spec
    ids = list(range(1, 12))
    torch.testing.assert_close(_logits(spec, loaded, ids), _logits(spec, model, ids), atol=0, rtol=0)


def test_sharded_vlm_layout_with_stacked_experts_and_skipped_keys(tmp_path, reference):
    spec, model = reference
    tensors = _hf_state_dict(model, prefix="model.language_model.", per_expert=False)
    # transposed stacks ([E, H, 2I] / [E, I, H]) are recognised by shape
    for k in [k for k in tensors if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj")]:
        tensors[k] = tensors[k].transpose(1, 2).contiguous()
    tensors["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(3, 3)
    tensors["mtp.layers.0.mlp.gate.weight"] = torch.zeros(3, 3)
    wrapper = {"model_type": "qwen3_5_moe", "text_config": dict(TINY, model_type="qwen3_5_moe_text"),
               "vision_config": {"depth": 1}}
    write_checkpoint(tmp_path / "m", wrapper, tensors, shards=3)
    _, loaded = load_model(str(tmp_path / "m"), dtype=torch.float64)
    assert loaded.model.embed_tokens.weight.dtype == torch.float64
    ids = list(range(3, 20))
    torch.testing.assert_close(_logits(spec, loaded, ids).float(), _logits(spec, model, ids), atol=1e-5, rtol=0)


def test_missing_key_is_named(tmp_path, reference):
    spec, model = reference
    tensors = _hf_state_dict(model)
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    write_checkpoint(tmp_path / "m", TINY, tensors)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight"):
        load_model(str(tmp_path / "m"))


def test_missing_expert_is_named(tmp_path, reference):
    spec, model = reference
    tensors = _hf_state_dict(model)
    del tensors["model.layers.2.mlp.experts.3.up_proj.weight"]
    write_checkpoint(tmp_path / "m", TINY, tensors)
    with pytest.raises(ValueError, match=r"model\.layers\.2\.mlp\.experts\.3\.up_proj"):
        load_model(str(tmp_path / "m"))


def test_wrong_shape_names_key_and_shapes(tmp_path, reference):
    spec, model = reference
    tensors = _hf_state_dict(model)
    tensors["model.layers.0.linear_attn.in_proj_z.weight"] = torch.zeros(31, 32)
    write_checkpoint(tmp_path / "m", TINY, tensors)
    with pytest.raises(ValueError, match=r"in_proj_z\.weight.*\[31, 32\].*expected \[32, 32\]"):
        load_model(str(tmp_path / "m"))


def test_folder_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_model(str(tmp_path / "absent"))
    write_checkpoint(tmp_path / "noweights", TINY, {})
    (tmp_path / "noweights" / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="neither model.safetensors"):
        load_model(str(tmp_path / "noweights"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        load_model(str(tmp_path / "bad"))
    with pytest.raises(ValueError, match="load_format"):
        load_model(str(tmp_path / "bad"), load_format="pt")


def test_dummy_weights_are_seeded_and_sane():
    _, a = build_dummy_model(TINY, dtype=torch.float32, seed=1)
    _, b = build_dummy_model(TINY, dtype=torch.float32, seed=1)
    _, c = build_dummy_model(TINY, dtype=torch.float32, seed=2)
    pa, pb, pc = dict(a.named_parameters()), dict(b.named_parameters()), dict(c.named_parameters())
    for name in pa:
        assert torch.equal(pa[name], pb[name]), name
    gdn = "model.layers.0.linear_attn."
    assert not torch.equal(pa[gdn + "in_proj_qkv.weight"], pc[gdn + "in_proj_qkv.weight"])
    a_log = pa[gdn + "A_log"]
    assert bool((a_log >= 0).all() and (a_log <= math.log(16) + 1e-6).all())
    dt = torch.nn.functional.softplus(pa[gdn + "dt_bias"])
    assert bool((dt > 9e-4).all() and (dt < 0.11).all())
    assert torch.equal(pa[gdn + "norm.weight"], torch.ones(8))
    assert torch.equal(pa["model.layers.1.input_layernorm.weight"], torch.zeros(32))
    assert abs(float(pa["model.layers.0.mlp.experts.gate_up_proj"].std()) - 0.02) < 0.003


def test_dummy_bf16_forward_is_finite():
    spec, model = build_dummy_model(dict(TINY, tie_word_embeddings=True), dtype=torch.bfloat16)
    assert not hasattr(model, "lm_head")
    logits = _logits(spec, model, list(range(10)))
    assert logits.dtype == torch.float32 and bool(torch.isfinite(logits).all())


@pytest.mark.parametrize("config, billions", [(QWEN35_35B_TEXT, 34.7), (QWEN3_NEXT_80B, 79.7)])
def test_full_size_shapes_on_meta_device(config, billions):
    """Full-size models build without allocating memory; parameter counts match the model names
    (MTP and vision weights are not part of the text model)."""
    spec = spec_from_config(config)
    model = build_empty_model(spec, torch.bfloat16, "meta")
    total = sum(p.numel() for p in model.parameters())
    assert abs(total / 1e9 - billions) < 0.6, total


def test_moe_backend_is_validated_and_reaches_the_moe_blocks():
    """``moe_backend="torch"`` runs the routed experts on the pure-PyTorch reference; the logits
    equal the automatic choice's (the reference, on CPU). Other values are refused."""
    spec, auto = build_dummy_model(TINY, dtype=torch.float32, seed=3)
    _, torch_path = build_dummy_model(TINY, dtype=torch.float32, seed=3, moe_backend="torch")
    impls = {m.moe_impl for m in torch_path.modules() if hasattr(m, "moe_impl")}
    assert impls == {"reference"}
    assert {m.moe_impl for m in auto.modules() if hasattr(m, "moe_impl")} == {"auto"}
    assert torch.equal(_logits(spec, auto, list(range(10))), _logits(spec, torch_path, list(range(10))))
    with pytest.raises(ValueError, match="moe_backend must be one of"):
        build_dummy_model(TINY, dtype=torch.float32, moe_backend="triton")
    with pytest.raises(ValueError, match="moe_backend must be one of"):
        load_model("/nonexistent", moe_backend="fast")
