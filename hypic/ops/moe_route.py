"""Routing, bucketing and mixing of the row-block MoE path in three Triton launches.

:func:`routed_experts_rows` is ``route_topk_softmax`` followed by ``moe_experts(...,
impl="rows")`` with the weights rounded to the activations' dtype (the model's MoE block), in
one call. The row-block GEMMs (:mod:`hypic.ops.moe_rows`) were already close to their byte floor
at a cached request's few hundred tokens; what surrounded them was not: per layer of the all-hit
32k request on the H200 (session 25 call 1, 40 MoE layers), the routing's softmax, ``topk`` and
renormalisation took ~25 us of GPU time (``gatherTopK`` alone 15.6 us), the sort by expert and
its bookkeeping (cast to uint8, a one-pass radix sort, ``searchsorted``, the range check and its
async assert, ``order // k``, the inverse permutation's scatter over an ``arange``) ~30 us in a
dozen kernels, and the compiled combine 19.5 us: ~3 ms of the request. Here:

1. :func:`route_topk` - softmax and top-k of a block of tokens per program, by K rounds of
   arg-max (largest first, as ``torch.topk``; the lowest expert among equal probabilities);
2. :func:`bucket_rows` - the stable sort of the ``T*K`` assignments by expert without a sort:
   one program per expert counts the assignments to smaller experts (its rows' start) and
   numbers its own in assignment order; it writes the experts' ends, each sorted row's token
   (what the first GEMM gathers) and each assignment's sorted row (what the mix reads). Ids come
   from :func:`route_topk`, so they are in range by construction: no check, no assert;
3. the two row-block GEMMs, unchanged;
4. :func:`mix_rows` - one program per token and column block sums its K rows, weighted, in fp32.

The references are :func:`hypic.ops.moe.route_topk_softmax` and
:func:`hypic.ops.moe_grouped.sort_rows_by_expert` / :func:`~hypic.ops.moe_grouped.combine_slots`;
tests compare each launch with them under the Triton interpreter and on CUDA.
``HYPIC_MOE_ROUTE=torch`` keeps the former path (those references' ops) for A/B runs.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch

from hypic.ops.moe_rows import RowsConfig, default_configs, rows_gemm

ROUTE_ENV = "HYPIC_MOE_ROUTE"
ROUTE_IMPLS = ("fused", "torch")
ROUTE_BLOCK_TOKENS = 16
BUCKET_BLOCK_ROWS = 1024
MIX_BLOCK_COLS = 1024
_KERNELS = None


def route_impl() -> str:
    """``HYPIC_MOE_ROUTE``: ``fused`` (default, this module) or ``torch`` (the reference ops)."""
    value = os.environ.get(ROUTE_ENV, "fused")
    if value not in ROUTE_IMPLS:
        raise ValueError(f"{ROUTE_ENV} must be one of {ROUTE_IMPLS}, got {value!r}")
    return value


def _kernels():
    global _KERNELS
    if _KERNELS is None:
        from hypic.ops import _moe_route_kernel

        _KERNELS = _moe_route_kernel
    return _KERNELS


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def route_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(weights [T, K] fp32, ids [T, K] int32)``: the top ``top_k`` of the fp32 softmax of
    ``router_logits [T, E]``, largest first, renormalised to sum 1 if asked (the contract of
    :func:`hypic.ops.moe.route_topk_softmax`, with int32 ids). Inputs are checked by the caller."""
    import triton

    num_tokens, num_experts = router_logits.shape
    weights = torch.empty(num_tokens, top_k, device=router_logits.device, dtype=torch.float32)
    ids = torch.empty(num_tokens, top_k, device=router_logits.device, dtype=torch.int32)
    if num_tokens:
        logits = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
        _kernels().route_topk_kernel[(triton.cdiv(num_tokens, ROUTE_BLOCK_TOKENS),)](
            logits, weights, ids, num_tokens, logits.stride(0), E=num_experts, EP=_pow2(num_experts), K=top_k,
            KP=_pow2(top_k), BT=ROUTE_BLOCK_TOKENS, RENORM=renormalize, num_warps=4,
        )
    return weights, ids


def bucket_rows(ids: torch.Tensor, num_experts: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ends [E], row_token [T*K], inverse [T*K])``, int64, for ``ids [T, K]`` (int32, every id
    in ``[0, E)``, which :func:`route_topk` guarantees): the assignments stably sorted by expert
    (as :func:`hypic.ops.moe_grouped.sort_rows_by_expert`), sorted row r holding token
    ``row_token[r]``, assignment ``t * K + j`` at sorted row ``inverse[t * K + j]``."""
    num_tokens, top_k = ids.shape
    num_rows = num_tokens * top_k
    device = ids.device
    ends = torch.empty(num_experts, device=device, dtype=torch.int64)
    row_token = torch.empty(num_rows, device=device, dtype=torch.int64)
    inverse = torch.empty(num_rows, device=device, dtype=torch.int64)
    _kernels().bucket_rows_kernel[(num_experts,)](
        ids.contiguous(), ends, row_token, inverse, num_rows, K=top_k, BR=BUCKET_BLOCK_ROWS, num_warps=4,
    )
    return ends, row_token, inverse


def mix_rows(rows_out: torch.Tensor, inverse: torch.Tensor, weights: torch.Tensor, out: torch.Tensor,
             round_weights: bool = True) -> torch.Tensor:
    """``out[t] = sum_j w[t, j] * rows_out[inverse[t * K + j]]`` in fp32 (slot order), written
    into ``out [T, H]``; ``round_weights``: each weight rounded to ``out``'s dtype first."""
    import triton

    num_tokens, top_k = weights.shape
    hidden = rows_out.shape[1]
    if num_tokens:
        _kernels().mix_rows_kernel[(num_tokens, triton.cdiv(hidden, MIX_BLOCK_COLS))](
            rows_out, inverse, weights.contiguous(), out, rows_out.stride(0), out.stride(0), H=hidden, K=top_k,
            BH=min(MIX_BLOCK_COLS, _pow2(hidden)), ROUND_WEIGHTS=round_weights, num_warps=4,
        )
    return out


def routed_experts_rows(x: torch.Tensor, router_logits: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                        top_k: int, renormalize: bool, config: Optional[RowsConfig] = None) -> torch.Tensor:
    """``sum_j w[t, j] * SwiGLU_{e[t, j]}(x[t])`` with ``(w, e)`` the top-k routing of
    ``router_logits`` and w rounded to x's dtype: five launches, no host sync. Operands as
    :func:`hypic.ops.moe.moe_routed` (validated there). Returns a fresh ``[T, H]``."""
    num_tokens, hidden = x.shape
    num_experts, two_inter, _ = gate_up.shape
    out = torch.empty_like(x)
    if num_tokens == 0:
        return out
    num_rows = num_tokens * top_k
    config, down_config = default_configs(num_rows, num_experts) if config is None else (config, config)
    weights, ids = route_topk(router_logits, top_k, renormalize)
    ends, row_token, inverse = bucket_rows(ids, num_experts)
    hidden_rows = torch.empty(num_rows, two_inter // 2, device=x.device, dtype=x.dtype)
    rows_gemm(x, row_token, gate_up, hidden_rows, ends, swiglu=True, config=config)
    rows_out = torch.empty(num_rows, hidden, device=x.device, dtype=x.dtype)
    rows_gemm(hidden_rows, None, down, rows_out, ends, swiglu=False, config=down_config)
    return mix_rows(rows_out, inverse, weights, out)
