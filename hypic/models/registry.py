"""model_type -> model class. One class serves the whole Qwen3-Next / Qwen3.5 family (the GDN
projection layout comes from the spec); Ring-linear-2.0 and MiniMax have a class each."""

from __future__ import annotations

from typing import Dict, Type

from torch import nn

from hypic.models.bailing_moe_linear import BailingMoeLinearV2ForCausalLM
from hypic.models.minimax import MiniMaxForCausalLM
from hypic.models.qwen3_next import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3NextForCausalLM

_REGISTRY: Dict[str, Type[nn.Module]] = {
    "qwen3_next": Qwen3NextForCausalLM,
    "qwen3_5_text": Qwen3_5ForCausalLM,
    "qwen3_5_moe_text": Qwen3_5MoeForCausalLM,
    "bailing_moe_linear": BailingMoeLinearV2ForCausalLM,
    "minimax": MiniMaxForCausalLM,
}


def model_class(model_type: str) -> Type[nn.Module]:
    """The causal-LM class for a text ``model_type`` (as in ``ModelSpec.model_type``)."""
    if model_type not in _REGISTRY:
        raise ValueError(f"no model registered for model_type {model_type!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[model_type]
