"""The one-pass K/V gather (hypic.ops.kv_gather) against its reference (concatenate, rotate,
gather).

CPU: input checks and the dispatch rule; the Triton kernel through
``TRITON_INTERPRET=1`` in a subprocess when Triton is installed, into NaN-poisoned outputs,
bit-identical to the reference. CUDA: bf16 at the engine's all-hit shape and odd shapes.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from hypic.ops import kv_gather
from tests.interpreter import interpreted_error

CASE = textwrap.dedent("""
    import torch
    from hypic.ops.kv_gather import PieceTable, gather_kv, gather_kv_reference, kernel_refusal, piece_format
    from hypic.ops.rope import RotaryEmbedding

    def pieces_in(buffer_rows, lengths, heads, dim, dtype, device, offset_elems, gen):
        # pieces as views of one flat buffer, `offset_elems` in: misaligned when that is odd
        per_row = heads * dim
        flat = torch.randn(offset_elems + sum(lengths) * per_row + 8, generator=gen).to(dtype).to(device)
        out, at = [], offset_elems
        for n in lengths:
            out.append(flat[at:at + n * per_row].view(n, heads, dim))
            at += n * per_row
        return out

    def case(dtype, device, lengths, num_live, heads=2, key_dim=32, value_dim=None, rotary_dim=8,
             shifts=None, offset_elems=0, requests=2, seed=0, rotated_ulps=0):
        gen = torch.Generator().manual_seed(seed)
        value_dim = key_dim if value_dim is None else value_dim
        k = torch.randn(num_live, heads, key_dim, generator=gen).to(dtype).to(device)
        v = torch.randn(num_live, heads, value_dim, generator=gen).to(dtype).to(device)
        ck = pieces_in(None, lengths, heads, key_dim, dtype, device, offset_elems, gen)
        cv = pieces_in(None, lengths, heads, value_dim, dtype, device, offset_elems + 1, gen)
        cu = torch.tensor([0] + lengths).cumsum(0).to(device)
        num_cached = sum(lengths)
        # several requests: each a random ordering of a share of the rows, some rows twice
        rows = torch.randperm(num_live + num_cached, generator=gen)
        parts = [p[torch.randperm(p.numel(), generator=gen)] for p in rows.chunk(max(requests, 1))]
        extra = rows[:3] if rows.numel() >= 3 else rows
        key_index = torch.cat(parts + [extra]).to(device)
        cos = sin = None
        if shifts is not None:
            rope = RotaryEmbedding(key_dim, rotary_dim, theta=1e6)
            cos, sin = rope.cos_sin(torch.tensor(shifts, device=device))
        formats = [piece_format(a, b, torch.device(device)) for a, b in zip(ck, cv)]
        table = None
        if ck:
            assert all(f is not None for f in formats), formats
            align = min(f.align_bytes for f in formats)
            # one spare column: the values' row starts num_table entries in, not P
            addresses = torch.tensor([[t.data_ptr() for t in ck] + [0], [t.data_ptr() for t in cv] + [0]],
                                     device=device)
            table = PieceTable(addresses, type(formats[0])(dtype, heads, key_dim, value_dim, align))
        want = gather_kv_reference(k, v, ck, cv, cu, key_index, shift_cos=cos, shift_sin=sin)
        out = (torch.full_like(want[0], float("nan")), torch.full_like(want[1], float("nan")))
        assert kernel_refusal(k, v, table, cos, len(ck)) is None  # the kernel takes these inputs
        got = gather_kv(k, v, ck, cv, cu, key_index, shift_cos=cos, shift_sin=sin, table=table, out=out)
        assert got[0] is out[0] and got[1] is out[1]
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape and not torch.isnan(g).any()
        # values and unrotated key dims: copied bit for bit; rotated dims: equal, or at most
        # `rotated_ulps` units in the last place apart (adjacent floats of one sign differ by
        # one in their bit patterns)
        assert torch.equal(got[1].cpu(), want[1].cpu())
        rd = rotary_dim if shifts is not None else 0
        assert torch.equal(got[0][..., rd:].cpu(), want[0][..., rd:].cpu())
        bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[dtype]
        g_bits = got[0][..., :rd].cpu().view(bits).long()
        w_bits = want[0][..., :rd].cpu().view(bits).long()
        worst_ulps = int((g_bits - w_bits).abs().max()) if rd and g_bits.numel() else 0
        assert worst_ulps <= rotated_ulps, worst_ulps
        # the rotation moved the keys (a rotated case that matched an unrotated copy proves nothing)
        if shifts is not None and any(shifts):
            plain = gather_kv_reference(k, v, ck, cv, cu, key_index)
            assert not torch.equal(plain[0].cpu(), want[0].cpu())
        return worst_ulps
""")


def _run_case(**kw):
    namespace = {}
    exec(CASE, namespace)
    return namespace["case"](**kw)


def test_kernel_interpreted():
    script = CASE + textwrap.dedent("""
        # partial rotary, several requests, pieces with zero shift, an empty piece, odd dims,
        # misaligned pieces (2-byte units), no rotation, no live rows, no pieces; each dtype.
        # fp16/fp32: bit-identical. bf16: the interpreter converts fp32 to bf16 by truncation
        # (compiled Triton rounds to nearest even, as torch does), so rotated dims may sit one
        # ulp apart there; everything else is still bit-identical.
        exact = [
            case(torch.float16, "cpu", [4, 9], 3, heads=3, key_dim=24, value_dim=40, rotary_dim=6,
                 shifts=[0, 17], offset_elems=3, seed=1),
            case(torch.float32, "cpu", [6, 2, 5], 0, key_dim=16, rotary_dim=16, shifts=[3, 1, 0], seed=2),
            case(torch.float32, "cpu", [6, 2], 4, heads=1, key_dim=20, shifts=None, offset_elems=1, seed=3),
            case(torch.float16, "cpu", [33] * 3, 40, key_dim=64, rotary_dim=16, shifts=[100, 0, 5000], seed=5),
        ]
        assert max(exact) == 0, exact
        case(torch.bfloat16, "cpu", [5, 0, 7, 3], 6, shifts=[4, 0, 9, -2], rotated_ulps=1)
        case(torch.bfloat16, "cpu", [], 7, shifts=None, seed=4)
        case(torch.bfloat16, "cpu", [33] * 3, 40, key_dim=64, rotary_dim=16, shifts=[100, 0, 5000], seed=5,
             rotated_ulps=1)
        print(0.0)
    """)
    assert interpreted_error(script) == 0.0


def test_reference_on_cpu_matches_the_old_sequence():
    """The reference with per-piece cos/sin is the engine's former per-row sequence."""
    from hypic.ops.rope import RotaryEmbedding, apply_rotary

    gen = torch.Generator().manual_seed(0)
    lengths, shifts = [3, 4, 2], [5, 0, -3]
    k, v = torch.randn(5, 2, 16, generator=gen), torch.randn(5, 2, 16, generator=gen)
    ck = [torch.randn(n, 2, 16, generator=gen) for n in lengths]
    cv = [torch.randn(n, 2, 16, generator=gen) for n in lengths]
    cu = torch.tensor([0] + lengths).cumsum(0)
    key_index = torch.randperm(5 + 9, generator=gen)
    rope = RotaryEmbedding(16, 8)
    cos, sin = rope.cos_sin(torch.tensor(shifts))
    keys, values = kv_gather.gather_kv(k, v, ck, cv, cu, key_index, shift_cos=cos, shift_sin=sin)
    delta = torch.tensor(sum(([s] * n for s, n in zip(shifts, lengths)), []))
    old_k = torch.cat([k, apply_rotary(torch.cat(ck), *rope.cos_sin(delta))]).index_select(0, key_index)
    old_v = torch.cat([v, torch.cat(cv)]).index_select(0, key_index)
    assert torch.equal(keys, old_k) and torch.equal(values, old_v)


def test_dispatch_rule(monkeypatch):
    """CPU tensors take the reference (outside Triton's interpreter), whatever the table; the
    refusal says why."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    k = v = torch.zeros(2, 1, 4)
    one = [torch.zeros(1, 1, 4)]
    cu, index = torch.tensor([0, 1]), torch.tensor([2, 0, 1])
    assert "CUDA" in kv_gather.kernel_refusal(k, v, None, None, 1)
    keys, values = kv_gather.gather_kv(k, v, one, one, cu, index)
    assert keys.shape == values.shape == (3, 1, 4)
    fp64 = torch.zeros(2, 1, 4, dtype=torch.float64)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "dtype" in kv_gather.kernel_refusal(fp64, fp64, None, None, 0)
    assert "no table" in kv_gather.kernel_refusal(k, v, None, None, 1)
    assert kv_gather.kernel_refusal(k, v, None, None, 0) is None  # every row live: nothing read in place


def test_piece_format_and_alignment():
    dev = torch.device("cpu")
    key, value = torch.zeros(4, 2, 8, dtype=torch.bfloat16), torch.zeros(4, 2, 6, dtype=torch.bfloat16)
    fmt = kv_gather.piece_format(key, value, dev)
    assert fmt is not None and (fmt.dtype, fmt.num_heads, fmt.key_dim, fmt.value_dim) == (torch.bfloat16, 2, 8, 6)
    assert fmt.align_bytes == 16
    flat = torch.zeros(100, dtype=torch.bfloat16)
    assert kv_gather.piece_format(flat[1:33].view(2, 2, 8), flat[40:64].view(2, 2, 6), dev).align_bytes == 2
    assert kv_gather.piece_format(key.transpose(0, 1), value.transpose(0, 1), dev) is None  # not contiguous
    assert kv_gather.piece_format(key, value.float(), dev) is None  # dtypes differ
    assert kv_gather.piece_format(key.double(), value.double(), dev) is None  # no fp64 kernel
    assert kv_gather.piece_format(key, value[:3], dev) is None  # row counts differ
    assert kv_gather.alignment_bytes(0x1000) == 16 and kv_gather.alignment_bytes(0x1004) == 4


def test_bad_input():
    k = v = torch.zeros(2, 1, 4)
    one = [torch.zeros(1, 1, 4)]
    cu, index = torch.tensor([0, 1]), torch.tensor([2, 0])
    with pytest.raises(ValueError, match="key_index"):
        kv_gather.gather_kv(k, v, one, one, cu, index.int())
    with pytest.raises(ValueError, match="cu_cached"):
        kv_gather.gather_kv(k, v, one, one, torch.tensor([0, 1, 1]), index)
    with pytest.raises(ValueError, match="cached_values"):
        kv_gather.gather_kv(k, v, one, [], cu, index)
    with pytest.raises(ValueError, match="^v "):
        kv_gather.gather_kv(k, torch.zeros(2, 2, 4), one, one, cu, index)
    cos = torch.ones(1, 4)
    with pytest.raises(ValueError, match="both or neither"):
        kv_gather.gather_kv(k, v, one, one, cu, index, shift_cos=cos)
    with pytest.raises(ValueError, match="even"):
        kv_gather.gather_kv(k, v, one, one, cu, index, shift_cos=torch.ones(1, 3), shift_sin=torch.ones(1, 3))
    with pytest.raises(ValueError, match="out"):
        kv_gather.gather_kv(k, v, one, one, cu, index, out=(torch.zeros(3, 1, 4), torch.zeros(2, 1, 4)))


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [
    dict(lengths=[504] * 64, num_live=576, key_dim=256, rotary_dim=64, shifts=list(range(0, 64 * 8, 8))),
    dict(lengths=[5, 0, 7, 3], num_live=6, key_dim=96, rotary_dim=32, shifts=[4, 0, 9, -2], offset_elems=3),
    dict(lengths=[40, 9], num_live=0, key_dim=128, shifts=None),
])
def test_kernel_cuda_bf16(shape):
    # Expected bit-identical (round-to-nearest-even, no FMA contraction); one ulp admitted on the
    # rotated dims, where compiled fp32 arithmetic is the only possible difference.
    _run_case(dtype=torch.bfloat16, device="cuda", seed=len(shape["lengths"]), rotated_ulps=1, **shape)
