"""Flash-attention varlen path for layouts where causal-by-position equals causal-by-index.

FlashAttention's varlen kernel (``torch.ops.aten._flash_attention_forward`` with ``cum_seq_q`` /
``cum_seq_k``, CUDA only) is causal **by index**, aligned bottom-right: query ``i`` of a
sequence with ``Lq`` queries and ``Lk`` keys sees keys ``j <= i + Lk - Lq``. That is exactly
causal-by-position (:func:`hypic.ops.attention.varlen_attention`) when, in every sequence,

* the keys are positions ``0 .. Lk-1`` stored in order, and
* the queries are positions ``Lk-Lq .. Lk-1`` stored in order (the last ``Lq`` tokens),

the common cases of a full recompute and of a PIC prompt whose tokens are all live. Whether a
layout qualifies depends only on the layout, so the engine decides it once on the host when it
builds the layout (:func:`index_causal_layout`, which reads positions back) and passes
``index_causal=True`` with the maximum lengths to ``varlen_attention``; the op itself never
inspects values. No compile step, no block mask; GQA is native to the kernel.
"""

from __future__ import annotations

import torch

_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_MAX_HEAD_DIM = 256


def index_causal_layout(
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    positions_q: torch.Tensor,
    positions_k: torch.Tensor,
) -> bool:
    """True when every sequence's keys are positions ``0..Lk-1`` in order and its queries the
    last ``Lq`` of them in order (so index-causal == position-causal). Host-side: synchronises;
    call once per layout, not per layer."""
    cu_q, cu_k = cu_seqlens_q.cpu().long(), cu_seqlens_k.cpu().long()
    pos_q, pos_k = positions_q.cpu().long(), positions_k.cpu().long()
    if cu_q.numel() != cu_k.numel():
        raise ValueError(f"cu_seqlens_q has {cu_q.numel() - 1} sequences, cu_seqlens_k {cu_k.numel() - 1}")
    len_q, len_k = torch.diff(cu_q), torch.diff(cu_k)
    if bool((len_q > len_k).any()):
        return False
    seq_q = torch.repeat_interleave(torch.arange(len_q.numel()), len_q)
    seq_k = torch.repeat_interleave(torch.arange(len_k.numel()), len_k)
    index_k = torch.arange(pos_k.numel()) - cu_k[seq_k]
    index_q = torch.arange(pos_q.numel()) - cu_q[seq_q]
    keys_in_order = torch.equal(pos_k, index_k)
    queries_last = torch.equal(pos_q, index_q + (len_k - len_q)[seq_q])
    return keys_in_order and queries_last


def flash_supported(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Host-only: CUDA, fp16/bf16, equal q/v head dims, a multiple of 8 and at most 256."""
    head_dim = q.shape[2]
    return (
        q.is_cuda
        and q.dtype in _FLASH_DTYPES
        and v.shape[2] == head_dim
        and head_dim % 8 == 0
        and head_dim <= _MAX_HEAD_DIM
    )


def flash_varlen_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    scale: float,
) -> torch.Tensor:
    """Bottom-right causal varlen flash attention: q ``[Tq, Hq, D]``, k/v ``[Tk, Hkv, D]`` ->
    ``[Tq, Hq, D]``. Only valid for layouts accepted by :func:`index_causal_layout` (the caller,
    ``varlen_attention(index_causal=True)``, vouches for it); shapes validated there."""
    if not flash_supported(q, v):
        raise ValueError(
            f"flash varlen path needs CUDA fp16/bf16 with equal q/v head dims <= {_MAX_HEAD_DIM}, "
            f"got {q.dtype} on {q.device}, head dims {q.shape[2]}/{v.shape[2]}"
        )
    if q.shape[0] == 0:
        return q.new_empty(0, q.shape[1], v.shape[2])
    out = torch.ops.aten._flash_attention_forward(
        q,
        k,
        v,
        cu_seqlens_q.to(device=q.device, dtype=torch.int32),
        cu_seqlens_k.to(device=q.device, dtype=torch.int32),
        max_seqlen_q,
        max_seqlen_k,
        0.0,  # dropout
        True,  # causal, bottom-right aligned per sequence
        False,  # debug mask
        scale=scale,
    )[0]
    return out
