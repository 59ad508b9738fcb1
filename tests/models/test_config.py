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
    assert spec.model_type == "qwen3_5_moe_text" and spec.arch.gdn_layout == "split"
    assert spec.full_attention_layer_ids == tuple(range(3, 40, 4))
    assert len(spec.linear_layer_ids) == 30
    assert spec.rotary_dim == 64 and spec.rope_theta == 1e7
    assert all(spec.moe_layers) and spec.norm_topk_prob
    assert spec.conv_dim == 8192 and spec.eos_token_ids == (248044,)


def test_qwen3_next_legacy_rope_fields_and_sparse_step():
    cfg = dict(QWEN3_NEXT_80B, decoder_sparse_step=2, mlp_only_layers=[5])
    spec = spec_from_config(cfg)
    assert spec.arch.gdn_layout == "fused" and spec.rotary_dim == 64 and spec.rope_theta == 1e7
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


# Ring-mini-linear-2.0's config.json as shipped (hybrid-models.md §4), the fields hypic reads
RING_MINI_LINEAR = {
    "model_type": "bailing_moe_linear", "architectures": ["BailingMoeLinearV2ForCausalLM"],
    "hidden_size": 2048, "num_hidden_layers": 20, "num_attention_heads": 16, "num_key_value_heads": 4,
    "head_dim": 128, "layer_group_size": 5, "group_norm_size": 4, "linear_silu": False, "use_qk_norm": True,
    "partial_rotary_factor": 0.5, "rope_theta": 1000000, "first_k_dense_replace": 1, "intermediate_size": 5120,
    "num_experts": 256, "num_experts_per_tok": 8, "num_shared_experts": 1, "moe_intermediate_size": 512,
    "moe_shared_expert_intermediate_size": 512, "n_group": 8, "topk_group": 4, "score_function": "sigmoid",
    "moe_router_enable_expert_bias": True, "routed_scaling_factor": 2.5, "max_position_embeddings": 131072,
    "vocab_size": 157184, "eos_token_id": 156892, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "use_bias": False, "use_qkv_bias": False,
}


def test_ring_linear_layout_and_fields():
    from hypic.models.spec import BailingLinearFields

    spec = spec_from_config(RING_MINI_LINEAR)
    assert spec.full_attention_layer_ids == (4, 9, 14, 19) and len(spec.linear_layer_ids) == 16
    assert spec.linear_family == "lightning" and spec.linear_transition == "scalar" and spec.conv_kernel_size == 0
    assert (spec.linear_num_value_heads, spec.linear_key_head_dim, spec.linear_value_head_dim) == (16, 128, 128)
    assert spec.rotary_dim == 64 and spec.linear_rotary_dim == 64 and spec.rope_theta == 1e6
    assert spec.moe_layers == (False,) + (True,) * 19 and spec.shared_expert_intermediate_size == 512
    assert not spec.attention_output_gate and not spec.shared_expert_gate and spec.conv_dim == 0
    assert spec.arch == BailingLinearFields(group_norm_size=4, use_qk_norm=True, linear_silu=False, qkv_bias=False,
                                            dense_bias=False, num_expert_groups=8, topk_groups=4,
                                            routed_scaling_factor=2.5, expert_bias=True)
    # a store entry per linear layer: S [16, 128, 128] and T one number per head, no conv tail
    assert spec.linear_entry_words(checkpoint=False) == 16 * 128 * 128 + 16
    assert spec.linear_entry_words(checkpoint=True) == 16 * 128 * 128
    # Ring-flash-linear-2.0: 32 layers in groups of 8; a remainder past the last whole group is softmax
    flash = spec_from_config(dict(RING_MINI_LINEAR, num_hidden_layers=32, layer_group_size=8))
    assert flash.full_attention_layer_ids == (7, 15, 23, 31)
    ragged = spec_from_config(dict(RING_MINI_LINEAR, num_hidden_layers=7, layer_group_size=3))
    assert ragged.full_attention_layer_ids == (2, 5, 6)
    # no RoPE inside the linear layers
    assert spec_from_config(dict(RING_MINI_LINEAR, linear_rope=False)).linear_rotary_dim == 0


@pytest.mark.parametrize(
    "change, message",
    [
        ({"full_attention_type": "mla"}, "full_attention_type"),
        ({"score_function": "softmax"}, "score_function"),
        ({"group_norm_size": 3}, "group_norm_size must divide"),
        ({"n_group": 7}, "multiple of n_group"),
        ({"topk_group": 9}, "topk_group"),
        ({"num_experts_per_tok": 200}, "exceeds the experts"),
        ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
        ({"layer_group_size": 0}, "layer_group_size"),
        ({"use_qk_norm": "yes"}, "use_qk_norm must be true or false"),
    ],
)
def test_invalid_ring_linear_configs_raise(change, message):
    with pytest.raises(ValueError, match=message):
        spec_from_config(dict(RING_MINI_LINEAR, **change))


MINIMAX_HF = {
    "model_type": "minimax", "hidden_size": 6144, "num_hidden_layers": 16, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 9216, "num_local_experts": 32,
    "num_experts_per_tok": 2, "vocab_size": 200064, "block_size": 256,
    "layer_types": (["linear_attention"] * 7 + ["full_attention"]) * 2,
    "full_attn_alpha_factor": 3.5565588200778455, "linear_attn_alpha_factor": 3.5565588200778455,
    "mlp_alpha_factor": 3.5565588200778455, "full_attn_beta_factor": 1.0, "linear_attn_beta_factor": 1.0,
    "mlp_beta_factor": 1.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                                                "partial_rotary_factor": 0.5},
}


def test_minimax_fields():
    from hypic.models.spec import MiniMaxFields

    spec = spec_from_config(MINIMAX_HF)
    assert spec.full_attention_layer_ids == (7, 15) and spec.linear_family == "lightning"
    assert spec.rotary_dim == 64 and spec.linear_rotary_dim == 0 and all(spec.moe_layers)
    assert spec.num_experts == 32 and spec.moe_intermediate_size == 9216 and spec.shared_expert_intermediate_size == 0
    assert spec.arch == MiniMaxFields(3.5565588200778455, 1.0, 3.5565588200778455, 1.0, 3.5565588200778455, 1.0)
    # the original configs' fields: attn_type_list and rotary_dim
    original = dict(MINIMAX_HF, attn_type_list=[0] * 7 + [1], num_hidden_layers=8, rotary_dim=32)
    del original["layer_types"]
    spec = spec_from_config(original)
    assert spec.full_attention_layer_ids == (7,) and spec.rotary_dim == 32
    with pytest.raises(ValueError, match="sliding_window"):
        spec_from_config(dict(MINIMAX_HF, sliding_window=4096))
    with pytest.raises(ValueError, match="postnorm"):
        spec_from_config(dict(MINIMAX_HF, postnorm=False))
    with pytest.raises(ValueError, match="attn_type_list"):
        spec_from_config(dict(original, attn_type_list=[0, 2]))
