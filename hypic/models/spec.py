"""The frozen :class:`ModelSpec` every model, cache and runner reads, and the helpers the
``config.json`` readers of :mod:`hypic.models.config` share.

A spec holds what is common to the hybrid families (layer layout, full-attention and MoE shapes,
the linear layers' state geometry) plus ``linear_family``, which says how a linear layer's state
evolves and therefore which ops and summaries it takes:

* ``gated_delta`` (Qwen3-Next, Qwen3.5): Gated DeltaNet behind a short causal conv; T of a span is
  a dense ``K x K`` matrix per head (:class:`hypic.ops.linear.summary.DenseSummary`);
* ``lightning`` (Ring-linear-2.0, MiniMax): linear attention with a constant per-head decay and no
  conv; T of a span is one number per head (:class:`hypic.ops.linear.summary.ScalarSummary`).

What only one checkpoint family has (Qwen's projection layout, Ring-linear's grouped output norm
and routing, MiniMax's residual scales) sits in ``arch``, a small frozen dataclass of that family,
so no family's fields leak into the others'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Tuple

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"

GATED_DELTA = "gated_delta"
LIGHTNING = "lightning"
LINEAR_FAMILIES = (GATED_DELTA, LIGHTNING)
# structure of a span's transition T in each family (hypic.ops.linear.summary)
TRANSITION_DENSE = "dense"
TRANSITION_SCALAR = "scalar"
_TRANSITIONS = {GATED_DELTA: TRANSITION_DENSE, LIGHTNING: TRANSITION_SCALAR}

# the text model types a spec can describe (VLM wrappers are unwrapped before)
TEXT_MODEL_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "bailing_moe_linear", "minimax")


@dataclass(frozen=True)
class GatedDeltaLayout:
    """Qwen3-Next / Qwen3.5: how the Gated DeltaNet input projections are laid out."""

    gdn_layout: str  # "fused" (in_proj_qkvz / in_proj_ba) or "split" (in_proj_qkv / z / b / a)

    def __post_init__(self) -> None:
        if self.gdn_layout not in ("fused", "split"):
            raise ValueError(f"gdn_layout must be 'fused' or 'split', got {self.gdn_layout!r}")


@dataclass(frozen=True)
class BailingLinearFields:
    """Ring-linear-2.0 (``bailing_moe_linear``): what its layers need beyond the common spec."""

    group_norm_size: int  # groups of the linear layers' output RMSNorm
    use_qk_norm: bool  # per-head RMSNorm of q and k (linear and softmax layers)
    linear_silu: bool  # SiLU on the linear layers' fused q/k/v projection
    qkv_bias: bool  # bias of query_key_value
    dense_bias: bool  # bias of the output projections (dense)
    num_expert_groups: int  # group-limited routing: experts in this many groups (1: no groups)
    topk_groups: int  # groups a token may route into
    routed_scaling_factor: float
    expert_bias: bool  # routing picks experts by sigmoid score + a learnt per-expert bias

    def __post_init__(self) -> None:
        if self.group_norm_size < 1:
            raise ValueError(f"group_norm_size must be >= 1, got {self.group_norm_size}")
        if not 1 <= self.topk_groups <= self.num_expert_groups:
            raise ValueError(f"topk_group must be in [1, n_group={self.num_expert_groups}], got {self.topk_groups}")
        if not self.routed_scaling_factor > 0:
            raise ValueError(f"routed_scaling_factor must be positive, got {self.routed_scaling_factor}")


@dataclass(frozen=True)
class MiniMaxFields:
    """MiniMax (transformers' ``minimax``): the residual scales of its post-norm decoder layer,
    ``residual * alpha + out * beta`` after the attention (full or lightning) and after the MoE."""

    full_attn_alpha: float
    full_attn_beta: float
    linear_attn_alpha: float
    linear_attn_beta: float
    mlp_alpha: float
    mlp_beta: float


@dataclass(frozen=True)
class ModelSpec:
    """Everything the model code and the caches need to know about one checkpoint."""

    model_type: str  # text model type (TEXT_MODEL_TYPES)
    vocab_size: int
    hidden_size: int
    num_layers: int
    layer_types: Tuple[str, ...]  # per layer: "linear_attention" | "full_attention"
    # full attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rotary_dim: int  # leading dims of each head that RoPE rotates (partial RoPE)
    rope_theta: float
    max_position_embeddings: int
    attention_bias: bool
    attention_output_gate: bool  # q_proj also yields a per-head sigmoid output gate (Qwen)
    # linear attention: the family and the state geometry [HV, K, V] of one layer
    linear_family: str  # LINEAR_FAMILIES
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    conv_kernel_size: int  # width of the short causal conv before the recurrence; 0: none
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
    # leading key dims that carry RoPE inside the linear layers (Ring-linear rotates q and k
    # before the recurrence); 0: none. Cached summaries of such layers are re-rotated.
    linear_rotary_dim: int = 0
    shared_expert_gate: bool = False  # the shared expert's output scaled by sigmoid(gate(x)) (Qwen)
    arch: Any = None  # the family's own fields (GatedDeltaLayout, BailingLinearFields, MiniMaxFields)

    def __post_init__(self) -> None:
        if self.model_type not in TEXT_MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not a supported text model type")
        if self.linear_family not in LINEAR_FAMILIES:
            raise ValueError(f"linear_family must be one of {LINEAR_FAMILIES}, got {self.linear_family!r}")
        for name in (
            "vocab_size", "hidden_size", "num_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "max_position_embeddings", "linear_num_key_heads",
            "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.linear_family == GATED_DELTA and self.conv_kernel_size <= 0:
            raise ValueError(f"conv_kernel_size must be a positive int, got {self.conv_kernel_size!r}")
        if self.conv_kernel_size < 0:
            raise ValueError(f"conv_kernel_size must be >= 0, got {self.conv_kernel_size!r}")
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
        if not (0 <= self.linear_rotary_dim <= self.linear_key_head_dim) or self.linear_rotary_dim % 2 != 0:
            raise ValueError(f"linear_rotary_dim must be even and in [0, linear_key_head_dim="
                             f"{self.linear_key_head_dim}], got {self.linear_rotary_dim}")
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
        """Channels of the short conv: q, k and v (not z, b, a); 0 without a conv."""
        return 2 * self.linear_key_dim + self.linear_value_dim if self.conv_kernel_size else 0

    @property
    def linear_transition(self) -> str:
        """Structure of a span's T in the linear layers: ``"dense"`` or ``"scalar"``."""
        return _TRANSITIONS[self.linear_family]

    def linear_entry_words(self, checkpoint: bool) -> int:
        """State-dtype words one store entry holds per linear layer: S ``[HV, K, V]``, T in its
        structured form (``[HV, K, K]`` dense, ``[HV]`` scalar; none for a prefix checkpoint,
        which stores the running state) and the conv tail ``[conv_dim, W - 1]``."""
        hv, k, v = self.linear_num_value_heads, self.linear_key_head_dim, self.linear_value_head_dim
        transition = 0 if checkpoint else (hv * k * k if self.linear_transition == TRANSITION_DENSE else hv)
        tail = self.conv_dim * (self.conv_kernel_size - 1) if self.conv_kernel_size else 0
        return hv * k * v + transition + tail


# ---- what the config.json readers share ------------------------------------------------------


class ConfigFields:
    """Typed reads of a parsed ``config.json`` that name the field and the model type in their
    errors."""

    def __init__(self, config: Mapping[str, Any], model_type: str) -> None:
        self.config = config
        self.model_type = model_type

    def __contains__(self, name: str) -> bool:
        return name in self.config

    def get(self, name: str, default: Any = None) -> Any:
        value = self.config.get(name)
        return default if value is None else value

    def required(self, name: str) -> Any:
        if name not in self.config or self.config[name] is None:
            raise ValueError(f"config.json (model_type {self.model_type!r}) is missing {name!r}")
        return self.config[name]

    def integer(self, name: str, default: Optional[int] = None) -> int:
        value = self.required(name) if default is None else self.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ValueError(f"{name} must be an integer, got {value!r}")
        return int(value)

    def number(self, name: str, default: Optional[float] = None) -> float:
        value = self.required(name) if default is None else self.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number, got {value!r}")
        return float(value)

    def flag(self, name: str, default: bool) -> bool:
        value = self.get(name, default)
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
        return value

    def silu(self) -> None:
        act = self.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported (only 'silu')")

    def eos_token_ids(self) -> Tuple[int, ...]:
        eos = self.config.get("eos_token_id")
        return () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))

    def rope(self, default_theta: float, default_factor: float) -> Tuple[float, float]:
        """``(theta, partial_rotary_factor)`` from ``rope_parameters`` (transformers 5) or the
        legacy ``rope_theta`` / ``partial_rotary_factor`` / ``rope_scaling`` fields."""
        params = self.config.get("rope_parameters") or {}
        legacy = self.config.get("rope_scaling") or {}
        rope_type = params.get("rope_type", legacy.get("rope_type", legacy.get("type", "default")))
        # mRoPE checkpoints say "default" (+ mrope_section) or "mrope"; both are plain RoPE for text.
        if rope_type not in ("default", "mrope"):
            raise ValueError(f"rope_type {rope_type!r} is not supported (only default / mrope)")
        theta = params.get("rope_theta", self.config.get("rope_theta", default_theta))
        factor = params.get("partial_rotary_factor", self.config.get("partial_rotary_factor", default_factor))
        if not (0 < float(factor) <= 1):
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {factor}")
        return float(theta), float(factor)


__all__ = [
    "BailingLinearFields", "ConfigFields", "FULL_ATTENTION", "GATED_DELTA", "GatedDeltaLayout", "LIGHTNING",
    "LINEAR_ATTENTION", "LINEAR_FAMILIES", "MiniMaxFields", "ModelSpec", "TEXT_MODEL_TYPES", "TRANSITION_DENSE",
    "TRANSITION_SCALAR",
]
