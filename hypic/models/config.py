"""Hugging Face ``config.json`` -> one frozen, validated :class:`~hypic.models.spec.ModelSpec`.

Supported checkpoints (see ../shared/reference/hybrid-models.md §1-2, §4-5):

* ``qwen3_next`` (Qwen3-Next): fused GDN projections ``in_proj_qkvz`` / ``in_proj_ba``.
* ``qwen3_5_text`` / ``qwen3_5_moe_text`` (Qwen3.5 text models): split GDN projections.
* ``qwen3_5`` / ``qwen3_5_moe`` (Qwen3.5 VLM checkpoints): their nested ``text_config`` is read,
  the vision tower is skipped.
* ``bailing_moe_linear`` (Ring-mini/flash-linear-2.0, ``BailingMoeLinearV2ForCausalLM``) and
  ``minimax`` (transformers' MiniMax): :mod:`hypic.models.config_lightning`.

Qwen3.5's 3-stream mRoPE is plain partial RoPE for text-only input (all three position streams are
equal), so the spec only keeps ``rotary_dim`` and ``rope_theta``.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from hypic.models.config_lightning import bailing_moe_linear_spec, minimax_spec
from hypic.models.spec import (
    FULL_ATTENTION,
    GATED_DELTA,
    LIGHTNING,
    LINEAR_ATTENTION,
    ConfigFields,
    GatedDeltaLayout,
    ModelSpec,
)

# model_type of a Qwen text model -> GDN projection layout
_QWEN_TEXT_MODEL_TYPES = {
    "qwen3_next": "fused",
    "qwen3_5_text": "split",
    "qwen3_5_moe_text": "split",
}
# VLM wrapper model_type -> model_type of its text_config
_WRAPPER_MODEL_TYPES = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}


def _qwen_spec(fields: ConfigFields, outer_tie: Optional[bool]) -> ModelSpec:
    """Qwen3-Next / Qwen3.5 (Gated DeltaNet) text models."""
    config, model_type = fields.config, fields.model_type
    fields.silu()
    num_layers = int(fields.required("num_hidden_layers"))
    layer_types = _qwen_layer_types(config, num_layers)
    hidden_size = int(fields.required("hidden_size"))
    num_heads = int(fields.required("num_attention_heads"))
    head_dim = config.get("head_dim") or hidden_size // num_heads
    rope_theta, rotary_factor = fields.rope(10000.0, 0.25)

    num_experts = int(config.get("num_experts", 0) or 0)
    if model_type == "qwen3_5_text":
        moe_layers = (False,) * num_layers  # dense Qwen3.5: every layer a SwiGLU MLP
        norm_topk = True
    elif model_type == "qwen3_5_moe_text":
        moe_layers = (True,) * num_layers  # every layer sparse; router always renormalises
        norm_topk = True
    else:
        mlp_only = set(config.get("mlp_only_layers") or [])
        step = int(config.get("decoder_sparse_step", 1) or 1)
        moe_layers = tuple(
            i not in mlp_only and num_experts > 0 and (i + 1) % step == 0 for i in range(num_layers)
        )
        norm_topk = bool(config.get("norm_topk_prob", True))
    tie = outer_tie if outer_tie is not None else config.get("tie_word_embeddings", False)
    shared = int(config.get("shared_expert_intermediate_size", 0) or 0)

    return ModelSpec(
        model_type=model_type,
        vocab_size=int(fields.required("vocab_size")),
        hidden_size=hidden_size,
        num_layers=num_layers,
        layer_types=layer_types,
        num_attention_heads=num_heads,
        num_key_value_heads=int(fields.required("num_key_value_heads")),
        head_dim=int(head_dim),
        rotary_dim=int(int(head_dim) * rotary_factor),
        rope_theta=float(rope_theta),
        max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
        attention_bias=bool(config.get("attention_bias", False)),
        attention_output_gate=True,
        linear_family=GATED_DELTA,
        linear_num_key_heads=int(fields.required("linear_num_key_heads")),
        linear_num_value_heads=int(fields.required("linear_num_value_heads")),
        linear_key_head_dim=int(fields.required("linear_key_head_dim")),
        linear_value_head_dim=int(fields.required("linear_value_head_dim")),
        conv_kernel_size=int(config.get("linear_conv_kernel_dim", 4)),
        intermediate_size=int(config.get("intermediate_size", 0) or 0),
        moe_layers=moe_layers,
        num_experts=num_experts,
        num_experts_per_tok=int(config.get("num_experts_per_tok", 0) or 0),
        moe_intermediate_size=int(config.get("moe_intermediate_size", 0) or 0),
        shared_expert_intermediate_size=shared,
        norm_topk_prob=norm_topk,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(tie),
        bos_token_id=config.get("bos_token_id"),
        eos_token_ids=fields.eos_token_ids(),
        shared_expert_gate=shared > 0,
        arch=GatedDeltaLayout(_QWEN_TEXT_MODEL_TYPES[model_type]),
    )


def _qwen_layer_types(config: Mapping[str, Any], num_layers: int) -> Tuple[str, ...]:
    types = config.get("layer_types")
    if types is not None:
        return tuple(types)
    interval = int(config.get("full_attention_interval", 4))
    if interval <= 0:
        raise ValueError(f"full_attention_interval must be positive, got {interval}")
    # transformers: layer i is full attention when (i + 1) % interval == 0
    return tuple(
        FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_layers)
    )


# text model_type -> reader of its config (the fields and the VLM wrapper's tie_word_embeddings)
_READERS: Dict[str, Callable[[ConfigFields, Optional[bool]], ModelSpec]] = {
    **{t: _qwen_spec for t in _QWEN_TEXT_MODEL_TYPES},
    "bailing_moe_linear": lambda fields, _: bailing_moe_linear_spec(fields),
    "minimax": lambda fields, _: minimax_spec(fields),
}

SUPPORTED_MODEL_TYPES = tuple(sorted(set(_READERS) | set(_WRAPPER_MODEL_TYPES)))
# the linear-attention family of each supported text model type
LINEAR_FAMILY_OF = {**{t: GATED_DELTA for t in _QWEN_TEXT_MODEL_TYPES}, "bailing_moe_linear": LIGHTNING,
                    "minimax": LIGHTNING}


# ---- reading config.json ----------------------------------------------------------------------


def load_spec(model_dir: str) -> ModelSpec:
    """Read ``<model_dir>/config.json`` into a :class:`ModelSpec`."""
    if not os.path.isdir(model_dir):
        raise ValueError(f"model folder {model_dir!r} does not exist")
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"model folder {model_dir!r} has no config.json")
    with open(path, encoding="utf-8") as f:
        try:
            config = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    return spec_from_config(config)


def spec_from_config(config: Mapping[str, Any]) -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed ``config.json`` dict."""
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be a dict, got {type(config).__name__}")
    model_type = config.get("model_type")
    outer_tie = None
    if model_type in _WRAPPER_MODEL_TYPES:
        text = config.get("text_config")
        if not isinstance(text, Mapping):
            raise ValueError(f"config of model_type {model_type!r} has no text_config dict")
        # The VLM wrapper carries tie_word_embeddings for the whole model.
        outer_tie = config.get("tie_word_embeddings")
        text = dict(text)
        text.setdefault("model_type", _WRAPPER_MODEL_TYPES[model_type])
        if text["model_type"] not in _QWEN_TEXT_MODEL_TYPES:
            raise ValueError(f"text_config has unsupported model_type {text['model_type']!r}")
        config = text
        model_type = text["model_type"]
    if model_type not in _READERS:
        raise ValueError(
            f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return _READERS[model_type](ConfigFields(config, model_type), outer_tie)


__all__ = ["FULL_ATTENTION", "LINEAR_ATTENTION", "LINEAR_FAMILY_OF", "ModelSpec", "SUPPORTED_MODEL_TYPES",
           "load_spec", "spec_from_config"]
