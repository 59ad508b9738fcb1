"""Tiny lightning-attention checkpoints for the tests: MiniMax made by transformers, and
Ring-linear-2.0 written in the published key layout, with an independent token-by-token reference
of Ring-linear written from the layer equations (no hypic module is used by it)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List

import torch
import torch.nn.functional as F

from tests.models._hf import write_checkpoint

VOCAB = 96

# two linear layers, then softmax; the first layer dense, MoE after; 4 heads of 16 (8 rotary)
RING_CONFIG = {
    "model_type": "bailing_moe_linear", "architectures": ["BailingMoeLinearV2ForCausalLM"],
    "vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "layer_group_size": 3, "group_norm_size": 2,
    "use_qk_norm": True, "linear_silu": False, "partial_rotary_factor": 0.5, "rope_theta": 10000.0,
    "first_k_dense_replace": 1, "intermediate_size": 96, "num_experts": 8, "num_experts_per_tok": 2,
    "num_shared_experts": 1, "moe_intermediate_size": 32, "moe_shared_expert_intermediate_size": 32,
    "n_group": 4, "topk_group": 2, "score_function": "sigmoid", "moe_router_enable_expert_bias": True,
    "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "use_bias": False,
    "use_qkv_bias": False, "max_position_embeddings": 4096, "num_nextn_predict_layers": 1,
}


def ring_is_linear(cfg: dict, layer: int) -> bool:
    group = cfg["layer_group_size"]
    whole = cfg["num_hidden_layers"] // group * group
    return (layer + 1) % group != 0 and layer < whole


def ring_tensors(cfg: dict, seed: int = 0) -> Dict[str, torch.Tensor]:
    """Random fp32 weights under the published checkpoint's key names (per-expert tensors, the
    router's ``expert_bias``, one multi-token-prediction layer after the last decoder layer),
    scaled so that activations, routing and logits are far from uniform."""
    gen = torch.Generator().manual_seed(seed)
    h, heads, kv, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    E, I, Is = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["moe_shared_expert_intermediate_size"]

    def lin(n_out, n_in):
        return torch.randn(n_out, n_in, generator=gen) / math.sqrt(n_in)

    def norm(n):
        return 1 + 0.2 * torch.randn(n, generator=gen)

    t = {"model.word_embeddings.weight": torch.randn(cfg["vocab_size"], h, generator=gen),
         "model.norm.weight": norm(h), "lm_head.weight": 0.3 * torch.randn(cfg["vocab_size"], h, generator=gen)}
    for i in range(cfg["num_hidden_layers"] + 1):  # the last one: an MTP layer, skipped on load
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        if i < cfg["num_hidden_layers"] and ring_is_linear(cfg, i):
            t[p + "attention.query_key_value.weight"] = lin(3 * heads * d, h)
            t[p + "attention.g_proj.weight"] = lin(heads * d, h)
            t[p + "attention.g_norm.weight"] = norm(heads * d)
        else:
            t[p + "attention.query_key_value.weight"] = lin((heads + 2 * kv) * d, h)
        t[p + "attention.dense.weight"] = lin(h, heads * d)
        t[p + "attention.query_layernorm.weight"] = norm(d)
        t[p + "attention.key_layernorm.weight"] = norm(d)
        if i < cfg["first_k_dense_replace"]:
            for name, shape in (("gate_proj", (cfg["intermediate_size"], h)), ("up_proj", (cfg["intermediate_size"], h)),
                                ("down_proj", (h, cfg["intermediate_size"]))):
                t[p + f"mlp.{name}.weight"] = lin(*shape)
            continue
        t[p + "mlp.gate.weight"] = torch.randn(E, h, generator=gen)
        t[p + "mlp.gate.expert_bias"] = 0.3 * torch.randn(E, generator=gen)
        for e in range(E):
            t[p + f"mlp.experts.{e}.gate_proj.weight"] = lin(I, h)
            t[p + f"mlp.experts.{e}.up_proj.weight"] = lin(I, h)
            t[p + f"mlp.experts.{e}.down_proj.weight"] = lin(h, I)
        t[p + "mlp.shared_experts.gate_proj.weight"] = lin(Is, h)
        t[p + "mlp.shared_experts.up_proj.weight"] = lin(Is, h)
        t[p + "mlp.shared_experts.down_proj.weight"] = lin(h, Is)
    t[f"model.layers.{cfg['num_hidden_layers']}.eh_proj.weight"] = lin(h, 2 * h)
    return t


def save_ring_checkpoint(path: Path, cfg: dict = RING_CONFIG, seed: int = 0, shards: int = 2) -> Dict[str, torch.Tensor]:
    """``config.json`` and the tensors in ``shards`` safetensors files with an index, as published."""
    tensors = ring_tensors(cfg, seed)
    write_checkpoint(path, cfg, tensors, shards)
    return tensors


# ---- the independent reference of Ring-linear-2.0 ------------------------------------------------


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, pos: int, rot: int, theta: float) -> torch.Tensor:
    """Rotate-half RoPE of ``x [heads, d]`` at position ``pos`` on its first ``rot`` dims."""
    half = rot // 2
    freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / rot)
    cos, sin = torch.cos(pos * freq), torch.sin(pos * freq)
    a, b = x[:, :half], x[:, half:rot]
    return torch.cat([a * cos - b * sin, b * cos + a * sin, x[:, rot:]], dim=-1)


def _slopes(n: int) -> List[float]:
    if math.log2(n).is_integer():
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]
    below = 2 ** math.floor(math.log2(n))
    return _slopes(below) + _slopes(2 * below)[0::2][: n - below]


def _swiglu(x, gate, up, down):
    return down @ (F.silu(gate @ x) * (up @ x))


class RingReference:
    """Ring-linear-2.0 written from its layer equations, one token at a time, float64: each linear
    layer keeps its state ``S [H, d, d]`` and updates it ``S <- exp(-rate) S + k v^T``,
    ``o = d^-0.5 q^T S``; each softmax layer keeps its keys and values."""

    def __init__(self, cfg: dict, tensors: Dict[str, torch.Tensor]) -> None:
        self.cfg = cfg
        self.w = {n: t.double() for n, t in tensors.items()}
        self.states: Dict[int, torch.Tensor] = {}
        self.keys: Dict[int, list] = {}
        self.values: Dict[int, list] = {}
        self.pos = 0

    def _moe(self, p: str, x: torch.Tensor) -> torch.Tensor:
        cfg, w = self.cfg, self.w
        scores = torch.sigmoid(w[p + "mlp.gate.weight"] @ x)
        biased = scores + w[p + "mlp.gate.expert_bias"]
        per_group = cfg["num_experts"] // cfg["n_group"]
        best_two = [sorted(biased[g * per_group:(g + 1) * per_group].tolist())[-2:] for g in range(cfg["n_group"])]
        groups = sorted(range(cfg["n_group"]), key=lambda g: -sum(best_two[g]))[:cfg["topk_group"]]
        allowed = [e for e in range(cfg["num_experts"]) if e // per_group in groups]
        chosen = sorted(allowed, key=lambda e: -float(biased[e]))[:cfg["num_experts_per_tok"]]
        weights = scores[chosen] / scores[chosen].sum() * cfg["routed_scaling_factor"]
        out = _swiglu(x, w[p + "mlp.shared_experts.gate_proj.weight"], w[p + "mlp.shared_experts.up_proj.weight"],
                      w[p + "mlp.shared_experts.down_proj.weight"])
        for e, we in zip(chosen, weights):
            out = out + we * _swiglu(x, w[p + f"mlp.experts.{e}.gate_proj.weight"],
                                     w[p + f"mlp.experts.{e}.up_proj.weight"], w[p + f"mlp.experts.{e}.down_proj.weight"])
        return out

    def step(self, token: int) -> torch.Tensor:
        """Feed one token; returns the logits after it."""
        cfg, w, t = self.cfg, self.w, self.pos
        heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        eps, rot = cfg["rms_norm_eps"], int(cfg["head_dim"] * cfg["partial_rotary_factor"])
        num_layers = cfg["num_hidden_layers"]
        x = w["model.word_embeddings.weight"][token]
        for i in range(num_layers):
            p = f"model.layers.{i}."
            h = _rms(x, w[p + "input_layernorm.weight"], eps)
            qkv = w[p + "attention.query_key_value.weight"] @ h
            if ring_is_linear(cfg, i):
                q, k, v = qkv.view(3 * heads, d).split(heads)
                q = _rope(_rms(q, w[p + "attention.query_layernorm.weight"], eps), t, rot, cfg["rope_theta"])
                k = _rope(_rms(k, w[p + "attention.key_layernorm.weight"], eps), t, rot, cfg["rope_theta"])
                rate = torch.tensor(_slopes(heads), dtype=torch.float64) * (1 - i / (num_layers - 1) + 1e-5)
                state = self.states.get(i, torch.zeros(heads, d, d, dtype=torch.float64))
                state = torch.exp(-rate)[:, None, None] * state + k[:, :, None] * v[:, None, :]
                self.states[i] = state
                o = (q[:, :, None] * state).sum(1).flatten() * d ** -0.5
                groups = o.view(cfg["group_norm_size"], -1)
                o = (groups / torch.sqrt((groups * groups).mean(-1, keepdim=True) + eps)).flatten()
                o = o * w[p + "attention.g_norm.weight"] * torch.sigmoid(w[p + "attention.g_proj.weight"] @ h)
            else:
                q, k, v = qkv.view(heads + 2 * kv, d).split([heads, kv, kv])
                q = _rope(_rms(q, w[p + "attention.query_layernorm.weight"], eps), t, rot, cfg["rope_theta"])
                k = _rope(_rms(k, w[p + "attention.key_layernorm.weight"], eps), t, rot, cfg["rope_theta"])
                self.keys.setdefault(i, []).append(k)
                self.values.setdefault(i, []).append(v)
                keys, values = torch.stack(self.keys[i]), torch.stack(self.values[i])  # [t+1, kv, d]
                group = heads // kv
                o = torch.stack([torch.softmax(keys[:, hh // group] @ q[hh] * d ** -0.5, 0) @ values[:, hh // group]
                                 for hh in range(heads)]).flatten()
            x = x + w[p + "attention.dense.weight"] @ o
            h2 = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
            if i < cfg["first_k_dense_replace"]:
                x = x + _swiglu(h2, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"])
            else:
                x = x + self._moe(p, h2)
        self.pos += 1
        return w["lm_head.weight"] @ _rms(x, w["model.norm.weight"], eps)

    def greedy(self, prompt: List[int], num_new: int) -> List[int]:
        for token in prompt:
            logits = self.step(token)
        out = []
        for _ in range(num_new):
            out.append(int(logits.argmax()))
            logits = self.step(out[-1])
        return out


# ---- MiniMax from transformers -------------------------------------------------------------------

MINIMAX_CONFIG = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, block_size=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"], full_attn_alpha_factor=1.7,
    linear_attn_alpha_factor=1.3, mlp_alpha_factor=1.5, full_attn_beta_factor=0.9, linear_attn_beta_factor=1.1,
    mlp_beta_factor=0.8, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    pad_token_id=0, bos_token_id=None, eos_token_id=None,
)


def build_minimax(seed: int = 0, **overrides):
    """A tiny transformers MiniMax with every parameter perturbed (norm weights around 1,
    decisive routers, logits far from uniform)."""
    import transformers as tf

    torch.manual_seed(seed)
    model = tf.MiniMaxForCausalLM(tf.MiniMaxConfig(**dict(MINIMAX_CONFIG, **overrides)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 1.0)
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            elif "lm_head" in name:
                p.normal_(0.0, 0.3)
            elif "qkv_proj" in name:
                p.normal_(0.0, 2.0 / math.sqrt(p.shape[-1]))  # silu(qkv): keys and values of some size
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
    return model.eval()
