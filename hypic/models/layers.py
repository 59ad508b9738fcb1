"""Building blocks shared by the model families of :mod:`hypic.models` (Hugging Face shaped, no
serving logic): linear layers and their fusion, the RMSNorm modules, the SwiGLU MLP, the routed
experts held stacked, and the decoder stack / causal-LM head that run packed live tokens through a
``ctx`` (docs/contracts.md, "hypic.models <-> hypic.engine").

Norm modules carry ``DUMMY_FILL``: the value their weight takes in a dummy-weight model
(:func:`hypic.models.loader.init_dummy_weights`), the one that makes the norm an identity scale.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from hypic.models.spec import ModelSpec
from hypic.ops.fused import swiglu
from hypic.ops.norms import gated_rms_norm, rms_norm, rms_norm_zero_centered
from hypic.ops.rope import RotaryEmbedding

# How the routed experts run: "auto" (the kernels hypic.ops.moe picks for the operands' device,
# dtype and rows per expert; the reference on CPU) or "torch" (the pure-PyTorch reference
# everywhere, for debugging a kernel).
MOE_BACKENDS = {"auto": "auto", "torch": "reference"}


def check_moe_backend(moe_backend: str) -> str:
    """``moe_backend`` if it is one of :data:`MOE_BACKENDS`; a ValueError naming them if not."""
    if moe_backend not in MOE_BACKENDS:
        raise ValueError(f"moe_backend must be one of {tuple(MOE_BACKENDS)}, got {moe_backend!r}")
    return moe_backend


def linear(n_in: int, n_out: int, bias: bool = False) -> nn.Linear:
    # Weights are always filled by the loader (checkpoint or dummy); the loader builds the model
    # on the meta device, so nn.Linear's own init costs nothing.
    return nn.Linear(n_in, n_out, bias=bias)


FUSED_ROWS_MULTIPLE = 8


def fuse_linears(linears: Sequence[nn.Linear]) -> Optional[torch.Tensor]:
    """One weight ``[sum N_i, K]`` for bias-free linears of one input: each linear's weight
    becomes a row block (a view) of it, so their parameters, names and values stay and their
    memory is the fused tensor's; one GEMM against it then gives every output as a column block.
    None (nothing changed) when they cannot share one (a bias, another dtype, device or width).
    Call it once the weights are loaded and on their device (a later ``.to()`` would copy the
    views apart)."""
    first = linears[0].weight
    if any(lin.bias is not None or lin.weight.dtype != first.dtype or lin.weight.device != first.device
           or lin.weight.shape[1] != first.shape[1] for lin in linears):
        return None
    num_rows = sum(lin.weight.shape[0] for lin in linears)
    with torch.no_grad():
        # zero rows up to a multiple of 8 outputs: 16-byte aligned output rows for the GEMM (the
        # MoE block's 1,281 columns become 1,288), read by nobody
        pad = first.new_zeros(-num_rows % FUSED_ROWS_MULTIPLE, first.shape[1])
        fused = torch.cat([lin.weight for lin in linears] + [pad], dim=0)
    row = 0
    for lin in linears:
        num_out = lin.weight.shape[0]
        lin.weight = nn.Parameter(fused[row:row + num_out], requires_grad=lin.weight.requires_grad)
        row += num_out
    return fused


def columns(y: torch.Tensor, widths: Sequence[int]):
    """The leading column blocks of ``widths`` of a fused GEMM's output (views; the padding
    columns after them dropped)."""
    return y.split(list(widths) + [y.shape[-1] - sum(widths)], dim=-1)[:len(widths)]


class RMSNorm(nn.Module):
    """``weight * rmsnorm(x)`` (transformers' Llama-style RMSNorm; weight around 1)."""

    DUMMY_FILL = 1.0

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class ZeroCenteredRMSNorm(nn.Module):
    """RMSNorm with output ``x_hat * (1 + weight)``; weight stored zero-centred."""

    DUMMY_FILL = 0.0

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_zero_centered(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    """GDN output norm: ``weight * rmsnorm(x) * silu(gate)`` per value head (weight around 1)."""

    DUMMY_FILL = 1.0

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, gate, self.weight, self.eps)


class SwiGLUMLP(nn.Module):
    """Dense SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = linear(hidden, intermediate)
        self.up_proj = linear(hidden, intermediate)
        self.down_proj = linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


class StackedExperts(nn.Module):
    """Routed experts, fused for grouped GEMM: gate_up_proj [E, 2I, H], down_proj [E, H, I]."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))


class DecoderStack(nn.Module):
    """A family's ``XModel``: an embedding (``EMBEDDING``, the checkpoint's name), decoder layers
    ``layer_cls(spec, i, moe_backend)`` called as ``layer(x, cos, sin, rotary, ctx)`` and a final
    ``norm_cls`` norm, run over packed live tokens."""

    EMBEDDING = "embed_tokens"

    def __init__(self, spec: ModelSpec, layer_cls, norm_cls, moe_backend: str = "auto") -> None:
        super().__init__()
        self.spec = spec
        setattr(self, self.EMBEDDING, nn.Embedding(spec.vocab_size, spec.hidden_size))
        self.layers = nn.ModuleList(layer_cls(spec, i, moe_backend) for i in range(spec.num_layers))
        self.norm = norm_cls(spec.hidden_size, spec.rms_norm_eps)
        # Kept outside the module tree (plain dict, not a buffer) so meta-device construction and
        # to_empty() never leave the RoPE tables uninitialised; one instance per device.
        self._rotary: Dict[torch.device, RotaryEmbedding] = {}

    def input_embeddings(self) -> nn.Embedding:
        return getattr(self, self.EMBEDDING)

    def rotary(self, device: torch.device) -> RotaryEmbedding:
        device = torch.device(device)
        if device not in self._rotary:
            with torch.device(device):
                rot = RotaryEmbedding(self.spec.head_dim, self.spec.rotary_dim, self.spec.rope_theta)
            if isinstance(rot, nn.Module):
                rot = rot.to(device)
            self._rotary[device] = rot
        return self._rotary[device]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Any) -> torch.Tensor:
        """input_ids, positions ``[T]`` (packed live tokens) -> final hidden states ``[T, H]``
        before the final norm (the caller selects the rows it needs first)."""
        if input_ids.dim() != 1 or input_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"input_ids must be a 1-D integer tensor [T], got {tuple(input_ids.shape)} {input_ids.dtype}")
        if positions.shape != input_ids.shape or positions.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"positions must be an integer tensor of shape {tuple(input_ids.shape)}, "
                f"got {tuple(positions.shape)} {positions.dtype}"
            )
        x = self.input_embeddings()(input_ids)
        rotary = self.rotary(x.device)
        cos, sin = ctx.rope_cos_sin(rotary, positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, rotary, ctx)
        return x


class CausalLM(nn.Module):
    """A family's ``XForCausalLM``: ``logits = model(input_ids [T], positions [T], ctx)`` -> fp32
    logits of the rows ``ctx.select_logits_rows`` keeps (e.g. the last token of each span).
    ``model_cls(spec, moe_backend)`` builds the :class:`DecoderStack`; an ``lm_head`` unless the
    embeddings are tied."""

    def __init__(self, spec: ModelSpec, model_cls, moe_backend: str = "auto") -> None:
        super().__init__()
        self.spec = spec
        self.model = model_cls(spec, moe_backend)
        if not spec.tie_word_embeddings:
            self.lm_head = linear(spec.hidden_size, spec.vocab_size)

    def fuse_projections(self) -> int:
        """Fuse the projections that share an input into one GEMM each (every submodule's own
        ``fuse_projections``, :func:`fuse_linears`); returns how many modules are fused."""
        return sum(bool(m.fuse_projections()) for m in self.modules()
                   if m is not self and hasattr(m, "fuse_projections"))

    def output_weight(self) -> torch.Tensor:
        return self.model.input_embeddings().weight if self.spec.tie_word_embeddings else self.lm_head.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Any) -> torch.Tensor:
        hidden = self.model(input_ids, positions, ctx)
        hidden = ctx.select_logits_rows(hidden)
        hidden = self.model.norm(hidden)
        return F.linear(hidden, self.output_weight()).float()


__all__ = [
    "CausalLM", "DecoderStack", "FUSED_ROWS_MULTIPLE", "GatedRMSNorm", "MOE_BACKENDS", "RMSNorm", "StackedExperts",
    "SwiGLUMLP", "ZeroCenteredRMSNorm", "check_moe_backend", "columns", "fuse_linears", "linear",
]
