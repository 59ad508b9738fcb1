"""The long model's exact training checkpoint, and its export as a shippable model folder.

A checkpoint folder holds everything a run is (a resumed run continues bit for bit on the CPU; on
a GPU the state is restored exactly and only kernel non-determinism can differ):

* ``weights-NNNNN.safetensors``: the fp32 master weights, split into files of at most
  :data:`MAX_FILE_BYTES` (a device call returns files of at most 16 MiB; 3 files for 8.7 M
  parameters), the tied output matrix stored once;
* ``optimizer.safetensors``: every optimiser state tensor, keyed ``<parameter name>/<state key>``
  (Adafactor's factored second moments are a few hundred KB; AdamW's moments are twice the weights);
* ``trainer_state.json``: step, curriculum stage, the stage's next batch index, tokens, calls, the
  running answer window that advances stages, the optimiser's hyper-parameters and the recipe;
* ``train_log.jsonl``: the log, appended by every call.

Each file is written to a temporary name and renamed, so a call killed while saving leaves the last
whole checkpoint. :func:`export_model` writes the Hugging Face folder hypic and transformers load
(config.json, model.safetensors in bf16, tokenizer.json, tokenizer_config.json).
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Tuple

import torch

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
WEIGHTS_PATTERN = "weights-{:05d}.safetensors"
MAX_FILE_BYTES = 15 * 2 ** 20


def _atomic(path: str, write) -> None:
    tmp = path + ".tmp"
    write(tmp)
    os.replace(tmp, path)


def model_tensors(model) -> Dict[str, torch.Tensor]:
    """fp32 state dict with a tied output matrix left out (it is the embedding)."""
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return state


def shard(tensors: Dict[str, torch.Tensor], max_bytes: int = MAX_FILE_BYTES) -> List[Dict[str, torch.Tensor]]:
    """Tensors in name order, cut into groups of at most ``max_bytes`` (a larger tensor alone)."""
    groups: List[Dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if groups[-1] and size + nbytes > max_bytes:
            groups.append({})
            size = 0
        groups[-1][name] = tensors[name]
        size += nbytes
    return groups


def optimizer_tensors(model, optimizer) -> Tuple[Dict[str, torch.Tensor], List[dict]]:
    """Optimiser state keyed by parameter name, and the param groups' hyper-parameters."""
    names = {id(p): n for n, p in model.named_parameters()}
    tensors = {}
    for param, slot in optimizer.state.items():
        for key, value in slot.items():
            tensors[f"{names[id(param)]}/{key}"] = torch.as_tensor(value).detach().to("cpu").clone().contiguous()
    groups = [{k: v for k, v in g.items() if k != "params"} | {"params": [names[id(p)] for p in g["params"]]}
              for g in optimizer.param_groups]
    return tensors, groups


def save_checkpoint(model, optimizer, state: dict, directory: str) -> None:
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    groups = shard(model_tensors(model))
    for i, group in enumerate(groups):
        _atomic(os.path.join(directory, WEIGHTS_PATTERN.format(i)), lambda p, g=group: save_file(g, p))
    for stale in sorted(os.listdir(directory)):  # shards of a larger earlier layout
        if stale.startswith("weights-") and stale.endswith(".safetensors") and \
                stale not in {WEIGHTS_PATTERN.format(i) for i in range(len(groups))}:
            os.remove(os.path.join(directory, stale))
    tensors, param_groups = optimizer_tensors(model, optimizer)
    _atomic(os.path.join(directory, OPTIMIZER_FILE), lambda p: save_file(tensors, p))
    payload = {**state, "param_groups": param_groups}
    _atomic(os.path.join(directory, STATE_FILE),
            lambda p: open(p, "w", encoding="utf-8").write(json.dumps(payload, indent=1) + "\n"))


def has_checkpoint(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, STATE_FILE))


def checkpoint_recipe(directory: str) -> dict:
    """The recipe (shape, curriculum, optimiser, seed, vocabulary size) the checkpoint was made by,
    read before any tensor so that another recipe's checkpoint is refused by name, not by shape."""
    with open(os.path.join(directory, STATE_FILE), encoding="utf-8") as handle:
        return json.load(handle).get("recipe")


def load_checkpoint(model, optimizer, directory: str) -> dict:
    """Restore weights and optimiser state into ``model`` / ``optimizer`` (built as the saved run
    built them); returns the trainer state."""
    from safetensors.torch import load_file

    with open(os.path.join(directory, STATE_FILE), encoding="utf-8") as handle:
        state = json.load(handle)
    weights: Dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(directory)):
        if name.startswith("weights-") and name.endswith(".safetensors"):
            weights.update(load_file(os.path.join(directory, name)))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"checkpoint {directory}: missing {missing[:4]}, unexpected {unexpected[:4]}")
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    saved = load_file(os.path.join(directory, OPTIMIZER_FILE))
    params = dict(model.named_parameters())
    groups = state.pop("param_groups")
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(f"checkpoint {directory}: {len(groups)} optimiser groups, the optimiser has "
                         f"{len(optimizer.param_groups)}")
    for group, saved_group in zip(optimizer.param_groups, groups):
        if [params[n] for n in saved_group["params"]] != group["params"]:
            raise ValueError(f"checkpoint {directory}: the optimiser groups hold other parameters")
        group.update({k: tuple(v) if isinstance(v, list) else v for k, v in saved_group.items() if k != "params"})
    optimizer.state.clear()
    # a fused or capturable optimiser keeps its step counts on the parameter's device, others on the CPU
    steps_on_device = bool(optimizer.defaults.get("fused") or optimizer.defaults.get("capturable"))
    for key, tensor in saved.items():
        name, slot = key.rsplit("/", 1)
        param = params[name]
        on_device = tensor.dim() > 0 or steps_on_device
        optimizer.state[param][slot] = tensor.to(param.device) if on_device else tensor
    return state


def export_model(model, directory: str, vocab: Dict[str, int]) -> None:
    """A Hugging Face folder of ``model`` in bf16 with the word-level tokenizer of ``vocab``."""
    from safetensors.torch import save_file

    from hypic.data.vocab import save_tokenizer

    os.makedirs(directory, exist_ok=True)
    state = {k: v.to(torch.bfloat16) for k, v in model_tensors(model).items()}
    model.config.save_pretrained(directory)
    generation = os.path.join(directory, "generation_config.json")
    if os.path.exists(generation):
        os.remove(generation)
    save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    save_tokenizer(directory, vocab)
