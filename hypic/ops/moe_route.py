"""Routing, bucketing and mixing of the row-block MoE path in three Triton launches.

:func:`routed_experts_rows` is ``route_topk_softmax`` followed by ``moe_experts(...,
impl="rows")`` with the weights rounded to the activations' dtype (the model's MoE block), in
one call. The row-block GEMMs (:mod:`hypic.ops.moe_rows`) were already close to their byte floor
at a cached request's few hundred tokens; what surrounded them was not: per layer of the all-hit
32k request on the H200 (40 MoE layers), the routing's softmax, ``topk`` and
renormalisation took ~25 us of GPU time (``gatherTopK`` alone 15.6 us), the sort by expert and
its bookkeeping (cast to uint8, a one-pass radix sort, ``searchsorted``, the range check and its
async assert, ``order // k``, the inverse permutation's scatter over an ``arange``) ~30 us in a
dozen kernels, and the compiled combine 19.5 us: ~3 ms of the request. Here:

1. :func:`route_topk` - softmax and top-k of a block of tokens per program, by K rounds of
   arg-max on the probabilities' bits as integers (largest first, as ``torch.topk``; the lowest
   expert among equal probabilities);
2. :func:`bucket_rows` - the stable sort of the ``T*K`` assignments by expert without a sort:
   one program per expert counts the assignments to smaller experts (its rows' start) and
   numbers its own in assignment order (a scan over the tokens: a token's K experts are
   distinct); it writes the experts' ends, each sorted row's token (what the first GEMM
   gathers) and each assignment's sorted row (what the mix reads). Ids come from
   :func:`route_topk`, so they are in range and distinct by construction: no check, no assert;
3. the two row-block GEMMs, unchanged;
4. :func:`mix_rows` - one program per token and column block sums its K rows, weighted, in fp32.

The references are :func:`hypic.ops.moe.route_topk_softmax` and
:func:`hypic.ops.moe_grouped.sort_rows_by_expert` / :func:`~hypic.ops.moe_grouped.combine_slots`;
tests compare each launch with them under the Triton interpreter and on CUDA. Against those
separate ops the whole MoE call, as a CUDA graph replay at 576 tokens on the H200, took 0.430
against 0.513 ms (192 tokens 0.400 / 0.458, 1024 tokens 0.501 / 0.589; outputs bit-identical), and
the all-hit 32k request 57.22 against 60.01 ms p50 (docs/decisions.md).
"""

from __future__ import annotations

from typing import Tuple

import torch

from hypic.ops.moe_rows import default_config, rows_gemm

# Launch shapes. Per call at 576 tokens on the H200 the routing kernel takes 4.64 us and the
# bucketing 5.76 us (the same on the model's stride-1,288 router columns); the alternatives timed
# beside them (1-16 tokens and 1-4 warps a routing program, 512-1,024 tokens and 4-16 warps a
# bucketing one) gave equal outputs, and these defaults stayed.
# Routing: one warp a program, so that every reduction over a token's experts stays within the
# warp whatever layout Triton gives the [tokens, experts] tile (with more warps a row wider
# than one warp's vector loads, such as 512 experts, fp32 logits or unvectorised loads, is
# spread over the warps: shared memory and a barrier per reduction), and two tokens a warp
# (576 tokens: 288 programs, whose two chains of reductions interleave).
ROUTE_BLOCK_TOKENS = 2
ROUTE_NUM_WARPS = 1
# Bucketing: up to 1,024 tokens (8,192 ids at top-8, the row-block path's whole range at 256
# experts) in one tile of 8 warps: each expert's program loads the ids once, counts them with
# one reduction and numbers its tokens with one scan over the tokens. More tokens take the tiled
# loop: a second compiled variant, the only other one (the token count is not specialised, so
# CUDA graphs of any token count reuse the binaries compiled at warm-up).
BUCKET_BLOCK_TOKENS = 1024
BUCKET_NUM_WARPS = 8
MIX_BLOCK_COLS = 1024
_KERNELS = None


def _kernels():
    global _KERNELS
    if _KERNELS is None:
        from hypic.ops import _moe_route_kernel

        _KERNELS = _moe_route_kernel
    return _KERNELS


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _stride_align(stride: int) -> int:
    """The largest power of two up to 16 dividing ``stride`` (1 for 0: a single row)."""
    return min(stride & -stride, 16) if stride > 0 else 1


def route_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(weights [T, K] fp32, ids [T, K] int32)``: the top ``top_k`` of the fp32 softmax of
    ``router_logits [T, E]``, largest first (of equal probabilities the lowest expert first),
    renormalised to sum 1 if asked (the contract of :func:`hypic.ops.moe.route_topk_softmax`, with
    int32 ids). Inputs are checked by the caller."""
    import triton

    num_tokens, num_experts = router_logits.shape
    weights = torch.empty(num_tokens, top_k, device=router_logits.device, dtype=torch.float32)
    ids = torch.empty(num_tokens, top_k, device=router_logits.device, dtype=torch.int32)
    if num_tokens:
        logits = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
        _kernels().route_topk_kernel[(triton.cdiv(num_tokens, ROUTE_BLOCK_TOKENS),)](
            logits, weights, ids, num_tokens, logits.stride(0), E=num_experts, EP=_pow2(num_experts), K=top_k,
            KP=_pow2(top_k), BT=ROUTE_BLOCK_TOKENS, RENORM=renormalize,
            STRIDE_ALIGN=_stride_align(logits.stride(0)), num_warps=ROUTE_NUM_WARPS,
        )
    return weights, ids


def bucket_rows(ids: torch.Tensor, num_experts: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ends [E], row_token [T*K], inverse [T*K])``, int64, for ``ids [T, K]`` (int32, every id
    in ``[0, E)`` and a token's K ids distinct, which :func:`route_topk` guarantees): the
    assignments stably sorted by expert (as :func:`hypic.ops.moe_grouped.sort_rows_by_expert`),
    sorted row r holding token ``row_token[r]``, assignment ``t * K + j`` at sorted row
    ``inverse[t * K + j]``. One program an expert: up to ``BUCKET_BLOCK_TOKENS`` tokens in one
    tile (the ids read once), more in a loop over tiles (read twice)."""
    num_tokens, top_k = ids.shape
    num_rows = num_tokens * top_k
    device = ids.device
    ends = torch.empty(num_experts, device=device, dtype=torch.int64)
    row_token = torch.empty(num_rows, device=device, dtype=torch.int64)
    inverse = torch.empty(num_rows, device=device, dtype=torch.int64)
    _kernels().bucket_rows_kernel[(num_experts,)](
        ids.contiguous(), ends, row_token, inverse, num_tokens, K=top_k, KP=_pow2(top_k), BT=BUCKET_BLOCK_TOKENS,
        SINGLE_TILE=num_tokens <= BUCKET_BLOCK_TOKENS, num_warps=BUCKET_NUM_WARPS,
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
                        top_k: int, renormalize: bool) -> torch.Tensor:
    """``sum_j w[t, j] * SwiGLU_{e[t, j]}(x[t])`` with ``(w, e)`` the top-k routing of
    ``router_logits`` and w rounded to x's dtype: five launches, no host sync. Operands as
    :func:`hypic.ops.moe.moe_routed` (validated there). Returns a fresh ``[T, H]``."""
    num_tokens, hidden = x.shape
    num_experts, two_inter, _ = gate_up.shape
    out = torch.empty_like(x)
    if num_tokens == 0:
        return out
    num_rows = num_tokens * top_k
    config = default_config(num_rows, num_experts)
    weights, ids = route_topk(router_logits, top_k, renormalize)
    ends, row_token, inverse = bucket_rows(ids, num_experts)
    hidden_rows = torch.empty(num_rows, two_inter // 2, device=x.device, dtype=x.dtype)
    rows_gemm(x, row_token, gate_up, hidden_rows, ends, swiglu=True, config=config)
    rows_out = torch.empty(num_rows, hidden, device=x.device, dtype=x.dtype)
    rows_gemm(hidden_rows, None, down, rows_out, ends, swiglu=False, config=config)
    return mix_rows(rows_out, inverse, weights, out)
