import json

import pytest

from hypic.models.config import FULL_ATTENTION, LINEAR_ATTENTION, load_spec, spec_from_config

QWEN35_35B_TEXT = {
    "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 256,
    "num_experts_per_tok": 8, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "full_attention_interval": 4, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
    "eos_token_id": 248044,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": True},
}

QWEN3_NEXT_80B = {
    "model_type": "qwen3_next", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5120,
    "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 512,
    "num_experts_per_tok": 10, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "full_attention_interval": 4,
    "rope_theta": 10000000, "partial_rotary_factor": 0.25, "tie_word_embeddings": False,
    "eos_token_id": 151645,
}


def test_qwen35_moe_nested_text_config():
    wrapper = {"model_type": "qwen3_5_moe", "text_config": dict(QWEN35_35B_TEXT), "vision_config": {"depth": 27},
               "tie_word_embeddings": False}
    spec = spec_from_config(wrapper)
    assert spec.model_type == "qwen3_5_moe_text" and spec.gdn_layout == "split"
    assert spec.full_attention_layer_ids == tuple(range(3, 40, 4))
    assert len(spec.linear_layer_ids) == 30
    assert spec.rotary_dim == 64 and spec.rope_theta == 1e7
    assert all(spec.moe_layers) and spec.norm_topk_prob
    assert spec.conv_dim == 8192 and spec.eos_token_ids == (248044,)


def test_qwen3_next_legacy_rope_fields_and_sparse_step():
    cfg = dict(QWEN3_NEXT_80B, decoder_sparse_step=2, mlp_only_layers=[5])
    spec = spec_from_config(cfg)
    assert spec.gdn_layout == "fused" and spec.rotary_dim == 64 and spec.rope_theta == 1e7
    assert spec.layer_types[3] == FULL_ATTENTION and spec.layer_types[0] == LINEAR_ATTENTION
    assert spec.moe_layers[1] and not spec.moe_layers[0] and not spec.moe_layers[5]
    assert spec.intermediate_size == 5120


def test_explicit_layer_types_win():
    types = ["linear_attention", "full_attention"] * 24
    spec = spec_from_config(dict(QWEN3_NEXT_80B, layer_types=types))
    assert spec.layer_types == tuple(types)


def test_dense_qwen35_has_no_moe_and_tied_embeddings_from_wrapper():
    text = dict(QWEN35_35B_TEXT, model_type="qwen3_5_text", intermediate_size=6144)
    spec = spec_from_config({"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": True})
    assert not any(spec.moe_layers) and spec.tie_word_embeddings


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "llama"}, "unsupported model_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
        ({"linear_num_value_heads": 24, "linear_num_key_heads": 16}, "linear_num_value_heads"),
        ({"layer_types": ["linear_attention"] * 3}, "layer_types has 3 entries"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "rope_type"),
        ({"num_experts_per_tok": 300}, "num_experts_per_tok"),
    ],
)
def test_invalid_configs_raise(change, message):
    with pytest.raises(ValueError, match=message):
        spec_from_config(dict(QWEN35_35B_TEXT, **change))


def test_missing_field_is_named():
    cfg = dict(QWEN35_35B_TEXT)
    del cfg["linear_key_head_dim"]
    with pytest.raises(ValueError, match="linear_key_head_dim"):
        spec_from_config(cfg)


def test_load_spec_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_spec(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="no config.json"):
        load_spec(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(ValueError, match="unsupported model_type 'mamba'"):
        load_spec(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(QWEN35_35B_TEXT))
    assert load_spec(str(tmp_path)).num_layers == 40


def test_spec_is_frozen():
    spec = spec_from_config(QWEN35_35B_TEXT)
    with pytest.raises(Exception):
        spec.hidden_size = 1
