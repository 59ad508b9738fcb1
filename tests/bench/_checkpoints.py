"""Tiny random Qwen3.5 checkpoints on disk for the quality-bench tests: one with the suites'
word-level tokenizer (hypic.data.vocab, or the long suites' extended vocabulary), one with a
byte-level BPE tokenizer (reads any text)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from hypic.data.vocab import EOS_TOKEN, save_tokenizer, special_token_ids, vocabulary
from hypic.models.loader import build_empty_model, init_dummy_weights
from hypic.models.config import spec_from_config


def _config(vocab_size: int, eos_token_id: int) -> dict:
    return dict(
        architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", vocab_size=vocab_size,
        hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, attn_output_gate=True,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        eos_token_id=eos_token_id, pad_token_id=0, bos_token_id=None,
    )


@torch.no_grad()
def _save_weights(folder: Path, config: dict, seed: int) -> None:
    model = build_empty_model(spec_from_config(config), torch.float32, "cpu")
    # Larger than the default 0.02 so logits have clear argmax margins (no float ties between modes).
    init_dummy_weights(model, seed=seed, std=0.15)
    for name, p in model.named_parameters():
        if "embed_tokens" in name:
            p.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(seed))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_word_level_checkpoint(folder: Path, seed: int = 0, vocab: dict | None = None) -> Path:
    """``vocab``: the word-level vocabulary (default the short suites' :func:`vocabulary`)."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = vocab or vocabulary()
    save_tokenizer(str(folder), vocab)
    vocab_size = (len(vocab) + 7) // 8 * 8
    _save_weights(folder, _config(vocab_size, special_token_ids()[EOS_TOKEN]), seed)
    return folder


def write_byte_level_checkpoint(folder: Path, seed: int = 0) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["the river flooded the town", "passage answer question"], trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}))
    vocab_size = (tok.get_vocab_size() + 7) // 8 * 8
    _save_weights(folder, _config(vocab_size, tok.token_to_id("<|endoftext|>")), seed)
    return folder
