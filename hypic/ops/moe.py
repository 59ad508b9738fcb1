"""Sparse mixture-of-experts: softmax top-k routing, sigmoid routing with a bias and
group-limited top-k, and a grouped-by-expert reference.

Expert weights use the fused layout a grouped GEMM consumes directly:
``gate_up [E, 2*I, H]`` (rows ``[0, I)`` = gate, ``[I, 2I)`` = up) and ``down [E, H, I]``.
:func:`moe_experts` sorts the (token, slot) assignments by expert and runs one SwiGLU per expert
over its contiguous group of rows - the same data movement a grouped-GEMM kernel does, so a GPU
path can replace it behind the same signature.

Dispatch: ``moe_experts(..., impl="auto")`` runs, on CUDA tensors, the row-block Triton kernel
(:mod:`hypic.ops.moe_rows`) when the experts get few rows each (a cached request's few hundred
live tokens: the GEMMs only stream the weights) and the grouped-GEMM path
(:mod:`hypic.ops.moe_grouped`) otherwise, each where its support check accepts the operands
(both run without host syncs); this reference runs everywhere else (CPU tensors included).
``impl="reference"`` runs the reference anywhere (the kernels' oracle, and a pure-PyTorch path
for debugging); ``"grouped"`` / ``"rows"`` force a kernel (ValueError where it cannot run).
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F

from hypic.ops.fused import dispatch
from hypic.ops.moe_grouped import grouped_mm_supported, moe_experts_grouped
from hypic.ops.moe_route import routed_experts_rows
from hypic.ops.moe_rows import moe_experts_rows, rows_preferred, rows_supported

_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
IMPLS = ("auto", "reference", "grouped", "rows")


def route_topk_softmax(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts (fp32), keep the top ``top_k``; renormalise them to sum 1 if asked.

    router_logits ``[T, E]`` -> (weights ``[T, top_k]`` fp32 (fp64 for fp64 logits),
    expert ids ``[T, top_k]`` int64).
    """
    if not isinstance(router_logits, torch.Tensor) or router_logits.dim() != 2:
        raise ValueError("router_logits must be a rank-2 tensor [T, E]")
    if router_logits.dtype not in _FLOAT:
        raise ValueError(f"router_logits must be floating point, got {router_logits.dtype}")
    num_experts = router_logits.shape[1]
    if not (0 < top_k <= num_experts):
        raise ValueError(f"top_k must be in [1, {num_experts}], got {top_k}")
    return dispatch(route_topk_softmax_math, router_logits, graph_only=True)(router_logits, top_k, renormalize)


def route_topk_softmax_math(router_logits: torch.Tensor, top_k: int, renormalize: bool):
    """The unchecked math of :func:`route_topk_softmax` (compiled inside CUDA graphs,
    :func:`hypic.ops.fused.dispatch`)."""
    math = torch.float64 if router_logits.dtype == torch.float64 else torch.float32
    probs = torch.softmax(router_logits.to(math), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def route_sigmoid_grouped(
    router_logits: torch.Tensor,
    expert_bias,
    top_k: int,
    num_groups: int = 1,
    topk_groups: int = 1,
    renormalize: bool = True,
    scaling: float = 1.0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid routing with a selection bias and group-limited top-k (Ring-linear-2.0,
    DeepSeek-V3's ``noaux_tc``): scores ``sigmoid(logits)``; experts are *picked* by score +
    ``expert_bias`` ``[E]`` (None: no bias), first the ``topk_groups`` best of ``num_groups`` equal
    groups (a group scored by its two best experts), then the ``top_k`` best experts inside them;
    their *weights* are the plain scores, renormalised to sum 1 (when ``renormalize`` and
    ``top_k > 1``) and multiplied by ``scaling``.

    router_logits ``[T, E]`` -> (weights ``[T, top_k]`` fp32 (fp64 for fp64 logits), ids
    ``[T, top_k]`` int64)."""
    if not isinstance(router_logits, torch.Tensor) or router_logits.dim() != 2:
        raise ValueError("router_logits must be a rank-2 tensor [T, E]")
    if router_logits.dtype not in _FLOAT:
        raise ValueError(f"router_logits must be floating point, got {router_logits.dtype}")
    num_experts = router_logits.shape[1]
    if expert_bias is not None and (not isinstance(expert_bias, torch.Tensor) or expert_bias.shape != (num_experts,)):
        raise ValueError(f"expert_bias must be a tensor [{num_experts}] or None")
    if num_groups < 1 or num_experts % num_groups or not 1 <= topk_groups <= num_groups:
        raise ValueError(f"num_groups ({num_groups}) must divide the {num_experts} experts and topk_groups "
                         f"({topk_groups}) be in [1, num_groups]")
    if num_groups > 1 and num_experts // num_groups < 2:
        raise ValueError("a group is scored by its two best experts: each needs at least 2")
    if not 0 < top_k <= topk_groups * (num_experts // num_groups):
        raise ValueError(f"top_k must be in [1, {topk_groups * (num_experts // num_groups)}], got {top_k}")
    return dispatch(route_sigmoid_grouped_math, router_logits, graph_only=True)(
        router_logits, expert_bias, top_k, num_groups, topk_groups, renormalize, scaling)


def route_sigmoid_grouped_math(router_logits, expert_bias, top_k: int, num_groups: int, topk_groups: int,
                               renormalize: bool, scaling: float):
    """The unchecked math of :func:`route_sigmoid_grouped`."""
    math = torch.float64 if router_logits.dtype == torch.float64 else torch.float32
    scores = torch.sigmoid(router_logits.to(math))
    choice = scores if expert_bias is None else scores + expert_bias.to(math)
    if num_groups > 1:
        num_tokens, num_experts = choice.shape
        grouped = choice.view(num_tokens, num_groups, num_experts // num_groups)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, group_scores.topk(topk_groups, dim=-1).indices, True)
        choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(num_tokens, num_experts)
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize and top_k > 1:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scaling, ids


def moe_routed(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    renormalize: bool,
    *,
    impl: str = "auto",
) -> torch.Tensor:
    """A routed MoE layer: :func:`route_topk_softmax` of ``router_logits [T, E]``, the weights
    rounded to x's dtype (as transformers mixes), then :func:`moe_experts`. Where the experts run
    on the row-block path, routing, bucketing and mixing run as the fused launches of
    :mod:`hypic.ops.moe_route` around its GEMMs."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    _check_expert_operands(x, gate_up, down)
    if not isinstance(router_logits, torch.Tensor) or router_logits.dim() != 2:
        raise ValueError("router_logits must be a rank-2 tensor [T, E]")
    if router_logits.shape != (x.shape[0], gate_up.shape[0]):
        raise ValueError(f"router_logits must be [{x.shape[0]}, {gate_up.shape[0]}] (tokens, experts), "
                         f"got {tuple(router_logits.shape)}")
    resolved = _resolve_impl(impl, x, gate_up, down, top_k)
    # fp64 logits keep the reference's fp64 softmax; a bad top_k gets route_topk_softmax's error
    if resolved == "rows" and router_logits.dtype in _FLOAT[:3] and 0 < top_k <= router_logits.shape[1]:
        _require_rows(x, gate_up, down)
        return routed_experts_rows(x, router_logits, gate_up, down, top_k, renormalize)
    weights, ids = route_topk_softmax(router_logits, top_k, renormalize)
    return moe_experts(x, gate_up, down, weights.to(x.dtype), ids, impl=resolved)


def _resolve_impl(impl: str, x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_k: int) -> str:
    """``impl`` with ``auto`` resolved as :func:`moe_experts` does (by the operands' device,
    dtypes, strides and the rows per expert)."""
    if impl == "auto":
        if x.is_cuda and rows_preferred(x.shape[0] * top_k, gate_up.shape[0]) and rows_supported(x, gate_up, down):
            impl = "rows"
        elif x.is_cuda and grouped_mm_supported(x, gate_up, down):
            impl = "grouped"
        else:
            impl = "reference"
    return impl


def _check_expert_operands(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> None:
    """Shapes and dtypes of the activations and the fused expert weights."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in _FLOAT:
        raise ValueError("x must be a floating rank-2 tensor [T, H]")
    hidden = x.shape[1]
    if gate_up.dim() != 3 or gate_up.shape[2] != hidden or gate_up.shape[1] % 2 != 0:
        raise ValueError(f"gate_up must be [E, 2*I, {hidden}], got {tuple(gate_up.shape)}")
    num_experts, two_inter, _ = gate_up.shape
    if down.shape != (num_experts, hidden, two_inter // 2):
        raise ValueError(f"down must be [{num_experts}, {hidden}, {two_inter // 2}], got {tuple(down.shape)}")
    if gate_up.dtype != x.dtype or down.dtype != x.dtype:
        raise ValueError(f"expert weights ({gate_up.dtype}, {down.dtype}) must match x dtype {x.dtype}")
    if gate_up.device != x.device or down.device != x.device:
        raise ValueError(f"expert weights ({gate_up.device}, {down.device}) must be on x's device {x.device}")


def _require_rows(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> None:
    if not rows_supported(x, gate_up, down):
        raise ValueError(
            f"rows MoE path unsupported for x {x.dtype} on {x.device}: needs Triton, CUDA (or "
            "TRITON_INTERPRET=1 on CPU), fp16/bf16 operands with unit stride along hidden/intermediate"
        )


def moe_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    impl: str = "auto",
) -> torch.Tensor:
    """``sum_j w[t, j] * SwiGLU_{e[t, j]}(x[t])`` for every token, grouped by expert.

    x ``[T, H]``; gate_up ``[E, 2I, H]``; down ``[E, H, I]``; topk_weights ``[T, k]`` (any float
    dtype); topk_ids ``[T, k]`` integer in ``[0, E)``. Returns ``[T, H]`` in x's dtype.
    ``impl``: ``"auto"`` (on CUDA the rows kernel for few rows per expert, else the grouped GEMM,
    where supported; else the reference), ``"reference"``, ``"grouped"`` or ``"rows"``
    (ValueError if the operands are unsupported).
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    _check_expert_operands(x, gate_up, down)
    num_tokens, hidden = x.shape
    inter = down.shape[2]
    if topk_ids.dim() != 2 or topk_ids.shape[0] != num_tokens:
        raise ValueError(f"topk_ids must be [{num_tokens}, k], got {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be an integer tensor, got {topk_ids.dtype}")
    if topk_weights.shape != topk_ids.shape or topk_weights.dtype not in _FLOAT:
        raise ValueError(
            f"topk_weights must be floating with shape {tuple(topk_ids.shape)}, got "
            f"{tuple(topk_weights.shape)} {topk_weights.dtype}"
        )

    impl = _resolve_impl(impl, x, gate_up, down, topk_ids.shape[1])
    if impl == "rows":
        _require_rows(x, gate_up, down)
        return moe_experts_rows(x, gate_up, down, topk_weights, topk_ids)
    if impl == "grouped":
        if not grouped_mm_supported(x, gate_up, down):
            raise ValueError(
                f"grouped MoE path unsupported for x {x.dtype} on {x.device} (hidden {hidden}, "
                f"intermediate {inter}): needs bf16/fp16/fp32 on CPU, bf16 on sm90+ CUDA, 16-byte "
                "aligned strides"
            )
        return moe_experts_grouped(x, gate_up, down, topk_weights, topk_ids)
    return _moe_experts_reference(x, gate_up, down, topk_weights, topk_ids)


def _moe_experts_reference(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """One SwiGLU per expert over its contiguous group of sorted rows (host loop; the oracle)."""
    num_tokens = x.shape[0]
    num_experts = gate_up.shape[0]
    out = torch.zeros_like(x)
    if num_tokens == 0:
        return out
    top_k = topk_ids.shape[1]
    flat_ids = topk_ids.reshape(-1).long()
    if bool(((flat_ids < 0) | (flat_ids >= num_experts)).any()):
        raise ValueError(f"topk_ids must lie in [0, {num_experts})")
    # Sort the T*k assignments by expert: each expert then owns one contiguous row range.
    order = torch.argsort(flat_ids, stable=True)
    token_of_row = order // top_k
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    rows_x = x.index_select(0, token_of_row)
    rows_w = topk_weights.reshape(-1).index_select(0, order)
    rows_out = torch.empty_like(rows_x)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        end = start + count
        gate, up = F.linear(rows_x[start:end], gate_up[expert]).chunk(2, dim=-1)
        rows_out[start:end] = F.linear(F.silu(gate) * up, down[expert])
        start = end
    rows_out = rows_out * rows_w.to(rows_out.dtype)[:, None]
    out.index_add_(0, token_of_row, rows_out)
    return out
