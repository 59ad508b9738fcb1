"""Ring-linear-2.0 (``BailingMoeLinearV2ForCausalLM``: Ring-mini-linear-2.0, Ring-flash-linear-2.0),
Hugging Face shaped. The published checkpoints ship remote code only; the maths follows it as
SGLang's and vLLM's ports state it (docs: hypic/models/config_lightning.py).

* Linear layers (``attention`` of most layers): ``query_key_value`` gives q, k, v of
  ``num_attention_heads`` heads each (MHA), optionally through SiLU; q and k take a per-head RMSNorm
  (``query_layernorm`` / ``key_layernorm``) and RoPE at their absolute positions on the first
  ``rotary_dim`` dims; lightning attention with scale ``head_dim^-0.5`` and the decay of
  :func:`~hypic.models.lightning.bailing_decay_rates`; the output takes ``g_norm`` (RMSNorm over
  ``group_norm_size`` groups) times ``sigmoid(g_proj(x))``, then ``dense``.
* Softmax layers (the last of each group of ``layer_group_size``): GQA from ``query_key_value``
  with the same q/k norm and RoPE, no output gate, ``dense``.
* MLP: dense SwiGLU in the first ``first_k_dense_replace`` layers, then a MoE of
  ``num_experts`` routed experts (:func:`hypic.ops.moe.route_sigmoid_grouped`) plus shared experts.
* Norms: pre-norm ``input_layernorm`` / ``post_attention_layernorm`` and the final ``norm``, all
  ``weight * rmsnorm(x)``.

Parameter names equal the checkpoint's (``model.word_embeddings``, ``model.layers.N.attention.*``,
``model.layers.N.mlp.*``, ``model.norm``, ``lm_head``), except routed experts, held stacked as
``mlp.experts.gate_up_proj`` / ``down_proj`` (assembled by the loader from the per-expert
tensors). Everything that touches a cache goes through ``ctx`` (``ctx.lightning_attention``,
``ctx.attention``, ``ctx.token_wise``, ``ctx.select_logits_rows``).
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
    SwiGLUMLP,
    check_moe_backend,
    columns,
    fuse_linears,
    linear,
)
from hypic.models.lightning import LogDecay, bailing_decay_rates
from hypic.models.spec import LINEAR_ATTENTION, ModelSpec
from hypic.ops.fused import swiglu
from hypic.ops.moe import moe_experts, route_sigmoid_grouped
from hypic.ops.norms import add_rms_norm, group_rms_norm_sigmoid_gated
from hypic.ops.rope import RotaryEmbedding, apply_rotary

_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")


class BailingMoeLinearV2LinearAttention(nn.Module):
    """A lightning-attention layer (``attention`` of a linear layer). q, k, v reach the
    recurrence in the activation dtype: the published ports cast them to fp32 first, which a bf16
    model here does not (fla's kernels accumulate in fp32 either way; the difference is one bf16
    rounding of q, k and v)."""

    def __init__(self, spec: ModelSpec, layer_idx: int) -> None:
        super().__init__()
        arch = spec.arch
        self.layer_idx = layer_idx
        self.num_heads = spec.linear_num_value_heads
        self.head_dim = spec.linear_key_head_dim
        self.inner = self.num_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.rotary_dim = spec.linear_rotary_dim  # 0: no RoPE in this layer
        self.silu = arch.linear_silu
        self.num_groups = arch.group_norm_size
        self.eps = spec.rms_norm_eps
        self.query_key_value = linear(spec.hidden_size, 3 * self.inner, arch.qkv_bias)
        self.g_proj = linear(spec.hidden_size, self.inner)
        self.dense = linear(self.inner, spec.hidden_size, arch.dense_bias)
        self.g_norm = RMSNorm(self.inner, spec.rms_norm_eps)
        if arch.use_qk_norm:
            self.query_layernorm = RMSNorm(self.head_dim, spec.rms_norm_eps)
            self.key_layernorm = RMSNorm(self.head_dim, spec.rms_norm_eps)
        self.decay = LogDecay(bailing_decay_rates(self.num_heads, layer_idx, spec.num_layers))
        # [query_key_value | g_proj] after fuse_projections(): one GEMM for both
        self.fused_in_proj: Optional[torch.Tensor] = None

    def fuse_projections(self) -> bool:
        if self.fused_in_proj is None:
            self.fused_in_proj = fuse_linears([self.query_key_value, self.g_proj])
        return self.fused_in_proj is not None

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Normed input -> q, k, v ``[T, H, D]`` (q, k normed and rotated) and the gate ``[T, H*D]``."""
        num_tokens = x.shape[0]
        if self.fused_in_proj is not None:
            qkv, gate = columns(F.linear(x, self.fused_in_proj), (3 * self.inner, self.inner))
        else:
            qkv, gate = self.query_key_value(x), self.g_proj(x)
        if self.silu:
            qkv = F.silu(qkv)
        q, k, v = qkv.view(num_tokens, 3 * self.num_heads, self.head_dim).split(self.num_heads, dim=1)
        if hasattr(self, "query_layernorm"):
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        if self.rotary_dim:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return q, k, v, gate

    def output(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        o = group_rms_norm_sigmoid_gated(o.reshape(o.shape[0], self.inner).to(gate.dtype), gate,
                                         self.g_norm.weight, self.num_groups, self.eps)
        return self.dense(o)


class BailingMoeLinearV2Attention(nn.Module):
    """A softmax layer's GQA: q/k RMSNorm, partial RoPE at absolute positions (applied here), no
    output gate; cached K/V handled by ``ctx.attention``."""

    def __init__(self, spec: ModelSpec, layer_idx: int) -> None:
        super().__init__()
        arch = spec.arch
        self.layer_idx = layer_idx
        self.num_heads = spec.num_attention_heads
        self.num_kv_heads = spec.num_key_value_heads
        self.head_dim = spec.head_dim
        self.scale = self.head_dim**-0.5
        width = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.query_key_value = linear(spec.hidden_size, width, arch.qkv_bias)
        self.dense = linear(self.num_heads * self.head_dim, spec.hidden_size, arch.dense_bias)
        if arch.use_qk_norm:
            self.query_layernorm = RMSNorm(self.head_dim, spec.rms_norm_eps)
            self.key_layernorm = RMSNorm(self.head_dim, spec.rms_norm_eps)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        num_tokens = x.shape[0]
        qkv = self.query_key_value(x).view(num_tokens, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        if hasattr(self, "query_layernorm"):
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def output(self, o: torch.Tensor) -> torch.Tensor:
        return self.dense(o.reshape(o.shape[0], self.num_heads * self.head_dim))


class BailingMoeLinearV2Gate(nn.Module):
    """The router: ``weight [E, H]`` and, with ``moe_router_enable_expert_bias``, the selection
    bias ``expert_bias [E]`` (kept fp32 in a 16-bit model)."""

    FP32_PARAMETERS = ("expert_bias",)

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(spec.num_experts, spec.hidden_size))
        self.expert_bias = nn.Parameter(torch.empty(spec.num_experts)) if spec.arch.expert_bias else None


class BailingMoeLinearV2SparseMoeBlock(nn.Module):
    """Routed experts (sigmoid scores, bias-picked, group-limited top-k, scaled weights) plus the
    shared experts; ``moe_backend`` one of :data:`MOE_BACKENDS`."""

    def __init__(self, spec: ModelSpec, moe_backend: str = "auto") -> None:
        super().__init__()
        arch = spec.arch
        self.moe_impl = MOE_BACKENDS[check_moe_backend(moe_backend)]
        self.top_k = spec.num_experts_per_tok
        self.renormalize = spec.norm_topk_prob
        self.groups = (arch.num_expert_groups, arch.topk_groups)
        self.scaling = arch.routed_scaling_factor
        self.gate = BailingMoeLinearV2Gate(spec)
        self.experts = StackedExperts(spec.num_experts, spec.hidden_size, spec.moe_intermediate_size)
        self.shared_experts = (SwiGLUMLP(spec.hidden_size, spec.shared_expert_intermediate_size)
                               if spec.shared_expert_intermediate_size else None)
        self.fused_shared: Optional[torch.Tensor] = None  # [gate_proj | up_proj] of the shared experts

    def fuse_projections(self) -> bool:
        if self.shared_experts is not None and self.fused_shared is None:
            self.fused_shared = fuse_linears([self.shared_experts.gate_proj, self.shared_experts.up_proj])
        return self.fused_shared is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the router in fp32, as the checkpoint's code computes it
        logits = F.linear(x.float(), self.gate.weight.float())
        weights, ids = route_sigmoid_grouped(logits, self.gate.expert_bias, self.top_k, *self.groups,
                                             renormalize=self.renormalize, scaling=self.scaling)
        out = moe_experts(x, self.experts.gate_up_proj, self.experts.down_proj, weights, ids, impl=self.moe_impl)
        if self.shared_experts is None:
            return out
        if self.fused_shared is not None:
            inter = self.shared_experts.gate_proj.weight.shape[0]
            gate, up = columns(F.linear(x, self.fused_shared), (inter, inter))
            return out + self.shared_experts.down_proj(swiglu(gate, up))
        return out + self.shared_experts(x)


class BailingMoeLinearV2DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer_idx: int, moe_backend: str = "auto") -> None:
        super().__init__()
        self.layer_type = spec.layer_types[layer_idx]
        if self.layer_type == LINEAR_ATTENTION:
            self.attention: nn.Module = BailingMoeLinearV2LinearAttention(spec, layer_idx)
        else:
            self.attention = BailingMoeLinearV2Attention(spec, layer_idx)
        if spec.moe_layers[layer_idx]:
            self.mlp: nn.Module = BailingMoeLinearV2SparseMoeBlock(spec, moe_backend)
        else:
            self.mlp = SwiGLUMLP(spec.hidden_size, spec.intermediate_size)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    # Row-wise phases around the context's calls (ctx.token_wise may replay them from CUDA
    # graphs); the maths is ``input_layernorm -> mixer -> residual -> post_attention_layernorm ->
    # mlp -> residual``.
    def linear_in(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return self.attention.project(self.input_layernorm(x), cos, sin)

    def attention_in(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return self.attention.project(self.input_layernorm(x), cos, sin)

    def linear_out(self, o: torch.Tensor, gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.finish(x, self.attention.output(o, gate))

    def attention_out(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.finish(x, self.attention.output(o))

    def finish(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        norm = self.post_attention_layernorm
        x, normed = add_rms_norm(x, h, norm.weight, norm.eps)
        return x + self.mlp(normed)

    def forward(self, x, cos, sin, rotary: RotaryEmbedding, ctx: Any) -> torch.Tensor:
        attn = self.attention
        if self.layer_type == LINEAR_ATTENTION:
            q, k, v, gate = ctx.token_wise(self.linear_in, x, cos, sin)
            o = ctx.lightning_attention(attn.layer_idx, q, k, v, attn.decay.on(q.device, q.dtype), attn.scale,
                                        rotary if attn.rotary_dim else None)
            return ctx.token_wise(self.linear_out, o, gate, x)
        q, k, v = ctx.token_wise(self.attention_in, x, cos, sin)
        o = ctx.attention(attn.layer_idx, q, k, v, attn.scale, rotary)
        return ctx.token_wise(self.attention_out, o, x)


class BailingMoeLinearV2Model(DecoderStack):
    EMBEDDING = "word_embeddings"

    def __init__(self, spec: ModelSpec, moe_backend: str = "auto") -> None:
        super().__init__(spec, BailingMoeLinearV2DecoderLayer, RMSNorm, moe_backend)


class BailingMoeLinearV2ForCausalLM(CausalLM):
    """``logits = model(input_ids [T], positions [T], ctx)``; ``moe_backend`` as in
    :data:`MOE_BACKENDS`. :meth:`fuse_projections` fuses each linear layer's
    ``query_key_value`` with its ``g_proj`` and each MoE block's shared-expert gate and up
    projections (the router stays a GEMM of its own: it runs in fp32)."""

    def __init__(self, spec: ModelSpec, moe_backend: str = "auto") -> None:
        super().__init__(spec, BailingMoeLinearV2Model, moe_backend)

    def checkpoint_key(self, key: str) -> Optional[str]:
        """Skip the multi-token-prediction layers the checkpoints append after the last decoder
        layer (``model.layers.<L>...``, ``model.mtp.*``) and the stored decay slopes (derived from
        the config); every other key is the parameter's name."""
        match = _LAYER_KEY.match(key)
        if (match is not None and int(match.group(1)) >= self.spec.num_layers) or key.startswith("model.mtp."):
            return None
        if key.endswith(("slope", "slope_rate")):
            return None
        return key


__all__ = [
    "BailingMoeLinearV2Attention", "BailingMoeLinearV2DecoderLayer", "BailingMoeLinearV2ForCausalLM",
    "BailingMoeLinearV2Gate", "BailingMoeLinearV2LinearAttention", "BailingMoeLinearV2Model",
    "BailingMoeLinearV2SparseMoeBlock",
]
