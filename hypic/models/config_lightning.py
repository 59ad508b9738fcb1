"""``config.json`` readers of the lightning-attention hybrids (../shared/reference/hybrid-models.md
§4-5): Ring-linear-2.0 (``bailing_moe_linear``, ``BailingMoeLinearV2ForCausalLM``, remote code) and
transformers' MiniMax (``minimax``, ``MiniMaxForCausalLM``).

Both run every linear layer as lightning attention (``linear_family = "lightning"``: a constant
per-head decay, no short conv) over ``num_attention_heads`` heads of ``head_dim``; the field names
are the checkpoints' own.
"""

from __future__ import annotations

from typing import Tuple

from hypic.models.spec import (
    FULL_ATTENTION,
    LIGHTNING,
    LINEAR_ATTENTION,
    BailingLinearFields,
    ConfigFields,
    MiniMaxFields,
    ModelSpec,
)


def _rotary_dim(fields: ConfigFields, head_dim: int, factor: float) -> int:
    """RoPE dims of a head: the legacy ``rotary_dim`` field when given (MiniMax-M1's original
    config, older Bailing configs), else ``head_dim * partial_rotary_factor``."""
    if "rotary_dim" in fields:
        rotary = fields.integer("rotary_dim")
    else:
        rotary = int(head_dim * factor)
    if rotary <= 0 or rotary > head_dim or rotary % 2:
        raise ValueError(f"rotary_dim must be even and in (0, head_dim={head_dim}], got {rotary}")
    return rotary


def _heads(fields: ConfigFields) -> Tuple[int, int, int, int]:
    """``(hidden_size, num_attention_heads, num_key_value_heads, head_dim)``."""
    hidden = fields.integer("hidden_size")
    heads = fields.integer("num_attention_heads")
    kv_heads = fields.integer("num_key_value_heads", heads)
    head_dim = fields.integer("head_dim", hidden // heads if hidden % heads == 0 else 0)
    if head_dim <= 0:
        raise ValueError(f"head_dim is missing and hidden_size {hidden} is not a multiple of "
                         f"num_attention_heads {heads}")
    return hidden, heads, kv_heads, head_dim


def _lightning_geometry(heads: int, head_dim: int) -> dict:
    """The spec fields of lightning linear layers: ``heads`` heads of ``head_dim`` for q, k and v
    alike (their state ``[heads, head_dim, head_dim]``), no short conv."""
    return dict(linear_family=LIGHTNING, linear_num_key_heads=heads, linear_num_value_heads=heads,
                linear_key_head_dim=head_dim, linear_value_head_dim=head_dim, conv_kernel_size=0)


def bailing_layer_types(num_layers: int, group_size: int) -> Tuple[str, ...]:
    """Ring-linear's layout: the last layer of each group of ``layer_group_size`` is softmax
    attention, and so is every layer past the last whole group."""
    if group_size < 1:
        raise ValueError(f"layer_group_size must be >= 1, got {group_size}")
    whole = num_layers // group_size * group_size
    return tuple(FULL_ATTENTION if (i + 1) % group_size == 0 or i >= whole else LINEAR_ATTENTION
                 for i in range(num_layers))


def bailing_moe_linear_spec(fields: ConfigFields) -> ModelSpec:
    """Ring-mini/flash-linear-2.0. Linear layers: fused ``query_key_value`` over
    ``num_attention_heads`` q, k and v heads (MHA), optional SiLU, per-head q/k RMSNorm, partial
    RoPE on q and k, lightning attention with ALiBi slopes scaled by depth, grouped output RMSNorm
    gated by ``sigmoid(g_proj(x))``, ``dense``. Softmax layers: GQA with q/k RMSNorm and partial
    RoPE, no output gate. MoE: sigmoid scores, routed by score + ``expert_bias`` with
    group-limited top-k, weights renormalised and scaled by ``routed_scaling_factor``, plus
    shared experts; the first ``first_k_dense_replace`` layers have a dense MLP."""
    fields.silu()
    if fields.get("full_attention_type", "mha") not in ("mha", "gqa"):
        raise ValueError(f"full_attention_type {fields.get('full_attention_type')!r} is not supported: "
                         "Ring-linear-2.0's softmax layers are GQA ('mha')")
    num_layers = fields.integer("num_hidden_layers")
    hidden, heads, kv_heads, head_dim = _heads(fields)
    theta, factor = fields.rope(600000.0, 1.0)
    rotary = _rotary_dim(fields, head_dim, factor)
    group_norm = fields.integer("group_norm_size", 1)
    if group_norm < 1 or (heads * head_dim) % group_norm:
        raise ValueError(f"group_norm_size must divide num_attention_heads * head_dim = {heads * head_dim}, "
                         f"got {group_norm}")

    num_experts = fields.integer("num_experts")
    top_k = fields.integer("num_experts_per_tok")
    moe_inter = fields.integer("moe_intermediate_size")
    num_shared = fields.integer("num_shared_experts", 0)
    shared_inter = fields.integer("moe_shared_expert_intermediate_size", moe_inter) * num_shared
    first_dense = fields.integer("first_k_dense_replace", 0)
    if not 0 <= first_dense <= num_layers:
        raise ValueError(f"first_k_dense_replace must be in [0, {num_layers}], got {first_dense}")
    expert_bias = fields.flag("moe_router_enable_expert_bias", False)
    score = fields.get("score_function", "sigmoid" if expert_bias else "softmax")
    if score != "sigmoid":
        raise ValueError(f"score_function {score!r} is not supported: Ring-linear-2.0 routes by sigmoid scores")
    groups = fields.integer("n_group", 1) or 1
    topk_groups = fields.integer("topk_group", groups) or groups
    if num_experts % groups:
        raise ValueError(f"num_experts ({num_experts}) must be a multiple of n_group ({groups})")
    if groups > 1 and num_experts // groups < 2:
        raise ValueError("group-limited routing scores a group by its two best experts: n_group must leave "
                         f"at least 2 experts per group, got {num_experts // groups}")
    if top_k > topk_groups * (num_experts // groups):
        raise ValueError(f"num_experts_per_tok ({top_k}) exceeds the experts of topk_group ({topk_groups}) groups")

    linear_rope = fields.flag("linear_rope", True)
    linear_silu = fields.flag("use_linear_silu", fields.flag("linear_silu", False))
    return ModelSpec(
        model_type="bailing_moe_linear",
        vocab_size=fields.integer("vocab_size"),
        hidden_size=hidden,
        num_layers=num_layers,
        layer_types=bailing_layer_types(num_layers, fields.integer("layer_group_size")),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rotary_dim=rotary,
        rope_theta=theta,
        max_position_embeddings=fields.integer("max_position_embeddings", 32768),
        attention_bias=fields.flag("use_qkv_bias", False),
        attention_output_gate=False,
        **_lightning_geometry(heads, head_dim),
        intermediate_size=fields.integer("intermediate_size") if first_dense else fields.integer("intermediate_size", 0),
        moe_layers=tuple(i >= first_dense for i in range(num_layers)),
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared_inter,
        norm_topk_prob=fields.flag("norm_topk_prob", True),
        rms_norm_eps=fields.number("rms_norm_eps", 1e-6),
        tie_word_embeddings=fields.flag("tie_word_embeddings", False),
        bos_token_id=fields.get("bos_token_id"),
        eos_token_ids=fields.eos_token_ids(),
        linear_rotary_dim=rotary if linear_rope else 0,
        arch=BailingLinearFields(
            group_norm_size=group_norm, use_qk_norm=fields.flag("use_qk_norm", False), linear_silu=linear_silu,
            qkv_bias=fields.flag("use_qkv_bias", False), dense_bias=fields.flag("use_bias", False),
            num_expert_groups=groups, topk_groups=topk_groups,
            routed_scaling_factor=fields.number("routed_scaling_factor", 1.0), expert_bias=expert_bias,
        ),
    )


def minimax_layer_types(fields: ConfigFields, num_layers: int) -> Tuple[str, ...]:
    """``layer_types`` (the ``-hf`` checkpoints), else the original ``attn_type_list`` (0 =
    lightning, 1 = softmax), else transformers' default (full attention at even layers)."""
    if "layer_types" in fields:
        return tuple(fields.required("layer_types"))
    if "attn_type_list" in fields:
        kinds = fields.required("attn_type_list")
        if any(k not in (0, 1) for k in kinds):
            raise ValueError(f"attn_type_list entries must be 0 (lightning) or 1 (softmax), got {kinds}")
        return tuple(FULL_ATTENTION if k else LINEAR_ATTENTION for k in kinds)
    return tuple(FULL_ATTENTION if (i + 1) % 2 else LINEAR_ATTENTION for i in range(num_layers))


def minimax_spec(fields: ConfigFields) -> ModelSpec:
    """transformers' MiniMax (MiniMax-Text-01 / MiniMax-M1 ``-hf`` checkpoints). Lightning layers:
    ``silu(qkv_proj(x))`` split per head into q, k, v, lightning attention with the slopes of
    :func:`hypic.models.lightning.minimax_log_decay` (no q scaling), ``out_proj(norm(o) *
    sigmoid(output_gate(x)))``. Softmax layers: plain GQA with RoPE on the first ``rotary_dim``
    dims. MoE: softmax top-k, renormalised, no shared expert. Every sub-layer adds its output to
    the *normalised* input scaled by an alpha and beta (post-norm residuals)."""
    fields.silu()
    if fields.get("sliding_window") is not None:
        raise ValueError("sliding_window is not supported for minimax (the published checkpoints have none)")
    if not fields.flag("postnorm", True):
        raise ValueError("postnorm=false is not supported: transformers' MiniMax layers are post-norm")
    if fields.integer("block_size", 256) <= 0:
        raise ValueError(f"block_size must be positive, got {fields.get('block_size')}")
    num_layers = fields.integer("num_hidden_layers")
    hidden, heads, kv_heads, head_dim = _heads(fields)
    theta, factor = fields.rope(1000000.0, 1.0)
    num_experts = fields.integer("num_local_experts", fields.integer("num_experts", 8))
    scales = MiniMaxFields(
        full_attn_alpha=fields.number("full_attn_alpha_factor", 1.0),
        full_attn_beta=fields.number("full_attn_beta_factor", 1.0),
        linear_attn_alpha=fields.number("linear_attn_alpha_factor", 1.0),
        linear_attn_beta=fields.number("linear_attn_beta_factor", 1.0),
        mlp_alpha=fields.number("mlp_alpha_factor", 1.0),
        mlp_beta=fields.number("mlp_beta_factor", 1.0),
    )
    return ModelSpec(
        model_type="minimax",
        vocab_size=fields.integer("vocab_size"),
        hidden_size=hidden,
        num_layers=num_layers,
        layer_types=minimax_layer_types(fields, num_layers),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rotary_dim=_rotary_dim(fields, head_dim, factor),
        rope_theta=theta,
        max_position_embeddings=fields.integer("max_position_embeddings", 131072),
        attention_bias=False,
        attention_output_gate=False,
        **_lightning_geometry(heads, head_dim),
        intermediate_size=fields.integer("intermediate_size"),
        moe_layers=(True,) * num_layers,
        num_experts=num_experts,
        num_experts_per_tok=fields.integer("num_experts_per_tok", 2),
        moe_intermediate_size=fields.integer("intermediate_size"),
        shared_expert_intermediate_size=0,
        norm_topk_prob=True,
        rms_norm_eps=fields.number("rms_norm_eps", 1e-5),
        tie_word_embeddings=fields.flag("tie_word_embeddings", False),
        bos_token_id=fields.get("bos_token_id"),
        eos_token_ids=fields.eos_token_ids(),
        arch=scales,
    )


__all__ = ["bailing_layer_types", "bailing_moe_linear_spec", "minimax_layer_types", "minimax_spec"]
