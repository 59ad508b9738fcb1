"""The embedded model's shape and its transformers Qwen3.5 config (used by train_tiny.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from hypic.data.vocab import special_token_ids

@dataclass(frozen=True)
class ModelShape:
    """Shape of the Qwen3.5-style model; full attention on every ``full_attention_interval``-th layer."""

    hidden_size: int = 256
    num_layers: int = 8
    intermediate_size: int = 768
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    linear_num_key_heads: int = 4
    linear_num_value_heads: int = 4
    linear_head_dim: int = 64
    full_attention_interval: int = 4
    partial_rotary_factor: float = 0.25
    max_position_embeddings: int = 16384

    def __post_init__(self) -> None:
        for field in ("hidden_size", "num_layers", "intermediate_size", "num_attention_heads",
                      "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
                      "linear_head_dim", "full_attention_interval", "max_position_embeddings"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{field}: must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_key_value_heads: must divide num_attention_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_key_heads: must divide linear_num_value_heads")
        if not 0 < self.partial_rotary_factor <= 1:
            raise ValueError(f"partial_rotary_factor: must be in (0, 1], got {self.partial_rotary_factor}")


TINY_SMOKE_SHAPE = ModelShape(hidden_size=32, num_layers=4, intermediate_size=64, num_attention_heads=2,
                              num_key_value_heads=1, head_dim=16, linear_num_key_heads=2,
                              linear_num_value_heads=2, linear_head_dim=16)


def mrope_section(shape: ModelShape) -> List[int]:
    """Split the rotary frequencies (rotary_dim / 2) over the 3 mRoPE streams as 2:1:1."""
    half = int(shape.head_dim * shape.partial_rotary_factor) // 2
    return [half - 2 * (half // 4), half // 4, half // 4]


def build_config(shape: ModelShape, vocab_size: int):
    from transformers import Qwen3_5TextConfig

    ids = special_token_ids()
    layer_types = [
        "full_attention" if (i + 1) % shape.full_attention_interval == 0 else "linear_attention"
        for i in range(shape.num_layers)
    ]
    return Qwen3_5TextConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        linear_num_key_heads=shape.linear_num_key_heads,
        linear_num_value_heads=shape.linear_num_value_heads,
        linear_key_head_dim=shape.linear_head_dim,
        linear_value_head_dim=shape.linear_head_dim,
        linear_conv_kernel_dim=4,
        layer_types=layer_types,
        max_position_embeddings=shape.max_position_embeddings,
        # mrope_section/interleaved as Qwen3.5 checkpoints write them: with text-only input the three
        # position streams are equal, so this is plain partial RoPE.
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": shape.partial_rotary_factor,
                         "mrope_section": mrope_section(shape), "mrope_interleaved": True},
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        bos_token_id=ids["<bos>"],
        eos_token_id=ids["<eos>"],
        pad_token_id=ids["<pad>"],
    )
