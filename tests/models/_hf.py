"""Tiny random transformers models (hybrid-models.md §7) saved to disk, a checkpoint writer, and a
greedy loop over hypic's PlainContext used by the parity tests."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, List

import torch

from hypic.engine.context import PlainContext, SequenceCache

KINDS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
VOCAB = 128

_COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, pad_token_id=0, eos_token_id=None, bos_token_id=None,
)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
_ROPE35 = {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25,
           "mrope_section": [1, 1, 2], "mrope_interleaved": True}


def build_hf_model(kind: str, seed: int = 0):
    """A tiny random transformers model with every parameter perturbed (so zero-initialised norms,
    routers and biases are exercised) and weights large enough that routing and logits are
    far from uniform."""
    import transformers as tf

    torch.manual_seed(seed)
    if kind == "qwen3_next":
        # layers: linear, full, linear(dense MLP via mlp_only_layers), full
        cfg = tf.Qwen3NextConfig(
            **_COMMON, **_MOE, intermediate_size=96, num_hidden_layers=4, full_attention_interval=2,
            mlp_only_layers=[2], rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                  "partial_rotary_factor": 0.25},
        )
        model = tf.Qwen3NextForCausalLM(cfg)
    elif kind == "qwen3_5":
        cfg = tf.Qwen3_5TextConfig(**_COMMON, intermediate_size=96, num_hidden_layers=4, rope_parameters=_ROPE35)
        model = tf.Qwen3_5ForCausalLM(cfg)
    elif kind == "qwen3_5_moe":
        cfg = tf.Qwen3_5MoeTextConfig(**_COMMON, **_MOE, num_hidden_layers=4, rope_parameters=_ROPE35)
        model = tf.Qwen3_5MoeForCausalLM(cfg)
    else:
        raise ValueError(kind)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(1.0, 16.0).log())
            elif name.endswith("dt_bias"):
                p.normal_(0.0, 0.5)
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("norm.weight"):
                p.normal_(0.0, 0.2)  # zero-centred norms: non-trivial (1 + w)
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 1.0)  # router: decisive, varied expert choice
            elif "conv1d" in name:
                p.uniform_(-0.5, 0.5)
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            elif "lm_head" in name:
                p.normal_(0.0, 0.3)  # logits std ~2.5: clear argmax margins, small abs error
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
    return model.eval()


def save_hf_model(kind: str, path, seed: int = 0):
    model = build_hf_model(kind, seed)
    model.save_pretrained(str(path))
    return model


@torch.no_grad()
def hf_logits(model, ids: List[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids])).logits[0].float()


@torch.no_grad()
def hf_greedy(model, prompt: List[int], num_new: int) -> List[int]:
    ids = torch.tensor([prompt])
    out = model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=num_new, do_sample=False,
        min_new_tokens=num_new, pad_token_id=0,
    )
    return out[0, len(prompt):].tolist()


@torch.no_grad()
def hypic_greedy(spec, model, prompt: List[int], num_new: int, dtype=torch.float32, device="cpu") -> List[int]:
    cache = SequenceCache.allocate(spec, device, dtype)
    ctx = PlainContext(spec, [cache], [len(prompt)])
    logits = model(torch.tensor(prompt, device=device), ctx.positions, ctx)
    out = []
    for _ in range(num_new):
        token = int(logits[-1].argmax())
        out.append(token)
        ctx = PlainContext(spec, [cache], [1])
        logits = model(torch.tensor([token], device=device), ctx.positions, ctx)
    return out


def write_checkpoint(path, config: dict, tensors: Dict[str, torch.Tensor], shards: int = 1) -> None:
    """``config.json`` and ``tensors`` in one ``model.safetensors``, or in ``shards`` files with a
    ``model.safetensors.index.json`` (as sharded Hugging Face checkpoints are published)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if shards == 1:
        save_file({k: t.contiguous() for k, t in tensors.items()}, str(path / "model.safetensors"))
        return
    keys = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k].contiguous() for k in keys[s::shards]}
        save_file(part, str(path / fname))
        weight_map.update({k: fname for k in part})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
