"""Routed experts for few rows per expert: a Triton GEMM over row blocks of one expert each.

Same contract as :func:`hypic.ops.moe.moe_experts` (the reference; call that with
``impl="rows"`` rather than this directly). A cached request prefills a few hundred live tokens:
at 576 tokens x top-8 over 256 experts every expert gets ~18 rows, so the expert GEMMs only
stream the weights (1.6 GB per layer of Qwen3.5-35B-A3B) and their time is HBM time.
``torch._grouped_mm`` (:mod:`hypic.ops.moe_grouped`) reached 3.0 TB/s there (21.3 ms over 40
layers, session 9's all-hit 32k profile) against the 4.3 TB/s the H200 measures. Here, in the
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

Measured on the H200 (session 11): the GEMMs alone at 576 tokens 0.29 ms (gate_up, 3.7 TB/s of
weights) and 0.16 ms (down, 3.3 TB/s) with the default tiles, the best of a sweep
(benchmarks/moe_rows_h200.py); in the all-hit 32k request's profile the 80 launches take
17.9-18.1 ms of GPU time, where session 9's profile had 21.3 ms of grouped GEMMs. The request's
TTFT A/B (one process per path) did not resolve the difference: runs of one path spread by 5 ms.

Variants for that regime (session 25, chosen through :class:`RowsConfig`; the defaults stay
session 11's kernel): ``swap_ab``, the transposed product, so that the weight tile is the MMA's M
operand (Hopper's wgmma, where 16 or 32 token rows alone get mma.sync); ``kernel="stream"``, one
pipelined loop over several column tiles per program (no drain and refill of the loads at each
tile; for the down GEMM whole 1 KB weight rows per block, the token rows loaded once), with the
weight blocks through host-side TMA descriptors (``tma``) or pointers. Compiled for sm_90 both
kernels pipeline their loads (cp.async or TMA, ``--compile-only`` of the benchmark shows it);
``benchmarks/moe_rows_h200.py --variants`` times each GEMM per variant.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, fields
from typing import Optional, Tuple

import torch

from hypic.ops.attention_split import _interpreting
from hypic.ops.moe_grouped import mix_sorted_rows, sort_rows_by_expert

# Up to this many assignments per expert on average the rows path runs under impl="auto". Whole
# MoE calls as CUDA graph replays on the H200 (benchmarks/moe_rows_h200.py, session 11 call 2;
# 256 experts, top-8): rows 0.45-0.66 ms against grouped 0.62-0.78 ms from 64 to 1024 tokens (up
# to 32 rows per expert), but 0.86 against 0.79 ms at 2048 tokens (64 per expert).
MAX_ROWS_PER_EXPERT = 32
_DTYPES = (torch.bfloat16, torch.float16)


_KERNELS = ("tiles", "stream")


@dataclass(frozen=True)
class RowsConfig:
    """Tile sizes, kernel variant and launch shape of the two GEMMs (the defaults: session 11's
    kernel and tiles).

    ``kernel="tiles"``: one program per (expert, ``block_n`` columns), a pipelined loop over the
    contraction. ``kernel="stream"``: one program per (expert, ``group_n`` column tiles), one
    pipelined loop over all their weight blocks, so the loads stay in flight across tile boundaries;
    ``block_k`` may cover the whole contraction (the down GEMM's 512: each weight row one contiguous
    block); ``tma`` reads the weight blocks through a host-side TMA descriptor where Triton and the
    GPU have them (Hopper or newer; the interpreter), else through pointers as without it.
    ``group_n`` is an upper bound: a program takes the largest power of two that divides the
    expert's tile count. ``swap_ab`` (both kernels): the transposed product ``w_tile @ rows.T``, so
    the weight tile is the MMA's M operand (Hopper's wgmma from ``block_n`` 64 on, ``num_warps`` a
    multiple of 4) and the few token rows its N operand.
    """

    block_m: int = 16
    block_n: int = 64
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3
    kernel: str = "tiles"
    swap_ab: bool = False
    group_n: int = 1
    tma: bool = False

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 16 or value & (value - 1):
                raise ValueError(f"RowsConfig.{name} must be a power of two >= 16, got {value!r}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"RowsConfig.num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 8:
            raise ValueError(f"RowsConfig.num_stages must be in [1, 8], got {self.num_stages!r}")
        if self.kernel not in _KERNELS:
            raise ValueError(f"RowsConfig.kernel must be one of {_KERNELS}, got {self.kernel!r}")
        for name in ("swap_ab", "tma"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"RowsConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.group_n, int) or self.group_n < 1 or self.group_n & (self.group_n - 1):
            raise ValueError(f"RowsConfig.group_n must be a power of two >= 1, got {self.group_n!r}")
        if self.kernel != "stream" and (self.group_n != 1 or self.tma):
            raise ValueError("RowsConfig.group_n and RowsConfig.tma need kernel='stream'")
        if self.tma and self.block_n > 256:  # a TMA box has at most 256 rows
            raise ValueError(f"RowsConfig.tma needs block_n <= 256, got {self.block_n}")


def default_config(num_rows: int, num_experts: int) -> RowsConfig:
    """Row blocks taller than almost every expert's row count (16, 32 or 64 rows), so each weight
    tile streams once."""
    per_expert = num_rows / max(num_experts, 1)
    block_m = 16 if per_expert <= 6 else (32 if per_expert <= 24 else 64)
    return RowsConfig(block_m=block_m)


CONFIG_ENV = "HYPIC_MOE_ROWS"


def parse_config(spec: str, block_m: int) -> RowsConfig:
    """A :class:`RowsConfig` from ``"field=value,..."`` (e.g. ``kernel=stream,swap_ab=1,group_n=8,
    tma=1,num_stages=4``); ``block_m`` unless the spec gives one. Unknown fields and bad values
    raise ``ValueError``."""
    kinds = {f.name: f.type for f in fields(RowsConfig)}
    values = {"block_m": block_m}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, raw = item.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or name not in kinds:
            raise ValueError(f"{CONFIG_ENV}: {item!r} is not field=value with a field of RowsConfig "
                             f"({', '.join(kinds)})")
        if name == "kernel":
            values[name] = raw
        elif name in ("swap_ab", "tma"):
            if raw not in ("0", "1"):
                raise ValueError(f"{CONFIG_ENV}: {name} must be 0 or 1, got {raw!r}")
            values[name] = raw == "1"
        else:
            try:
                values[name] = int(raw)
            except ValueError:
                raise ValueError(f"{CONFIG_ENV}: {name} must be an integer, got {raw!r}") from None
    return RowsConfig(**values)


@functools.lru_cache(maxsize=64)
def _env_configs(spec: str, block_m: int) -> Tuple[RowsConfig, RowsConfig]:
    gate_up, sep, down = spec.partition("|")
    if not sep:
        raise ValueError(f"{CONFIG_ENV} must be 'GATE_UP_SPEC|DOWN_SPEC' (either may be empty), got {spec!r}")
    return parse_config(gate_up, block_m), parse_config(down, block_m)


def default_configs(num_rows: int, num_experts: int) -> Tuple[RowsConfig, RowsConfig]:
    """``(gate_up, down)`` configs: :func:`default_config` for both, or what ``HYPIC_MOE_ROWS``
    (``"GATE_UP_SPEC|DOWN_SPEC"``, each as :func:`parse_config`, with :func:`default_config`'s
    ``block_m`` unless given) says, to A/B a variant in a whole forward. The engine runs the MoE
    inside CUDA graphs, so this is read when a phase is captured."""
    base = default_config(num_rows, num_experts)
    spec = os.environ.get(CONFIG_ENV, "")
    if not spec:
        return base, base
    return _env_configs(spec, base.block_m)


def rows_supported(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> bool:
    """Whether :func:`moe_experts_rows` can run these operands: CUDA (or the Triton interpreter
    on CPU), fp16/bf16, unit stride along each weight's contraction dim. Host-only."""
    if not (x.is_cuda or _interpreting()):
        return False
    if x.dtype not in _DTYPES or gate_up.dtype != x.dtype or down.dtype != x.dtype:
        return False
    return x.stride(1) == 1 and gate_up.stride(2) == 1 and down.stride(2) == 1


def rows_preferred(num_rows: int, num_experts: int) -> bool:
    """The auto rule: few rows per expert (the weight-streaming regime)."""
    return num_rows <= MAX_ROWS_PER_EXPERT * num_experts


_KERNELS_JIT = {}


def _kernel(name: str = "tiles"):
    if not _KERNELS_JIT:
        from hypic.ops._moe_rows_kernel import moe_rows_gemm_kernel, moe_rows_stream_kernel

        _KERNELS_JIT.update(tiles=moe_rows_gemm_kernel, stream=moe_rows_stream_kernel)
    return _KERNELS_JIT[name]


def tma_available(w: torch.Tensor) -> bool:
    """Whether Triton's host-side TMA descriptors can carry these weights: a Triton that has them,
    a Hopper-or-newer GPU (or the interpreter), the [E, rows, KD] weights one uniformly strided
    [E * rows, KD] matrix, 16-byte aligned rows. Host-only."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401  (Triton >= 3.4)
    except ImportError:
        return False
    if w.is_cuda:
        if torch.cuda.get_device_capability(w.device) < (9, 0):
            return False
    elif not _interpreting():
        return False
    row_bytes = w.stride(1) * w.element_size()
    return (w.stride(2) == 1 and w.stride(0) == w.shape[1] * w.stride(1) and row_bytes % 16 == 0
            and w.data_ptr() % 16 == 0)


def _weight_descriptor(w: torch.Tensor, config: RowsConfig):
    """A TMA descriptor over ``w`` as one [E * rows, KD] matrix, in [block_n, block_k] blocks
    (built at each call: a launch encodes it into the kernel's arguments, so a CUDA graph captures
    it by value)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows = w.view(w.shape[0] * w.shape[1], w.shape[2])  # a view: tma_available checked the strides
    return TensorDescriptor.from_tensor(rows, [config.block_n, config.block_k])


def rows_gemm(a: torch.Tensor, a_row_of: Optional[torch.Tensor], w: torch.Tensor, out: torch.Tensor,
              ends: torch.Tensor, *, swiglu: bool, config: RowsConfig) -> torch.Tensor:
    """One launch: ``out[r] = a[a_row_of[r]] @ w[e(r)].T`` (SwiGLU of the two halves of
    ``w[e]`` with ``swiglu``; ``a[r]`` without ``a_row_of``) for every sorted row r, expert e(r)
    the one whose range ``[ends[e - 1], ends[e])`` holds r. ``config.kernel`` picks the kernel;
    every variant computes the same (fp32 accumulation, SwiGLU on the accumulators)."""
    import triton

    num_cols = w.shape[1] // 2 if swiglu else w.shape[1]
    if out.shape[1] != num_cols or a.shape[1] != w.shape[2] or ends.numel() != w.shape[0]:
        raise ValueError(f"rows_gemm: a {tuple(a.shape)}, w {tuple(w.shape)}, out {tuple(out.shape)}, "
                         f"ends {tuple(ends.shape)} do not match")
    gather = a_row_of is not None
    num_tiles = triton.cdiv(num_cols, config.block_n)
    args = [a, a_row_of if gather else ends, w, out, ends, a.stride(0), w.stride(0), w.stride(1), out.stride(0)]
    meta = dict(N=num_cols, KD=w.shape[2], GATHER=gather, SWIGLU=swiglu, BM=config.block_m, BN=config.block_n,
                BK=config.block_k, SWAP_AB=config.swap_ab, num_warps=config.num_warps, num_stages=config.num_stages)
    if config.kernel == "tiles":
        _kernel("tiles")[(w.shape[0], num_tiles)](*args, **meta)
        return out
    group = math.gcd(config.group_n, num_tiles)  # a power of two dividing the tile count
    tma = config.tma and tma_available(w)
    if tma:
        args[2] = _weight_descriptor(w, config)
    _kernel("stream")[(w.shape[0], num_tiles // group)](*args, **meta, GROUP=group, TMA=tma)
    return out


def moe_experts_rows(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, config: Optional[RowsConfig] = None,
                     down_config: Optional[RowsConfig] = None) -> torch.Tensor:
    """``sum_j w[t, j] * SwiGLU_{e[t, j]}(x[t])`` through two row-block launches; no host sync.
    Arguments as :func:`hypic.ops.moe.moe_experts` (validated there); ``config`` for the gate_up
    GEMM and, without ``down_config``, also the down GEMM. Returns a fresh ``[T, H]``."""
    num_tokens, hidden = x.shape
    num_experts, two_inter, _ = gate_up.shape
    top_k = topk_ids.shape[1]
    if num_tokens == 0:
        return x.new_zeros(0, hidden)
    num_rows = num_tokens * top_k
    if config is None:
        config, env_down = default_configs(num_rows, num_experts)
        down_config = env_down if down_config is None else down_config
    order, ends = sort_rows_by_expert(topk_ids, num_experts)
    hidden_rows = torch.empty(num_rows, two_inter // 2, device=x.device, dtype=x.dtype)
    rows_gemm(x, order // top_k, gate_up, hidden_rows, ends, swiglu=True, config=config)
    rows_out = torch.empty(num_rows, hidden, device=x.device, dtype=x.dtype)
    rows_gemm(hidden_rows, None, down, rows_out, ends, swiglu=False,
              config=config if down_config is None else down_config)
    return mix_sorted_rows(rows_out, order, topk_weights, x)
