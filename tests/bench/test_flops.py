"""The FLOP model (hypic.bench.flops) against the parameters each family's model actually holds: the
GEMM parameters a token touches, counted from the modules, equal the formula's, for Gated DeltaNet
(Qwen3.5 MoE), Ring-linear-2.0 and MiniMax; and each family's recurrence term."""

import pytest
import torch

from hypic.bench.flops import active_params_per_token, flop_model
from hypic.models.config import spec_from_config
from hypic.models.loader import build_empty_model
from tests.bench.test_floor import MOE_CONFIG
from tests.models._lightning import MINIMAX_CONFIG, RING_CONFIG

CONFIGS = {
    "qwen3_5_moe": MOE_CONFIG,
    "ring": RING_CONFIG,
    "minimax": dict(MINIMAX_CONFIG, model_type="minimax"),
}


def _counted(spec, model) -> float:
    """GEMM parameters one token uses, from the model's modules: every matrix but the embedding
    and the LM head (norm weights, routing biases and decays are not GEMMs), the routed experts'
    at ``top_k / E`` of their total (the short conv's weights counted whole, as the formula does)."""
    total = 0.0
    for name, p in model.named_parameters():
        if p.dim() < 2 and "conv1d" not in name:
            continue
        if name.endswith(("embed_tokens.weight", "word_embeddings.weight")) or name.startswith("lm_head"):
            continue
        share = spec.num_experts_per_tok / spec.num_experts if ".mlp.experts." in name else 1.0
        total += p.numel() * share
    return total


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_active_parameters_equal_the_models_gemm_parameters(name):
    spec = spec_from_config(CONFIGS[name])
    model = build_empty_model(spec, torch.float32, "meta")
    assert active_params_per_token(spec) == pytest.approx(_counted(spec, model))


def test_recurrence_per_family():
    qwen, ring = spec_from_config(MOE_CONFIG), spec_from_config(RING_CONFIG)
    assert flop_model(qwen).recurrence_per_token == 6.0 * 4 * 16 * 16 * len(qwen.linear_layer_ids)
    # lightning: k v^T and q^T S per head, the decay a scalar
    assert flop_model(ring).recurrence_per_token == 4.0 * 4 * 16 * 16 * len(ring.linear_layer_ids)
