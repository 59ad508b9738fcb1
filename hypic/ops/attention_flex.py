"""Varlen causal-by-position attention through FlexAttention, with no host synchronisation.

Same contract as :func:`hypic.ops.attention.varlen_attention` (the reference loops over
sequences and query blocks and reads lengths / masks back to the host). Here the whole packed
batch is **one** flex-attention call: queries ``[1, Hq, Tq, D]`` against keys ``[1, Hkv, Tk, D]``
(GQA via ``enable_gqa``), with the mask

    allowed(i, j) = seq_q[i] == seq_k[j]  and  pos_k[j] <= pos_q[i]

given as a ``mask_mod`` over per-token sequence ids and positions, plus a :class:`BlockMask`
built here from per-tile summaries instead of ``create_block_mask`` (which evaluates the mask on
all ``Tq x Tk`` pairs - gigabytes at 32k tokens - before reducing it to tiles):

* a (query tile, key tile) pair may hold an allowed pair only if the tiles' sequence-id ranges
  overlap and the key tile's smallest position is ``<=`` the query tile's largest one: such
  tiles are visited, with ``mask_mod`` applied (*partial*);
* it is *full* (visited without ``mask_mod``) only if both tiles lie inside one and the same
  sequence, are complete (no tail past ``Tq`` / ``Tk``), and the key tile's largest position is
  ``<=`` the query tile's smallest.

Both tests are conservative (never skip an allowed pair, never drop the mask where a pair is
forbidden), cost ``O(Tq + Tk + tiles)`` and run on the device. The per-token tensors captured
by ``mask_mod`` are padded to whole tiles with sequence ids that match nothing, so the kernel can
evaluate the mask on tail rows without reading out of bounds.

flex_attention is only fast when compiled: on CUDA the call goes through
``torch.compile(flex_attention, dynamic=True)`` - token counts change with every batch, and a
static compile per (Tq, Tk) would recompile each time. ``HYPIC_FLEX_COMPILE`` picks the mode:
``dynamic`` (default), ``static`` (``dynamic=False``: one compile per shape) or ``auto``
(dynamo's default: static first, dynamic after the first recompile). On CPU it runs eagerly
(an unfused reference that materialises scores - tests only); CPU inductor (torch 2.13) fails to
build the flex template with dynamic shapes, so compiled CPU runs need ``static``.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, Optional, Tuple

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

# flex_attention's default sparse tile (rows and columns).
FLEX_BLOCK_SIZE = 128
_INT_BIG = torch.iinfo(torch.int64).max
_INT_SMALL = torch.iinfo(torch.int64).min
_COMPILE_MODES = {"dynamic": True, "static": False, "auto": None}
_compiled_flex: Dict[str, Callable] = {}


def _flex_fn(device: torch.device, use_compile: Optional[bool]) -> Callable:
    """Eager flex_attention, or the compiled one for the ``HYPIC_FLEX_COMPILE`` mode (cached)."""
    if use_compile is None:
        use_compile = device.type == "cuda"
    if not use_compile:
        return flex_attention
    mode = os.environ.get("HYPIC_FLEX_COMPILE", "dynamic")
    if mode not in _COMPILE_MODES:
        raise ValueError(f"HYPIC_FLEX_COMPILE must be one of {tuple(_COMPILE_MODES)}, got {mode!r}")
    if mode not in _compiled_flex:
        _compiled_flex[mode] = torch.compile(flex_attention, dynamic=_COMPILE_MODES[mode])
    return _compiled_flex[mode]


def _device_check(ok: torch.Tensor, message: str) -> None:
    """Raise on a failed value check: asynchronously on CUDA (no host sync), ValueError on CPU."""
    if ok.is_cuda:
        torch._assert_async(ok, message)
    elif not bool(ok):
        raise ValueError(message)


def _token_sequence_ids(cu_seqlens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Sequence index of every packed token (empty sequences own no token); int64 ``[num_tokens]``."""
    tokens = torch.arange(num_tokens, device=cu_seqlens.device, dtype=torch.int64)
    return torch.searchsorted(cu_seqlens[1:].to(torch.int64).contiguous(), tokens, right=True)


def _pad_to_tiles(values: torch.Tensor, num_tiles: int, block: int, fill: int) -> torch.Tensor:
    pad = num_tiles * block - values.numel()
    if pad == 0:
        return values
    return torch.cat([values, values.new_full((pad,), fill)])


def _tile_min_max(values: torch.Tensor, num_tiles: int, block: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-tile min and max of ``values`` (the tail tile ignores its padding)."""
    lo = _pad_to_tiles(values, num_tiles, block, _INT_BIG).view(num_tiles, block).amin(dim=1)
    hi = _pad_to_tiles(values, num_tiles, block, _INT_SMALL).view(num_tiles, block).amax(dim=1)
    return lo, hi


def _ordered(tiles: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Boolean ``[nQ, nK]`` tile matrix -> (counts ``[1, 1, nQ]``, indices ``[1, 1, nQ, nK]``) int32,
    the visited key tiles of each query tile first, in increasing order."""
    counts = tiles.sum(dim=-1, dtype=torch.int32)
    indices = torch.argsort(tiles.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return counts[None, None], indices[None, None]


def build_varlen_block_mask(
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    positions_q: torch.Tensor,
    positions_k: torch.Tensor,
    *,
    block_size: int = FLEX_BLOCK_SIZE,
) -> BlockMask:
    """The :class:`BlockMask` of causal-by-position attention over packed varlen sequences.

    Arguments as :func:`hypic.ops.attention.varlen_attention` (already validated by the caller).
    Built on the tensors' device without host synchronisation; depends only on the layout, so
    one mask serves every attention layer of a forward.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    num_q, num_k = positions_q.numel(), positions_k.numel()
    device = positions_q.device
    tiles_q = max(1, -(-num_q // block_size))
    tiles_k = max(1, -(-num_k // block_size))
    seq_q = _token_sequence_ids(cu_seqlens_q, num_q)
    seq_k = _token_sequence_ids(cu_seqlens_k, num_k)
    pos_q, pos_k = positions_q.to(torch.int64), positions_k.to(torch.int64)

    q_seq_lo, q_seq_hi = _tile_min_max(seq_q, tiles_q, block_size)
    k_seq_lo, k_seq_hi = _tile_min_max(seq_k, tiles_k, block_size)
    q_pos_lo, q_pos_hi = _tile_min_max(pos_q, tiles_q, block_size)
    k_pos_lo, k_pos_hi = _tile_min_max(pos_k, tiles_k, block_size)
    visited = (
        (q_seq_lo[:, None] <= k_seq_hi[None, :])
        & (k_seq_lo[None, :] <= q_seq_hi[:, None])
        & (k_pos_lo[None, :] <= q_pos_hi[:, None])
    )
    q_complete = torch.arange(1, tiles_q + 1, device=device) * block_size <= num_q
    k_complete = torch.arange(1, tiles_k + 1, device=device) * block_size <= num_k
    one_sequence = (
        (q_seq_lo == q_seq_hi)[:, None]
        & (k_seq_lo == k_seq_hi)[None, :]
        & (q_seq_lo[:, None] == k_seq_lo[None, :])
    )
    full = (
        visited
        & one_sequence
        & (k_pos_hi[None, :] <= q_pos_lo[:, None])
        & q_complete[:, None]
        & k_complete[None, :]
    )
    partial = visited & ~full

    # Captured by mask_mod; padded so tail rows/columns index in bounds and never match.
    seq_q_pad = _pad_to_tiles(seq_q, tiles_q, block_size, -1)
    seq_k_pad = _pad_to_tiles(seq_k, tiles_k, block_size, -2)
    pos_q_pad = _pad_to_tiles(pos_q, tiles_q, block_size, 0)
    pos_k_pad = _pad_to_tiles(pos_k, tiles_k, block_size, 0)

    def mask_mod(b, h, q_idx, kv_idx):
        return (seq_q_pad[q_idx] == seq_k_pad[kv_idx]) & (pos_k_pad[kv_idx] <= pos_q_pad[q_idx])

    kv_num_blocks, kv_indices = _ordered(partial)
    full_kv_num_blocks, full_kv_indices = _ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num_blocks,
        kv_indices,
        full_kv_num_blocks,
        full_kv_indices,
        BLOCK_SIZE=block_size,
        mask_mod=mask_mod,
        seq_lengths=(num_q, num_k),
    )


def check_varlen_values(
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    positions_q: torch.Tensor,
    positions_k: torch.Tensor,
) -> None:
    """Value checks of the varlen layout on the device (async asserts on CUDA, ValueError on CPU):
    cu_seqlens start at 0, end at the token counts, never decrease; every query has a key of its
    sequence at or before its position (a fully masked row would silently come out as zeros)."""
    num_q, num_k = positions_q.numel(), positions_k.numel()
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, num_q), ("cu_seqlens_k", cu_seqlens_k, num_k)):
        ok = (cu[0] == 0) & (cu[-1] == total) & (cu[1:] >= cu[:-1]).all()
        _device_check(ok, f"{name} must start at 0, end at {total} and be non-decreasing")
    if num_q == 0:
        return
    num_seqs = cu_seqlens_q.numel() - 1
    seq_q = _token_sequence_ids(cu_seqlens_q, num_q)
    seq_k = _token_sequence_ids(cu_seqlens_k, num_k)
    first_key = torch.full((num_seqs,), _INT_BIG, dtype=torch.int64, device=positions_k.device)
    first_key.scatter_reduce_(0, seq_k, positions_k.to(torch.int64), reduce="amin", include_self=True)
    ok = (positions_q.to(torch.int64) >= first_key.index_select(0, seq_q)).all()
    _device_check(ok, "a query has no key at or before its position")


def flex_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    block_mask: BlockMask,
    scale: float,
    use_compile: Optional[bool] = None,
) -> torch.Tensor:
    """One flex-attention call over the packed batch: q ``[Tq, Hq, D]``, k ``[Tk, Hkv, D]``,
    v ``[Tk, Hkv, Dv]`` -> ``[Tq, Hq, Dv]`` (contiguous, q's dtype).

    ``block_mask`` from :func:`build_varlen_block_mask` for the same layout; shapes are validated
    by :func:`hypic.ops.attention.varlen_attention`. ``use_compile``: None = compile on CUDA only.
    """
    if block_mask.seq_lengths != (q.shape[0], k.shape[0]):
        raise ValueError(
            f"block_mask is for (Tq, Tk) = {block_mask.seq_lengths}, got ({q.shape[0]}, {k.shape[0]})"
        )
    if q.shape[0] == 0:
        return q.new_empty(0, q.shape[1], v.shape[2])
    fn = _flex_fn(q.device, use_compile)
    # The main Triton kernel always: with fewer than 128 queries "AUTO" picks flex-decoding, whose
    # template has no valid config for 256-wide heads in bf16 on the H200 (inductor's
    # NoValidChoicesError, seen on torch 2.11 for a 64-token question over 32k cached keys).
    options = {"BACKEND": "TRITON"} if q.is_cuda else None
    out = fn(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        block_mask=block_mask,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
        kernel_options=options,
    )
    return out[0].transpose(0, 1).contiguous()
