"""Routed experts through two grouped GEMMs (``torch._grouped_mm``), with no host synchronisation.

Same contract as :func:`hypic.ops.moe.moe_experts` (the reference, one ``F.linear`` pair per
expert in a Python loop, with a ``.tolist()`` of the per-expert counts). Here:

1. the ``T*k`` (token, slot) assignments are sorted by expert (``torch.sort``, stable);
2. the group boundaries ``offs[e]`` = number of assignments to experts ``<= e`` come from a
   ``searchsorted`` over the sorted ids - on the device, so empty experts cost nothing and the
   host never waits (``bincount`` on CUDA reads the maximum id back to size its output, a sync);
3. one grouped GEMM ``rows @ gate_up[e].T`` for all experts, SiLU(gate) * up, one grouped GEMM
   ``h @ down[e].T``;
4. the rows go back to (token, slot) order by a gather through the inverse permutation (a
   vectorised ``index_select``; ``index_copy_`` of the same rows took 3x as long on the H200) and
   the top-k mix is one batched ``[1, k] @ [k, H]`` product per token - deterministic (no
   atomics) and accumulated in fp32 even for bf16 activations. On CUDA (large inputs, and inside
   CUDA graphs: :func:`hypic.ops.fused.dispatch`) the gathers and the mix are one compiled
   pointwise kernel (:func:`combine_slots_math`): the ``[T*k, H]`` rows are read once and only
   ``[T, H]`` is written.

Weight layout: the model stores ``gate_up [E, 2I, H]`` and ``down [E, H, I]`` (``nn.Linear``
orientation). ``_grouped_mm`` computes ``a @ b[e]`` with ``b [E, K, N]``; the transposed views
``gate_up.transpose(1, 2)`` ``[E, H, 2I]`` and ``down.transpose(1, 2)`` ``[E, I, H]`` are
column-major in their last two dims, which the kernel accepts as long as the leading stride
(``H`` resp. ``I`` elements) is a multiple of 16 bytes - no weight copy is made.
"""

from __future__ import annotations

import torch

from hypic.ops.fused import dispatch, swiglu

# Dtypes torch._grouped_mm accepts. On CPU (torch 2.13): bf16, fp16, fp32 (fp64 is rejected).
# On CUDA the fast kernel is bf16 only and needs sm90+ (Hopper).
_CPU_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_CUDA_DTYPES = (torch.bfloat16,)
_ALIGN_BYTES = 16


def grouped_mm_supported(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> bool:
    """Whether :func:`moe_experts_grouped` can run these operands (dtype, device, strides).

    Host-only (shapes, strides, device properties): never synchronises with the device.
    """
    if not hasattr(torch, "_grouped_mm"):
        return False
    if x.device.type == "cuda":
        if x.dtype not in _CUDA_DTYPES or torch.cuda.get_device_capability(x.device) < (9, 0):
            return False
    elif x.device.type == "cpu":
        if x.dtype not in _CPU_DTYPES:
            return False
    else:
        return False
    if gate_up.dtype != x.dtype or down.dtype != x.dtype:
        return False
    align = _ALIGN_BYTES // x.element_size()
    # Row starts of the gathered activations and the leading strides of the (transposed) weights must be
    # 16-byte aligned; hidden H and intermediate I are the contraction dims of the two GEMMs.
    hidden, inter = x.shape[1], down.shape[2]
    if hidden % align or inter % align:
        return False
    for w in (gate_up, down):
        if w.stride(2) != 1 or w.stride(1) % align or w.stride(0) % align:
            return False
        if w.data_ptr() % _ALIGN_BYTES:
            return False
    # x itself never reaches the kernel (a fresh gathered copy does), so its offset is irrelevant.
    return True


def _check_ids_in_range(flat_ids: torch.Tensor, num_experts: int) -> None:
    """Reject expert ids outside ``[0, E)`` without a host sync on CUDA (an async device assert).

    An out-of-range id would otherwise be folded silently into expert 0 or dropped.
    """
    in_range = ((flat_ids >= 0) & (flat_ids < num_experts)).all()
    if flat_ids.is_cuda:
        torch._assert_async(in_range, f"topk_ids must lie in [0, {num_experts})")
    elif not bool(in_range):
        raise ValueError(f"topk_ids must lie in [0, {num_experts})")


def moe_experts_grouped(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """``sum_j w[t, j] * SwiGLU_{e[t, j]}(x[t])`` via two grouped GEMMs; no host sync.

    Arguments as :func:`hypic.ops.moe.moe_experts` (validated there; call that with
    ``impl="grouped"`` rather than this directly). Returns a fresh ``[T, H]`` tensor in x's dtype;
    every element is written.
    """
    num_tokens, hidden = x.shape
    num_experts = gate_up.shape[0]
    top_k = topk_ids.shape[1]
    if num_tokens == 0:
        return x.new_zeros(0, hidden)
    order, ends = sort_rows_by_expert(topk_ids, num_experts)
    offs = ends.to(torch.int32)  # offs[e] = end of expert e's row group; empty experts repeat it
    rows_x = x.index_select(0, order // top_k)  # [T*k, H], grouped by expert
    gate_up_rows = torch._grouped_mm(rows_x, gate_up.transpose(1, 2), offs=offs)  # [T*k, 2I]
    gate, up = gate_up_rows.chunk(2, dim=-1)
    hidden_rows = swiglu(gate, up)  # [T*k, I], contiguous
    rows_out = torch._grouped_mm(hidden_rows, down.transpose(1, 2), offs=offs)  # [T*k, H]
    return mix_sorted_rows(rows_out, order, topk_weights, x)


def expert_ends(sorted_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``[E]`` int64: the end of each expert's rows among ids sorted by expert (cumulative counts;
    an empty expert repeats the previous end). On the device, no sync."""
    experts = torch.arange(num_experts, device=sorted_ids.device, dtype=sorted_ids.dtype)
    return torch.searchsorted(sorted_ids, experts, right=True)


def sort_rows_by_expert(topk_ids: torch.Tensor, num_experts: int):
    """``(order, ends)``: the ``T*k`` (token, slot) assignments sorted by expert (stable; sorted
    row r is assignment ``order[r]``, token ``order[r] // k``) and :func:`expert_ends`. Ids
    outside ``[0, E)`` are rejected without a host sync."""
    flat_ids = topk_ids.reshape(-1)
    _check_ids_in_range(flat_ids, num_experts)
    sorted_ids, order = torch.sort(flat_ids.to(sort_key_dtype(num_experts)), stable=True)
    return order, expert_ends(sorted_ids, num_experts)


def sort_key_dtype(num_experts: int) -> torch.dtype:
    """The narrowest integer dtype holding every expert id: CUDA's radix sort makes one pass per
    8 key bits, so uint8 keys (up to 256 experts) sort in one pass where int64 keys took eight
    (the all-hit 32k request's 40 sorts were 320 radix-sort launches, 1.74 ms on the H200).
    The ids are checked to lie in ``[0, E)`` first, so the cast is exact."""
    if num_experts <= 256:
        return torch.uint8
    if num_experts <= 2 ** 15:
        return torch.int16
    return torch.int32 if num_experts <= 2 ** 31 else torch.int64


def mix_sorted_rows(rows_out: torch.Tensor, order: torch.Tensor, topk_weights: torch.Tensor,
                    x: torch.Tensor) -> torch.Tensor:
    """``[T, H]`` in x's dtype: the expert outputs of the sorted rows back in (token, slot) order,
    mixed by the top-k weights (:func:`combine_slots_math`, compiled on CUDA when x is large)."""
    # row r of the sorted list is assignment order[r], so assignment a sits at row inverse[a]
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    mix = topk_weights.to(x.dtype)
    return dispatch(combine_slots_math, x, eager=combine_slots)(rows_out, inverse, mix)


def combine_slots(rows_out: torch.Tensor, inverse: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """Eager combine: ``out[t] = sum_j mix[t, j] * rows_out[inverse[t * k + j]]`` via one gather and
    one batched ``[1, k] @ [k, H]`` product (fp32 accumulation in the GEMM)."""
    num_tokens, top_k = mix.shape
    per_slot = rows_out.index_select(0, inverse).view(num_tokens, top_k, rows_out.shape[-1])
    return torch.bmm(mix.unsqueeze(1), per_slot).view(num_tokens, rows_out.shape[-1])


def combine_slots_math(rows_out: torch.Tensor, inverse: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """The same combine as :func:`combine_slots`, written for ``torch.compile``: one gather per
    slot, accumulated in fp32, so the compiled graph is a single pointwise kernel over ``[T, H]``
    that reads each slot's row directly (the gather-multiply-sum form compiled to a reduction
    over the slot axis that ran 2.5 ms per layer at 32k tokens on the H200; eager gather + bmm
    took 1.6 ms)."""
    num_tokens, top_k = mix.shape
    slots = inverse.view(num_tokens, top_k)
    weights = mix.float()
    out = rows_out.index_select(0, slots[:, 0]).float() * weights[:, 0:1]
    for j in range(1, top_k):
        out = out + rows_out.index_select(0, slots[:, j]).float() * weights[:, j:j + 1]
    return out.to(rows_out.dtype)
