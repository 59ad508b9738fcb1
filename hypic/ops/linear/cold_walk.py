"""A chain made only of live spans (a cold prefill's seams, bodies and question) walked chunk by
chunk in one flat loop per (V block, head, chain).

The chain kernel (:mod:`hypic.ops.linear.triton_scan`) walks such a chain span by span, each span
an inner loop over its chunks. Triton pipelines only that inner loop: with 512-token segments
after 8-token seams it fills and drains a pipeline of 8 chunks and then of 1, and on the H200
(session 16) its cold 32k walk took 1.96 us a chunk against 1.17 for fla's own state pass over
one sequence. Here every chunk of the chain is one iteration of one loop over a host-built chunk
table (first token, end token, the span a chunk opens), as fla's state pass runs one sequence;
the state entering a span is recorded by a masked store in the first chunk it opens. The maths
per chunk is the chain kernel's own (:func:`wy_chunk`): the same outputs.

``HYPIC_WALK_LOOP`` (:func:`walk_loop`): ``flat`` (default) or ``spans`` (the chain kernel), for
A/B runs. A chain with an empty span keeps the chain kernel (an empty span opens no chunk).
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np
import torch

ENV = "HYPIC_WALK_LOOP"
WALK_LOOPS = ("flat", "spans")
CHUNK_TOKENS = 64  # fla's chunk size
_KERNEL = None
_TABLES: list = []
_MAX_TABLES = 8


def walk_loop() -> str:
    """``HYPIC_WALK_LOOP``: ``flat`` (default, :func:`walk_chains_flat`) or ``spans``."""
    value = os.environ.get(ENV, "flat")
    if value not in WALK_LOOPS:
        raise ValueError(f"{ENV} must be one of {WALK_LOOPS}, got {value!r}")
    return value


def chunk_walk_table_host(cu_cpu: torch.Tensor, chunk_size: int = CHUNK_TOKENS):
    """Host ``(chunk_cum [N + 1] int64: chunk rows before each span, chunks [3, NC] int64: each
    row's first token, end token and the span it opens or -1)`` in fla's chunk order (spans in
    order, their chunks in order), or None when a span is empty."""
    bounds = np.asarray(cu_cpu.tolist(), dtype=np.int64)
    lengths = np.diff(bounds)
    if lengths.size and lengths.min() <= 0:
        return None
    counts = (lengths + chunk_size - 1) // chunk_size
    chunk_cum = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    num_chunks = int(chunk_cum[-1])
    span = np.repeat(np.arange(lengths.size, dtype=np.int64), counts)
    within = np.arange(num_chunks, dtype=np.int64) - chunk_cum[span]
    first = bounds[span] + within * chunk_size
    chunks = np.stack([first, np.minimum(first + chunk_size, bounds[span + 1]), np.where(within == 0, span, -1)])
    return chunk_cum, chunks


def chunk_walk_table(cu: torch.Tensor, cu_cpu: torch.Tensor):
    """:func:`chunk_walk_table_host` on ``cu``'s device (pinned, non-blocking), cached by the
    identity of the two tensors as the other chunk tables are; None when a span is empty."""
    for held_cu, held_cpu, table in _TABLES:
        if held_cu is cu and held_cpu is cu_cpu:
            return table
    host = chunk_walk_table_host(cu_cpu)
    if host is None:
        table = None
    else:
        pair = [torch.from_numpy(np.ascontiguousarray(x)) for x in host]
        if cu.is_cuda:
            pair = [x.pin_memory().to(cu.device, non_blocking=True) for x in pair]
        else:
            pair = [x.to(cu.device) for x in pair]
        table = tuple(pair)
    _TABLES.insert(0, (cu, cu_cpu, table))
    del _TABLES[_MAX_TABLES:]
    return table


def walk_chains_flat(k: torch.Tensor, w: torch.Tensor, u: torch.Tensor, g: Optional[torch.Tensor], table,
                     cu_chains: torch.Tensor, initial_states: Optional[torch.Tensor] = None,
                     record_rows: Optional[torch.Tensor] = None, num_records: Optional[int] = None):
    """:func:`~hypic.ops.linear.triton_scan.scan_chain_wy_triton` with ``long_spans`` and no
    source (element i of the chains is live span i) over ``table`` (:func:`chunk_walk_table`, not
    None). Same outputs: ``(v_new, h_chunks, final[, incoming])``."""
    import triton

    from hypic.ops.linear.triton_scan import _interpreting

    chunk_cum, chunks = table
    num_heads, key_dim, value_dim = w.shape[1], w.shape[2], u.shape[2]
    num_chunks = chunks.shape[1]
    device = w.device
    num_chains = cu_chains.numel() - 1
    final = torch.empty(num_chains, num_heads, key_dim, value_dim, device=device, dtype=torch.float32)
    v_new = torch.empty_like(u)
    h_chunks = torch.empty(num_chunks, num_heads, key_dim, value_dim, device=device, dtype=w.dtype)
    has_record = record_rows is not None
    if has_record:
        if num_records is None:
            raise ValueError("record_rows needs num_records")
        record = record_rows.to(device=device, dtype=torch.int64).contiguous()
        incoming = torch.empty(num_records, num_heads, key_dim, value_dim, device=device, dtype=torch.float32)
    else:
        record, incoming = chunk_cum, final  # placeholders the kernel neither reads nor writes
    if num_chains > 0:
        cu = cu_chains.to(device=device, dtype=torch.int64).contiguous()
        has_init = initial_states is not None
        init = initial_states.to(torch.float32).contiguous() if has_init else final
        kernel, fixed = _kernel()

        def grid(meta):
            return (triton.cdiv(value_dim, meta["BV"]), num_heads, num_chains)

        kernel[grid](init, incoming, final, cu, chunk_cum, chunks, record, k, w, u,
                     final if g is None else g.to(torch.float32), v_new, h_chunks, num_chunks,
                     H=k.shape[1], HV=num_heads, K=key_dim, V=value_dim,
                     BK=max(16, triton.next_power_of_2(key_dim)), BT=CHUNK_TOKENS, HAS_INIT=has_init,
                     HAS_RECORD=has_record, USE_G=g is not None, INTERPRET=_interpreting(), **fixed)
    if has_record:
        return v_new, h_chunks, final, incoming
    return v_new, h_chunks, final


def _kernel():
    """The kernel, autotuned on GPU over the V block, warps and stages fla's state pass is tuned
    over (every output is rewritten by each launch, so benchmarking runs are harmless); one
    block under the interpreter."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton

    from hypic.ops.linear._cold_walk_kernel import cold_walk_kernel as kernel
    from hypic.ops.linear.triton_scan import _interpreting

    if _interpreting():
        _KERNEL = (kernel, {"BV": 32})
        return _KERNEL
    configs = [triton.Config({"BV": bv}, num_warps=nw, num_stages=ns)
               for bv, nw, ns in [(32, 2, 3), (32, 4, 2), (32, 4, 4), (64, 2, 3), (64, 4, 2), (64, 4, 3), (64, 4, 4)]]
    _KERNEL = (triton.autotune(configs=configs, key=["H", "HV", "K", "V", "HAS_INIT", "HAS_RECORD", "USE_G"])(kernel),
               {})
    return _KERNEL


__all__ = ["ENV", "WALK_LOOPS", "chunk_walk_table", "chunk_walk_table_host", "walk_chains_flat", "walk_loop"]
