"""Tests of hypic/ops/linear/t_planes.py: a dense T stored as bf16 hi/lo planes, every reader of
a packed DenseSummary getting T's values, and the chain walk reading the planes as they are."""

from __future__ import annotations

import textwrap

import pytest
import torch

from hypic.ops.linear import t_planes
from hypic.ops.linear.scan import gather_chain, scan_chain, scan_chain_from
from hypic.ops.linear.summary import (
    DenseSummary,
    SummaryTable,
    apply_summary,
    check_summary_targets,
    compose,
    select_spans,
    summary_addresses,
    write_summaries_into,
)
from hypic.ops.linear.t_planes import pack_planes, pack_planes_, planes, split_planes, unpack_planes
from tests.interpreter import interpreted_error


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def dense(n=3, hv=2, k=8, v=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return DenseSummary(torch.randn(n, hv, k, k, generator=g) / k ** 0.5, torch.randn(n, hv, k, v, generator=g))


def packed_of(s: DenseSummary) -> DenseSummary:
    return DenseSummary(pack_planes(s.transition), s.state, True)


# ------------------------------------------------------------------------------------------
# The packing itself
# ------------------------------------------------------------------------------------------

def test_pack_round_trip_and_layout():
    t = torch.randn(2, 3, 16, 16) * torch.logspace(-6, 3, 16)  # every magnitude
    packed = pack_planes(t)
    assert packed.shape == t.shape and packed.dtype == torch.float32 and packed.is_contiguous()
    hi, lo = split_planes(t)
    # hi = bf16(T) rounded to nearest, lo = bf16(T - hi): the split the walk's kernel makes
    assert torch.equal(hi, t.to(torch.bfloat16))
    assert torch.equal(lo, (t - t.to(torch.bfloat16).float()).to(torch.bfloat16))
    # the layout the H200 ablation read: per head, K*K hi then K*K lo in the head's 4*K*K bytes
    ablation = torch.cat([hi.flatten(2), lo.flatten(2)], -1).view(torch.float32).view(t.shape)
    assert torch.equal(packed.view(torch.int32), ablation.view(torch.int32))
    got_hi, got_lo = planes(packed)
    assert torch.equal(got_hi, hi) and torch.equal(got_lo, lo)
    back = unpack_planes(packed)
    assert float(((back - t).abs() / t.abs()).max()) < 2 ** -16 + 1e-7  # 16 significant bits
    assert not torch.equal(packed, t)  # the words really are other bits


def test_pack_in_place_on_cpu_equals_the_reference():
    ts = [torch.randn(3, 2, 8, 8), torch.randn(1, 1, 8, 8)]
    want = [pack_planes(t) for t in ts]
    pack_planes_(ts)
    assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(ts, want))
    pack_planes_([])  # nothing to do
    with pytest.raises(ValueError, match="contiguous"):
        pack_planes_([torch.randn(2, 8, 8).transpose(-1, -2)])
    with pytest.raises(ValueError, match="float32"):
        pack_planes_([torch.randn(2, 8, 8, dtype=torch.float64)])
    with pytest.raises(ValueError, match="float32"):
        pack_planes(torch.randn(2, 8, 4))


def test_entries_written_on_cuda_are_packed():
    assert not t_planes.presplit_wanted(torch.device("cpu"))  # the CPU reference reads fp32 T
    assert t_planes.presplit_wanted(torch.device("cuda", 0)) and t_planes.presplit_wanted("cuda")


# ------------------------------------------------------------------------------------------
# Every reader of a packed summary gets T's values
# ------------------------------------------------------------------------------------------

def test_packed_summary_gives_values_and_keeps_its_form():
    plain = dense()
    packed = packed_of(plain)
    values = unpack_planes(packed.t_storage)
    assert packed.t_packed and not plain.t_packed
    assert torch.equal(packed.transition, values) and rel(packed.transition, plain.transition) < 1e-5
    assert packed.parts()[0] is packed.t_storage  # parts: T as stored (what addresses point at)
    assert packed.nbytes == plain.nbytes
    assert torch.equal(packed.unpacked().t_storage, values) and not packed.unpacked().t_packed
    assert plain.unpacked() is plain
    for other in (packed.index(torch.tensor([2, 0])), packed.to("cpu"), packed.cloned(),
                  DenseSummary.cat([packed, packed])):
        assert other.t_packed  # the storage moves as it is, with its flag
    assert torch.equal(packed.index(torch.tensor([2, 0])).transition, values[[2, 0]])
    mixed = DenseSummary.cat([packed, plain])  # two forms: one result, as values
    assert not mixed.t_packed and torch.equal(mixed.transition, torch.cat([values, plain.transition]))
    with pytest.raises(ValueError, match="fp32"):
        DenseSummary(torch.randn(1, 1, 4, 4, dtype=torch.float64), torch.randn(1, 1, 4, 2, dtype=torch.float64), True)
    with pytest.raises(ValueError, match="bool"):
        DenseSummary(torch.randn(1, 1, 4, 4), torch.randn(1, 1, 4, 2), 1)


def test_summary_algebra_reads_values():
    plain, packed = dense(seed=1), None
    packed = packed_of(plain)
    as_values = DenseSummary(packed.transition, plain.state)  # what every reader must see
    state = torch.randn(3, 2, 8, 5)
    assert torch.equal(apply_summary(packed, state), apply_summary(as_values, state))
    for later, earlier in ((packed, plain), (plain, packed), (packed, packed)):
        got = compose(later, earlier)
        want = compose(later.unpacked(), earlier.unpacked())
        assert not got.t_packed and torch.equal(got.transition, want.transition) and torch.equal(got.state, want.state)
    cu = torch.tensor([0, 2, 3])
    for a, b in zip(scan_chain(packed, cu), scan_chain(as_values, cu)):
        assert torch.equal(a, b)
    # bodies as a table of packed one-span items, and as one packed summary
    live = dense(n=2, seed=2)
    items = [packed.index(torch.tensor([j])) for j in range(3)]
    source = torch.tensor([0, -1, -3, 1, -2])
    cu_chains = torch.tensor([0, 3, 5])
    want = scan_chain_from(live, as_values, source, cu_chains)
    for second in (SummaryTable(items), packed):
        assert SummaryTable(items).t_packed
        for a, b in zip(scan_chain_from(live, second, source, cu_chains), want):
            assert torch.equal(a, b)
    assert torch.equal(gather_chain(live, packed, source).transition, gather_chain(live, as_values, source).transition)
    assert torch.equal(select_spans(packed, (1, 3)).transition, as_values.transition[1:3])
    assert torch.equal(select_spans(packed, torch.tensor([2])).transition, as_values.transition[2:3])


def test_rope_rerotation_reads_values():
    from hypic.ops.rope import RotaryEmbedding, rotate_summary_keys

    plain = dense(n=2, k=8, seed=3)
    packed = packed_of(plain)
    rotary = RotaryEmbedding(8, 8)
    offsets = torch.tensor([3, 11])
    got = rotate_summary_keys(packed, offsets, rotary)
    want = rotate_summary_keys(DenseSummary(packed.transition, plain.state), offsets, rotary)
    assert not got.t_packed and torch.equal(got.transition, want.transition) and torch.equal(got.state, want.state)


def test_writers_refuse_packed_targets():
    item = packed_of(dense(n=1))
    table = SummaryTable([item])
    with pytest.raises(ValueError, match="plain fp32"):
        check_summary_targets(table, 1, 2, 8, 5, torch.device("cpu"))
    with pytest.raises(ValueError, match="packed"):
        write_summaries_into(table, dense(n=1))
    check_summary_targets(SummaryTable([dense(n=1)]), 1, 2, 8, 5, torch.device("cpu"))  # plain: fine


def test_addresses_point_at_the_storage():
    item = packed_of(dense(n=1))
    assert summary_addresses(item, torch.device("cpu")) == (item.t_storage.data_ptr(), item.state.data_ptr())


# ------------------------------------------------------------------------------------------
# The walk kernel reading packed T (under the interpreter, and compiled on CUDA)
# ------------------------------------------------------------------------------------------

WALK_CASE = textwrap.dedent("""
    import torch
    from hypic.ops.linear.short_span import short_span_rows
    from hypic.ops.linear._fla_common import span_chunk_rows
    from hypic.ops.linear.summary import DenseSummary, SummaryTable, summary_addresses
    from hypic.ops.linear.t_planes import pack_planes_
    from hypic.ops.linear.triton_scan import scan_chain_wy_triton

    def body_table(bodies, device, packed):
        # one-span copies read in place through an address table, as the store holds them;
        # packed by the same launch as the entry writer's
        items = [DenseSummary(*(x.clone() for x in bodies.index(torch.tensor([j], device=device)).parts()))
                 for j in range(bodies.num_spans)]
        if packed:
            before = [it.t_storage.clone() for it in items]
            pack_planes_([it.t_storage for it in items])
            assert not any(torch.equal(a, it.t_storage) for a, it in zip(before, items))
            items = [DenseSummary(it.t_storage, it.state, True) for it in items]
        addresses = torch.tensor([summary_addresses(it, torch.device(device)) for it in items]).T.contiguous()
        return SummaryTable(items, addresses.to(device))

    def walk(device, packed, long_spans=False, record=False, lengths=(16, 0, 1, 17, 8, 20, 64), dtype=torch.float16,
             h=2, hv=4, kd=32, vd=24):
        gen = torch.Generator().manual_seed(5)
        t = sum(lengths)
        cu_cpu = torch.tensor((0,) + tuple(lengths)).cumsum(0)
        cu = cu_cpu.to(device)
        k = torch.nn.functional.normalize(torch.randn(t, h, kd, generator=gen), dim=-1).to(dtype).to(device)
        w = (torch.randn(t, hv, kd, generator=gen) * 0.3 / kd ** 0.5).to(dtype).to(device)
        u = torch.randn(t, hv, vd, generator=gen).to(dtype).to(device)
        gc = (-torch.rand(t, hv, generator=gen).cumsum(0) * 0.01).to(device)
        bodies = DenseSummary(torch.randn(4, hv, kd, kd, generator=gen) * 0.5 / kd ** 0.5,
                              torch.randn(4, hv, kd, vd, generator=gen)).to(device)
        init = torch.randn(2, hv, kd, vd, generator=gen).to(device)
        source = torch.tensor([1, -1, 0, -2, 5, -3, 2, 3, -4, 4, 6], device=device)
        cu_chains = torch.tensor([0, 5, 11], device=device)
        if long_spans:
            span_chunk, num_chunks = span_chunk_rows(cu, cu_cpu)
            gc = None  # (chunk-local gates: the long-span case runs ungated)
        else:
            rows = short_span_rows(cu, cu_cpu, 64, classes=False)
            span_chunk, num_chunks = rows.span_chunk, rows.chunk_spans.shape[0]
        rec = dict(record_rows=torch.arange(11, device=device), num_records=11) if record else {}
        return scan_chain_wy_triton(k, w, u, gc, cu, span_chunk, num_chunks, cu_chains, init,
                                    second=body_table(bodies, device, packed), source=source,
                                    long_spans=long_spans, **rec)

    def mismatches(device, **kw):
        a, b = walk(device, False, **kw), walk(device, True, **kw)
        assert len(a) == len(b)
        return sum(int(not torch.equal(x, y)) for x, y in zip(a, b))
""")


# no records: seam_body_step reads the planes (and, after the 17-token seam, the body's own
# scan_step); records: every body's scan_step does
@pytest.mark.parametrize("long_spans,record", [(False, False), (False, True), (True, True)])
def test_walk_with_packed_bodies_equals_the_fp32_walk_under_interpreter(long_spans, record):
    script = WALK_CASE + f"print(mismatches('cpu', long_spans={long_spans}, record={record}))\n"
    assert interpreted_error(script) == 0  # bit for bit: the same split, the same products


def test_pack_kernel_makes_the_walks_split_under_interpreter():
    """The in-place pack kernel's planes are bit for bit the walk kernel's ``split_bf16`` of the
    same T (the interpreter rounds bf16 its own way, so this compares kernel with kernel)."""
    script = textwrap.dedent("""
        import torch, triton, triton.language as tl
        from hypic.ops.linear._triton_scan_kernel import split_bf16
        from hypic.ops.linear.t_planes import pack_planes_, planes

        @triton.jit
        def split_kernel(x, hi, lo, N: tl.constexpr):
            o = tl.arange(0, N)
            a, b = split_bf16(tl.load(x + o))
            tl.store(hi + o, a)
            tl.store(lo + o, b)

        t = torch.randn(4, 2, 16, 16) * torch.logspace(-4, 2, 16)
        hi = torch.empty(t.shape, dtype=torch.bfloat16)
        lo = torch.empty_like(hi)
        split_kernel[(1,)](t, hi, lo, N=t.numel())
        packed = [t[:3].clone(), t[3:].clone()]  # two tensors: addresses relative to the first
        pack_planes_([torch.empty(0, 2, 16, 16)] + packed)  # (an empty one is left out)
        got = [torch.cat(p) for p in zip(*(planes(x) for x in packed))]
        print(int(not torch.equal(got[0], hi)) + int(not torch.equal(got[1], lo)))
    """)
    assert interpreted_error(script) == 0


@pytest.mark.cuda
def test_pack_kernel_equals_the_reference_on_cuda():
    ts = [torch.randn(3, 4, 128, 128, device="cuda"), torch.randn(1, 4, 128, 128, device="cuda")]
    want = [pack_planes(t) for t in ts]
    pack_planes_(ts)
    assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(ts, want))


@pytest.mark.cuda
@pytest.mark.parametrize("long_spans,record", [(False, False), (False, True), (True, True)])
def test_walk_with_packed_bodies_equals_the_fp32_walk_on_cuda(long_spans, record):
    namespace: dict = {}
    exec(WALK_CASE, namespace)  # noqa: S102 - the interpreter test's case
    assert namespace["mismatches"]("cuda", long_spans=long_spans, record=record, dtype=torch.bfloat16, kd=128,
                                   vd=128) == 0
