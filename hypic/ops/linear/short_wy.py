"""The WY step and the output of spans that fit in one chunk, in tiles of their own length.

A request whose segments are all cached runs its linear layers over short spans only: an
8-token seam per segment and the question. fla's kernels pad every span to a 64-token chunk:
the gate cumsum, the ``kkt`` + triangular solve (a serial forward substitution per row), the
``w``/``u`` products and the output kernel. On the H200 at the all-hit 32k shape (65 spans x 32
heads per layer) those took 2.4 ms (output), 1.8 ms (solve) and 0.8 ms (``w``/``u``) of the
request's 59 GPU ms, for work that is almost all padding.

Here each span runs in a tile of its length rounded up to a power of two (at least 16 rows;
one launch per tile size, :func:`~hypic.ops.linear.short_span.tile_groups_host`):

* :func:`short_span_wy` is fla's ``chunk_local_cumsum`` + ``chunk_gated_delta_rule_fwd_intra``
  in one launch, the triangular inverse in closed form (a nilpotent Neumann product, a few
  MMAs instead of a serial loop);
* :func:`short_span_output` is fla's ``chunk_fwd_o`` for those spans.

Outputs keep fla's layouts and rounding points (``A^-1`` in k's dtype, ``w``/``u``/``o`` in the
inputs' dtype, the gate cumsum fp32 in log2 units), so the chain kernel and the summaries read
them unchanged. The torch functions are the reference (batched per width class); the
``*_triton`` ones the fast path: all-hit 32k 58.91 ms p50 against 61.74 with fla's kernels, RAG
8k 42.72 against 43.58 (H200, interleaved; benchmarks/results/README.md).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from hypic.ops.linear.short_span import SpanRows, _need_classes
from hypic.ops.linear.transition import _side_stream

def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rows(x: torch.Tensor, flat: torch.Tensor, members: int, width: int, heads: int) -> torch.Tensor:
    """``x [T, heads_x, D]`` gathered at the class rows, repeated to ``heads``: ``[Nc, heads, R, D]``."""
    out = x.index_select(0, flat).view(members, width, x.shape[1], x.shape[-1])
    if heads != x.shape[1]:
        out = out.repeat_interleave(heads // x.shape[1], dim=2)
    return out.transpose(1, 2)


def _gate_rows(x: torch.Tensor, flat: torch.Tensor, members: int, width: int, acc) -> torch.Tensor:
    """``x [T, HV]`` at the class rows: ``[Nc, HV, R]`` in ``acc``."""
    return x.index_select(0, flat).view(members, width, x.shape[1]).transpose(1, 2).to(acc)


def _pairs(valid: torch.Tensor) -> torch.Tensor:
    """``[Nc, 1, R, R]``: both positions of a pair inside the span."""
    return valid[:, None, :, None] & valid[:, None, None, :]


def _scatter(out: torch.Tensor, cls, values: torch.Tensor) -> None:
    """Class values ``[Nc, HV, R, ...]`` into the token rows of ``out [T, HV, ...]``."""
    members, heads, width = values.shape[:3]
    flat = values.transpose(1, 2).reshape(members * width, heads, *values.shape[3:])
    out.index_copy_(0, cls.token_rows, flat.index_select(0, cls.token_slots).to(out.dtype))


def short_span_wy(k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor], beta: torch.Tensor,
                  table: SpanRows) -> Tuple[Optional[torch.Tensor], torch.Tensor, torch.Tensor]:
    """``(gc [T, HV] fp32 or None, w [T, HV, K], u [T, HV, V])``: fla's gate cumsum and WY
    factors of spans of at most one chunk (the torch reference; ``table`` built with classes).

    ``k [T, H, K]`` (H divides HV), ``v [T, HV, V]``, ``g [T, HV]`` log gates or None (DeltaNet),
    ``beta [T, HV]``. With ``G`` the within-span cumsum of ``g``: ``A = strict_lower(beta_i
    exp(G_i - G_j) k_i.k_j)``, ``w = (I + A)^-1 diag(beta exp(G)) K``, ``u = (I + A)^-1
    diag(beta) V``; ``(I + A)^-1`` is rounded to k's dtype and the scaled K and V to theirs
    before the products, as in fla."""
    _need_classes(table)
    heads, key_dim, value_dim = v.shape[1], k.shape[-1], v.shape[-1]
    acc = _acc_dtype(k.dtype)
    num_tokens = k.shape[0]
    w = torch.zeros(num_tokens, heads, key_dim, device=k.device, dtype=k.dtype)
    u = torch.zeros(num_tokens, heads, value_dim, device=k.device, dtype=v.dtype)
    gc = None if g is None else torch.zeros(num_tokens, heads, device=k.device, dtype=torch.float32)
    for cls in table.classes:
        members, width = cls.rows.shape
        flat = cls.rows.reshape(-1)
        valid = cls.valid[:, None, :]  # [Nc, 1, R]
        k_rows = _rows(k, flat, members, width, heads).to(acc)  # [Nc, HV, R, K]
        b = _gate_rows(beta, flat, members, width, acc) * valid
        lower = torch.ones(width, width, dtype=torch.bool, device=k.device).tril(-1) & _pairs(cls.valid)
        a = k_rows @ k_rows.transpose(-1, -2)
        if g is not None:
            g_cum = (_gate_rows(g, flat, members, width, acc) * valid).cumsum(-1) / math.log(2.0)
            a = torch.where(lower, a * torch.exp2(torch.where(lower, g_cum[..., :, None] - g_cum[..., None, :], 0)), 0)
            k_scale = b * torch.exp2(g_cum)
            _scatter(gc, cls, g_cum)
        else:
            a = torch.where(lower, a, 0)
            k_scale = b
        eye = torch.eye(width, device=k.device, dtype=acc)
        inverse = torch.linalg.solve_triangular(eye + a * b[..., :, None], eye.expand_as(a), upper=False,
                                                unitriangular=True)
        inverse = inverse.to(k.dtype).to(acc)
        k_scaled = (k_rows * k_scale[..., None]).to(k.dtype).to(acc)
        _scatter(w, cls, inverse @ k_scaled)
        v_scaled = (_rows(v, flat, members, width, heads).to(acc) * b[..., None]).to(v.dtype).to(acc)
        _scatter(u, cls, inverse.to(v.dtype).to(acc) @ v_scaled)
    return gc, w, u


def short_span_output(q: torch.Tensor, k: torch.Tensor, v_new: torch.Tensor, h: torch.Tensor,
                      gc: Optional[torch.Tensor], table: SpanRows, scale: float) -> torch.Tensor:
    """fla's output for spans of at most one chunk (the torch reference): for each span and
    token t, ``o_t = scale (exp2(gc_t) q_t h + sum_{j <= t} exp2(gc_t - gc_j) (q_t.k_j) v_new_j)``
    with ``h = h[span_chunk[span]]`` the state entering the span; the scores are rounded to
    v_new's dtype before their product, as in fla. ``q``, ``k [T, H, K]``, ``v_new [T, HV, V]``,
    ``h [num_chunks, HV, K, V]``; returns ``[T, HV, V]`` in v_new's dtype."""
    _need_classes(table)
    heads = v_new.shape[1]
    acc = _acc_dtype(q.dtype)
    o = torch.zeros_like(v_new)
    for cls in table.classes:
        members, width = cls.rows.shape
        flat = cls.rows.reshape(-1)
        valid = cls.valid[:, None, :]
        chunk = table.span_chunk.index_select(0, cls.span_ids).to(torch.int64).clamp_min(0)
        h_rows = h.index_select(0, chunk).to(acc)  # [Nc, HV, K, V]; an empty span's rows are all masked
        q_rows = _rows(q, flat, members, width, heads).to(acc)
        k_rows = _rows(k, flat, members, width, heads).to(acc)
        causal = torch.ones(width, width, dtype=torch.bool, device=q.device).tril() & _pairs(cls.valid)
        inter = q_rows @ h_rows
        scores = q_rows @ k_rows.transpose(-1, -2)
        if gc is not None:
            g_rows = _gate_rows(gc, flat, members, width, acc) * valid
            inter = inter * torch.exp2(g_rows)[..., None]
            scores = scores * torch.exp2(torch.where(causal, g_rows[..., :, None] - g_rows[..., None, :], 0))
        scores = torch.where(causal, scores, 0).to(v_new.dtype).to(acc)
        out = inter * scale + (scores @ _rows(v_new, flat, members, width, heads).to(acc)) * scale
        _scatter(o, cls, out)
    return o


# --------------------------------------------------------------------------------------------
# Triton: one launch per tile size (the torch functions above are their reference)
# --------------------------------------------------------------------------------------------

_KERNELS = None
# Launch configs per tile rows, (warps, w/u column block) and (warps, V block). Measured one
# launch at a time at the all-hit 32k shape on the H200 (benchmarks/short_kernels_h200.py;
# 64 seams in 16-row tiles, the 64-token question in one 64-row tile, 32
# value heads): the WY step at 16 rows 17.5 us with 2 warps against 19.0 with 4 (26.1 with 8);
# the output at 16 rows 28.0 us with 2 warps and V blocks of 64 against 31.1 with 4 (BV 32:
# 37.9 / 46.6), at 64 rows 6.2 us with 4 warps. Sizes not listed take the last entry at or
# below them.
WY_CONFIGS = {16: (2, 128), 32: (4, 128), 64: (4, 128)}
OUTPUT_CONFIGS = {16: (2, 64), 32: (4, 64), 64: (4, 64)}


def _config(table: dict, rows: int) -> tuple:
    return table[max([r for r in table if r <= rows], default=min(table))]


def _kernels():
    global _KERNELS
    if _KERNELS is None:
        from hypic.ops.linear._short_wy_kernel import short_output_kernel, short_wy_kernel

        _KERNELS = (short_wy_kernel, short_output_kernel)
    return _KERNELS


def _tile_launches(device: torch.device, tiles, launch) -> None:
    """``launch(rows, ids)`` for each tile size. A cached request has 16-row seam tiles (64 spans
    x heads programs) and one 64-row question tile (one program per head, a serial inverse with
    few programs to hide it): in the all-hit 32k profile they took 17.5 and 32.6 us one after
    the other in every linear layer. On CUDA the largest size is launched on a side stream forked
    from the current one and joined back after the others, so the two run side by side (in a
    CUDA graph capture the fork and join become the graph's branches): both sizes' WY step and
    output took 69.6 us so inside a graph against 83.1 one after another, the all-hit 32k
    request 53.21 ms p50 against 53.37 (H200, benchmarks/results/README.md). Their outputs are disjoint rows of tensors allocated before
    the fork, and the current stream waits for the side stream before anything reads them or
    can reuse their memory."""
    if len(tiles) < 2 or device.type != "cuda":
        for rows, ids in tiles:
            launch(rows, ids)
        return
    current = torch.cuda.current_stream(device)
    side = _side_stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        launch(*tiles[-1])  # the tiles come in increasing size
    for rows, ids in tiles[:-1]:
        launch(rows, ids)
    current.wait_stream(side)


def _check_tiles(table: SpanRows, key_dim: int) -> None:
    """A table whose non-empty spans have tiles (else the kernels would write nothing) and a key
    dim the kernels take."""
    if not table.tiles and table.chunk_spans.numel():
        raise ValueError("the span table has non-empty spans but no Triton tiles")
    if key_dim < 16 or key_dim & (key_dim - 1):
        raise ValueError(f"short_wy's kernels need a power-of-two key dim >= 16, got {key_dim}")


def short_span_wy_triton(k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor], beta: torch.Tensor,
                         cu: torch.Tensor, table: SpanRows) -> Tuple[Optional[torch.Tensor], torch.Tensor, torch.Tensor]:
    """:func:`short_span_wy` in one launch per tile size. Rows that no span covers (none in a
    PIC forward: its spans tile the tokens) keep unspecified values."""
    _check_tiles(table, k.shape[-1])
    k, v, beta = k.contiguous(), v.contiguous(), beta.contiguous()
    g = None if g is None else g.contiguous()
    heads, key_dim, value_dim = v.shape[1], k.shape[-1], v.shape[-1]
    num_tokens = k.shape[0]
    w = torch.empty(num_tokens, heads, key_dim, device=k.device, dtype=k.dtype)
    u = torch.empty(num_tokens, heads, value_dim, device=k.device, dtype=v.dtype)
    gc = None if g is None else torch.empty(num_tokens, heads, device=k.device, dtype=torch.float32)
    fp32 = k.dtype == torch.float32
    block_v = max(16, 1 << (value_dim - 1).bit_length())

    def launch(rows: int, ids: torch.Tensor) -> None:
        warps, block_c = _config(WY_CONFIGS, rows)
        block_c = min(block_c, key_dim, block_v)  # both powers of two: the block divides K and BV
        _kernels()[0][(ids.shape[0], heads)](
            k, v, g if g is not None else beta, beta, cu, ids, gc if gc is not None else w, w, u,
            H=k.shape[1], HV=heads, K=key_dim, V=value_dim, BV=block_v,
            BT=rows, LOG2_BT=rows.bit_length() - 1, USE_G=g is not None,
            # 16-row tiles: exact fp32 FMA dots are cheap; larger ones use 3xTF32 MMAs (fp32-accurate)
            INV_PRECISION="ieee" if rows <= 16 else "tf32x3", IO_PRECISION="ieee" if fp32 else "tf32",
            BC=block_c, num_warps=warps,
        )

    _tile_launches(k.device, table.tiles, launch)
    return gc, w, u


def short_span_output_triton(q: torch.Tensor, k: torch.Tensor, v_new: torch.Tensor, h: torch.Tensor,
                             gc: Optional[torch.Tensor], cu: torch.Tensor, table: SpanRows,
                             scale: float) -> torch.Tensor:
    """:func:`short_span_output` in one launch per tile size."""
    _check_tiles(table, k.shape[-1])
    q, k, v_new, h = q.contiguous(), k.contiguous(), v_new.contiguous(), h.contiguous()
    gc = None if gc is None else gc.contiguous()
    heads, key_dim, value_dim = v_new.shape[1], k.shape[-1], v_new.shape[-1]
    o = torch.empty_like(v_new)

    def launch(rows: int, ids: torch.Tensor) -> None:
        warps, block_v = _config(OUTPUT_CONFIGS, rows)
        block_v = min(block_v, max(16, 1 << (value_dim - 1).bit_length()))
        _kernels()[1][(ids.shape[0], heads, -(-value_dim // block_v))](
            q, k, v_new, h, gc if gc is not None else v_new, cu, ids, table.span_chunk, o, float(scale),
            H=k.shape[1], HV=heads, K=key_dim, V=value_dim, BT=rows, BV=block_v, USE_G=gc is not None,
            num_warps=warps,
        )

    _tile_launches(q.device, table.tiles, launch)
    return o


__all__ = ["short_span_output", "short_span_output_triton", "short_span_wy", "short_span_wy_triton"]
