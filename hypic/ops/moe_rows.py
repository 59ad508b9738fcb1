"""Routed experts for few rows per expert: a Triton GEMM over row blocks of one expert each.

Same contract as :func:`hypic.ops.moe.moe_experts` (the reference; call that with
``impl="rows"`` rather than this directly). A cached request prefills a few hundred live tokens:
at 576 tokens x top-8 over 256 experts every expert gets ~18 rows, so the expert GEMMs only
stream the weights (1.6 GB per layer of Qwen3.5-35B-A3B) and their time is HBM time.
``torch._grouped_mm`` (:mod:`hypic.ops.moe_grouped`) reached 3.0 TB/s there (21.3 ms over 40
layers in the all-hit 32k request's profile) against the 4.3 TB/s the H200 measures. Here, in the
spirit of vLLM's and SGLang's fused-MoE kernels but without their padded block table:

1. the assignments are sorted by expert (as in the grouped path) and each expert's end among
   the sorted rows found by a ``searchsorted`` on the device (nothing is read back);
2. one launch per GEMM over (expert, column tile): a program streams its tile of the expert's
   weights once per ``block_m`` rows of that expert (almost always once: the default block is
   taller than an expert's average row count) and an expert without rows returns at once, so no
   block table is built; the first GEMM gathers its rows from x by token (no ``[R, H]`` copy)
   and applies SwiGLU to the fp32 gate and up accumulators (no ``[R, 2I]`` intermediate);
3. the rows go back to (token, slot) order and are mixed exactly as in the grouped path.

Row blocks are padded to ``block_m`` rows (masked loads): the path is for the weight-bound
regime only. :func:`rows_preferred` says when it applies (``MAX_ROWS_PER_EXPERT``); large
prefills keep the grouped GEMM.

Measured on the H200: the GEMMs alone at 576 tokens 0.29 ms (gate_up, 3.7 TB/s of weights) and
0.16 ms (down, 3.3 TB/s) with the default tiles, the best of a sweep; in the all-hit 32k
request's profile the 80 launches take 17.9-18.1 ms of GPU time, where the grouped GEMMs took
21.3 ms. Variants for that regime were measured against this kernel and not taken
(docs/decisions.md): the transposed product (the weight tile as the MMA's M operand, for
Hopper's wgmma), a streaming kernel over several column tiles per program (with and without TMA
descriptors), taller row blocks. At 576 tokens gate_up's current kernel was the fastest of 17
(0.2539 ms, 4.23 TB/s), the best down variant took 0.1363 against 0.1386 ms, the whole MoE layer
as a graph replay 0.4765 against 0.4788 ms, and ``block_m=64`` left the request within the
rounds' spread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from hypic import envs
from hypic.ops.moe_grouped import mix_sorted_rows, sort_rows_by_expert

# Up to this many assignments per expert on average the rows path runs under impl="auto". Whole
# MoE calls as CUDA graph replays on the H200 (256 experts, top-8): rows 0.45-0.66 ms against
# grouped 0.62-0.78 ms from 64 to 1024 tokens (up to 32 rows per expert), but 0.86 against 0.79
# ms at 2048 tokens (64 per expert).
MAX_ROWS_PER_EXPERT = 32
_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class RowsConfig:
    """Tile sizes and launch shape of the row-block GEMMs: one program per (expert, ``block_n``
    columns), ``block_m`` rows at a time, a pipelined loop over ``block_k`` contraction columns."""

    block_m: int = 16
    block_n: int = 64
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 16 or value & (value - 1):
                raise ValueError(f"RowsConfig.{name} must be a power of two >= 16, got {value!r}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"RowsConfig.num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 8:
            raise ValueError(f"RowsConfig.num_stages must be in [1, 8], got {self.num_stages!r}")


def default_config(num_rows: int, num_experts: int) -> RowsConfig:
    """Row blocks taller than almost every expert's row count (16, 32 or 64 rows), so each weight
    tile streams once."""
    per_expert = num_rows / max(num_experts, 1)
    block_m = 16 if per_expert <= 6 else (32 if per_expert <= 24 else 64)
    return RowsConfig(block_m=block_m)


def rows_supported(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> bool:
    """Whether :func:`moe_experts_rows` can run these operands: CUDA (or the Triton interpreter
    on CPU), fp16/bf16, unit stride along each weight's contraction dim. Host-only."""
    if not (x.is_cuda or (x.device.type == "cpu" and envs.triton_interpret())):
        return False
    if x.dtype not in _DTYPES or gate_up.dtype != x.dtype or down.dtype != x.dtype:
        return False
    return x.stride(1) == 1 and gate_up.stride(2) == 1 and down.stride(2) == 1


def rows_preferred(num_rows: int, num_experts: int) -> bool:
    """The auto rule: few rows per expert (the weight-streaming regime)."""
    return num_rows <= MAX_ROWS_PER_EXPERT * num_experts


_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        from hypic.ops._moe_rows_kernel import moe_rows_gemm_kernel

        _KERNEL = moe_rows_gemm_kernel
    return _KERNEL


def rows_gemm(a: torch.Tensor, a_row_of: Optional[torch.Tensor], w: torch.Tensor, out: torch.Tensor,
              ends: torch.Tensor, *, swiglu: bool, config: RowsConfig) -> torch.Tensor:
    """One launch: ``out[r] = a[a_row_of[r]] @ w[e(r)].T`` (SwiGLU of the two halves of
    ``w[e]`` with ``swiglu``; ``a[r]`` without ``a_row_of``) for every sorted row r, expert e(r)
    the one whose range ``[ends[e - 1], ends[e])`` holds r (fp32 accumulation, SwiGLU on the
    accumulators)."""
    import triton

    num_cols = w.shape[1] // 2 if swiglu else w.shape[1]
    if out.shape[1] != num_cols or a.shape[1] != w.shape[2] or ends.numel() != w.shape[0]:
        raise ValueError(f"rows_gemm: a {tuple(a.shape)}, w {tuple(w.shape)}, out {tuple(out.shape)}, "
                         f"ends {tuple(ends.shape)} do not match")
    gather = a_row_of is not None
    _kernel()[(w.shape[0], triton.cdiv(num_cols, config.block_n))](
        a, a_row_of if gather else ends, w, out, ends, a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        N=num_cols, KD=w.shape[2], GATHER=gather, SWIGLU=swiglu, BM=config.block_m, BN=config.block_n,
        BK=config.block_k, num_warps=config.num_warps, num_stages=config.num_stages)
    return out


def moe_experts_rows(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, config: Optional[RowsConfig] = None) -> torch.Tensor:
    """``sum_j w[t, j] * SwiGLU_{e[t, j]}(x[t])`` through two row-block launches; no host sync.
    Arguments as :func:`hypic.ops.moe.moe_experts` (validated there); ``config`` for both GEMMs
    (default :func:`default_config`). Returns a fresh ``[T, H]``."""
    num_tokens, hidden = x.shape
    num_experts, two_inter, _ = gate_up.shape
    top_k = topk_ids.shape[1]
    if num_tokens == 0:
        return x.new_zeros(0, hidden)
    num_rows = num_tokens * top_k
    config = default_config(num_rows, num_experts) if config is None else config
    order, ends = sort_rows_by_expert(topk_ids, num_experts)
    hidden_rows = torch.empty(num_rows, two_inter // 2, device=x.device, dtype=x.dtype)
    rows_gemm(x, order // top_k, gate_up, hidden_rows, ends, swiglu=True, config=config)
    rows_out = torch.empty(num_rows, hidden, device=x.device, dtype=x.dtype)
    rows_gemm(hidden_rows, None, down, rows_out, ends, swiglu=False, config=config)
    return mix_sorted_rows(rows_out, order, topk_weights, x)
