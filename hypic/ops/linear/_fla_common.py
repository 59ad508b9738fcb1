"""Helpers shared by the fla fast paths (:mod:`hypic.ops.linear.fla_paths`): layout adapters,
chunk tables, the input guard. fla is imported inside function bodies only."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from hypic.envs import triton_interpret
from hypic.ops.linear._layout_tables import LayoutTables

CHUNK_SIZE = 64  # fla chunk length (tokens); summaries are exact for any span length
MAX_KEY_DIM = 256  # fla's delta-rule state kernels assert K <= 256


def any_fp64(*tensors) -> bool:
    return any(t is not None and t.dtype == torch.float64 for t in tensors)


def fla_takes(*tensors, key_dim: int = 0) -> bool:
    """Whether the fla fast paths take inputs ``tensors`` (None entries ignored): every one on
    CUDA and none float64 (the exactness tests' inputs take the reference), and ``key_dim`` at
    most ``MAX_KEY_DIM``. The choice is made on the tensors' device, so a CPU tensor takes the
    reference whatever the machine has."""
    present = [t for t in tensors if t is not None]
    return (bool(present) and all(t.is_cuda for t in present) and not any_fp64(*present)
            and key_dim <= MAX_KEY_DIM)


def _check_fla_inputs(name: str, key_dim: int, *tensors) -> None:
    """The guard of every fast-path entry: CUDA tensors (CPU ones only under Triton's
    interpreter) and a key dim fla's delta-rule kernels take (the callers check this first and
    take the reference otherwise: :func:`fla_takes`)."""
    for t in tensors:
        if t is not None and not t.is_cuda and not triton_interpret():
            raise ValueError(f"{name}: fla path needs CUDA tensors, got one on {t.device}")
    if key_dim > MAX_KEY_DIM:
        raise ValueError(f"{name}: fla delta-rule kernels need key dim <= {MAX_KEY_DIM}, got {key_dim}")


def _cu(cu_seqlens: torch.Tensor, device) -> torch.Tensor:
    return cu_seqlens.to(device=device, dtype=torch.long).contiguous()


# Tables of a forward's layout tensors, kept while those live (see _layout_tables: CUDA graphs
# replayed in later forwards read them where they lie).
_TABLES = LayoutTables()


def _chunk_indices(cu: torch.Tensor, cu_cpu: Optional[torch.Tensor] = None) -> torch.Tensor:
    """fla's chunk table ``[num_chunks, 2]`` (sequence, chunk within it) for ``cu``.

    From the device ``cu`` alone fla reads the lengths back to the host (a sync). With a host
    copy ``cu_cpu`` the table is built here on the host and sent with one pinned, asynchronous
    copy: fla's own host path ends in a pageable copy, which blocks the host until the device
    has drained its queue (two such waits per PIC forward before). Kept for the two tensors while
    ``cu`` lives (:class:`LayoutTables`), so a forward pays once per distinct ``cu``."""
    if cu_cpu is None:
        from fla.ops.utils.index import prepare_chunk_indices

        return prepare_chunk_indices(cu, CHUNK_SIZE)

    def build():
        table = chunk_table_host(cu_cpu, CHUNK_SIZE)
        if cu.is_cuda:
            return table.pin_memory().to(cu.device, non_blocking=True)
        return table.to(cu.device)

    return _TABLES.get(cu, cu_cpu, "chunk_indices", build)


def chunk_table_host(cu_cpu: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Host int64 ``[num_chunks, 2]``: row ``(i, j)`` for chunk j of sequence i, sequences in
    order, ``ceil(len_i / chunk_size)`` chunks each (what fla's ``prepare_chunk_indices`` gives)."""
    bounds = np.asarray(cu_cpu.tolist(), dtype=np.int64)
    counts = (np.diff(bounds) + chunk_size - 1) // chunk_size
    seq = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    within = np.arange(seq.size, dtype=np.int64) - starts
    return torch.from_numpy(np.stack([seq, within], axis=1))


def span_chunk_rows(cu: torch.Tensor, cu_cpu: torch.Tensor):
    """``(span_chunk [N] int32 on cu's device, num_chunks)``: the first row of each span's chunks
    in fla's chunk order (-1 for an empty span), as :func:`chunk_table_host` lays them: what the
    chain scan's long WY spans write their chunk states to. Cached by the identity of the two
    tensors while ``cu`` lives, like the chunk table."""
    def build():
        first, num_chunks = span_chunk_rows_host(cu_cpu, CHUNK_SIZE)
        host = torch.from_numpy(first)
        dev = host.pin_memory().to(cu.device, non_blocking=True) if cu.is_cuda else host.to(cu.device)
        return dev, num_chunks

    return _TABLES.get(cu, cu_cpu, "span_chunk_rows", build)


def span_chunk_rows_host(cu_cpu: torch.Tensor, chunk_size: int):
    """Host ``(first chunk row of each span as int32, -1 when empty; number of chunks)`` for
    ``cu_cpu``, in :func:`chunk_table_host`'s order."""
    bounds = np.asarray(cu_cpu.tolist(), dtype=np.int64)
    counts = (np.diff(bounds) + chunk_size - 1) // chunk_size
    first = np.where(counts > 0, np.cumsum(counts) - counts, -1).astype(np.int32)
    return first, int(counts.sum())


def _b1(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Add fla's batch dim (B = 1 for varlen)."""
    return None if t is None else t.unsqueeze(0).contiguous()


def _state_or_none(initial_state: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if initial_state is None else initial_state.to(torch.float32).contiguous()


def _local_cumsum(g: Optional[torch.Tensor], cu, ci) -> Optional[torch.Tensor]:
    """Per-chunk cumsum of log gates, in log2 units (what fla's kernels use with exp2)."""
    if g is None:
        return None
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    return chunk_local_cumsum(
        g.float(), chunk_size=CHUNK_SIZE, scale=RCP_LN2, cu_seqlens=cu, chunk_indices=ci
    )
