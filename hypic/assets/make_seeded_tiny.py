"""Generate a seeded random Qwen3.5 test model (deterministic); not the shipped ``tiny`` model.

    python3 -m hypic.assets.make_seeded_tiny --out DIR

The embedded default model ``hypic/assets/tiny/`` is the trained checkpoint of
``training/train_tiny.py`` (see its README.md). This generator makes a *different*, seeded
stand-in that the tests use where they need what the trained model lacks: a byte-level tokenizer
that reads any text, and a ChatML chat template (tests/engine/test_tokenizer.py,
tests/engine/test_engine_pic.py, tests/entrypoints/test_cli.py, tests/entrypoints/test_llm.py).
It was the shipped ``tiny`` model before the trained one.

The checkpoint is a Hugging Face-format Qwen3.5 text model (``model_type: qwen3_5_text``):
8 layers with full attention every 4th, hidden 256, Gated DeltaNet with 4 key heads x 64 and
8 value heads x 32 (so grouped value heads are exercised), gated GQA attention with partial
RoPE, a byte-level BPE tokenizer of 1024 tokens trained on a generated corpus, and a ChatML
chat template. Weights are random (seeded) at scales where every layer matters: it is not a
language model.

Everything is derived from fixed seeds: the corpus from ``random.Random``, the weights from a
``torch.Generator`` (drawn in fp32, stored as bf16 to keep the folder small).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

import torch
from safetensors.torch import save_file

SEED = 20260101
VOCAB_SIZE = 1024
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

HIDDEN_SIZE = 256
NUM_LAYERS = 8
FULL_ATTENTION_INTERVAL = 4
INTERMEDIATE_SIZE = 128
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 64
PARTIAL_ROTARY_FACTOR = 0.25
LINEAR_NUM_KEY_HEADS = 4
LINEAR_KEY_HEAD_DIM = 64
LINEAR_NUM_VALUE_HEADS = 8
LINEAR_VALUE_HEAD_DIM = 32
CONV_KERNEL = 4
MAX_POSITION_EMBEDDINGS = 4096

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_SUBJECTS = [
    "the model", "a small cache", "every request", "the scheduler", "our engine", "the user",
    "a long prompt", "the tokenizer", "each layer", "the state", "a segment", "the query",
    "my friend", "the river", "a bright star", "the old tree", "this machine", "the teacher",
]
_VERBS = [
    "reads", "writes", "stores", "reuses", "computes", "finds", "loves", "sees", "moves",
    "returns", "answers", "follows", "keeps", "shares", "builds", "opens", "checks", "counts",
]
_OBJECTS = [
    "the answer", "a document", "many tokens", "the attention", "a question", "the summary",
    "the window", "some numbers", "a story", "the garden", "the weather", "a green apple",
    "the last word", "a new idea", "the river bank", "two hundred lines", "the next step",
]
_ADVERBS = ["quickly", "slowly", "again", "today", "carefully", "twice", "at night", "once"]
_QUESTIONS = [
    "what is the capital of france", "how many tokens fit in the window", "why is the sky blue",
    "who wrote this story", "where does the river go", "when will the answer arrive",
]


def make_corpus(num_lines: int = 4000, seed: int = SEED) -> list[str]:
    """Sentences from a small grammar; deterministic for a given seed."""
    rng = random.Random(seed)
    lines = []
    for i in range(num_lines):
        kind = i % 4
        if kind == 3:
            question = rng.choice(_QUESTIONS)
            lines.append(f"User: {question.capitalize()}? Assistant: {rng.choice(_SUBJECTS)} "
                         f"{rng.choice(_VERBS)} {rng.choice(_OBJECTS)}.")
            continue
        sentence = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
        if rng.random() < 0.5:
            sentence += " " + rng.choice(_ADVERBS)
        if rng.random() < 0.3:
            sentence += f", {rng.randint(0, 999)} times"
        lines.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "!", "?", "."]))
    return lines


def make_tokenizer(corpus: list[str]):
    """Byte-level BPE (any text encodes, no unknown token) with the special tokens first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    if tokenizer.get_vocab_size() > VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tokenizer.get_vocab_size()} tokens > {VOCAB_SIZE}")
    return tokenizer


def make_config(eos_token_id: int, pad_token_id: int) -> dict:
    layer_types = [
        "full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention"
        for i in range(NUM_LAYERS)
    ]
    rotary_dim = int(HEAD_DIM * PARTIAL_ROTARY_FACTOR)
    half = rotary_dim // 2
    # mRoPE sections must sum to rotary_dim / 2; for text the three streams coincide, so the
    # split only matters to transformers' bookkeeping.
    mrope_section = [half - 2 * (half // 3), half // 3, half // 3]
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "layer_types": layer_types,
        "full_attention_interval": FULL_ATTENTION_INTERVAL,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "attn_output_gate": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_num_key_heads": LINEAR_NUM_KEY_HEADS,
        "linear_key_head_dim": LINEAR_KEY_HEAD_DIM,
        "linear_num_value_heads": LINEAR_NUM_VALUE_HEADS,
        "linear_value_head_dim": LINEAR_VALUE_HEAD_DIM,
        "linear_conv_kernel_dim": CONV_KERNEL,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": PARTIAL_ROTARY_FACTOR,
            "mrope_section": mrope_section,
            "mrope_interleaved": True,
        },
        "tie_word_embeddings": False,
        "mamba_ssm_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "dtype": "bfloat16",
        "initializer_range": 0.02,
        "use_cache": True,
    }


def make_weights(config: dict, seed: int = SEED) -> dict[str, torch.Tensor]:
    """Seeded random weights in the Hugging Face Qwen3.5 key layout.

    Linear weights use std 1/sqrt(fan_in) (not the 0.02 of HF init) so each block changes the
    residual stream substantially, and the head is untied: a model dominated by its embedding
    only echoes its input token, which would let broken attention or state handling pass
    unnoticed.
    """
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return normal(out_features, in_features, std=1.0 / math.sqrt(in_features))

    hidden = config["hidden_size"]
    weights: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(VOCAB_SIZE, hidden, std=1.0)}
    key_dim = LINEAR_NUM_KEY_HEADS * LINEAR_KEY_HEAD_DIM
    value_dim = LINEAR_NUM_VALUE_HEADS * LINEAR_VALUE_HEAD_DIM
    conv_dim = 2 * key_dim + value_dim
    for i, kind in enumerate(config["layer_types"]):
        p = f"model.layers.{i}."
        # Zero-centred RMSNorms (output x (1 + w)): small offsets so the weights are exercised.
        weights[p + "input_layernorm.weight"] = normal(hidden, std=0.1)
        weights[p + "post_attention_layernorm.weight"] = normal(hidden, std=0.1)
        if kind == "linear_attention":
            a = p + "linear_attn."
            weights[a + "in_proj_qkv.weight"] = linear(conv_dim, hidden)
            weights[a + "in_proj_z.weight"] = linear(value_dim, hidden)
            weights[a + "in_proj_b.weight"] = linear(LINEAR_NUM_VALUE_HEADS, hidden)
            weights[a + "in_proj_a.weight"] = linear(LINEAR_NUM_VALUE_HEADS, hidden)
            weights[a + "conv1d.weight"] = normal(conv_dim, 1, CONV_KERNEL, std=0.5)
            # Decay rates spread over heads: A in [1, 16) as in HF init, dt_bias around 1.
            uniform = torch.rand(LINEAR_NUM_VALUE_HEADS, generator=gen)
            weights[a + "A_log"] = torch.log(1.0 + 15.0 * uniform)
            weights[a + "dt_bias"] = 1.0 + normal(LINEAR_NUM_VALUE_HEADS, std=0.5)
            # The gated norm is *not* zero-centred (plain x w).
            weights[a + "norm.weight"] = 1.0 + normal(LINEAR_VALUE_HEAD_DIM, std=0.1)
            weights[a + "out_proj.weight"] = linear(hidden, value_dim)
        else:
            s = p + "self_attn."
            weights[s + "q_proj.weight"] = linear(2 * NUM_HEADS * HEAD_DIM, hidden)
            weights[s + "k_proj.weight"] = linear(NUM_KV_HEADS * HEAD_DIM, hidden)
            weights[s + "v_proj.weight"] = linear(NUM_KV_HEADS * HEAD_DIM, hidden)
            weights[s + "o_proj.weight"] = linear(hidden, NUM_HEADS * HEAD_DIM)
            weights[s + "q_norm.weight"] = normal(HEAD_DIM, std=0.1)
            weights[s + "k_norm.weight"] = normal(HEAD_DIM, std=0.1)
        m = p + "mlp."
        weights[m + "gate_proj.weight"] = linear(INTERMEDIATE_SIZE, hidden)
        weights[m + "up_proj.weight"] = linear(INTERMEDIATE_SIZE, hidden)
        weights[m + "down_proj.weight"] = linear(hidden, INTERMEDIATE_SIZE)
    weights["model.norm.weight"] = normal(hidden, std=0.1)
    # Untied head at a scale giving logits of std ~3: peaked enough that sampling is not
    # uniform noise and greedy choices are far from float ties.
    weights["lm_head.weight"] = normal(VOCAB_SIZE, hidden, std=3.0 / math.sqrt(hidden))
    return {name: w.to(torch.bfloat16).contiguous() for name, w in weights.items()}


def write_tiny_model(out_dir: Path) -> None:
    """Write the seeded test model (config, generation config, tokenizer, bf16 weights) to ``out_dir``."""
    out_dir = Path(out_dir)
    if out_dir.resolve() == (Path(__file__).resolve().parent / "tiny"):
        raise ValueError(f"out_dir: {out_dir} is the shipped trained model; write the seeded model elsewhere")
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(make_corpus())
    ids = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    tokenizer.save(str(out_dir / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "model_max_length": MAX_POSITION_EMBEDDINGS,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    config = make_config(eos_token_id=ids["<|endoftext|>"], pad_token_id=ids["<|endoftext|>"])
    generation_config = {
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
    }
    for name, obj in [
        ("tokenizer_config.json", tokenizer_config),
        ("config.json", config),
        ("generation_config.json", generation_config),
    ]:
        (out_dir / name).write_text(json.dumps(obj, indent=2) + "\n")
    save_file(make_weights(config), str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # No default: the natural default (hypic/assets/tiny) is the trained model, never to be overwritten.
    parser.add_argument("--out", type=Path, required=True, help="folder to write (created if missing)")
    args = parser.parse_args(argv)
    write_tiny_model(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
