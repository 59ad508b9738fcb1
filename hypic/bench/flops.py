"""FLOP counts of a prefill, so measured times can be set against the H200's floor.

Formula (bf16 matrix FLOPs; the per-token recurrence of the linear layers is counted too):

* dense projections: ``2 * P_active`` per live token, with ``P_active`` the non-embedding
  parameters a token touches (attention / linear-layer projections, dense MLP or router + top-k
  experts + shared expert); the LM head ``2 * hidden * vocab`` only for rows whose logits are
  computed;
* causal attention per full-attention layer: ``2 * Hq * D * sum_q (keys visible to q)`` for QK^T
  plus the same for PV, i.e. ``2 * n^2 * Hq * D`` for a plain causal prompt of n tokens;
* the recurrence per linear layer and token: Gated DeltaNet ``6 * HV * K * V`` (state decay +
  update, the delta read ``S^T k`` and the output ``S^T q``); lightning attention ``4 * H * K * V``
  (the update ``k v^T`` and the output ``S^T q``; its decay is a scalar per head).

Linear-layer projections: Gated DeltaNet ``q, k, v, z`` plus ``b, a`` (two per value head) and the
output; lightning ``q, k, v``, the output gate and the output. Full attention: ``q`` (doubled where
it also yields the output gate), ``k, v``, the output.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypic.models.spec import GATED_DELTA, LINEAR_ATTENTION, ModelSpec


@dataclass(frozen=True)
class FlopModel:
    dense_per_token: float  # 2 * active non-embedding params (no LM head)
    lm_head_per_row: float
    attention_per_visible_pair: float  # per (query, visible key) pair, summed over attention layers
    recurrence_per_token: float  # all linear layers

    def prefill(self, live_tokens: int, visible_pairs: int, logits_rows: int = 1) -> float:
        return (
            self.dense_per_token * live_tokens
            + self.recurrence_per_token * live_tokens
            + self.attention_per_visible_pair * visible_pairs
            + self.lm_head_per_row * logits_rows
        )

    def causal_prefill(self, num_tokens: int) -> float:
        return self.prefill(num_tokens, num_tokens * (num_tokens + 1) // 2)


def active_params_per_token(spec: ModelSpec) -> int:
    h = spec.hidden_size
    total = 0
    for i, kind in enumerate(spec.layer_types):
        if kind == LINEAR_ATTENTION:
            kd, vd = spec.linear_key_dim, spec.linear_value_dim
            if spec.linear_family == GATED_DELTA:
                hv = spec.linear_num_value_heads
                total += h * (2 * kd + vd) + h * vd + 2 * h * hv + vd * h  # qkv, z, b+a, out
            else:
                total += h * (2 * kd + vd) + h * vd + vd * h  # qkv, output gate, out
            total += spec.conv_dim * spec.conv_kernel_size
        else:
            hq, hkv, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
            q_width = 2 if spec.attention_output_gate else 1
            total += h * hq * d * q_width + 2 * h * hkv * d + hq * d * h  # q (+gate), k, v, o
        if spec.moe_layers[i]:
            total += h * spec.num_experts  # router
            total += spec.num_experts_per_tok * 3 * h * spec.moe_intermediate_size
            if spec.shared_expert_intermediate_size:
                total += 3 * h * spec.shared_expert_intermediate_size + (h if spec.shared_expert_gate else 0)
        else:
            total += 3 * h * spec.intermediate_size
    return total


def flop_model(spec: ModelSpec) -> FlopModel:
    num_attn = sum(1 for t in spec.layer_types if t != LINEAR_ATTENTION)
    num_lin = spec.num_layers - num_attn
    return FlopModel(
        dense_per_token=2.0 * active_params_per_token(spec),
        lm_head_per_row=2.0 * spec.hidden_size * spec.vocab_size,
        attention_per_visible_pair=4.0 * spec.num_attention_heads * spec.head_dim * num_attn,
        recurrence_per_token=(6.0 if spec.linear_family == GATED_DELTA else 4.0) * spec.linear_num_value_heads
        * spec.linear_key_head_dim * spec.linear_value_head_dim * num_lin,
    )
