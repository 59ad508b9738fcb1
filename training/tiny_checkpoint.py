"""Checkpoint files of train_tiny.py: a Hugging Face folder plus trainer state and AdamW moments."""

from __future__ import annotations

import json
import os
from typing import Dict

import torch

from hypic.data.vocab import save_tokenizer

STATE_FILE = "trainer_state.json"

SAVE_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
OPTIMIZER_FILES = ("optimizer_exp_avg.safetensors", "optimizer_exp_avg_sq.safetensors")


def save_checkpoint(model, optimizer, state: Dict, out_dir: str, save_dtype: str, save_optimizer: bool) -> None:
    """Write a Hugging Face folder plus the trainer state, sized for the device machine's transfers.

    Files (at most 8, each under 16 MiB for the default 7.4 M-parameter model in bf16):
    config.json, model.safetensors, tokenizer.json, tokenizer_config.json, trainer_state.json,
    train_log.jsonl (appended by the logger), and with ``save_optimizer`` the AdamW moments
    optimizer_exp_avg.safetensors / optimizer_exp_avg_sq.safetensors. Weights and moments are stored
    in ``save_dtype``: training keeps fp32 master weights in memory, so bf16 storage only rounds once
    per resume (negligible next to one optimiser step). generation_config.json is not kept.
    Each file is written to a temporary name and renamed, so an interrupted call leaves whole files.
    """
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    dtype = SAVE_DTYPES[save_dtype]
    state_dict = {k: v.detach().to("cpu", dtype) for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        # Casting broke the tie: store the shared matrix once, as tied HF checkpoints do.
        state_dict.pop("lm_head.weight", None)
    # config.json keeps dtype float32 (the compute dtype loaders should use); tensors are save_dtype.
    model.save_pretrained(out_dir, state_dict=state_dict, safe_serialization=True)
    generation_config = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(generation_config):
        os.remove(generation_config)
    save_tokenizer(out_dir)
    if save_optimizer:
        # Moments keyed by parameter name, so a resume does not depend on parameter order.
        names = {id(p): n for n, p in model.named_parameters()}
        moments: Dict[str, Dict[str, torch.Tensor]] = {"exp_avg": {}, "exp_avg_sq": {}}
        adam_steps = {}
        for group in optimizer.param_groups:
            for param in group["params"]:
                slot = optimizer.state.get(param)
                if not slot:
                    continue
                name = names[id(param)]
                for key in moments:
                    moments[key][name] = slot[key].detach().to("cpu", dtype).contiguous()
                adam_steps[name] = float(slot["step"])
        for key, filename in zip(("exp_avg", "exp_avg_sq"), OPTIMIZER_FILES):
            tmp = os.path.join(out_dir, filename + ".tmp")
            save_file(moments[key], tmp, metadata={"format": "pt"})
            os.replace(tmp, os.path.join(out_dir, filename))
        state = {**state, "adam_step": max(adam_steps.values()) if adam_steps else 0.0}
    else:
        for filename in OPTIMIZER_FILES:
            if os.path.exists(os.path.join(out_dir, filename)):
                os.remove(os.path.join(out_dir, filename))
        state = {**state, "adam_step": 0.0}
    tmp = os.path.join(out_dir, STATE_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(state, handle, indent=2)
    os.replace(tmp, os.path.join(out_dir, STATE_FILE))


def load_optimizer_state(model, optimizer, directory: str, adam_step: float) -> bool:
    """Restore AdamW moments saved by :func:`save_checkpoint`; False if the folder has none."""
    from safetensors.torch import load_file

    paths = [os.path.join(directory, f) for f in OPTIMIZER_FILES]
    if not all(os.path.exists(p) for p in paths) or adam_step <= 0:
        return False
    exp_avg, exp_avg_sq = (load_file(p) for p in paths)
    restored = 0
    for name, param in model.named_parameters():
        if name not in exp_avg:
            continue
        if exp_avg[name].shape != param.shape or exp_avg_sq[name].shape != param.shape:
            raise ValueError(f"--resume: optimizer moment of {name} has shape {tuple(exp_avg[name].shape)}, "
                             f"the parameter {tuple(param.shape)}")
        optimizer.state[param] = {
            "step": torch.tensor(adam_step, dtype=torch.float32,
                                 device=param.device if args_fused(optimizer) else "cpu"),
            "exp_avg": exp_avg[name].to(param.device, torch.float32),
            "exp_avg_sq": exp_avg_sq[name].to(param.device, torch.float32),
        }
        restored += 1
    return restored > 0


def args_fused(optimizer) -> bool:
    """Fused AdamW keeps ``step`` on the parameter's device; the default one keeps it on the CPU."""
    return bool(optimizer.defaults.get("fused"))
