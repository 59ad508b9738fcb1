"""Reference varlen causal attention by absolute position, and the dispatch to the GPU kernels.

Queries of N sequences are packed ``[Tq, Hq, D]``; each sequence's keys are packed ``[Tk, Hkv, D]``
(cached + live, in any order). A query at position ``p`` attends to the keys of **its own sequence**
whose position is ``<= p``. Positions, not indices, define causality, so cached keys of a reused
segment and live keys interleave freely (architecture §2).

Memory stays bounded: one sequence at a time, queries in blocks, one ``[block, keys]`` boolean
mask per block handed to ``scaled_dot_product_attention`` - never an ``n x n`` mask over the batch.

Dispatch (``impl="auto"``), by what the caller vouches for about the layout and by the inputs'
device, dtype and head dims:

* ``index_causal`` (every sequence's keys are positions ``0..Lk-1`` in order and its queries the
  last ``Lq`` of them, known on the host: :func:`hypic.ops.attention_flash.index_causal_layout`):
  a square causal prefill of a few long sequences with host ``cu_seqlens`` takes cuDNN's kernel
  (:mod:`hypic.ops.attention_cudnn`), other such layouts FlashAttention's varlen kernel
  (:mod:`hypic.ops.attention_flash`), on CUDA fp16/bf16;
* ``keys_by_position`` (keys are positions ``0..Lk-1`` in order, queries anywhere among them: a
  PIC request with cached segments) with host ``cu_seqlens``: the split-KV kernel
  (:mod:`hypic.ops.attention_split`) on CUDA fp16/bf16 with power-of-two head dims and query heads
  per kv head. It replaced FlexAttention there: all-hit 32k request 210.9 against 266.4 ms, 0.656
  against 1.980 ms per attention layer (H200; docs/decisions.md);
* everything else (CPU tensors, fp32/fp64, other layouts): this reference.

``impl="reference"`` runs the reference anywhere (the oracle of the kernels' tests, and a
pure-PyTorch path for debugging); ``"flash"``, ``"cudnn"`` and ``"split"`` force a kernel and raise
``ValueError`` where it cannot run.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from hypic.ops.attention_cudnn import cudnn_square_causal_attention, cudnn_square_causal_supported
from hypic.ops.attention_flash import flash_supported, flash_varlen_causal_attention
from hypic.ops.attention_split import split_prefix_attention, split_supported

_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Elements of one [Hq, block, keys] score tile; bounds memory of the math backend on CPU.
_MAX_TILE_ELEMENTS = 1 << 24
# On CUDA the fused SDPA kernels never materialise scores: only the [block, keys] mask counts.
_MAX_CUDA_MASK_ELEMENTS = 1 << 27
IMPLS = ("auto", "reference", "flash", "cudnn", "split")


def _check_cu_shape(name: str, cu: torch.Tensor) -> None:
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be a 1-D integer tensor [N+1]")
    if cu.numel() < 1:
        raise ValueError(f"{name} must have at least one entry")


def _check_cu(name: str, cu: torch.Tensor, total: int) -> None:
    """Value checks of the reference path (host reads: the reference syncs anyway)."""
    if int(cu[0]) != 0 or int(cu[-1]) != total:
        raise ValueError(f"{name} must start at 0 and end at {total}, got {cu.tolist()}")
    if bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"{name} must be non-decreasing, got {cu.tolist()}")


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    positions_q: torch.Tensor,
    positions_k: torch.Tensor,
    scale: Optional[float] = None,
    block_size: Optional[int] = None,
    impl: str = "auto",
    index_causal: bool = False,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    layout_key: Optional[object] = None,
    cu_seqlens_q_host: Optional[Sequence[int]] = None,
    cu_seqlens_k_host: Optional[Sequence[int]] = None,
    keys_by_position: bool = False,
) -> torch.Tensor:
    """Causal-by-position GQA attention over packed varlen sequences.

    q ``[Tq, Hq, D]``, k ``[Tk, Hkv, D]``, v ``[Tk, Hkv, Dv]`` (``Hq % Hkv == 0``: query head h
    reads kv head ``h // (Hq // Hkv)``); ``cu_seqlens_q`` / ``cu_seqlens_k`` ``[N+1]``;
    ``positions_q [Tq]``, ``positions_k [Tk]`` absolute positions. Returns ``[Tq, Hq, Dv]`` in q's
    dtype. Every query must see at least one key (itself, normally). ``block_size``: query rows
    per step of the reference. ``impl``: ``"auto"`` (the module's dispatch), ``"reference"``,
    ``"flash"``, ``"cudnn"`` or ``"split"`` (ValueError where the kernel cannot run).
    ``index_causal``: the caller vouches that every sequence's keys are positions ``0..Lk-1`` in
    order and its queries the last ``Lq`` of them in order (enables ``"flash"`` and ``"cudnn"``);
    ``max_seqlen_q`` / ``max_seqlen_k``: host ints for the flash path (read back - a sync - if
    omitted). ``layout_key``: any object the caller keeps alive while the layout (cu_seqlens,
    positions) stays the same - a forward context passes itself - so the split-KV path builds its
    block table once per forward instead of once per layer (None: every call).
    ``cu_seqlens_q_host`` / ``cu_seqlens_k_host``: host copies of the cumulative lengths; with
    ``index_causal`` they let a square causal prefill (each sequence's queries are all its keys,
    a few long sequences) take cuDNN's kernel (:mod:`hypic.ops.attention_cudnn`), about twice
    flash's rate on Hopper at head dim 256.
    ``keys_by_position``: the caller vouches that every sequence's keys are its positions
    ``0..Lk-1`` in order (queries anywhere among them, e.g. a cached request's seams); with host
    ``cu_seqlens`` CUDA fp16/bf16 then takes the split-KV kernel (:mod:`hypic.ops.attention_split`).
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a rank-3 tensor [T, H, D], got {getattr(t, 'shape', t)}")
        if t.dtype not in _FLOAT:
            raise ValueError(f"{name} must be floating point, got {t.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    num_q, num_heads, head_dim = q.shape
    num_k, num_kv_heads, _ = k.shape
    if k.shape[2] != head_dim:
        raise ValueError(f"k head dim {k.shape[2]} != q head dim {head_dim}")
    if v.shape[0] != num_k or v.shape[1] != num_kv_heads:
        raise ValueError(f"v shape {tuple(v.shape)} must match k on tokens and heads {tuple(k.shape[:2])}")
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(f"query heads ({num_heads}) must be a multiple of kv heads ({num_kv_heads})")
    _check_cu_shape("cu_seqlens_q", cu_seqlens_q)
    _check_cu_shape("cu_seqlens_k", cu_seqlens_k)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(
            f"cu_seqlens_q has {cu_seqlens_q.numel() - 1} sequences, cu_seqlens_k {cu_seqlens_k.numel() - 1}"
        )
    for name, pos, n in (("positions_q", positions_q, num_q), ("positions_k", positions_k, num_k)):
        if not isinstance(pos, torch.Tensor) or pos.shape != (n,) or pos.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be an integer tensor of shape [{n}]")
    if scale is None:
        scale = head_dim**-0.5
    if block_size is not None and block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must share a device, got {q.device}, {k.device}, {v.device}")

    square_ok = (
        index_causal and cu_seqlens_q_host is not None and cu_seqlens_k_host is not None
        and cudnn_square_causal_supported(q, v, cu_seqlens_q_host, cu_seqlens_k_host)
    )
    split_ok = (
        keys_by_position and cu_seqlens_q_host is not None and cu_seqlens_k_host is not None
        and split_supported(q, v, num_kv_heads)
    )
    if impl == "split" and not split_ok:
        raise ValueError(
            "impl='split' needs keys_by_position=True, host cu_seqlens and CUDA fp16/bf16 with "
            "power-of-two head dims and query heads per kv head (see hypic.ops.attention_split)"
        )
    if impl == "cudnn" and not square_ok:
        raise ValueError(
            "impl='cudnn' needs index_causal=True, host cu_seqlens with equal query and key lengths "
            "per sequence, and CUDA sm90+ fp16/bf16 (see hypic.ops.attention_cudnn)"
        )
    if impl == "auto":
        if square_ok:
            impl = "cudnn"
        elif index_causal and flash_supported(q, v):
            impl = "flash"
        elif split_ok and q.is_cuda:
            impl = "split"
        else:
            impl = "reference"
    if impl == "cudnn":
        out = cudnn_square_causal_attention(q, k, v, cu_seqlens_host=cu_seqlens_q_host, scale=scale)
        if out is not None:
            return out
        impl = "flash"  # cuDNN refused (warned once): same layout, FlashAttention's kernel
    if impl == "flash":
        if not index_causal:
            raise ValueError("impl='flash' is causal by index: pass index_causal=True for a layout it is valid for")
        if max_seqlen_q is None:
            max_seqlen_q = int(torch.diff(cu_seqlens_q).max()) if num_q else 0
        if max_seqlen_k is None:
            max_seqlen_k = int(torch.diff(cu_seqlens_k).max()) if num_k else 0
        return flash_varlen_causal_attention(
            q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, scale=scale,
        )
    if impl == "split":
        return split_prefix_attention(q, k, v, positions_q=positions_q, cu_seqlens_q_host=cu_seqlens_q_host,
                                      cu_seqlens_k_host=cu_seqlens_k_host, scale=scale, layout_key=layout_key)
    _check_cu("cu_seqlens_q", cu_seqlens_q, num_q)
    _check_cu("cu_seqlens_k", cu_seqlens_k, num_k)
    out = q.new_empty(num_q, num_heads, v.shape[2])
    cu_q = cu_seqlens_q.tolist()
    cu_k = cu_seqlens_k.tolist()
    groups = num_heads // num_kv_heads
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        if q1 == q0:
            continue
        if k1 == k0:
            raise ValueError(f"sequence {i} has queries but no keys")
        # [H, L, D] layout for SDPA; kv heads expanded for GQA (view + reshape, one copy).
        keys = _expand_heads(k[k0:k1], groups)
        values = _expand_heads(v[k0:k1], groups)
        pos_k = positions_k[k0:k1]
        keys_sorted = bool((pos_k[1:] >= pos_k[:-1]).all()) if k1 - k0 > 1 else True
        if block_size is not None:
            block = block_size
        elif q.is_cuda:
            block = max(1, _MAX_CUDA_MASK_ELEMENTS // (k1 - k0))
        else:
            block = max(1, _MAX_TILE_ELEMENTS // (num_heads * (k1 - k0)))
        for b0 in range(q0, q1, block):
            b1 = min(q1, b0 + block)
            pos_q = positions_q[b0:b1]
            limit = k1 - k0
            if keys_sorted:
                # Keys after the block's last visible position can never be attended: trim them.
                limit = int(torch.searchsorted(pos_k, pos_q.max(), right=True))
                if limit == 0:
                    raise ValueError(f"a query of sequence {i} has no key at or before its position")
            mask = pos_k[None, :limit] <= pos_q[:, None]  # [block, keys]
            if not bool(mask.any(-1).all()):
                raise ValueError(f"a query of sequence {i} has no key at or before its position")
            o = F.scaled_dot_product_attention(
                q[b0:b1].transpose(0, 1),
                keys[:, :limit],
                values[:, :limit],
                attn_mask=mask,
                scale=scale,
            )
            out[b0:b1] = o.transpose(0, 1)
    return out


def _expand_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[L, Hkv, D] -> [Hkv * groups, L, D] with head h = kv head h // groups."""
    x = x.transpose(0, 1)
    if groups == 1:
        return x
    hkv, length, dim = x.shape
    return x[:, None].expand(hkv, groups, length, dim).reshape(hkv * groups, length, dim)
