"""The Triton kernel of :func:`hypic.ops.linear.t_planes.pack_planes_` (imported lazily, so a
CPU-only machine never imports Triton)."""

from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from hypic.ops.linear._triton_scan_kernel import split_bf16


@triton.jit(do_not_specialize=["num_tensors"])
def pack_planes_kernel(base, base16, table, num_tensors, KK: tl.constexpr, BLOCK: tl.constexpr):
    """Matrix ``program_id(0)`` of tensor ``program_id(1)`` packed in place: its ``KK`` fp32
    words become ``KK`` bf16 ``hi`` then ``KK`` bf16 ``lo``. ``table[0, w]``: tensor w's first
    word counted in fp32 words from ``base``; ``table[1, w]``: its matrix count. ``base16`` is
    ``base`` as bf16."""
    m = tl.program_id(0).to(tl.int64)
    w = tl.program_id(1)
    count = tl.load(table + num_tensors + w)
    if m < count:
        start = tl.load(table + w) + m * KK
        o = tl.arange(0, BLOCK)
        mask = o < KK
        x = tl.load(base + start + o, mask=mask, other=0.0)
        hi, lo = split_bf16(x)  # the walk's own split: its planes are what it would compute
        # In place: the planes overwrite words other threads of this program may not have read
        # yet; every load completes before any store.
        tl.debug_barrier()
        tl.store(base16 + 2 * start + o, hi, mask=mask)
        tl.store(base16 + 2 * start + KK + o, lo, mask=mask)


def launch_pack(tensors: Sequence[torch.Tensor], key_dim: int) -> None:
    """One launch packing every ``[..., K, K]`` matrix of ``tensors`` (checked by the caller:
    contiguous fp32, one device, none empty)."""
    base = tensors[0]
    kk = key_dim * key_dim
    starts = [(t.data_ptr() - base.data_ptr()) // 4 for t in tensors]
    counts = [t.numel() // kk for t in tensors]
    if max(counts) == 0:
        return
    table = torch.tensor([starts, counts], dtype=torch.int64)
    if base.is_cuda:  # pinned and asynchronous: no wait for the forward queued before it
        table = table.pin_memory().to(base.device, non_blocking=True)
    block = triton.next_power_of_2(kk)
    grid = (max(counts), len(tensors))
    pack_planes_kernel[grid](base, base.view(-1).view(torch.bfloat16), table,
                             len(tensors), KK=kk, BLOCK=block, num_warps=8 if block >= 4096 else 4)
