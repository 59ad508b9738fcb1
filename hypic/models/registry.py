"""model_type -> model class. One class serves the whole Qwen3-Next / Qwen3.5 family; the GDN
projection layout comes from the spec."""

from __future__ import annotations

from typing import Dict, Type

from torch import nn

_REGISTRY: Dict[str, str] = {
    "qwen3_next": "hypic.models.qwen3_next:Qwen3NextForCausalLM",
    "qwen3_5_text": "hypic.models.qwen3_next:Qwen3_5ForCausalLM",
    "qwen3_5_moe_text": "hypic.models.qwen3_next:Qwen3_5MoeForCausalLM",
}


def model_class(model_type: str) -> Type[nn.Module]:
    """The causal-LM class for a text ``model_type`` (as in ``ModelSpec.model_type``)."""
    if model_type not in _REGISTRY:
        raise ValueError(f"no model registered for model_type {model_type!r}; known: {sorted(_REGISTRY)}")
    module_name, cls_name = _REGISTRY[model_type].split(":")
    import importlib

    return getattr(importlib.import_module(module_name), cls_name)
