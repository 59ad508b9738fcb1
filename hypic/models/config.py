"""Hugging Face ``config.json`` -> one frozen, validated :class:`ModelSpec`.

Supported checkpoints (see ../shared/reference/hybrid-models.md §1-2):

* ``qwen3_next`` (Qwen3-Next): fused GDN projections ``in_proj_qkvz`` / ``in_proj_ba``.
* ``qwen3_5_text`` / ``qwen3_5_moe_text`` (Qwen3.5 text models): split GDN projections.
* ``qwen3_5`` / ``qwen3_5_moe`` (Qwen3.5 VLM checkpoints): their nested ``text_config`` is read,
  the vision tower is skipped.

Qwen3.5's 3-stream mRoPE is plain partial RoPE for text-only input (all three position streams are
equal), so the spec only keeps ``rotary_dim`` and ``rope_theta``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Tuple

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"

# model_type of the text model -> GDN projection layout
_TEXT_MODEL_TYPES = {
    "qwen3_next": "fused",
    "qwen3_5_text": "split",
    "qwen3_5_moe_text": "split",
}
# VLM wrapper model_type -> model_type of its text_config
_WRAPPER_MODEL_TYPES = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}

SUPPORTED_MODEL_TYPES = tuple(sorted(set(_TEXT_MODEL_TYPES) | set(_WRAPPER_MODEL_TYPES)))


@dataclass(frozen=True)
class ModelSpec:
    """Everything the model code and the caches need to know about one checkpoint."""

    model_type: str  # text model type: qwen3_next | qwen3_5_text | qwen3_5_moe_text
    gdn_layout: str  # "fused" (in_proj_qkvz/in_proj_ba) or "split" (in_proj_qkv/z/b/a)
    vocab_size: int
    hidden_size: int
    num_layers: int
    layer_types: Tuple[str, ...]  # per layer: "linear_attention" | "full_attention"
    # gated full attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rotary_dim: int  # leading dims of each head that RoPE rotates (partial RoPE)
    rope_theta: float
    max_position_embeddings: int
    attention_bias: bool
    # Gated DeltaNet
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    conv_kernel_size: int
    # feed-forward
    intermediate_size: int  # dense SwiGLU width (layers without MoE)
    moe_layers: Tuple[bool, ...]  # per layer: sparse MoE block (True) or dense MLP
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool
    # misc
    rms_norm_eps: float
    tie_word_embeddings: bool
    bos_token_id: Optional[int] = None
    eos_token_ids: Tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.model_type not in _TEXT_MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not a supported text model type")
        if self.gdn_layout not in ("fused", "split"):
            raise ValueError(f"gdn_layout must be 'fused' or 'split', got {self.gdn_layout!r}")
        for name in (
            "vocab_size", "hidden_size", "num_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "max_position_embeddings", "linear_num_key_heads",
            "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "conv_kernel_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if len(self.layer_types) != self.num_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries, expected num_layers={self.num_layers}"
            )
        bad = sorted({t for t in self.layer_types if t not in (LINEAR_ATTENTION, FULL_ATTENTION)})
        if bad:
            raise ValueError(f"layer_types contains unsupported kinds {bad}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.linear_num_value_heads % self.linear_num_key_heads != 0:
            raise ValueError(
                f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.linear_num_key_heads})"
            )
        if not (0 < self.rotary_dim <= self.head_dim) or self.rotary_dim % 2 != 0:
            raise ValueError(
                f"rotary_dim must be even and in (0, head_dim={self.head_dim}], got {self.rotary_dim}"
            )
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be positive, got {self.rms_norm_eps}")
        if len(self.moe_layers) != self.num_layers:
            raise ValueError(
                f"moe_layers has {len(self.moe_layers)} entries, expected num_layers={self.num_layers}"
            )
        if any(self.moe_layers):
            for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
                if getattr(self, name) <= 0:
                    raise ValueError(f"{name} must be positive when MoE layers exist")
            if self.num_experts_per_tok > self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok ({self.num_experts_per_tok}) exceeds num_experts "
                    f"({self.num_experts})"
                )
            if self.shared_expert_intermediate_size < 0:
                raise ValueError("shared_expert_intermediate_size must be >= 0")
        if not all(self.moe_layers) and self.intermediate_size <= 0:
            raise ValueError("intermediate_size must be positive when dense MLP layers exist")

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def linear_layer_ids(self) -> Tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION)

    @property
    def full_attention_layer_ids(self) -> Tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the short conv: q, k and v (not z, b, a)."""
        return 2 * self.linear_key_dim + self.linear_value_dim


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
        if text["model_type"] not in _TEXT_MODEL_TYPES:
            raise ValueError(f"text_config has unsupported model_type {text['model_type']!r}")
        config = text
        model_type = text["model_type"]
    if model_type not in _TEXT_MODEL_TYPES:
        raise ValueError(
            f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )

    def req(name: str) -> Any:
        if name not in config:
            raise ValueError(f"config.json (model_type {model_type!r}) is missing {name!r}")
        return config[name]

    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported (only 'silu')")
    num_layers = int(req("num_hidden_layers"))
    layer_types = _layer_types(config, num_layers)
    hidden_size = int(req("hidden_size"))
    num_heads = int(req("num_attention_heads"))
    head_dim = config.get("head_dim") or hidden_size // num_heads
    rope_theta, rotary_factor = _rope(config)

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

    eos = config.get("eos_token_id")
    eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
    tie = outer_tie if outer_tie is not None else config.get("tie_word_embeddings", False)

    return ModelSpec(
        model_type=model_type,
        gdn_layout=_TEXT_MODEL_TYPES[model_type],
        vocab_size=int(req("vocab_size")),
        hidden_size=hidden_size,
        num_layers=num_layers,
        layer_types=layer_types,
        num_attention_heads=num_heads,
        num_key_value_heads=int(req("num_key_value_heads")),
        head_dim=int(head_dim),
        rotary_dim=int(int(head_dim) * rotary_factor),
        rope_theta=float(rope_theta),
        max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
        attention_bias=bool(config.get("attention_bias", False)),
        linear_num_key_heads=int(req("linear_num_key_heads")),
        linear_num_value_heads=int(req("linear_num_value_heads")),
        linear_key_head_dim=int(req("linear_key_head_dim")),
        linear_value_head_dim=int(req("linear_value_head_dim")),
        conv_kernel_size=int(config.get("linear_conv_kernel_dim", 4)),
        intermediate_size=int(config.get("intermediate_size", 0) or 0),
        moe_layers=moe_layers,
        num_experts=num_experts,
        num_experts_per_tok=int(config.get("num_experts_per_tok", 0) or 0),
        moe_intermediate_size=int(config.get("moe_intermediate_size", 0) or 0),
        shared_expert_intermediate_size=int(config.get("shared_expert_intermediate_size", 0) or 0),
        norm_topk_prob=norm_topk,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(tie),
        bos_token_id=config.get("bos_token_id"),
        eos_token_ids=eos_ids,
    )


def _layer_types(config: Mapping[str, Any], num_layers: int) -> Tuple[str, ...]:
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


def _rope(config: Mapping[str, Any]) -> Tuple[float, float]:
    """(theta, partial_rotary_factor) from ``rope_parameters`` (transformers 5) or legacy fields."""
    params = config.get("rope_parameters") or {}
    legacy = config.get("rope_scaling") or {}
    rope_type = params.get("rope_type", legacy.get("rope_type", legacy.get("type", "default")))
    # mRoPE checkpoints say "default" (+ mrope_section) or "mrope"; both are plain RoPE for text.
    if rope_type not in ("default", "mrope"):
        raise ValueError(f"rope_type {rope_type!r} is not supported (only default / mrope)")
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    factor = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.25))
    if not (0 < float(factor) <= 1):
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {factor}")
    return float(theta), float(factor)
