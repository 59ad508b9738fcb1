"""Build a model from a Hugging Face checkpoint folder, or with seeded dummy weights.

* Weights: ``model.safetensors`` or shards listed by ``model.safetensors.index.json``. Keys may be
  ``model.layers.N...`` (text checkpoints) or ``model.language_model.layers.N...`` (Qwen3.5 VLM
  checkpoints); vision (``model.visual.*``) and MTP (``mtp.*``) keys are skipped.
* Routed experts are accepted per expert (``mlp.experts.E.{gate,up,down}_proj.weight``, as
  ``save_pretrained`` writes them) or stacked (``mlp.experts.gate_up_proj [E, 2I, H]`` /
  ``mlp.experts.down_proj [E, H, I]``; the transposed stacks ``[E, H, 2I]`` / ``[E, I, H]`` are
  recognised by shape).
* ``load_format="dummy"``: random weights at sane scales, generated directly on the target device
  (the model is built on the meta device and materialised there), so full-size shapes such as
  Qwen3.5-35B-A3B can be benchmarked without a download and without a CPU copy.
* Once the weights are in place, the projections that share an input are fused into one GEMM
  each (``fuse_projections``, e.g. :meth:`hypic.models.qwen3_next.Qwen3NextForCausalLM.fuse_projections`).
* ``moe_backend``: how the routed experts run, ``"auto"`` (the kernels for the device) or
  ``"torch"`` (the pure-PyTorch reference, for debugging); :data:`hypic.models.layers.MOE_BACKENDS`.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from hypic.models.config import ModelSpec, load_spec, spec_from_config
from hypic.models.layers import check_moe_backend
from hypic.models.registry import model_class

_SKIP_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.mtp.")
_EXPERT_KEY = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
LOAD_FORMATS = ("safetensors", "dummy")


def build_empty_model(spec: ModelSpec, dtype: torch.dtype, device: Union[str, torch.device],
                      moe_backend: str = "auto") -> nn.Module:
    """Model with uninitialised parameters of ``dtype`` allocated on ``device`` (no CPU copy)."""
    with torch.device("meta"):
        model = model_class(spec.model_type)(spec, moe_backend=moe_backend)
    model = model.to(dtype=dtype)
    _keep_fp32(model, dtype)
    model = model.to_empty(device=torch.device(device))
    return model.eval().requires_grad_(False)


def _keep_fp32(model: nn.Module, dtype: torch.dtype) -> None:
    """Parameters a module lists in ``FP32_PARAMETERS`` stay fp32 in a 16-bit model (Ring-linear's
    routing bias: its values differ by less than a bf16 step, and they pick the experts)."""
    if dtype not in (torch.float16, torch.bfloat16):
        return
    for module in model.modules():
        for name in getattr(module, "FP32_PARAMETERS", ()):
            param = getattr(module, name, None)
            if param is not None:
                setattr(module, name, nn.Parameter(param.to(torch.float32), requires_grad=False))


def load_model(
    model_dir: str,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: Union[str, torch.device] = "cpu",
    load_format: str = "safetensors",
    seed: int = 0,
    moe_backend: str = "auto",
) -> Tuple[ModelSpec, nn.Module]:
    """Read ``config.json`` and the weights of ``model_dir``; returns ``(spec, model)``."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {load_format!r}")
    _check_dtype(dtype)
    check_moe_backend(moe_backend)
    spec = load_spec(model_dir)
    model = build_empty_model(spec, dtype, device, moe_backend)
    if load_format == "dummy":
        init_dummy_weights(model, seed=seed)
    else:
        load_weights(model, _iter_checkpoint(model_dir))
    _fuse(model)
    return spec, model


def build_dummy_model(
    config: Mapping[str, Any],
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: Union[str, torch.device] = "cpu",
    seed: int = 0,
    moe_backend: str = "auto",
) -> Tuple[ModelSpec, nn.Module]:
    """``(spec, model)`` from a config dict alone, with seeded dummy weights on ``device``."""
    _check_dtype(dtype)
    spec = spec_from_config(config)
    model = build_empty_model(spec, dtype, device, moe_backend)
    init_dummy_weights(model, seed=seed)
    _fuse(model)
    return spec, model


def _fuse(model: nn.Module) -> None:
    """Projections that share an input as one GEMM each, once the weights are in place."""
    fuse = getattr(model, "fuse_projections", None)
    if fuse is not None:
        fuse()


def _check_dtype(dtype: torch.dtype) -> None:
    if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")


# ---- dummy weights ------------------------------------------------------------------------------


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0, std: float = 0.02) -> None:
    """Seeded random weights that keep activations in a realistic range:

    linear / embedding / expert weights ~ N(0, std); norm weights their module's ``DUMMY_FILL``
    (zero-centred RMSNorms 0, the others 1: scale 1 either way); routing biases 0; conv weights U(-1/sqrt(W), 1/sqrt(W)) (PyTorch's Conv1d default);
    ``A_log = log(U(1, 16))``; ``dt_bias = softplus^-1(dt)`` with ``dt`` log-uniform in
    [1e-3, 1e-1] (Mamba-style). Random numbers are drawn on the parameter's device, so a seed
    reproduces the same weights on the same device type (CPU and CUDA streams differ).
    """
    # norm weights: the value that makes each norm module an identity scale (its DUMMY_FILL)
    fills = {f"{prefix}.weight" if prefix else "weight": module.DUMMY_FILL
             for prefix, module in model.named_modules() if hasattr(module, "DUMMY_FILL")}
    for name, param in model.named_parameters():
        gen = torch.Generator(device=param.device)
        # Per-parameter seed from the name: independent of iteration order and of other params.
        gen.manual_seed((seed * 1_000_003 + _stable_hash(name)) % (2**63 - 1))
        if name in fills:
            param.fill_(fills[name])
        elif name.endswith("expert_bias"):
            param.zero_()  # routing by score alone
        elif name.endswith("A_log"):
            param.copy_(torch.empty(param.shape, device=param.device).uniform_(1.0, 16.0, generator=gen).log_())
        elif name.endswith("dt_bias"):
            dt = torch.empty(param.shape, device=param.device).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp_()
            param.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        elif name.endswith("conv1d.weight"):
            bound = 1.0 / math.sqrt(param.shape[-1])
            param.uniform_(-bound, bound, generator=gen)
        elif param.dtype in (torch.float32, torch.float64):
            param.normal_(0.0, std, generator=gen)
        else:
            # Draw in fp32 (bf16/fp16 normal_ with a generator is not supported everywhere) in
            # chunks along dim 0 so a 35B model never needs a full fp32 copy of a big tensor.
            flat = param.view(param.shape[0], -1) if param.dim() > 1 else param.view(1, -1)
            step = max(1, (1 << 26) // max(1, flat.shape[1]))
            for r0 in range(0, flat.shape[0], step):
                chunk = torch.empty(flat[r0 : r0 + step].shape, device=param.device)
                flat[r0 : r0 + step] = chunk.normal_(0.0, std, generator=gen)


def _stable_hash(text: str) -> int:
    value = 1469598103934665603  # FNV-1a, stable across processes (unlike hash())
    for byte in text.encode():
        value = ((value ^ byte) * 1099511628211) % (1 << 64)
    return value


# ---- checkpoint reading -------------------------------------------------------------------------


def _iter_checkpoint(model_dir: str) -> Iterator[Tuple[str, Any]]:
    """Yield ``(key, lazy slice)`` for every tensor of the checkpoint (index or single file)."""
    from safetensors import safe_open

    index = os.path.join(model_dir, "model.safetensors.index.json")
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no weight_map")
        files = sorted(set(weight_map.values()))
    elif os.path.isfile(single):
        files = ["model.safetensors"]
    else:
        raise ValueError(f"{model_dir!r} has neither model.safetensors nor model.safetensors.index.json")
    for fname in files:
        path = os.path.join(model_dir, fname)
        if not os.path.isfile(path):
            raise ValueError(f"checkpoint shard {fname!r} listed in the index is missing from {model_dir!r}")
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                yield key, _LazyTensor(f, key)


class _LazyTensor:
    """Shape now, data on demand (a safetensors slice), so skipped keys are never read."""

    def __init__(self, handle: Any, key: str) -> None:
        self._handle, self._key = handle, key
        self.shape = tuple(handle.get_slice(key).get_shape())

    def load(self) -> torch.Tensor:
        return self._handle.get_tensor(self._key)


def _canonical_key(key: str, model: nn.Module) -> Optional[str]:
    """Checkpoint key -> our parameter name, or None for keys that are skipped. A model class
    whose checkpoints name some tensors otherwise than its parameters maps them in its
    ``checkpoint_key(key)`` (None: skip)."""
    if key.startswith(_SKIP_PREFIXES):
        return None
    if key.startswith("model.language_model."):
        key = "model." + key[len("model.language_model.") :]
    rename = getattr(model, "checkpoint_key", None)
    return key if rename is None else rename(key)


@torch.no_grad()
def load_weights(model: nn.Module, tensors) -> None:
    """Copy ``(key, tensor-or-lazy)`` pairs into ``model``; every parameter must be covered.

    Raises ValueError naming the key for missing weights and for shape mismatches (expected vs got).
    """
    params: Dict[str, nn.Parameter] = dict(model.named_parameters())
    loaded = set()
    expert_rows: Dict[str, set] = {}
    for key, tensor in tensors:
        name = _canonical_key(key, model)
        if name is None:
            continue
        m = _EXPERT_KEY.match(name)
        if m is not None:
            prefix, expert, proj = m.group(1), int(m.group(2)), m.group(3)
            _load_one_expert(params, key, prefix, expert, proj, tensor)
            expert_rows.setdefault(prefix, set()).add((expert, proj))
            continue
        if name.endswith("rotary_emb.inv_freq"):
            continue  # derived from the config
        if name not in params:
            continue  # unknown extra tensors (e.g. other heads) are ignored
        param = params[name]
        shape = tuple(tensor.shape)
        if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")) and shape != tuple(param.shape):
            if shape == (param.shape[0], param.shape[2], param.shape[1]):
                _copy(param, _materialise(tensor).transpose(1, 2), key)
                loaded.add(name)
                continue
        if shape != tuple(param.shape):
            raise ValueError(f"weight {key!r} has shape {list(shape)}, expected {list(param.shape)}")
        _copy(param, _materialise(tensor), key)
        loaded.add(name)
    # Stacked expert parameters assembled from per-expert tensors count when complete.
    for prefix, seen in expert_rows.items():
        num_experts = params[prefix + ".gate_up_proj"].shape[0]
        for proj, pname in (("gate_proj", "gate_up_proj"), ("up_proj", "gate_up_proj"), ("down_proj", "down_proj")):
            missing = [e for e in range(num_experts) if (e, proj) not in seen]
            if missing:
                raise ValueError(
                    f"missing weight {prefix}.{missing[0]}.{proj}.weight "
                    f"({len(missing)} of {num_experts} experts lack {proj})"
                )
        loaded.update({prefix + ".gate_up_proj", prefix + ".down_proj"})
    missing = [n for n in params if n not in loaded]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"missing weight {missing[0]!r}{more} in the checkpoint")


def _load_one_expert(params, key, prefix, expert, proj, tensor) -> None:
    gate_up = params.get(prefix + ".gate_up_proj")
    down = params.get(prefix + ".down_proj")
    if gate_up is None or down is None:
        raise ValueError(f"checkpoint has expert weight {key!r} but layer {prefix!r} has no routed experts")
    num_experts, two_inter, hidden = gate_up.shape
    inter = two_inter // 2
    if expert >= num_experts:
        raise ValueError(f"weight {key!r}: expert index {expert} >= num_experts {num_experts}")
    expected = (hidden, inter) if proj == "down_proj" else (inter, hidden)
    if tuple(tensor.shape) != expected:
        raise ValueError(f"weight {key!r} has shape {list(tensor.shape)}, expected {list(expected)}")
    if proj == "gate_proj":
        target = gate_up[expert, :inter]
    elif proj == "up_proj":
        target = gate_up[expert, inter:]
    else:
        target = down[expert]
    _copy(target, _materialise(tensor), key)


def _materialise(tensor) -> torch.Tensor:
    return tensor.load() if isinstance(tensor, _LazyTensor) else tensor


def _copy(target: torch.Tensor, source: torch.Tensor, key: str) -> None:
    if not source.is_floating_point():
        raise ValueError(f"weight {key!r} has non-floating dtype {source.dtype}")
    target.copy_(source.to(device=target.device, dtype=target.dtype))
