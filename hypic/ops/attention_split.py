"""Split-KV attention of a few queries over a long run of keys (a PIC request with cached segments).

A cached request recomputes only short spans (a seam window per reused segment and the
question), but every live query reads every earlier key of its request. Its keys are the
request's positions ``0 .. Lk-1`` in order (prefix, cached bodies and live tokens gathered by
position), so a query at position ``p`` attends to keys ``0 .. p`` of its own request: the
layout promises this with ``keys_by_position``.

FlexAttention ran that case at 74 TFLOP/s on the H200 (all-hit 32k: 576 queries over 32.8k keys,
1.98 ms per layer, against 0.656 ms here; the request 266.4 against 210.9 ms): its 128-row query
tiles of one head give few programs, each walking all the keys. Here each program holds
``BLOCK_Q`` consecutive queries times the ``GROUP`` query heads of one kv head (GQA packed into
the rows: a seam of 8 queries x 8 heads is one 64-row tile, which reads each key tile once for
all of them) and one ``split`` of the keys; a second step merges the splits by their
log-sum-exp. Blocks of queries never cross a request; key tiles past a block's last position
are not visited.

The reference is :func:`hypic.ops.attention.varlen_attention` with ``impl="reference"``.
Triton is imported lazily (the kernel runs on CUDA tensors, and on CPU tensors only under
Triton's interpreter, :func:`hypic.envs.triton_interpret`); the block table is built on the host
from host ``cu_seqlens`` and cached per layout key (the attention layers of one forward share it).
"""

from __future__ import annotations

import math
import weakref
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from hypic import envs

# Query rows (queries x heads of a group) per program. Every program of a query block reads every
# key tile its block sees, from L2 (a layer's K/V of a 32k prompt, 67 MB, is beyond it only once):
# at the all-hit 32k shape 72 blocks of 64 rows (one seam's 8 queries x 8 heads each) read ~2.4 GB
# per layer, so 128 rows (two seams; the first sees a few masked keys past its position) halve that
# traffic at twice the registers per program. H200, interleaved in one process: all-hit 32k 60.53
# ms p50 with 128 rows against 62.29 with 64, 8k 33.62 against 33.90 (docs/decisions.md).
ROWS_PER_PROGRAM = 128
MAX_GROUP = 64  # query heads per kv head, at most
BLOCK_N = 64  # split lengths are multiples of this (and of every tuned key step)
MIN_SPLIT = 2048  # keys per program, at least
MAX_SPLITS = 16  # splits per query block, at most
# fp32 partial outputs of all splits: fewer splits beyond this (one split always runs, so a large
# live set - cold segments among cached ones - takes one split, like one flash-attention pass,
# written straight into the output)
MAX_PARTIAL_BYTES = 256 << 20
_DTYPES = (torch.float16, torch.bfloat16)
_KERNEL = None


def _build_kernel():
    """The kernel, autotuned over key step and warps on GPU (keyed on head dims and group); one
    fixed config under the interpreter, which cannot benchmark. A sweep of fixed configurations
    (key step 32-128, 4 or 8 warps, 2 or 3 stages, 512-2048 keys per split) found none faster than
    the autotuned pick at the all-hit 32k shape: 0.5275 ms a layer with its merge (H200)."""
    import triton

    from hypic.ops._attention_split_kernel import split_kv_prefix_attention_kernel as kernel

    if envs.triton_interpret():
        return kernel, {"BLOCK_N": BLOCK_N, "num_warps": 4, "num_stages": 1, "WHILE_LOOP": True}
    configs = [
        triton.Config({"BLOCK_N": 64}, num_warps=4, num_stages=2),
        triton.Config({"BLOCK_N": 64}, num_warps=8, num_stages=2),
        triton.Config({"BLOCK_N": 32}, num_warps=4, num_stages=3),
        triton.Config({"BLOCK_N": 64}, num_warps=8, num_stages=3),
        triton.Config({"BLOCK_N": 32}, num_warps=8, num_stages=3),
    ]
    # o_part / lse_part are fully rewritten by every launch, so benchmarking runs are harmless
    return triton.autotune(configs=configs, key=["D", "DV", "GROUP", "BLOCK_Q"])(kernel), {"WHILE_LOOP": False}


def split_supported(q: torch.Tensor, v: torch.Tensor, num_kv_heads: int) -> bool:
    """Host-only test of what the kernel handles: CUDA (or the Triton interpreter) fp16/bf16,
    power-of-two head dims in [16, 256], a power-of-two number of query heads per kv head <= 64."""
    if not (q.is_cuda or (q.device.type == "cpu" and envs.triton_interpret())) or q.dtype not in _DTYPES:
        return False
    group = q.shape[1] // num_kv_heads
    dims_ok = all(16 <= d <= 256 and d & (d - 1) == 0 for d in (q.shape[2], v.shape[2]))
    return dims_ok and group & (group - 1) == 0 and group <= MAX_GROUP


def split_blocks_host(cu_q_host: Sequence[int], cu_k_host: Sequence[int], block_q: int) -> np.ndarray:
    """``[NB, 4]`` int32 rows (first query, queries, first key, keys): every request's queries cut
    into blocks of at most ``block_q``, in order."""
    cu_q = np.asarray(cu_q_host, dtype=np.int64)
    cu_k = np.asarray(cu_k_host, dtype=np.int64)
    num_q = np.diff(cu_q)
    per_req = (num_q + block_q - 1) // block_q
    req = np.repeat(np.arange(num_q.size), per_req)
    within = np.arange(req.size) - np.repeat(np.cumsum(per_req) - per_req, per_req)
    first = cu_q[req] + within * block_q
    count = np.minimum(block_q, cu_q[req + 1] - first)
    return np.stack([first, count, cu_k[req], cu_k[req + 1] - cu_k[req]], axis=1).astype(np.int32)


# (weak layout key, shapes, (blocks on device, number of splits, split length)), or None
_plan_cache: Optional[Tuple[weakref.ref, tuple, tuple]] = None


def _plan(cu_q_host, cu_k_host, block_q: int, device, layout_key, shape_key, partial_bytes_per_split: int):
    global _plan_cache
    if layout_key is not None and _plan_cache is not None:
        key_ref, held, plan = _plan_cache
        if key_ref() is layout_key and held == shape_key:
            return plan
    blocks = split_blocks_host(cu_q_host, cu_k_host, block_q)
    max_keys = int(blocks[:, 3].max()) if blocks.size else 0
    by_memory = max(1, MAX_PARTIAL_BYTES // max(1, partial_bytes_per_split))
    num_splits = max(1, min(MAX_SPLITS, by_memory, math.ceil(max_keys / MIN_SPLIT)))
    split = max(BLOCK_N, math.ceil(max(max_keys, 1) / num_splits / BLOCK_N) * BLOCK_N)
    table = torch.from_numpy(blocks)
    if device.type == "cuda":
        table = table.pin_memory().to(device, non_blocking=True)
    plan = (table, num_splits, split)
    _plan_cache = (weakref.ref(layout_key), shape_key, plan) if layout_key is not None else None
    return plan


def split_prefix_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    positions_q: torch.Tensor,
    cu_seqlens_q_host: Sequence[int],
    cu_seqlens_k_host: Sequence[int],
    scale: float,
    layout_key: Optional[object] = None,
) -> torch.Tensor:
    """Query ``i`` of request ``b`` attends to keys ``cu_k[b] .. cu_k[b] + positions_q[i]``.

    q ``[Tq, Hq, D]``, k ``[Tk, Hkv, D]``, v ``[Tk, Hkv, DV]``; returns ``[Tq, Hq, DV]`` in q's
    dtype. The caller guarantees ``0 <= positions_q[i] < Lk[b]`` (a live query is one of its
    request's keys) and that :func:`split_supported` holds; nothing is read back to check it (a
    position past the keys sees them all, a negative one none and yields 0, where the reference
    raises)."""
    global _KERNEL
    num_q, num_heads, head_dim = q.shape
    num_kv_heads, value_dim = k.shape[1], v.shape[2]
    out = q.new_empty(num_q, num_heads, value_dim)
    if num_q == 0:
        return out
    group = num_heads // num_kv_heads
    block_q = max(1, ROWS_PER_PROGRAM // group)
    if _KERNEL is None:
        _KERNEL = _build_kernel()
    kernel, fixed = _KERNEL
    shape_key = (len(cu_seqlens_q_host), num_q, k.shape[0], group, block_q)
    blocks, num_splits, split = _plan(cu_seqlens_q_host, cu_seqlens_k_host, block_q, q.device, layout_key, shape_key,
                                      num_q * num_heads * (value_dim + 1) * 4)
    # one split: its normalised output is the result, stored straight into ``out`` (a large live
    # set keeps no fp32 copy of it); several: fp32 partials, merged by their log-sum-exp
    o_part = out if num_splits == 1 else torch.empty(num_splits, num_q, num_heads, value_dim, device=q.device,
                                                     dtype=torch.float32)
    lse_part = torch.empty(num_splits, num_q, num_heads, device=q.device, dtype=torch.float32)
    grid = (blocks.shape[0], num_kv_heads, num_splits)
    kernel[grid](
        q.contiguous(), k.contiguous(), v.contiguous(), positions_q.to(torch.int64).contiguous(), blocks,
        o_part, lse_part, float(scale) * math.log2(math.e), split, num_q,
        HQ=num_heads, HKV=num_kv_heads, D=head_dim, DV=value_dim, GROUP=group, BLOCK_Q=block_q, **fixed,
    )
    if num_splits == 1:
        return out
    return merge_splits_triton(o_part, lse_part, out)


def merge_splits_torch(o_part: torch.Tensor, lse_part: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The reference merge of split partials into ``out`` (``o_part [S, ..., DV]`` fp32,
    ``lse_part [S, ...]`` log2-sum-exp): weights ``2^(lse_s - max)``, a split that saw no key
    weighs 0, a row no split saw (a position outside the caller's contract) comes out 0, as with
    one split. ``o_part`` is scaled in place (no second buffer of partials)."""
    top = lse_part.amax(0)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weight = torch.exp2(lse_part - top)
    merged = o_part.mul_(weight.unsqueeze(-1)).sum(0) / weight.sum(0).clamp_min(1e-30).unsqueeze(-1)
    return out.copy_(merged)


MERGE_BLOCK_ROWS = 16


def merge_splits_triton(o_part: torch.Tensor, lse_part: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """:func:`merge_splits_torch` in one Triton launch that reads the partials once (the torch
    merge's scale, sum and divide were ~11 launches and three passes over ``o_part``: 1.7 ms of
    an all-hit 32k request's GPU time over 10 layers on the H200). ``out`` must be
    contiguous with ``o_part[0]``'s shape."""
    num_splits, value_dim = o_part.shape[0], o_part.shape[-1]
    num_rows = o_part[0].numel() // value_dim
    if not out.is_contiguous() or tuple(out.shape) != tuple(o_part.shape[1:]):
        raise ValueError(f"out must be contiguous of shape {tuple(o_part.shape[1:])}, got {tuple(out.shape)}")
    import triton

    from hypic.ops._attention_split_kernel import merge_splits_kernel

    merge_splits_kernel[(triton.cdiv(num_rows, MERGE_BLOCK_ROWS),)](
        o_part.contiguous(), lse_part.contiguous(), out, num_rows, NUM_SPLITS=num_splits, DV=value_dim,
        BLOCK_R=MERGE_BLOCK_ROWS, num_warps=4)
    return out


__all__ = ["merge_splits_torch", "merge_splits_triton", "split_prefix_attention", "split_supported",
           "split_blocks_host"]
