"""A tiny Qwen3.5-shaped model with trained-like gates, and helpers to run it through PIC plans."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch

from hypic.engine.context import PlainContext, SequenceCache
from hypic.runner.pic_runner import PicRunner
from hypic.models.config import spec_from_config
from hypic.models.loader import build_empty_model, init_dummy_weights
from hypic.pic.keys import Keyer, KeyNamespace
from hypic.pic.modes import PICConfig
from hypic.pic.plan import plan_request
from hypic.pic.segments import SegmentedPrompt
from hypic.pic.store import SegmentStore

VOCAB = 96
TINY_CONFIG = dict(
    model_type="qwen3_5_text", vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
    num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, tie_word_embeddings=False,
    max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
)


# five linear layers: the per-forward graphs of the linear cores replay from the third on
DEEP_LAYER_TYPES = ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 2 + ["full_attention"]


@torch.no_grad()
def tiny_model(seed: int = 0, dtype=torch.float32, layer_types: Optional[Sequence[str]] = None):
    """Random weights scaled so activations and logits are far from uniform, and GDN gates that
    decay like a trained model's (per-token decays mostly in 0.8-0.9995, many heads near 1).
    ``layer_types`` replaces the default four layers."""
    config = TINY_CONFIG if layer_types is None else dict(TINY_CONFIG, layer_types=list(layer_types),
                                                          num_hidden_layers=len(layer_types))
    spec = spec_from_config(config)
    model = build_empty_model(spec, dtype, "cpu")
    init_dummy_weights(model, seed=seed, std=0.15)
    gen = torch.Generator().manual_seed(seed + 1)
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.empty(p.shape).uniform_(math.log(0.5), math.log(2.0), generator=gen))
        elif name.endswith("dt_bias"):
            dt = torch.empty(p.shape).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp()
            p.copy_(dt + torch.log(-torch.expm1(-dt)))
        elif "embed_tokens" in name:
            p.normal_(0.0, 1.0, generator=gen)
        elif name.endswith("norm.weight") and "linear_attn" not in name:
            p.normal_(0.0, 0.1, generator=gen)
    return spec, model


ATOL = 1e-4  # float32 logits of PIC prefills that must equal full recompute


def concat(segments, query) -> List[int]:
    """The plain token stream of a segmented prompt."""
    out: List[int] = []
    for s in segments:
        out.extend(s)
    return out + list(query)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def random_segment(n: int, seed: int) -> List[int]:
    return torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.no_grad()
def full_logits(spec, model, token_ids: Sequence[int]) -> torch.Tensor:
    """Logits at the last token of a plain full forward."""
    cache = SequenceCache.allocate(spec, "cpu", next(model.parameters()).dtype)
    ctx = PlainContext(spec, [cache], [len(token_ids)])
    return model(torch.tensor(list(token_ids)), ctx.positions, ctx)[-1]


class PicHarness:
    """Store + keyer + runner around one model; ``run`` plans and prefills one request. Its
    default policy caches every segment a seam leaves a body in, written inline (the runner's
    tests are about those writes and their reuse)."""

    def __init__(self, spec, model, *, budget: Optional[int] = None, host_budget: int = 0,
                 config: PICConfig = PICConfig(cold_policy="inline", segment_min_tokens=0), hash_fn=None,
                 prefix_block_tokens: Optional[int] = None):
        self.spec, self.model = spec, model
        self.store = SegmentStore(budget, host_budget)
        ns = KeyNamespace("tiny-test", "float32")
        self.keyer = Keyer(ns) if hash_fn is None else Keyer(ns, hash_fn)
        self.runner = PicRunner(model, spec, self.store, torch.device("cpu"), next(model.parameters()).dtype)
        self.config = config
        # the prefix cache's spine spacing (None: no prefix cache, except in prefix_cache mode,
        # which needs one: 16 tokens then)
        self.prefix_block_tokens = prefix_block_tokens

    def plan(self, segments, query, **overrides):
        policy = self.config.resolve(**overrides)
        block = self.prefix_block_tokens
        if block is None and policy.mode.uses_prefix_checkpoints:
            block = 16
        return plan_request(SegmentedPrompt(tuple(map(tuple, segments)), tuple(query)), policy,
                            store=self.store, keyer=self.keyer, prefix_block_tokens=block)

    def run(self, segments, query, **overrides):
        plan = self.plan(segments, query, **overrides)
        with plan:
            result = self.runner.prefill([plan])[0]
        return plan, result

    def run_batch(self, requests, **overrides):
        plans = [self.plan(s, q, **overrides) for s, q in requests]
        try:
            results = self.runner.prefill(plans)
        finally:
            for p in plans:
                p.release()
        return plans, results
