"""MiniMax (transformers' ``minimax``: MiniMax-Text-01 and MiniMax-M1 in their ``-hf`` format),
Hugging Face shaped, with transformers' module and parameter names.

* Lightning layers (``self_attn`` of a ``linear_attention`` layer): ``silu(qkv_proj(x))`` viewed
  per head as ``[q | k | v]``; lightning attention with scale 1 and the decay of
  :func:`~hypic.models.lightning.minimax_decay_rates`; ``out_proj(norm(o) *
  sigmoid(output_gate(x)))`` with ``norm`` an RMSNorm over all heads (eps 1e-6, transformers'
  default for it).
* Softmax layers: GQA (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, no bias, no norm, no gate)
  with RoPE on the first ``rotary_dim`` dims of each head.
* MoE in every layer (``mlp``: router ``gate``, experts held stacked as ``experts.gate_up_proj`` /
  ``down_proj``): softmax top-k, renormalised.
* Post-norm residuals: each sub-layer reads the normalised input ``h`` and returns
  ``h * alpha + out * beta`` (:class:`hypic.models.spec.MiniMaxFields`).

On RoPE: transformers 5.25 builds MiniMax's default RoPE over the whole head whatever
``partial_rotary_factor`` says, while the published models rotate 64 of 128 dims (``rotary_dim``
of the original configs); this module rotates ``spec.rotary_dim`` dims, which equals transformers
whenever the factor is 1.

Checkpoints saved by transformers hold the routed experts as ``block_sparse_moe.experts.E.w1/w2/w3``
and the router as ``block_sparse_moe.gate`` (the original format); :meth:`MiniMaxForCausalLM.checkpoint_key`
maps them, and skips the decay tables transformers stores (``slope_rate``, ``*_decay``).
"""

from __future__ import annotations

import re
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from hypic.models.layers import (
    MOE_BACKENDS,
    CausalLM,
    DecoderStack,
    RMSNorm,
    StackedExperts,
    check_moe_backend,
    columns,
    fuse_linears,
    linear,
)
from hypic.models.lightning import LogDecay, minimax_decay_rates
from hypic.models.spec import LINEAR_ATTENTION, ModelSpec
from hypic.ops.fused import sigmoid_gate
from hypic.ops.moe import moe_routed
from hypic.ops.norms import rms_norm
from hypic.ops.rope import RotaryEmbedding, apply_rotary

# transformers builds the lightning layers' output norm with MiniMaxRMSNorm's default eps
LIGHTNING_NORM_EPS = 1e-6
_EXPERT_KEY = re.compile(r"^(model\.layers\.\d+\.)block_sparse_moe\.experts\.(\d+)\.w([123])\.weight$")
_EXPERT_PROJ = {"1": "gate_proj", "2": "down_proj", "3": "up_proj"}
_DERIVED = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")


class MiniMaxLightningAttention(nn.Module):
    def __init__(self, spec: ModelSpec, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = spec.linear_num_value_heads
        self.head_dim = spec.linear_key_head_dim
        self.inner = self.num_heads * self.head_dim
        self.scale = 1.0  # no query scaling in MiniMax's lightning attention
        self.qkv_proj = linear(spec.hidden_size, 3 * self.inner)
        self.output_gate = linear(spec.hidden_size, self.inner)
        self.out_proj = linear(self.inner, spec.hidden_size)
        self.norm = RMSNorm(self.inner, LIGHTNING_NORM_EPS)
        self.decay = LogDecay(minimax_decay_rates(self.num_heads, layer_idx, spec.num_layers))
        self.fused_in_proj: Optional[torch.Tensor] = None  # [qkv_proj | output_gate]

    def fuse_projections(self) -> bool:
        if self.fused_in_proj is None:
            self.fused_in_proj = fuse_linears([self.qkv_proj, self.output_gate])
        return self.fused_in_proj is not None

    def project(self, h: torch.Tensor):
        """Normed input -> q, k, v ``[T, H, D]`` and the output gate's logits ``[T, H*D]``."""
        if self.fused_in_proj is not None:
            qkv, gate = columns(F.linear(h, self.fused_in_proj), (3 * self.inner, self.inner))
        else:
            qkv, gate = self.qkv_proj(h), self.output_gate(h)
        qkv = F.silu(qkv).view(h.shape[0], self.num_heads, 3 * self.head_dim)
        q, k, v = qkv.split(self.head_dim, dim=-1)
        return q, k, v, gate

    def output(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        o = self.norm(o.reshape(o.shape[0], self.inner).to(gate.dtype))
        return self.out_proj(sigmoid_gate(o, gate))


class MiniMaxAttention(nn.Module):
    def __init__(self, spec: ModelSpec, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = spec.num_attention_heads
        self.num_kv_heads = spec.num_key_value_heads
        self.head_dim = spec.head_dim
        self.scale = self.head_dim**-0.5
        self.q_proj = linear(spec.hidden_size, self.num_heads * self.head_dim)
        self.k_proj = linear(spec.hidden_size, self.num_kv_heads * self.head_dim)
        self.v_proj = linear(spec.hidden_size, self.num_kv_heads * self.head_dim)
        self.o_proj = linear(self.num_heads * self.head_dim, spec.hidden_size)
        self.fused_in_proj: Optional[torch.Tensor] = None  # [q_proj | k_proj | v_proj]

    def fuse_projections(self) -> bool:
        if self.fused_in_proj is None:
            self.fused_in_proj = fuse_linears([self.q_proj, self.k_proj, self.v_proj])
        return self.fused_in_proj is not None

    def project(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        num_tokens, q_width, kv_width = h.shape[0], self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if self.fused_in_proj is not None:
            q, k, v = columns(F.linear(h, self.fused_in_proj), (q_width, kv_width, kv_width))
        else:
            q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def output(self, o: torch.Tensor) -> torch.Tensor:
        return self.o_proj(o.reshape(o.shape[0], self.num_heads * self.head_dim))


class MiniMaxTopKRouter(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(spec.num_experts, spec.hidden_size))


class MiniMaxSparseMoeBlock(nn.Module):
    """Softmax top-k routed experts, renormalised, no shared expert; ``moe_backend`` one of
    :data:`MOE_BACKENDS`."""

    def __init__(self, spec: ModelSpec, moe_backend: str = "auto") -> None:
        super().__init__()
        self.moe_impl = MOE_BACKENDS[check_moe_backend(moe_backend)]
        self.top_k = spec.num_experts_per_tok
        self.gate = MiniMaxTopKRouter(spec)
        self.experts = StackedExperts(spec.num_experts, spec.hidden_size, spec.moe_intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.gate.weight)
        return moe_routed(x, logits, self.experts.gate_up_proj, self.experts.down_proj, self.top_k, True,
                          impl=self.moe_impl)


class MiniMaxDecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer_idx: int, moe_backend: str = "auto") -> None:
        super().__init__()
        scales = spec.arch
        self.layer_type = spec.layer_types[layer_idx]
        if self.layer_type == LINEAR_ATTENTION:
            self.self_attn: nn.Module = MiniMaxLightningAttention(spec, layer_idx)
            self.attn_alpha, self.attn_beta = scales.linear_attn_alpha, scales.linear_attn_beta
        else:
            self.self_attn = MiniMaxAttention(spec, layer_idx)
            self.attn_alpha, self.attn_beta = scales.full_attn_alpha, scales.full_attn_beta
        self.mlp_alpha, self.mlp_beta = scales.mlp_alpha, scales.mlp_beta
        self.mlp = MiniMaxSparseMoeBlock(spec, moe_backend)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    # Row-wise phases around the context's calls (ctx.token_wise may replay them from CUDA
    # graphs). The normalised input ``h`` is the residual of the attention, so the first phase
    # returns it with the projections.
    def linear_in(self, x: torch.Tensor):
        h = self.input_layernorm(x)
        return (*self.self_attn.project(h), h)

    def attention_in(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        h = self.input_layernorm(x)
        return (*self.self_attn.project(h, cos, sin), h)

    def linear_out(self, o: torch.Tensor, gate: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return self.finish(h, self.self_attn.output(o, gate))

    def attention_out(self, o: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return self.finish(h, self.self_attn.output(o))

    def finish(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """``h * alpha + attn * beta``, post-attention norm, MoE, the MLP's scaled residual."""
        norm = self.post_attention_layernorm
        h2 = rms_norm(h * self.attn_alpha + attn * self.attn_beta, norm.weight, norm.eps)
        return h2 * self.mlp_alpha + self.mlp(h2) * self.mlp_beta

    def forward(self, x, cos, sin, rotary: RotaryEmbedding, ctx: Any) -> torch.Tensor:
        attn = self.self_attn
        if self.layer_type == LINEAR_ATTENTION:
            q, k, v, gate, h = ctx.token_wise(self.linear_in, x)
            o = ctx.lightning_attention(attn.layer_idx, q, k, v, attn.decay.on(q.device, q.dtype), attn.scale, None)
            return ctx.token_wise(self.linear_out, o, gate, h)
        q, k, v, h = ctx.token_wise(self.attention_in, x, cos, sin)
        o = ctx.attention(attn.layer_idx, q, k, v, attn.scale, rotary)
        return ctx.token_wise(self.attention_out, o, h)


class MiniMaxModel(DecoderStack):
    def __init__(self, spec: ModelSpec, moe_backend: str = "auto") -> None:
        super().__init__(spec, MiniMaxDecoderLayer, RMSNorm, moe_backend)


class MiniMaxForCausalLM(CausalLM):
    """``logits = model(input_ids [T], positions [T], ctx)``; ``moe_backend`` as in
    :data:`MOE_BACKENDS`. :meth:`fuse_projections` fuses each lightning layer's ``qkv_proj`` with
    its ``output_gate`` and each softmax layer's ``q_proj``, ``k_proj``, ``v_proj``."""

    def __init__(self, spec: ModelSpec, moe_backend: str = "auto") -> None:
        super().__init__(spec, MiniMaxModel, moe_backend)

    def checkpoint_key(self, key: str) -> Optional[str]:
        """transformers' saved names -> parameter names: ``block_sparse_moe.experts.E.w1/w3/w2``
        are expert E's gate / up / down projections, ``block_sparse_moe.gate`` the router; the
        decay tables are derived from the config and skipped."""
        match = _EXPERT_KEY.match(key)
        if match is not None:
            prefix, expert, which = match.groups()
            return f"{prefix}mlp.experts.{expert}.{_EXPERT_PROJ[which]}.weight"
        if key.rpartition(".")[2] in _DERIVED:
            return None
        return key.replace(".block_sparse_moe.", ".mlp.")


__all__ = [
    "MiniMaxAttention", "MiniMaxDecoderLayer", "MiniMaxForCausalLM", "MiniMaxLightningAttention", "MiniMaxModel",
    "MiniMaxSparseMoeBlock", "MiniMaxTopKRouter",
]
