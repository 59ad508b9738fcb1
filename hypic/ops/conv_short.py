"""Varlen short causal conv in one Triton launch, for many short sequences.

The output of :func:`hypic.ops.conv.causal_conv1d` (the reference, which picks this kernel on
CUDA for short runs, :func:`hypic.ops.conv.conv_kernel`, and forms the final states itself). A
cached request's linear layers convolve its seams and question: 65 sequences of 8-64 tokens at
the all-hit 32k shape. fla's ``causal_conv1d_fwd`` took 96-150 us per layer there (H200
profiles) for 576 x 8192 bf16 inputs that take ~4 us to read; it also needs the states padded
to its ``[N, D, W]`` layout. Here each program takes a tile of tokens x channels, finds each
token's sequence by a binary search over ``cu_seqlens`` (no per-token tables to build) and
reads taps before a sequence's start from its ``[N, D, W-1]`` state directly, in the state's own
dtype.

Measured on the H200: in the all-hit 32k request's profile the 30 launches take 0.95 ms of GPU
time (31.6 us each). Long runs (a cold prefill) keep fla's kernel: the two were not compared
there, so runs averaging over 64 tokens go to fla.
"""

from __future__ import annotations

from typing import Optional

import torch

# Tile (tokens x channels) and warps. At the all-hit 32k shape (64 seams of 8 tokens + a 64-token
# question, 8192 channels, bf16, the runs' initial states read) on the H200, one eager call each
# (benchmarks/moe_glue_h200.py; ~50 us of it is the launch, as a call without
# states shows): 16 x 128 x 4 warps 0.061 ms, 32 x 128 (before) 0.095, 8 x 512 0.086, 16 x 256
# 0.083; without states every 128-channel tile took 0.050-0.064. Taller tiles hold more of the
# states' gathered addresses at once. Timed again behind a sleep kernel, so without the launch
# (benchmarks/short_kernels_h200.py, a column block of a wider input): 16 x
# 128 x 4 warps 31.3 us with 16 search steps, 25.3 with 7; then 8 x 128 x 2 warps 22.3, 16 x 64
# x 2 warps 22.3, 32 x 128 x 4 warps 27.4, 64 x 64 x 4 warps 36.9.
BLOCK_T, BLOCK_D, NUM_WARPS = 8, 128, 2
# Binary-search steps: 8 for up to 256 runs (a cached request: its seams and question), else 16
# (up to 65,536): two compiled variants, rather than one per bit length of the run count. Each
# step is a dependent load, so the 16 steps of a 65-run request cost 6 us of its 31.
_SEARCH_STEPS = (8, 16)
TAILS_BLOCK_D = 512
_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        from hypic.ops._conv_short_kernel import short_conv_kernel

        _KERNEL = short_conv_kernel
    return _KERNEL


def search_steps(num_seqs: int) -> int:
    """Binary-search steps the kernel takes over ``[0, num_seqs - 1]``: the first of
    ``_SEARCH_STEPS`` that covers the run count's bit length (the count itself past them)."""
    need = max(1, num_seqs.bit_length())
    return next((steps for steps in _SEARCH_STEPS if steps >= need), need)


def short_conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], *, cu_seqlens: torch.Tensor,
               initial_state: Optional[torch.Tensor] = None, activation: Optional[str] = "silu") -> torch.Tensor:
    """The output ``y [T, D]`` of ``causal_conv1d`` through :func:`short_conv_kernel` (inputs
    validated by the caller)."""
    import triton

    num_tokens, dim = x.shape
    width = weight.shape[1]
    num_seqs = cu_seqlens.numel() - 1
    y = torch.empty_like(x)
    if num_tokens > 0:
        x = x if x.stride(1) == 1 else x.contiguous()
        cu = cu_seqlens.to(device=x.device, dtype=torch.int64)
        state = None if initial_state is None else initial_state.contiguous()
        grid = (triton.cdiv(num_tokens, BLOCK_T), triton.cdiv(dim, BLOCK_D))
        _kernel()[grid](
            x, weight.contiguous(), bias if bias is not None else x, state if state is not None else x, cu, y,
            num_tokens, num_seqs, x.stride(0), y.stride(0), D=dim, W=width, HAS_BIAS=bias is not None,
            HAS_STATE=state is not None, SILU=activation == "silu", BT=BLOCK_T, BD=BLOCK_D,
            LOG_N=search_steps(num_seqs), num_warps=NUM_WARPS,
        )
    return y


def conv_tails(x: torch.Tensor, init: torch.Tensor, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """:func:`hypic.ops.conv.conv_tails` in one Triton launch (operands checked by the caller)."""
    import triton

    from hypic.ops._conv_short_kernel import conv_tails_kernel

    dim, width_1 = init.shape[1], init.shape[2]
    num_groups = index.numel() // width_1
    out = torch.empty(num_groups, dim, width_1, device=x.device, dtype=dtype)
    if num_groups:
        x = x if x.stride(1) == 1 else x.contiguous()
        conv_tails_kernel[(num_groups, triton.cdiv(dim, TAILS_BLOCK_D))](
            x, init, index, out, x.shape[0], num_groups, x.stride(0), init.stride(0), init.stride(1), init.stride(2),
            D=dim, G=width_1, GP=1 << max(0, (width_1 - 1).bit_length()), BD=TAILS_BLOCK_D, num_warps=4,
        )
    return out
