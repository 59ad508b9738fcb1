"""Qwen3-Next and Qwen3.5 (dense and MoE) hybrid models, Hugging Face shaped.

One module serves the whole family; the only architectural switch is the Gated DeltaNet input
projection layout (``spec.arch.gdn_layout``):

* ``"fused"`` (Qwen3-Next): ``in_proj_qkvz`` / ``in_proj_ba``, grouped **per key head**
  (``[q_h | k_h | v_h.. | z_h..]`` for each key head h), which is un-interleaved here;
* ``"split"`` (Qwen3.5): ``in_proj_qkv`` (already ``[q | k | v]``), ``in_proj_z``, ``in_proj_b``,
  ``in_proj_a``.

Parameter names equal the checkpoint's (with the ``model.`` prefix), except routed experts, which
are held fused as ``mlp.experts.gate_up_proj [E, 2I, H]`` / ``mlp.experts.down_proj [E, H, I]``
(the loader assembles them from per-expert checkpoint tensors when needed).

No serving logic lives here: the forward runs over ``T`` packed live tokens with explicit
positions, and every cache interaction goes through the ``ctx`` (docs/contracts.md,
"hypic.models <-> hypic.engine"): ``ctx.short_conv``, ``ctx.linear_attention``, ``ctx.attention``,
``ctx.select_logits_rows``, and ``ctx.token_wise`` around the row-wise phases of a layer.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from hypic.models.layers import (
    CausalLM,
    DecoderStack,
    GatedRMSNorm,
    MOE_BACKENDS,
    StackedExperts,
    SwiGLUMLP,
    ZeroCenteredRMSNorm,
    check_moe_backend,
    columns,
    fuse_linears,
    linear,
)
from hypic.models.spec import LINEAR_ATTENTION, ModelSpec
from hypic.ops.fused import add_sigmoid_gated, gdn_gates, sigmoid_gate, swiglu
from hypic.ops.moe import moe_routed
from hypic.ops.norms import add_rms_norm_zero_centered, l2_normalize
from hypic.ops.rope import RotaryEmbedding, apply_rotary

# transformers' l2norm inside the GDN kernels uses eps 1e-6 regardless of rms_norm_eps.
QK_L2NORM_EPS = 1e-6


class DepthwiseConvWeight(nn.Module):
    """Holds the short conv's ``weight [D, 1, W]`` (checkpoint shape); the conv itself runs in
    the context, which owns the conv state."""

    def __init__(self, channels: int, kernel_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))


class Qwen3NextGatedDeltaNet(nn.Module):
    def __init__(self, spec: ModelSpec, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.layout = spec.arch.gdn_layout
        self.num_k_heads = spec.linear_num_key_heads
        self.num_v_heads = spec.linear_num_value_heads
        self.head_k_dim = spec.linear_key_head_dim
        self.head_v_dim = spec.linear_value_head_dim
        self.key_dim = spec.linear_key_dim
        self.value_dim = spec.linear_value_dim
        self.conv_dim = spec.conv_dim
        hidden = spec.hidden_size
        if self.layout == "fused":
            self.in_proj_qkvz = linear(hidden, 2 * self.key_dim + 2 * self.value_dim)
            self.in_proj_ba = linear(hidden, 2 * self.num_v_heads)
        else:
            self.in_proj_qkv = linear(hidden, 2 * self.key_dim + self.value_dim)
            self.in_proj_z = linear(hidden, self.value_dim)
            self.in_proj_b = linear(hidden, self.num_v_heads)
            self.in_proj_a = linear(hidden, self.num_v_heads)
        self.conv1d = DepthwiseConvWeight(self.conv_dim, spec.conv_kernel_size)
        self.dt_bias = nn.Parameter(torch.empty(self.num_v_heads))
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, spec.rms_norm_eps)
        self.out_proj = linear(self.value_dim, hidden)
        # [qkv | z | b | a] (split layout) after fuse_projections(): one GEMM for the four
        self.fused_in_proj: Optional[torch.Tensor] = None

    def fuse_projections(self) -> bool:
        """Fuse the split layout's four input projections (:func:`fuse_linears`)."""
        if self.layout == "split" and self.fused_in_proj is None:
            self.fused_in_proj = fuse_linears([self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a])
        return self.fused_in_proj is not None

    def _project(self, x: torch.Tensor):
        """-> mixed_qkv [T, conv_dim] in conv order [q | k | v], z [T, HV, dv], b, a [T, HV]."""
        num_tokens = x.shape[0]
        if self.fused_in_proj is not None:
            # column blocks of one output (views: the consumers take strided rows)
            mixed, z, b, a = columns(F.linear(x, self.fused_in_proj),
                                      (self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads))
            return mixed, z.view(num_tokens, self.num_v_heads, self.head_v_dim), b, a
        if self.layout == "split":
            mixed = self.in_proj_qkv(x)
            z = self.in_proj_z(x).view(num_tokens, self.num_v_heads, self.head_v_dim)
            return mixed, z, self.in_proj_b(x), self.in_proj_a(x)
        # Fused layout groups everything per key head h: [q_h, k_h, v_(h,0..r), z_(h,0..r)], and
        # [b_(h,0..r), a_(h,0..r)]; value head j = h * r + i belongs to key head j // r.
        ratio = self.num_v_heads // self.num_k_heads
        vdim = ratio * self.head_v_dim
        qkvz = self.in_proj_qkvz(x).view(num_tokens, self.num_k_heads, 2 * self.head_k_dim + 2 * vdim)
        q, k, v, z = torch.split(qkvz, [self.head_k_dim, self.head_k_dim, vdim, vdim], dim=-1)
        ba = self.in_proj_ba(x).view(num_tokens, self.num_k_heads, 2 * ratio)
        b, a = torch.split(ba, [ratio, ratio], dim=-1)
        mixed = torch.cat(
            [q.reshape(num_tokens, -1), k.reshape(num_tokens, -1), v.reshape(num_tokens, -1)], dim=-1
        )
        z = z.reshape(num_tokens, self.num_v_heads, self.head_v_dim)
        return mixed, z, b.reshape(num_tokens, self.num_v_heads), a.reshape(num_tokens, self.num_v_heads)

    def gates(self, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor):
        """Conv output ``[T, conv_dim]`` and raw gates -> L2-normalised q, k ``[T, H, dk]``, v
        ``[T, HV, dv]``, log decay g and beta ``[T, HV]`` (fp32; fp64 for an fp64 model)."""
        num_tokens = mixed.shape[0]
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = l2_normalize(q.reshape(num_tokens, self.num_k_heads, self.head_k_dim), QK_L2NORM_EPS)
        k = l2_normalize(k.reshape(num_tokens, self.num_k_heads, self.head_k_dim), QK_L2NORM_EPS)
        v = v.reshape(num_tokens, self.num_v_heads, self.head_v_dim)
        g, beta = gdn_gates(b, a, self.A_log, self.dt_bias)
        return q, k, v, g, beta

    def output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Gated norm of the recurrence output ``[T, HV, dv]`` and the output projection."""
        o = self.norm(o.to(z.dtype), z)
        return self.out_proj(o.reshape(o.shape[0], self.value_dim))

    def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        mixed, z, b, a = self._project(x)
        # Short causal conv + SiLU over q, k, v only; the context supplies/keeps the conv state.
        mixed = ctx.short_conv(self.layer_idx, mixed, self.conv1d.weight[:, 0, :], None)
        q, k, v, g, beta = self.gates(mixed, b, a)
        o = ctx.linear_attention(self.layer_idx, q, k, v, g, beta)  # [T, HV, dv]
        return self.output(o, z)


class Qwen3NextAttention(nn.Module):
    """Gated GQA: q_proj gives query and a per-head sigmoid output gate; zero-centred q/k norm;
    partial RoPE at absolute positions (applied here); cached K/V handled by ``ctx.attention``."""

    def __init__(self, spec: ModelSpec, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = spec.num_attention_heads
        self.num_kv_heads = spec.num_key_value_heads
        self.head_dim = spec.head_dim
        self.scale = self.head_dim**-0.5
        hidden, bias = spec.hidden_size, spec.attention_bias
        self.q_proj = linear(hidden, self.num_heads * self.head_dim * 2, bias)
        self.k_proj = linear(hidden, self.num_kv_heads * self.head_dim, bias)
        self.v_proj = linear(hidden, self.num_kv_heads * self.head_dim, bias)
        self.o_proj = linear(self.num_heads * self.head_dim, hidden, bias)
        self.q_norm = ZeroCenteredRMSNorm(self.head_dim, spec.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(self.head_dim, spec.rms_norm_eps)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """-> q ``[T, Hq, D]``, k, v ``[T, Hkv, D]`` (q, k normed, RoPE at cos/sin), output gate ``[T, Hq*D]``."""
        num_tokens = x.shape[0]
        query, gate = torch.chunk(self.q_proj(x).view(num_tokens, self.num_heads, 2 * self.head_dim), 2, dim=-1)
        gate = gate.reshape(num_tokens, self.num_heads * self.head_dim)
        q = self.q_norm(query)
        k = self.k_norm(self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v, gate

    def output(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.o_proj(sigmoid_gate(o.reshape(o.shape[0], self.num_heads * self.head_dim), gate))

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: RotaryEmbedding, ctx: Any
    ) -> torch.Tensor:
        q, k, v, gate = self.project(x, cos, sin)
        o = ctx.attention(self.layer_idx, q, k, v, self.scale, rotary)  # [T, Hq, D]
        return self.output(o, gate)


# the dense SwiGLU MLP and the stacked routed experts under their transformers names
Qwen3NextMLP = SwiGLUMLP
Qwen3NextExperts = StackedExperts


class Qwen3NextSparseMoeBlock(nn.Module):
    """Softmax top-k routed experts plus a sigmoid-gated shared expert; ``moe_backend`` one of
    :data:`MOE_BACKENDS`."""

    def __init__(self, spec: ModelSpec, moe_backend: str = "auto") -> None:
        super().__init__()
        self.moe_impl = MOE_BACKENDS[check_moe_backend(moe_backend)]
        self.top_k = spec.num_experts_per_tok
        self.renormalize = spec.norm_topk_prob
        self.gate = linear(spec.hidden_size, spec.num_experts)
        self.experts = Qwen3NextExperts(spec.num_experts, spec.hidden_size, spec.moe_intermediate_size)
        self.has_shared = spec.shared_expert_intermediate_size > 0
        if self.has_shared:
            self.shared_expert = Qwen3NextMLP(spec.hidden_size, spec.shared_expert_intermediate_size)
            self.shared_expert_gate = linear(spec.hidden_size, 1)
        # [shared gate | shared up | router | shared expert gate] after fuse_projections(): the
        # four GEMMs of the block's input in one (the router's logits at an aligned column)
        self.fused_in_proj: Optional[torch.Tensor] = None

    def fuse_projections(self) -> bool:
        """Fuse the GEMMs that read the block's input (:func:`fuse_linears`)."""
        if self.has_shared and self.fused_in_proj is None:
            shared = self.shared_expert
            self.fused_in_proj = fuse_linears([shared.gate_proj, shared.up_proj, self.gate, self.shared_expert_gate])
        return self.fused_in_proj is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_in_proj is not None:
            inter = self.shared_expert.gate_proj.weight.shape[0]
            gate, up, logits, shared_gate = columns(F.linear(x, self.fused_in_proj),
                                                     (inter, inter, self.gate.weight.shape[0], 1))
            shared = self.shared_expert.down_proj(swiglu(gate, up))
        else:
            logits = self.gate(x)
            if self.has_shared:
                shared, shared_gate = self.shared_expert(x), self.shared_expert_gate(x)
        # softmax top-k routing, the weights rounded to the activation dtype (as transformers mixes)
        out = moe_routed(x, logits, self.experts.gate_up_proj, self.experts.down_proj, self.top_k,
                         self.renormalize, impl=self.moe_impl)
        if self.has_shared:
            out = add_sigmoid_gated(out, shared, shared_gate)
        return out


class Qwen3NextDecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer_idx: int, moe_backend: str = "auto") -> None:
        super().__init__()
        self.layer_type = spec.layer_types[layer_idx]
        if self.layer_type == LINEAR_ATTENTION:
            self.linear_attn = Qwen3NextGatedDeltaNet(spec, layer_idx)
        else:
            self.self_attn = Qwen3NextAttention(spec, layer_idx)
        if spec.moe_layers[layer_idx]:
            self.mlp: nn.Module = Qwen3NextSparseMoeBlock(spec, moe_backend)
        else:
            self.mlp = Qwen3NextMLP(spec.hidden_size, spec.intermediate_size)
        self.input_layernorm = ZeroCenteredRMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(spec.hidden_size, spec.rms_norm_eps)

    # The layer runs as token-wise phases around the context's calls (each phase maps rows to
    # rows, so a runner may replay it from a CUDA graph: ctx.token_wise); the maths is that of
    # ``input_layernorm -> mixer -> residual -> post_attention_layernorm -> mlp -> residual``.
    def linear_in(self, x: torch.Tensor):
        return self.linear_attn._project(self.input_layernorm(x))

    def attention_in(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return self.self_attn.project(self.input_layernorm(x), cos, sin)

    def linear_out(self, o: torch.Tensor, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.finish(x, self.linear_attn.output(o, z))

    def attention_out(self, o: torch.Tensor, gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.finish(x, self.self_attn.output(o, gate))

    def finish(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Residual, post-attention norm, MLP / MoE, residual."""
        norm = self.post_attention_layernorm
        x, normed = add_rms_norm_zero_centered(x, h, norm.weight, norm.eps)
        return x + self.mlp(normed)

    def forward(self, x, cos, sin, rotary, ctx) -> torch.Tensor:
        if self.layer_type == LINEAR_ATTENTION:
            mix = self.linear_attn
            mixed, z, b, a = ctx.token_wise(self.linear_in, x)
            # Short causal conv + SiLU over q, k, v only; the context supplies/keeps the conv state.
            mixed = ctx.short_conv(mix.layer_idx, mixed, mix.conv1d.weight[:, 0, :], None)
            q, k, v, g, beta = ctx.token_wise(mix.gates, mixed, b, a)
            o = ctx.linear_attention(mix.layer_idx, q, k, v, g, beta)  # [T, HV, dv]
            return ctx.token_wise(self.linear_out, o, z, x)
        attn = self.self_attn
        q, k, v, gate = ctx.token_wise(self.attention_in, x, cos, sin)
        o = ctx.attention(attn.layer_idx, q, k, v, attn.scale, rotary)  # [T, Hq, D]
        return ctx.token_wise(self.attention_out, o, gate, x)


class Qwen3NextModel(DecoderStack):
    def __init__(self, spec: ModelSpec, moe_backend: str = "auto") -> None:
        super().__init__(spec, Qwen3NextDecoderLayer, ZeroCenteredRMSNorm, moe_backend)


class Qwen3NextForCausalLM(CausalLM):
    """``logits = model(input_ids [T], positions [T], ctx)`` -> fp32 logits of the rows
    ``ctx.select_logits_rows`` keeps (e.g. the last token of each span). ``moe_backend``: how the
    routed experts run (:data:`MOE_BACKENDS`).

    :meth:`fuse_projections` fuses each GDN layer's four input projections and each MoE block's
    router, shared-expert and shared-gate GEMMs into one GEMM each. Separate GEMMs of a cached
    request's few hundred rows are launch-bound: on the H200 the router, shared-gate and GDN
    ``b``/``a`` GEMMs took 5.3-5.9 us each (140 of them in the all-hit 32k request's profile);
    fused, the GDN input GEMM took 1.26 ms where its four took ~1.73, the MoE block's 0.32 where
    its four took ~1.04 (the request 56.34 against 56.67 ms p50, within the spread of runs;
    docs/decisions.md)."""

    def __init__(self, spec: ModelSpec, moe_backend: str = "auto") -> None:
        super().__init__(spec, Qwen3NextModel, moe_backend)


# Qwen3.5 checkpoints run on the same classes (spec.arch.gdn_layout == "split").
Qwen3_5ForCausalLM = Qwen3NextForCausalLM
Qwen3_5MoeForCausalLM = Qwen3NextForCausalLM
