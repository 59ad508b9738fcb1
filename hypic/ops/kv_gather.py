"""Packed keys and values of a PIC forward's full-attention layer, written in one pass.

A cached request's keys are its live tokens' K plus the K of every cached piece (prefix
checkpoints, reused segment bodies), each piece's RoPE shifted to where the piece now sits, all
gathered into one packed varlen key set by ``key_index``. The reference
(:func:`gather_kv_reference`) is the sequence the engine ran before: concatenate the pieces,
rotate the cached K by its shift, concatenate with the live rows, gather by ``key_index``. At the
all-hit 32k shape (64 pieces of 504 tokens and 576 live ones, 2 KV heads of 256 dims, bf16) that
is 4-5 passes over ~33 MB of K and of V per layer: the H200 profile showed ~1.85 ms of
``aten::cat``, 0.93 + 0.89 ms of batched copies, ~1.3 ms of gathers and the rotation's
elementwise kernels per request (10 attention layers).

:func:`gather_kv_triton` writes the packed tensors in one launch: each output row reads its
source once (a live row, or a cached piece read where the store holds it, through an int64 table
of the pieces' addresses built once per layout) and the rotated dims of cached K are rotated on
the way. :func:`gather_kv` dispatches on its inputs: the kernel for CUDA tensors (or CPU tensors
under Triton's interpreter, :func:`hypic.envs.triton_interpret`) whose pieces can be read in
place, the reference elsewhere (CPU, fp64, pieces in another format). On the H200 the kernel
assembles a layer's keys and values of the all-hit 32k request in 0.061 ms against the former
sequence's 0.281 ms (graph replays; 2.04 ms of GPU time a request over 10 layers, the output
bit-identical; docs/decisions.md).

Precision: the reference rotates in fp32 (``apply_rotary`` promotes the stored dtype to the fp32
cos/sin) as ``x*cos + rotate_half(x)*sin``, each product and the sum rounded to fp32, then
rounds to the stored dtype once (to nearest even). The kernel does the same operations in the
same order with FMA contraction disabled, from a per-piece cos/sin table holding the reference's
values (``RotaryEmbedding.cos_sin`` of the piece shifts: the per-row table's rows), so the
results are the reference's bits. Checked under the interpreter for fp16 and fp32
(tests/ops/test_kv_gather.py); the interpreter itself converts fp32 to bf16 by truncation, so
there bf16 rotated dims may sit one ulp (at most 2^-7 relative) off, which compiled Triton does not do.
On the GPU the CUDA test admits that one ulp on the rotated dims and benchmarks/kv_gather_h200.py
reports whether the bits agree. Unrotated dims and values are copied bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

from hypic import envs
from hypic.ops.linear.checks import FLOAT_DTYPES, check_tensor, concrete_device, on_device
from hypic.ops.rope import apply_rotary

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK_ROWS = 8  # output rows per program; 8 x 4 warps measured fastest on the H200 (0.061 ms/layer, 16 rows 0.078)
NUM_WARPS = 4
MAX_UNIT_BYTES = 16  # widest vector load
# Binary-search steps over the pieces: one constant for up to 65,536 pieces, so the kernel
# compiles once rather than once per bit length of the piece count
_SEARCH_STEPS = 16
_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        from hypic.ops._kv_gather_kernel import kv_gather_kernel

        _KERNEL = kv_gather_kernel
    return _KERNEL


@dataclass(frozen=True)
class PieceFormat:
    """What every cached piece of a table is: contiguous ``[n, num_heads, key_dim]`` keys and
    ``[n, num_heads, value_dim]`` values of ``dtype``, each at an address that is a multiple of
    ``align_bytes`` (a power of two, at most :data:`MAX_UNIT_BYTES`)."""

    dtype: torch.dtype
    num_heads: int
    key_dim: int
    value_dim: int
    align_bytes: int


@dataclass(frozen=True)
class PieceTable:
    """One layer's cached pieces as the kernel reads them in place: ``addresses [2, N]`` int64
    (N >= the piece count; row 0 the byte address of each piece's keys, row 1 of its values) on
    the device, every piece of ``fmt``. The caller keeps the pieces alive until the launch is
    queued (stream order protects them after that)."""

    addresses: torch.Tensor
    fmt: PieceFormat


def alignment_bytes(address: int) -> int:
    """The largest power of two dividing ``address``, at most :data:`MAX_UNIT_BYTES`."""
    return MAX_UNIT_BYTES if address % MAX_UNIT_BYTES == 0 else address & -address


def piece_format(key: object, value: object, device: torch.device) -> Optional[PieceFormat]:
    """The format of one cached piece if the kernel can read it in place on ``device`` (``cuda``
    without an index: the current one): 3-D contiguous key and value tensors there, of one kernel
    dtype and head count, element-aligned; else None. Host-only."""
    if not (isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor)):
        return None
    device = concrete_device(device)
    if key.dim() != 3 or value.dim() != 3 or key.shape[:2] != value.shape[:2]:
        return None
    if key.device != device or value.device != device or key.dtype != value.dtype:
        return None
    if key.dtype not in KERNEL_DTYPES or not (key.is_contiguous() and value.is_contiguous()):
        return None
    align = min(alignment_bytes(key.data_ptr()), alignment_bytes(value.data_ptr()))
    if align < key.element_size():
        return None
    return PieceFormat(key.dtype, key.shape[1], key.shape[2], value.shape[2], align)


def gather_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    cached_keys: Sequence[torch.Tensor],
    cached_values: Sequence[torch.Tensor],
    cu_cached: torch.Tensor,
    key_index: torch.Tensor,
    *,
    shift_cos: Optional[torch.Tensor] = None,
    shift_sin: Optional[torch.Tensor] = None,
    table: Optional[PieceTable] = None,
    out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Packed ``(keys [R, H, DK], values [R, H, DV])``: row r is row ``key_index[r]`` of
    ``cat(live rows, cached rows)``, the cached rows being the P pieces in order, keys rotated by
    their piece's ``shift_cos``/``shift_sin`` (fp32 ``[P, RD]``; None: no rotation).

    k ``[T, H, DK]``, v ``[T, H, DV]`` live rows; ``cached_keys``/``cached_values`` the pieces
    ``[n_p, H, *]`` (the kernel path does not iterate them: a lazy sequence costs nothing there);
    ``cu_cached [P + 1]`` int64 their row bounds on k's device; ``key_index [R]`` int64 there.
    ``table`` lets the kernel read the pieces in place: the kernel runs where
    :func:`kernel_refusal` finds nothing against it, the reference elsewhere. ``out`` optional
    contiguous output tensors. Index contents are not checked (that would wait for the device)."""
    num_pieces = _check(k, v, cached_keys, cached_values, cu_cached, key_index, shift_cos, shift_sin, out)
    if kernel_refusal(k, v, table, shift_cos, num_pieces) is None:
        return gather_kv_triton(k, v, table, cu_cached, key_index, shift_cos=shift_cos, shift_sin=shift_sin, out=out)
    keys, values = gather_kv_reference(k, v, cached_keys, cached_values, cu_cached, key_index,
                                       shift_cos=shift_cos, shift_sin=shift_sin)
    if out is None:
        return keys, values
    out[0].copy_(keys)
    out[1].copy_(values)
    return out


def gather_kv_reference(
    k: torch.Tensor,
    v: torch.Tensor,
    cached_keys: Sequence[torch.Tensor],
    cached_values: Sequence[torch.Tensor],
    cu_cached: torch.Tensor,
    key_index: torch.Tensor,
    *,
    shift_cos: Optional[torch.Tensor] = None,
    shift_sin: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`gather_kv` as separate tensor ops (pieces converted to k's device and dtype): the
    CPU path and the kernel's reference."""
    if len(cached_keys) == 0:
        return k.index_select(0, key_index), v.index_select(0, key_index)
    ck = torch.cat([on_device(t, k.device, k.dtype) for t in cached_keys])
    cv = torch.cat([on_device(t, v.device, v.dtype) for t in cached_values])
    if shift_cos is not None:
        # RoPE composes: R(p + d) = R(d) R(p), so rotating cached K by its piece's shift d moves it.
        # Each row takes its piece's cos/sin (output_size given: no wait for the device).
        pieces = torch.arange(len(cached_keys), device=cu_cached.device)
        piece_of_row = torch.repeat_interleave(pieces, cu_cached[1:] - cu_cached[:-1], output_size=ck.shape[0])
        ck = apply_rotary(ck, shift_cos.index_select(0, piece_of_row), shift_sin.index_select(0, piece_of_row))
    keys = torch.cat([k, ck]).index_select(0, key_index)
    values = torch.cat([v, cv]).index_select(0, key_index)
    return keys, values


def gather_kv_triton(
    k: torch.Tensor,
    v: torch.Tensor,
    table: Optional[PieceTable],
    cu_cached: torch.Tensor,
    key_index: torch.Tensor,
    *,
    shift_cos: Optional[torch.Tensor] = None,
    shift_sin: Optional[torch.Tensor] = None,
    out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    block_rows: int = BLOCK_ROWS,
    num_warps: int = NUM_WARPS,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`gather_kv` in one launch (inputs validated by the caller: :func:`gather_kv`, or a
    benchmark sweeping ``block_rows`` and ``num_warps``). ``table`` may be None only without
    pieces."""
    import triton

    if block_rows < 1 or block_rows & (block_rows - 1):
        raise ValueError(f"block_rows must be a power of two, got {block_rows}")
    num_live, num_heads, key_dim = k.shape
    value_dim = v.shape[2]
    num_rows = key_index.shape[0]
    num_pieces = cu_cached.shape[0] - 1
    if out is None:
        out = (torch.empty(num_rows, num_heads, key_dim, dtype=k.dtype, device=k.device),
               torch.empty(num_rows, num_heads, value_dim, dtype=v.dtype, device=v.device))
    out_k, out_v = out
    if num_rows == 0:
        return out
    if num_live == 0:
        k, v = out_k, out_v  # never read (no live row); an empty tensor's pointer may be null
    k = k if k.stride(2) == 1 else k.contiguous()
    v = v if v.stride(2) == 1 else v.contiguous()
    if table is None:
        if num_pieces:
            raise ValueError(f"{num_pieces} cached pieces but no table of their addresses")
        addresses, piece_align_bytes = cu_cached.view(1, 1), MAX_UNIT_BYTES  # never read: no row is cached
    else:
        addresses, piece_align_bytes = table.addresses, table.fmt.align_bytes
    # piece offsets count from the outputs' addresses in steps every address is a multiple of
    unit_bytes = min(piece_align_bytes, alignment_bytes(out_k.data_ptr()), alignment_bytes(out_v.data_ptr()))
    rotate = shift_cos is not None
    cos = shift_cos.contiguous() if rotate else out_k  # a placeholder pointer when not read
    sin = shift_sin.contiguous() if rotate else out_k
    grid = (triton.cdiv(num_rows, block_rows), num_heads)
    _kernel()[grid](
        k, v, addresses, addresses.stride(0), cu_cached, key_index, cos, sin, out_k, out_v,
        out_k.data_ptr(), out_v.data_ptr(), num_rows, num_live, num_pieces,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        H=num_heads, DK=key_dim, DV=value_dim, DK_PAD=triton.next_power_of_2(key_dim),
        DV_PAD=triton.next_power_of_2(value_dim), RD=shift_cos.shape[1] if rotate else 0, ROTATE=rotate,
        UNIT_BYTES=unit_bytes, ELEM_BYTES=k.element_size(), BR=block_rows,
        LOG_N=max(_SEARCH_STEPS, num_pieces.bit_length()), num_warps=num_warps,
        # the reference rounds each product and the sum to fp32: no fused multiply-adds
        enable_fp_fusion=False,
    )
    return out


def _check(k, v, cached_keys, cached_values, cu_cached, key_index, shift_cos, shift_sin, out) -> int:
    """Shapes, dtypes and devices (host-only); returns the piece count."""
    check_tensor("k", k, (None, None, None), FLOAT_DTYPES)
    num_live, num_heads, _ = k.shape
    check_tensor("v", v, (num_live, num_heads, None), (k.dtype,))
    check_tensor("key_index", key_index, (None,), (torch.int64,))
    num_pieces = len(cached_keys)
    if len(cached_values) != num_pieces:
        raise ValueError(f"cached_keys has {num_pieces} pieces, cached_values {len(cached_values)}")
    check_tensor("cu_cached", cu_cached, (num_pieces + 1,), (torch.int64,))
    for name, t in (("v", v), ("key_index", key_index), ("cu_cached", cu_cached)):
        if t.device != k.device:
            raise ValueError(f"{name} is on {t.device}, k on {k.device}")
    if (shift_cos is None) != (shift_sin is None):
        raise ValueError("shift_cos and shift_sin go together (both or neither)")
    if shift_cos is not None:
        check_tensor("shift_cos", shift_cos, (num_pieces, None), FLOAT_DTYPES)
        check_tensor("shift_sin", shift_sin, tuple(shift_cos.shape), (shift_cos.dtype,))
        rotary_dims = shift_cos.shape[1]
        if rotary_dims == 0 or rotary_dims % 2 or rotary_dims > k.shape[2]:
            raise ValueError(f"shift_cos width {rotary_dims} must be even and in (0, key dim {k.shape[2]}]")
        for name, t in (("shift_cos", shift_cos), ("shift_sin", shift_sin)):
            if t.device != k.device:
                raise ValueError(f"{name} is on {t.device}, k on {k.device}")
    if out is not None:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ValueError("out must be a (keys, values) tuple")
        num_rows = key_index.shape[0]
        for name, t, like in (("out[0]", out[0], k), ("out[1]", out[1], v)):
            check_tensor(name, t, (num_rows, num_heads, like.shape[2]), (like.dtype,))
            if t.device != k.device or not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous on {k.device}")
    return num_pieces


def kernel_refusal(k: torch.Tensor, v: torch.Tensor, table: Optional[PieceTable], shift_cos: Optional[torch.Tensor],
                   num_pieces: int) -> Optional[str]:
    """Why :func:`gather_kv_triton` cannot take these (checked) inputs, or None when it can: the
    kernel needs CUDA tensors (CPU ones only under Triton's interpreter), a kernel dtype, and the
    pieces readable in place through ``table``. Host-only."""
    if not (k.is_cuda or (k.device.type == "cpu" and envs.triton_interpret())):
        return f"k is on {k.device} (the kernel needs CUDA, or TRITON_INTERPRET=1)"
    if k.dtype not in KERNEL_DTYPES:
        return f"dtype {k.dtype} (the kernel takes {KERNEL_DTYPES})"
    if num_pieces == 0:
        return None  # every row is live: nothing read in place
    if table is None:
        return "no table of the pieces' addresses (some piece cannot be read in place)"
    fmt = table.fmt
    if (fmt.dtype, fmt.num_heads, fmt.key_dim, fmt.value_dim) != (k.dtype, k.shape[1], k.shape[2], v.shape[2]):
        return (f"the pieces are [*, {fmt.num_heads}, {fmt.key_dim}/{fmt.value_dim}] {fmt.dtype}, "
                f"the live rows [*, {k.shape[1]}, {k.shape[2]}/{v.shape[2]}] {k.dtype}")
    addresses = table.addresses
    if (addresses.dim() != 2 or addresses.shape[0] != 2 or addresses.shape[1] < num_pieces
            or addresses.dtype != torch.int64 or addresses.device != k.device or addresses.stride(1) != 1):
        return f"the address table must be [2, >= {num_pieces}] int64 rows on {k.device}"
    if shift_cos is not None and shift_cos.dtype != torch.float32:
        return f"shift_cos is {shift_cos.dtype} (the kernel rotates with fp32 tables, as the reference does)"
    return None


__all__ = ["PieceFormat", "PieceTable", "alignment_bytes", "gather_kv", "gather_kv_reference", "gather_kv_triton",
           "kernel_refusal", "piece_format"]
