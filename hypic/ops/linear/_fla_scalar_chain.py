"""GPU path of :func:`hypic.ops.linear.simple_gla.simple_gla_chain_forward` for a constant decay
per head (lightning attention: Ring-linear, MiniMax) when every live span fits in one chunk: a
cached request's seam windows and question between its cached bodies (re-exported by
:mod:`hypic.ops.linear.fla_paths`; the reference calls it when :func:`scalar_chain_takes` says
so).

The reference runs three passes: the live spans' zero-start summaries, the scan of every chain
for their entering states and the varlen forward from those states (on CUDA fla's
``chunk_simple_gla`` twice, each call reading a chunk count back to the host, and the Triton
scan over bodies stacked and, for RoPE'd keys, rotated by a dozen whole-tensor ops). Here:

* one launch of the chain walk (:func:`~hypic.ops.linear.triton_scan.scan_chain_wy_triton` in
  scalar mode, ``W = 0``, ``u = v``): a live span is applied as ``gamma^L h + Kd^T V`` while the
  state entering it is written for the output kernel; a cached body as ``exp(log_decay) h + S``,
  its S read where the store holds it, rotated on load where its keys' RoPE moved
  (``body_rotation``);
* the one-chunk output of :mod:`hypic.ops.linear.short_wy` from those entering states;
* the chunk-local cumulative log2 gate they share, ``(position in span + 1) * g_gamma / ln 2``.

Nothing reads a device tensor back on the host (the span tables come from the host copy of the
bounds), so the layer's core can be captured in a CUDA graph (:mod:`hypic.graphs.layer_graphs`).
The entering states reach the output in k's dtype, as in fla's chunked forward; the chain's state
stays fp32."""

from __future__ import annotations

import numpy as np
import torch

from hypic.ops.linear._fla_common import CHUNK_SIZE, _check_fla_inputs, _cu, _state_or_none, fla_takes
from hypic.ops.linear._layout_tables import LayoutTables
from hypic.ops.linear.short_span import short_span_rows, triton_supported
from hypic.ops.linear.short_wy import short_span_output_triton
from hypic.ops.linear.triton_scan import MODE_SCALAR, body_rotation_tables, scan_chain_wy_triton

RCP_LN2 = 1.4426950408889634  # 1 / ln 2: fla's gates are kept in log2 units

# Tables of a forward's layout tensors, kept while those live (see _layout_tables).
_TABLES = LayoutTables()


def scalar_chain_takes(q, k, v, g, g_gamma, cu_seqlens, cu_seqlens_cpu, initial_states=None, bodies=None,
                       summarize=False, record_rows=None) -> bool:
    """Whether :func:`simple_gla_chain_walk` takes these inputs of a chain forward: a constant
    decay (``g_gamma``), nothing to summarise or record, the bounds' host copy given, the
    kernels' devices and dtypes (:func:`fla_takes`; bodies not float64), head dims the Triton
    kernels take, and every live span at most one chunk long."""
    if g is not None or g_gamma is None or summarize or record_rows is not None or cu_seqlens_cpu is None:
        return False
    if not fla_takes(q, k, v, g_gamma, initial_states, key_dim=k.shape[-1]):
        return False
    if bodies is not None and bodies.dtype == torch.float64:
        return False
    if not triton_supported(k.shape[-1], v.shape[-1], CHUNK_SIZE):
        return False
    return short_span_rows(_cu(cu_seqlens, k.device), cu_seqlens_cpu, CHUNK_SIZE, classes=False) is not None


def span_positions_host(cu_cpu: torch.Tensor) -> np.ndarray:
    """Host float32 ``[T]``: each token's position in its span plus one (spans of ``cu_cpu``)."""
    bounds = np.asarray(cu_cpu.tolist(), dtype=np.int64)
    lengths = np.diff(bounds)
    starts = np.repeat(bounds[:-1], lengths)
    return (np.arange(int(bounds[-1]), dtype=np.int64) - starts + 1).astype(np.float32)


def constant_gate_cumsum(g_gamma: torch.Tensor, cu: torch.Tensor, cu_cpu: torch.Tensor) -> torch.Tensor:
    """``[T, HV]`` fp32: the chunk-local cumulative log2 gate of a constant decay over spans of at
    most one chunk, ``(position in span + 1) * g_gamma / ln 2`` (fla's ``g_gamma`` kernels form
    the same product). The positions are built on the host and kept while ``cu`` lives."""
    def build():
        host = torch.from_numpy(span_positions_host(cu_cpu))
        return host.pin_memory().to(cu.device, non_blocking=True) if cu.is_cuda else host.to(cu.device)

    positions = _TABLES.get(cu, cu_cpu, "span_positions", build)
    return positions[:, None] * (g_gamma.float() * RCP_LN2)[None, :]


def simple_gla_chain_walk(q, k, v, g_gamma, *, cu_seqlens, cu_chains, source=None, bodies=None,
                          initial_states=None, scale=None, cu_seqlens_cpu, body_rotation=None):
    """``(o [T, HV, V], final [B, HV, K, V])`` of :func:`simple_gla_chain_forward` without
    summaries or records (see the module doc); ``body_rotation`` ``(cos, sin) [N, rotary_dim]``
    per body as in the reference."""
    _check_fla_inputs("simple_gla_chain_walk", 0, q, k, v, g_gamma)
    cu = _cu(cu_seqlens, k.device)
    table = short_span_rows(cu, cu_seqlens_cpu, CHUNK_SIZE, classes=False)
    if table is None:
        raise ValueError(f"simple_gla_chain_walk: every live span must have at most {CHUNK_SIZE} tokens")
    scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
    with torch.no_grad():
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        gc = constant_gate_cumsum(g_gamma, cu, cu_seqlens_cpu)
        rotation = None if body_rotation is None else body_rotation_tables(*body_rotation, k.shape[-1])
        _, h, final = scan_chain_wy_triton(
            k, None, v, gc, cu, table.span_chunk, table.chunk_spans.shape[0], cu_chains,
            _state_or_none(initial_states), second=bodies, source=source, mode=MODE_SCALAR,
            body_rotation=rotation)
        o = short_span_output_triton(q, k, v, h, gc, cu, table, scale)
    return o.to(v.dtype), final


__all__ = ["constant_gate_cumsum", "scalar_chain_takes", "simple_gla_chain_walk", "span_positions_host"]
