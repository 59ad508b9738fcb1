"""Single-launch chain scan of affine summaries on GPU (Triton), plus a batched torch formulation.

A chain of spans with summaries (T_i, S_i) is walked left to right: the state entering span i is
recorded, then ``state = T_i @ state + S_i``. Each Triton program owns one (chain, value head,
V-block): the V columns of the state evolve independently (T acts on the K axis), so programs never
communicate and the whole scan is one launch whatever the number of chains, spans and heads.

T comes in three structures (``MODE``): dense ``[K, K]`` (delta-rule families), diagonal ``[K]``
log decays (GLA) and scalar log decay (simple GLA, Mamba2). Everything is stored and accumulated
in fp32; the dense product is bf16x3: both operands split into bf16 high and low parts, three
bf16 MMAs.

Why bf16x3 (H200, ``benchmarks/scan_step_h200.py`` and ``chain_forward_h200.py``): the step is
bound by its chain of MMAs, and a bf16 MMA covers 16 of K where TF32 covers 8, so bf16x3 issues
half of tf32x3's MMAs: a dense step took 3.73 us against 5.46, one linear layer's fused scan at
the all-hit 32k shape 0.571 ms against 0.713, the all-hit request 75.00 against 81.69 ms p50 at
32k and 42.36 against 43.67 at 8k (benchmarks/results/README.md). Its error after 64 steps against
float64 was 1.7e-5 (tf32x3: 8.2e-6; one-pass TF32: 1.6e-2), and the layer's final
state stayed 4.2e-4 from float64 with either (the WY factors' bf16 inputs dominate); fla's own
chunked prefill rounds the state to bf16 (2^-9) at every chunk.

:func:`scan_chain_wy_triton` fuses the scan with the state pass of live spans given by their WY
factors, for fla's output kernel. A seam of at most ``SEAM_ROWS`` tokens and the cached body
after it are one step of the walk, ``gamma T h + (T Kd^T) v + S`` (the kernel's
``seam_body_step``). Against the seam and then the body as two steps it measured within noise
(H200, all-hit 32k TTFT interleaved: 75.92 against 77.18 ms p50; RAG 32k 82.80 against 82.18 and
82.16 against 81.67 ms), so the one-step form is the only one. Two other forms were slower and
were removed: every pair's ``M h + c`` composed beforehand by a parallel launch (84.43 ms; commit
549bab2 has it) and the next step's body tiles loaded while a step runs (one layer's scan 0.766
ms against 0.716; commit a2b8c4c).

Triton is imported lazily: importing this module on a CPU-only machine needs no Triton. The
reference is the scan of :mod:`hypic.ops.linear.scan` (which calls :func:`scan_chain_triton` for
CUDA fp32 summaries); :func:`scan_chain_wy_reference` is the walk's.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from hypic.envs import triton_interpret
from hypic.ops.linear._fla_common import span_chunk_rows_host
from hypic.ops.linear.summary import DenseSummary, DiagonalSummary, ScalarSummary, SummaryTable

MODE_DENSE = 0
MODE_DIAGONAL = 1
MODE_SCALAR = 2
CHUNK_TOKENS = 64  # fla's chunk size: the rows of one chunk step of a long WY span
SEAM_ROWS = 16  # rows of a short live span's block; a seam this long or shorter fuses with its body

_KERNEL = None


def _build_kernel():
    """Define the Triton kernel on first use (keeps Triton out of CPU-only imports).

    On GPU the V-block and warp count are autotuned; under ``TRITON_INTERPRET=1`` (CPU tests)
    autotuning cannot benchmark, so one fixed block is used.
    """
    import triton

    from hypic.ops.linear._triton_scan_kernel import scan_chain_kernel

    # a dense fp32 T tile is 64 KiB at K = 128: at most two pipeline stages fit in shared memory
    configs = [
        triton.Config({"BV": 16}, num_warps=4, num_stages=1),
        triton.Config({"BV": 16}, num_warps=4, num_stages=2),
        triton.Config({"BV": 32}, num_warps=4, num_stages=2),
        triton.Config({"BV": 32}, num_warps=8, num_stages=2),
        triton.Config({"BV": 64}, num_warps=8, num_stages=1),
    ]
    # A chain of live spans alone walked chunk by chunk (a cold prefill: no T tile) can take
    # deeper pipelines of its per-chunk loads, as fla's own state pass does (stages 2-4).
    walk_only = [
        triton.Config({"BV": 32}, num_warps=4, num_stages=3),
        triton.Config({"BV": 64}, num_warps=4, num_stages=3),
        triton.Config({"BV": 64}, num_warps=8, num_stages=3),
    ]
    if triton_interpret():
        return scan_chain_kernel, 32

    def prune(configs, named_args, **kwargs):
        args = {**named_args, **kwargs}
        # scalar / diagonal T: no big tile, nothing to tune (saves compile time)
        if args.get("MODE", MODE_DENSE) != MODE_DENSE:
            return configs[2:3]
        if args.get("LONG_WY") and not args.get("HAS_SOURCE"):
            return configs + walk_only
        return configs

    key = ["H", "HV", "K", "V", "BK", "MODE", "HAS_SOURCE", "HAS_RECORD", "HAS_WY", "USE_G", "LONG_WY", "T_UNIT",
           "S_UNIT", "FUSE", "T_PACKED", "HAS_W", "ROTATE", "RD"]
    tuned = triton.autotune(configs=configs, key=key, prune_configs_by={"early_config_prune": prune})
    return tuned(scan_chain_kernel), None


def _mode_and_transition(summary) -> Tuple[int, torch.Tensor]:
    if isinstance(summary, DenseSummary):
        return MODE_DENSE, summary.transition
    if isinstance(summary, DiagonalSummary):
        return MODE_DIAGONAL, summary.log_decay
    if isinstance(summary, ScalarSummary):
        return MODE_SCALAR, summary.log_decay
    raise ValueError(f"summaries must be a Dense/Diagonal/ScalarSummary, got {type(summary).__name__}")


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a copy of it, starting on a 64-byte boundary: the kernel reads table entries as
    64-byte steps from the live summaries' base (fresh allocations always are aligned)."""
    return t if t.data_ptr() % 64 == 0 else t.clone()


def body_rotation_tables(cos: torch.Tensor, sin: torch.Tensor, key_dim: int) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """``(cos, sin, rotary_dim)`` for a walk that rotates its bodies' S on load, from rotate-half
    RoPE tables ``cos, sin [N, rotary_dim]`` of each body's shift (``RotaryEmbedding.cos_sin``):
    both widened to ``[N, key_dim]`` fp32, the cosines with 1 past ``rotary_dim`` and the sines
    signed as rotate-half applies them (``-sin`` on the first half, 0 past ``rotary_dim``)."""
    num, rotary_dim = cos.shape
    if sin.shape != cos.shape or rotary_dim % 2 or not 0 < rotary_dim <= key_dim:
        raise ValueError(f"cos and sin must be one [N, rotary_dim] shape with an even rotary_dim <= {key_dim}, "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")
    half = rotary_dim // 2
    cos_full = torch.ones(num, key_dim, device=cos.device, dtype=torch.float32)
    sin_full = torch.zeros(num, key_dim, device=cos.device, dtype=torch.float32)
    cos_full[:, :rotary_dim] = cos
    sin_full[:, :half] = -sin[:, :half]
    sin_full[:, half:rotary_dim] = sin[:, half:]
    return cos_full, sin_full, rotary_dim


def _table_of(second, mode: int, device: torch.device, packed_ok: bool = False):
    """``([2, N] int64 byte addresses of the second summaries' one-span (T, S), N, (T, S)
    alignment in bytes, owner, t_packed)``: a SummaryTable's own addresses when it has them
    (64-byte aligned allocations), else those of its (or a stacked summary's) contiguous fp32
    copy, whose items lie one item size apart; ``owner`` holds that copy and must stay
    referenced until the launch is queued (after that, stream order protects the memory).
    ``t_packed``: the table's T are stored as bf16 planes, which only a launch that can read
    them (``packed_ok``) is given; otherwise the copy holds T's values."""
    if isinstance(second, SummaryTable):
        if (second.addresses is not None and second.addresses.device == device
                and (packed_ok or not second.t_packed)):
            table = second.addresses.contiguous()
            return table, table.shape[1], (64, 64), None, second.t_packed
        second = second.stacked()
    other_mode, trans2 = _mode_and_transition(second)
    if other_mode != mode:
        raise ValueError("a source table needs second summaries of the same structure")
    trans2 = trans2.to(device=device, dtype=torch.float32).contiguous()
    state2 = second.state.to(device=device, dtype=torch.float32).contiguous()
    n = state2.shape[0]
    steps = torch.arange(n, device=device, dtype=torch.int64)
    t_bytes, s_bytes = trans2[0].numel() * 4, state2[0].numel() * 4
    table = torch.stack([trans2.data_ptr() + steps * t_bytes, state2.data_ptr() + steps * s_bytes])
    units = (math.gcd(64, t_bytes) if trans2.data_ptr() % 64 == 0 else 4,
             math.gcd(64, s_bytes) if state2.data_ptr() % 64 == 0 else 4)
    return table, n, units, (trans2, state2), False


def scan_chain_triton(
    summaries,
    cu_chains: torch.Tensor,
    initial_states: Optional[torch.Tensor] = None,
    second=None,
    source: Optional[torch.Tensor] = None,
    record_rows: Optional[torch.Tensor] = None,
    num_records: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Triton scan over B chains of summaries (CUDA, fp32). Returns (incoming, final [B]).

    With ``second`` and ``source [M]`` the chain is not laid out in ``summaries``: span i is
    ``summaries[source[i]]`` when ``source[i] >= 0``, else ``second[-source[i] - 1]``, where
    ``second`` is a summary or a :class:`~hypic.ops.linear.summary.SummaryTable` read in place
    through its addresses. ``incoming`` is ``[M]``, or ``[num_records]`` with ``record_rows``
    (span i's incoming state in row ``record_rows[i]``, -1: not written)."""
    mode, trans = _mode_and_transition(summaries)
    state = summaries.state
    if state.dim() != 4:
        raise ValueError(f"summaries.state must be [M, HV, K, V], got shape {tuple(state.shape)}")
    num_spans, num_heads, key_dim, value_dim = state.shape
    device = state.device
    has_source = source is not None
    trans = _aligned(trans.to(device=device, dtype=torch.float32).contiguous())
    state = _aligned(state.to(torch.float32).contiguous())
    if has_source:
        if second is None:
            raise ValueError("a source table needs second summaries")
        # (packed bodies read by the summary walk, whose steps mix them with live summaries:
        # a copy of their values; the walks of a PIC forward are the WY ones below)
        table, num_table, (t_unit, s_unit), owner, _ = _table_of(second, mode, device)
        num_spans = source.numel()
        source = source.to(device=device, dtype=torch.int64).contiguous()
    else:  # _launch puts placeholders in for what a flag switches off
        table, num_table, owner, t_unit, s_unit = None, 0, None, 64, 64
    has_record = record_rows is not None
    if has_record:
        record = record_rows.to(device=device, dtype=torch.int64).contiguous()
        num_rows = num_records
    else:
        record, num_rows = None, num_spans
    num_chains = cu_chains.numel() - 1
    incoming = torch.empty(num_rows, num_heads, key_dim, value_dim, device=device, dtype=torch.float32)
    final = torch.empty(num_chains, num_heads, key_dim, value_dim, device=device, dtype=torch.float32)
    _launch(trans, state, incoming, final, cu_chains, initial_states, table, num_table, source, record,
            None, mode, has_source, has_record, (t_unit, s_unit), t_packed=False)
    del owner  # the copies read through the table may go once the launch is queued
    return incoming, final


def _launch(trans, state, incoming, final, cu_chains, initial_states, table, num_table, source, record, wy,
            mode: int, has_source: bool, has_record: bool, units, long_wy: bool = False,
            t_packed: bool = False, rotation=None) -> None:
    """One launch of the scan kernel; ``wy`` = ``(k, w or None, u, g or None, cu_spans, span_chunk,
    v_new, h_chunks)`` makes live elements WY spans (of at most one chunk, or of any length with
    ``long_wy``; ``w`` None: W = 0, ``v_new`` unused); ``t_packed``: the table's T are stored as
    bf16 planes (needs ``wy``, a source and dense T); ``rotation`` = ``(cos, sin, rotary_dim)``
    (:func:`body_rotation_tables`) rotates the bodies' S on load (needs ``wy``, a source and
    scalar T)."""
    import triton

    global _KERNEL
    num_heads, key_dim, value_dim = final.shape[1:]
    device = final.device
    num_chains = cu_chains.numel() - 1
    if num_chains == 0:
        return
    cu = cu_chains.to(device=device, dtype=torch.int64).contiguous()
    if not has_source:
        table, num_table, source = cu, 0, cu
    if not has_record:
        record = cu
    has_init = initial_states is not None
    init = initial_states.to(torch.float32).contiguous() if has_init else final
    if wy is None:
        k = w = u = g = cu_spans = span_chunk = v_new = h_chunks = cu
        key_heads, use_g, has_w = num_heads, False, True
    else:
        k, w, u, g, cu_spans, span_chunk, v_new, h_chunks = wy
        key_heads, use_g, has_w = k.shape[1], g is not None, w is not None
        g = cu if g is None else g
        w = u if w is None else w  # never read without W
        if not has_w and long_wy:
            raise ValueError("a walk without W (W = 0) takes live spans of at most one chunk")
    if rotation is not None and not (wy is not None and has_source and mode == MODE_SCALAR):
        raise ValueError("bodies are rotated on load only by a WY walk of scalar-T bodies from a source")
    rot_cos, rot_sin, rotary_dim = (cu, cu, 0) if rotation is None else rotation
    if _KERNEL is None:
        _KERNEL = _build_kernel()
    kernel, fixed_block_v = _KERNEL
    block_k = max(16, triton.next_power_of_2(key_dim))
    extra = {} if fixed_block_v is None else {"BV": fixed_block_v}
    if t_packed and not (wy is not None and has_source and mode == MODE_DENSE):
        raise ValueError("packed T (bf16 planes) are read only by a WY walk of dense bodies from a source")
    # a seam and the body after it in one step: dense bodies from a source, no recorded states
    fuse = wy is not None and has_source and mode == MODE_DENSE and not has_record

    def grid(meta):
        return (triton.cdiv(value_dim, meta["BV"]), num_heads, num_chains)

    kernel[grid](
        trans, state, init, incoming, final, cu, table, source, record, k, w, u, g, cu_spans, span_chunk, v_new,
        h_chunks, rot_cos, rot_sin, num_table, trans.data_ptr(), state.data_ptr(),
        H=key_heads, HV=num_heads, K=key_dim, V=value_dim, BK=block_k, BS=SEAM_ROWS,
        MODE=mode, HAS_INIT=has_init, INTERPRET=triton_interpret(), HAS_SOURCE=has_source,
        HAS_RECORD=has_record, HAS_WY=wy is not None, USE_G=use_g, LONG_WY=long_wy, BT=CHUNK_TOKENS,
        T_UNIT=units[0], S_UNIT=units[1], FUSE=fuse, T_PACKED=t_packed, HAS_W=has_w,
        ROTATE=rotation is not None, RD=rotary_dim, **extra,
    )


def scan_chain_wy_triton(
    k: torch.Tensor,
    w: Optional[torch.Tensor],
    u: torch.Tensor,
    g: Optional[torch.Tensor],
    cu_spans: torch.Tensor,
    span_chunk: torch.Tensor,
    num_chunks: int,
    cu_chains: torch.Tensor,
    initial_states: Optional[torch.Tensor] = None,
    second=None,
    source: Optional[torch.Tensor] = None,
    long_spans: bool = False,
    record_rows: Optional[torch.Tensor] = None,
    num_records: Optional[int] = None,
    mode: int = MODE_DENSE,
    body_rotation: Optional[Tuple[torch.Tensor, torch.Tensor, int]] = None,
):
    """The chain scan with live spans given by their WY factors instead of summaries, fused with
    their state pass (CUDA, delta-rule families). Returns ``(v_new [T, HV, V] in u's dtype,
    h [num_chunks, HV, K, V] in w's dtype, final [B, HV, K, V] fp32)``: what fla's output kernel
    reads, and the state after each chain; with ``record_rows`` (int64 ``[M]``, -1: not kept) a
    fourth output, ``incoming [num_records, HV, K, V]`` fp32: the state entering element i in
    row ``record_rows[i]``.

    Live span s (tokens ``cu_spans[s]:cu_spans[s+1]``; its chunks are rows ``span_chunk[s]`` on
    of ``h``, -1 for an empty span) is element i of a chain where ``source[i] == s``;
    ``source[i] < 0`` is entry ``-source[i] - 1`` of ``second`` (dense summaries, or a
    SummaryTable read in place); without ``source`` element i is live span i. Without
    ``long_spans`` every live span has at most one chunk (a cached request's seams and question;
    their one step keeps h in fp32 for ``W h``, a bf16x3 split); with it spans of any
    length are walked chunk by chunk in fla's state-pass precision (:func:`wy_chunks` of the
    kernel module), which is how a cold prefill's segments run. ``k [T, H, K]`` (H divides HV),
    ``w [T, HV, K]``, ``u [T, HV, V]``, ``g [T, HV]`` chunk-local cumulative log2 gate or None
    (DeltaNet): fla's WY step outputs. Tokens no live span covers keep an unspecified ``v_new``.

    A scalar-decay family (simple GLA, lightning) walks with ``w`` None (``W = 0``; one-chunk
    spans only), ``u = v``, ``mode = MODE_SCALAR`` (the bodies' T a log decay per head) and ``g``
    the chunk-local cumulative log2 gate: ``v_new`` is then ``u`` itself and ``h`` is in k's
    dtype. ``body_rotation`` ``(cos, sin, rotary_dim)`` (:func:`body_rotation_tables`, scalar T
    only) rotates each body's S on load to where it now starts."""
    num_heads, key_dim, value_dim = u.shape[1], k.shape[2], u.shape[2]
    device = u.device
    final = torch.empty(cu_chains.numel() - 1, num_heads, key_dim, value_dim, device=device, dtype=torch.float32)
    v_new = u if w is None else torch.empty_like(u)
    h_chunks = torch.empty(num_chunks, num_heads, key_dim, value_dim, device=device,
                           dtype=k.dtype if w is None else w.dtype)
    has_source = source is not None
    # The table's addresses are read relative to an fp32 base: with no live summaries, ``final``
    # (a fresh, aligned allocation) is that base.
    trans = state = final
    table, num_table, units, owner, t_packed = None, 0, (64, 64), None, False
    if has_source:
        if second is None:
            raise ValueError("a source table needs second summaries")
        # packed bodies are read as they are: the walk's bf16x3 products would split fp32 T so
        table, num_table, units, owner, t_packed = _table_of(second, mode, device, packed_ok=True)
        source = source.to(device=device, dtype=torch.int64).contiguous()
    has_record = record_rows is not None
    incoming = final
    record = None
    if has_record:
        if num_records is None:
            raise ValueError("record_rows needs num_records")
        record = record_rows.to(device=device, dtype=torch.int64).contiguous()
        incoming = torch.empty(num_records, num_heads, key_dim, value_dim, device=device, dtype=torch.float32)
    wy = (k, w, u, g if g is None else g.to(torch.float32), cu_spans.to(device=device, dtype=torch.int64),
          span_chunk, v_new, h_chunks)
    _launch(trans, state, incoming, final, cu_chains, initial_states, table, num_table, source, record, wy,
            mode, has_source, has_record, units, long_wy=long_spans, t_packed=t_packed, rotation=body_rotation)
    del owner
    if has_record:
        return v_new, h_chunks, final, incoming
    return v_new, h_chunks, final


def scan_chain_wy_reference(
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    g: Optional[torch.Tensor],
    cu_spans: torch.Tensor,
    num_chunks: int,
    cu_chains: torch.Tensor,
    initial_states: Optional[torch.Tensor] = None,
    second=None,
    source: Optional[torch.Tensor] = None,
    record_rows: Optional[torch.Tensor] = None,
    num_records: Optional[int] = None,
    chunk_size: int = CHUNK_TOKENS,
):
    """Plain-loop reference of :func:`scan_chain_wy_triton` with ``long_spans`` (any device and
    dtype; computes in float64 on the CPU, for tests): every live span walked chunk by chunk,
    ``h_chunk <- h``, ``v_new = u - W h``, ``h <- exp2(g_last) h + (K * exp2(g_last - g))^T v_new``;
    bodies (``second``, dense) as ``T h + S``. Chunk rows are laid in span order. Returns the
    same outputs, float64 on the CPU (``v_new`` and ``h`` unrounded)."""
    f64 = lambda x: None if x is None else x.detach().to("cpu", torch.float64)  # noqa: E731
    k, w, u, g = f64(k), f64(w), f64(u), f64(g)
    bounds = [int(x) for x in cu_spans.tolist()]
    chains = [int(x) for x in cu_chains.tolist()]
    num_heads, key_dim, value_dim = w.shape[1], w.shape[2], u.shape[2]
    ratio = num_heads // k.shape[1]
    if isinstance(second, SummaryTable):
        second = second.stacked()
    trans2 = None if second is None else f64(second.transition)
    state2 = None if second is None else f64(second.state)
    src = None if source is None else [int(x) for x in source.tolist()]
    rec = None if record_rows is None else [int(x) for x in record_rows.tolist()]
    first_chunk = span_chunk_rows_host(cu_spans.cpu(), chunk_size)[0].tolist()
    v_new = torch.zeros_like(u)
    h_chunks = torch.zeros(num_chunks, num_heads, key_dim, value_dim, dtype=torch.float64)
    final = torch.zeros(len(chains) - 1, num_heads, key_dim, value_dim, dtype=torch.float64)
    incoming = None if rec is None else torch.zeros(num_records, num_heads, key_dim, value_dim, dtype=torch.float64)
    key_heads = torch.arange(num_heads) // ratio
    for c in range(len(chains) - 1):
        h = (torch.zeros(num_heads, key_dim, value_dim, dtype=torch.float64) if initial_states is None
             else f64(initial_states[c]).clone())
        for i in range(chains[c], chains[c + 1]):
            if rec is not None and rec[i] >= 0:
                incoming[rec[i]] = h
            s = i if src is None else src[i]
            if s < 0:
                h = trans2[-s - 1] @ h + state2[-s - 1]
                continue
            a, b = bounds[s], bounds[s + 1]
            for j, t0 in enumerate(range(a, b, chunk_size)):
                t1 = min(t0 + chunk_size, b)
                h_chunks[first_chunk[s] + j] = h
                vn = u[t0:t1] - torch.einsum("thk,hkv->thv", w[t0:t1], h)
                v_new[t0:t1] = vn
                kk = k[t0:t1][:, key_heads]
                if g is not None:
                    g_last = g[t1 - 1]
                    vn = vn * torch.exp2(g_last[None, :] - g[t0:t1])[..., None]
                    h = torch.exp2(g_last)[:, None, None] * h
                h = h + torch.einsum("thk,thv->hkv", kk, vn)
        final[c] = h
    if rec is not None:
        return v_new, h_chunks, final, incoming
    return v_new, h_chunks, final
