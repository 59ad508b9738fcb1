"""cuDNN path for square causal prefill: every sequence's queries are all of its keys.

A cold prefill (``full_recompute``, a cold PIC request with every token live) attends each
sequence's tokens to themselves, causally. On the H200 at Qwen3.5-35B-A3B's attention shape (16
query heads, 2 KV heads, head dim 256, bf16) PyTorch's cuDNN SDPA backend runs that at 640 TFLOP/s
where FlashAttention-2's varlen kernel reaches 316: at 32k tokens, 13.7 against 27.8 ms per layer.

cuDNN's varlen entry point (``aten._cudnn_attention_forward`` with cumulative lengths) measured
2-40x slower than flash there and gave wrong results with two sequences, so this path calls the
dense SDPA backend once per sequence, on ``[1, H, L, D]`` views of the packed tensors; it is
meant for a few long sequences, and :func:`cudnn_square_causal_supported` says when it applies.
SDPA's ``is_causal`` is top-left aligned, which equals position-causal only when a sequence's
queries are exactly its keys (positions ``0..L-1`` in order): the caller vouches for the order
(``index_causal``) and this module checks the equal lengths on the host.

KV heads are expanded for GQA (one copy per layer, ~0.2 ms at 32k): cuDNN's grouped-query
support in SDPA varies across PyTorch releases, the expanded form does not.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

_CUDNN_DTYPES = (torch.float16, torch.bfloat16)
_MAX_HEAD_DIM = 256
# Below this many tokens per sequence one flash varlen launch over the batch costs less than a
# cuDNN call per sequence; above it cuDNN is ~2x faster (8k: 0.91 vs 1.92 ms, 32k: 13.7 vs 27.8).
MIN_SEQUENCE_TOKENS = 2048
MAX_SEQUENCES = 8

# Set when cuDNN refused a call (old cuDNN, unsupported GPU): later calls go to flash.
_disabled_reason: str | None = None


def cudnn_square_causal_supported(
    q: torch.Tensor, v: torch.Tensor, cu_seqlens_q_host: Sequence[int], cu_seqlens_k_host: Sequence[int]
) -> bool:
    """Host-only: CUDA sm90+, fp16/bf16, equal q/v head dims (multiple of 8, <= 256), at most
    ``MAX_SEQUENCES`` sequences, each with as many queries as keys and at least
    ``MIN_SEQUENCE_TOKENS`` of them."""
    if _disabled_reason is not None or not q.is_cuda or q.dtype not in _CUDNN_DTYPES:
        return False
    head_dim = q.shape[2]
    if v.shape[2] != head_dim or head_dim % 8 or head_dim > _MAX_HEAD_DIM:
        return False
    if torch.cuda.get_device_capability(q.device)[0] < 9:
        return False
    num_seqs = len(cu_seqlens_q_host) - 1
    if num_seqs < 1 or num_seqs > MAX_SEQUENCES or len(cu_seqlens_k_host) != len(cu_seqlens_q_host):
        return False
    for i in range(num_seqs):
        len_q = cu_seqlens_q_host[i + 1] - cu_seqlens_q_host[i]
        len_k = cu_seqlens_k_host[i + 1] - cu_seqlens_k_host[i]
        if len_q != len_k or len_q < MIN_SEQUENCE_TOKENS:
            return False
    return True


def cudnn_square_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cu_seqlens_host: Sequence[int],
    scale: float,
) -> torch.Tensor | None:
    """Causal attention of each packed sequence over itself: q ``[T, Hq, D]``, k/v ``[T, Hkv, D]``
    with the same ``cu_seqlens_host`` -> ``[T, Hq, D]``. Returns None (after one warning) where
    cuDNN refuses the call, so the caller can take another kernel; the refusal disables this
    path for the rest of the process."""
    global _disabled_reason
    groups = q.shape[1] // k.shape[1]
    out = None
    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            pieces = []
            for i in range(len(cu_seqlens_host) - 1):
                a, b = cu_seqlens_host[i], cu_seqlens_host[i + 1]
                keys = k[a:b].repeat_interleave(groups, dim=1) if groups > 1 else k[a:b]
                values = v[a:b].repeat_interleave(groups, dim=1) if groups > 1 else v[a:b]
                o = F.scaled_dot_product_attention(
                    q[a:b].transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
                    is_causal=True, scale=scale,
                )
                pieces.append(o[0].transpose(0, 1))
        # contiguous like the other kernels' outputs (free when cuDNN wrote [L, H, D] rows)
        out = pieces[0].contiguous() if len(pieces) == 1 else torch.cat(pieces)
    except RuntimeError as exc:  # no cuDNN kernel for this build / GPU / shape
        _disabled_reason = f"{type(exc).__name__}: {str(exc)[:200]}"
        warnings.warn(f"cuDNN attention unavailable, using FlashAttention instead ({_disabled_reason})",
                      RuntimeWarning, stacklevel=2)
    return out
