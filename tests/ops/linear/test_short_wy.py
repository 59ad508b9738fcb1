"""Tests of hypic.ops.linear.short_wy: the WY step and output of one-chunk spans in tiles of
their own length.

CPU: the torch reference against the WY factors' definition and against the gated delta rule's
reference forward (float64), the Triton kernels against the torch reference under the
interpreter. CUDA: the kernels against fla's chunk kernels, which they replace."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hypic.ops.linear import gated_delta
from hypic.ops.linear.short_span import short_span_rows, short_span_state_pass, tile_groups_host
from hypic.ops.linear.short_wy import short_span_output, short_span_wy
from tests.interpreter import interpreted_error
from tests.ops.linear.test_short_span import HV, K, V, inputs, rel, wy_factors

LENGTHS = [[8, 0, 1, 64, 8], [64], [3, 3, 3], [8, 20, 8, 64, 0], [16, 17, 33]]


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("lengths", LENGTHS)
def test_reference_wy_matches_definition(gated, lengths):
    x, cu = inputs(lengths, seed=len(lengths) + 3, gated=gated)
    w_ref, u_ref, gc_ref = wy_factors(x["k"], x["v"], x["g"], x["beta"], cu)
    gc, w, u = short_span_wy(x["k"], x["v"], x["g"], x["beta"], short_span_rows(cu, cu, 64))
    assert w.dtype == torch.float64 and u.dtype == torch.float64
    assert rel(w, w_ref) < 1e-10 and rel(u, u_ref) < 1e-10
    if gated:
        assert gc.dtype == torch.float32 and rel(gc, gc_ref) < 1e-6
    else:
        assert gc is None


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("lengths", LENGTHS)
def test_reference_output_is_the_rule_from_each_spans_state(gated, lengths):
    """WY step, state pass and output from per-span initial states: the reference forward."""
    x, cu = inputs(lengths, seed=len(lengths), gated=gated)
    gen = torch.Generator().manual_seed(11)
    q = F.normalize(torch.randn(x["k"].shape, generator=gen), dim=-1).double()
    h0 = torch.randn(len(lengths), HV, K, V, generator=gen).double() * 0.5
    table = short_span_rows(cu, cu, 64)
    gc, w, u = short_span_wy(x["k"], x["v"], x["g"], x["beta"], table)
    v_new, h = short_span_state_pass(w, u, h0, table)
    o = short_span_output(q, x["k"], v_new, h, gc, table, scale=0.3)
    g = x["g"] if gated else torch.zeros_like(x["beta"])
    ref, _ = gated_delta.gated_delta_forward(q, x["k"], x["v"], g, x["beta"], cu_seqlens=cu, initial_state=h0,
                                             scale=0.3)
    assert o.dtype == torch.float64 and rel(o, ref) < 1e-6  # gc is fp32: its rounding is all that is left


def test_tiles_group_nonempty_spans_by_rounded_length():
    groups = tile_groups_host(np.array([8, 0, 1, 64, 8, 17, 16]))
    assert [(r, ids.tolist()) for r, ids in groups] == [(16, [0, 2, 4, 6]), (32, [5]), (64, [3])]
    assert tile_groups_host(np.array([0, 0])) == []
    cu = torch.tensor([0, 8, 8, 72])
    table = short_span_rows(cu, cu.clone(), 64, classes=False)
    assert [(r, ids.tolist()) for r, ids in table.tiles] == [(16, [0]), (64, [2])]


KERNEL_CASE = textwrap.dedent("""
    import torch
    from hypic.ops.linear.short_span import short_span_rows, short_span_state_pass
    from hypic.ops.linear.short_wy import (short_span_output, short_span_output_triton, short_span_wy,
                                           short_span_wy_triton)

    def case(dtype, device, gated=True, lengths=(8, 0, 1, 64, 8, 20, 16), h=2, hv=4, kd=32, vd=24):
        gen = torch.Generator().manual_seed(5)
        t = sum(lengths)
        cu_cpu = torch.tensor((0,) + tuple(lengths)).cumsum(0)
        cu = cu_cpu.to(device)
        k = torch.nn.functional.normalize(torch.randn(t, h, kd, generator=gen), dim=-1).to(dtype).to(device)
        q = torch.nn.functional.normalize(torch.randn(t, h, kd, generator=gen), dim=-1).to(dtype).to(device)
        v = torch.randn(t, hv, vd, generator=gen).to(dtype).to(device)
        beta = torch.sigmoid(torch.randn(t, hv, generator=gen)).to(dtype).to(device)
        g = torch.nn.functional.logsigmoid(torch.randn(t, hv, generator=gen) + 2.0).to(device) if gated else None
        h0 = torch.randn(len(lengths), hv, kd, vd, generator=gen).to(device) * 0.5
        table = short_span_rows(cu, cu_cpu, 64)
        rel = lambda a, b: float((a.double() - b.double()).norm() / b.double().norm())  # noqa: E731
        gc_ref, w_ref, u_ref = short_span_wy(k, v, g, beta, table)
        gc_fast, w_fast, u_fast = short_span_wy_triton(k, v, g, beta, cu, table)
        assert w_fast.dtype == k.dtype and u_fast.dtype == v.dtype
        errors = [rel(w_fast, w_ref), rel(u_fast, u_ref)]
        if gated:
            assert gc_fast.dtype == torch.float32
            errors.append(rel(gc_fast, gc_ref))
        v_new, h_chunks = short_span_state_pass(w_ref, u_ref, h0, table)
        o_ref = short_span_output(q, k, v_new, h_chunks, gc_ref, table, 0.25)
        o_fast = short_span_output_triton(q, k, v_new, h_chunks, gc_ref, cu, table, 0.25)
        assert o_fast.dtype == v_new.dtype
        errors.append(rel(o_fast, o_ref))
        return max(errors)
""")


# Launch configs other than the defaults: w/u formed in several column blocks (16 of K = 32,
# and of V = 24 padded to 32, the last block part-masked), and output V blocks of 16.
SMALL_BLOCKS = ("import hypic.ops.linear.short_wy as sw\n"
                "sw.WY_CONFIGS = {16: (2, 16), 64: (8, 16)}\nsw.OUTPUT_CONFIGS = {16: (2, 16), 64: (8, 16)}\n")


@pytest.mark.parametrize("gated,configs", [(True, ""), (False, ""), (True, SMALL_BLOCKS)])
def test_triton_kernels_match_torch_under_interpreter(gated, configs):
    assert interpreted_error(KERNEL_CASE + configs + f"print(case(torch.float16, 'cpu', gated={gated}))\n") < 2e-3


def test_launch_configs_take_the_entry_at_or_below_the_tile():
    from hypic.ops.linear.short_wy import _config

    table = {16: (2, 64), 64: (4, 128)}
    assert _config(table, 16) == (2, 64) and _config(table, 32) == (2, 64)
    assert _config(table, 64) == (4, 128) and _config(table, 128) == (4, 128)
    assert _config(table, 8) == (2, 64)  # below every entry: the smallest


@pytest.mark.cuda
@pytest.mark.parametrize("gated", [True, False])
def test_triton_kernels_match_torch_on_cuda(gated):
    namespace: dict = {}
    exec(KERNEL_CASE, namespace)  # noqa: S102 - the same case as the interpreter test
    assert namespace["case"](torch.bfloat16, "cuda", gated=gated, kd=128, vd=128) < 1e-2


@pytest.mark.cuda
def test_tile_sizes_side_by_side_on_cuda():
    """The largest tile size on a side stream: eager, it matches the torch reference; captured
    in a CUDA graph and replayed, it gives exactly the eager outputs."""
    from hypic.ops.linear.short_wy import short_span_output_triton, short_span_wy_triton

    dev = torch.device("cuda")
    lengths = [8] * 64 + [64, 17]  # three tile sizes: 16, 32, 64
    gen = torch.Generator().manual_seed(3)
    t, h, hv, kd, vd = sum(lengths), 2, 4, 128, 128
    k = F.normalize(torch.randn(t, h, kd, generator=gen), dim=-1).bfloat16().to(dev)
    q = F.normalize(torch.randn(t, h, kd, generator=gen), dim=-1).bfloat16().to(dev)
    v = torch.randn(t, hv, vd, generator=gen).bfloat16().to(dev)
    beta = torch.rand(t, hv, generator=gen).bfloat16().to(dev)
    g = F.logsigmoid(torch.randn(t, hv, generator=gen) + 2.0).to(dev)
    h0 = torch.randn(len(lengths), hv, kd, vd, generator=gen).bfloat16().to(dev)
    cu_cpu = torch.tensor([0] + lengths).cumsum(0)
    cu = cu_cpu.to(dev)
    table = short_span_rows(cu, cu_cpu, 64)
    assert len(table.tiles) == 3

    def run():
        gc, w, u = short_span_wy_triton(k, v, g, beta, cu, table)
        return gc, w, u, short_span_output_triton(q, k, u, h0, gc, cu, table, 0.25)

    eager = run()
    torch.cuda.synchronize()
    gc_ref, w_ref, u_ref = short_span_wy(k, v, g, beta, table)
    o_ref = short_span_output(q, k, eager[2], h0, eager[0], table, 0.25)
    for got, want in zip(eager, (gc_ref, w_ref, u_ref, o_ref)):
        assert rel(got, want) < 1e-2
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()  # warm-up off the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    for out in captured:
        out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for got_eager, got_graph in zip(eager, captured):
        assert torch.equal(got_graph, got_eager)


@pytest.mark.cuda
@pytest.mark.parametrize("gated", [True, False])
def test_triton_kernels_match_fla_on_cuda(gated):
    """What the kernels replace: fla's gate cumsum, WY intra step and output kernel."""
    pytest.importorskip("fla")
    from fla.ops.common.chunk_o import chunk_fwd_o

    from hypic.ops.linear._fla_common import _b1, _chunk_indices, _local_cumsum
    from hypic.ops.linear._fla_wy import _wy_intra
    from hypic.ops.linear.short_wy import short_span_output_triton, short_span_wy_triton

    gen = torch.Generator().manual_seed(3)
    lengths = [8] * 40 + [64, 0, 1, 20]
    t = sum(lengths)
    cu_cpu = torch.tensor([0] + lengths).cumsum(0)
    cu = cu_cpu.cuda()
    k = F.normalize(torch.randn(t, 16, 128, generator=gen), dim=-1).bfloat16().cuda()
    q = F.normalize(torch.randn(t, 16, 128, generator=gen), dim=-1).bfloat16().cuda()
    v = torch.randn(t, 32, 128, generator=gen).bfloat16().cuda()
    beta = torch.sigmoid(torch.randn(t, 32, generator=gen)).bfloat16().cuda()
    g = F.logsigmoid(torch.randn(t, 32, generator=gen) + 2.0).cuda() if gated else None
    table = short_span_rows(cu, cu_cpu, 64, classes=False)
    ci = _chunk_indices(cu, cu_cpu)
    gc_fla = _local_cumsum(None if g is None else _b1(g), cu, ci)
    w_fla, u_fla = _wy_intra(_b1(k), _b1(v), gc_fla, _b1(beta), cu, ci)
    gc, w, u = short_span_wy_triton(k, v, g, beta, cu, table)
    assert rel(w, w_fla[0]) < 1e-2 and rel(u, u_fla[0]) < 1e-2
    if gated:
        assert rel(gc, gc_fla[0]) < 1e-6
    h = (torch.randn(table.chunk_spans.shape[0], 32, 128, 128, generator=gen) * 0.3).bfloat16().cuda()
    o_fla = chunk_fwd_o(q=_b1(q), k=_b1(k), v=u_fla, h=h.unsqueeze(0), g=gc_fla, scale=0.088, cu_seqlens=cu,
                        chunk_size=64, chunk_indices=ci)[0]
    o = short_span_output_triton(q, k, u_fla[0], h, None if gc_fla is None else gc_fla[0], cu, table, 0.088)
    assert rel(o, o_fla) < 1e-2


def test_fla_paths_take_the_tiles_only_when_every_span_fits():
    """``_fla_wy._short_tiles``: the kernels' table for one-chunk spans, else fla's kernels."""
    from hypic.ops.linear._fla_wy import _short_tiles

    cu = torch.tensor([0, 8, 16, 80])
    table = _short_tiles(128, 128, cu, cu.clone())
    assert [(r, ids.tolist()) for r, ids in table.tiles] == [(16, [0, 1]), (64, [2])]
    assert _short_tiles(128, 128, cu, None) is None  # no host copy: never read the device one back
    long_cu = torch.tensor([0, 8, 73])
    assert _short_tiles(128, 128, long_cu, long_cu.clone()) is None  # a 65-token span
    assert _short_tiles(96, 128, cu, cu.clone()) is None  # not a power-of-two key dim


@pytest.mark.cuda
@pytest.mark.parametrize("key_dim", [16, 32, 64, 128])
@pytest.mark.parametrize("value_dim", [8, 128])
def test_wy_tiles_match_torch_for_every_key_dim_on_cuda(key_dim, value_dim):
    """Each tile size (16 and 64 rows) of the Triton WY step against the torch WY, per span, for
    the key dims the kernels accept: the 64-row tile runs on the side stream and compiles to other
    MMA shapes than the 16-row one."""
    from hypic.ops.linear.short_wy import short_span_wy_triton

    dev = torch.device("cuda")
    lengths = [8, 8, 0, 64, 1, 8]
    gen = torch.Generator().manual_seed(3)
    t, h, hv = sum(lengths), 2, 4
    k = F.normalize(torch.randn(t, h, key_dim, generator=gen), dim=-1).bfloat16().to(dev)
    v = torch.randn(t, hv, value_dim, generator=gen).bfloat16().to(dev)
    beta = torch.sigmoid(torch.randn(t, hv, generator=gen)).bfloat16().to(dev)
    g = F.logsigmoid(torch.randn(t, hv, generator=gen) + 2.0).to(dev)
    cu_cpu = torch.tensor([0] + lengths).cumsum(0)
    cu = cu_cpu.to(dev)
    gc, w, u = short_span_wy_triton(k, v, g, beta, cu, short_span_rows(cu, cu_cpu, 64, classes=False))
    torch.cuda.synchronize()
    gc_ref, w_ref, u_ref = short_span_wy(k, v, g, beta, short_span_rows(cu, cu_cpu, 64))
    errors = {}
    for s, e in zip(cu_cpu[:-1].tolist(), cu_cpu[1:].tolist()):
        if e > s:
            errors[e - s] = (rel(gc[s:e], gc_ref[s:e]), rel(w[s:e], w_ref[s:e]), rel(u[s:e], u_ref[s:e]))
    assert all(max(err) < 2e-2 for err in errors.values()), errors
