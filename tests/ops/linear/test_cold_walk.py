"""Tests of :mod:`hypic.ops.linear.cold_walk`: chains of live spans walked in one flat loop
over their chunks.

CPU: the host chunk table (rows, bounds, the span each chunk opens; None with an empty span) and
the switch. Kernel: against the float64 walk reference and against the chain kernel's own walk of
the same chains (the same per-chunk maths: the outputs agree to fp32 rounding), under the Triton
interpreter and on CUDA, with and without initial states and records.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from hypic.ops.linear.cold_walk import chunk_walk_table, chunk_walk_table_host, walk_loop
from tests.interpreter import interpreted_error
from tests.ops.linear.test_chain_forward import CUDA


def test_host_table():
    chunk_cum, chunks = chunk_walk_table_host(torch.tensor([0, 130, 138, 202, 203]))
    assert chunk_cum.tolist() == [0, 3, 4, 5, 6]
    assert chunks.tolist() == [[0, 64, 128, 130, 138, 202],
                               [64, 128, 130, 138, 202, 203],
                               [0, -1, -1, 1, 2, 3]]
    assert chunk_walk_table_host(torch.tensor([0, 5, 5, 9])) is None  # an empty span opens no chunk
    cu = torch.tensor([0, 5, 9])
    cu_cpu = cu.clone()
    table = chunk_walk_table(cu, cu_cpu)
    assert chunk_walk_table(cu, cu_cpu) is table  # cached by identity
    assert table[1].tolist() == [[0, 5], [5, 9], [0, 1]]


def test_env_switch(monkeypatch):
    monkeypatch.delenv("HYPIC_WALK_LOOP", raising=False)
    assert walk_loop() == "flat"
    monkeypatch.setenv("HYPIC_WALK_LOOP", "spans")
    assert walk_loop() == "spans"
    monkeypatch.setenv("HYPIC_WALK_LOOP", "nested")
    with pytest.raises(ValueError, match="HYPIC_WALK_LOOP"):
        walk_loop()


CASE = textwrap.dedent("""
    import torch
    from hypic.ops.linear._fla_common import chunk_table_host, span_chunk_rows
    from hypic.ops.linear.cold_walk import chunk_walk_table, walk_chains_flat
    from hypic.ops.linear.triton_scan import scan_chain_wy_reference, scan_chain_wy_triton

    def case(device, gated=True, init=True, record=True, lengths=(8, 504, 8, 130, 64, 1, 200, 65), h=2, hv=4,
             kd=32, vd=24):
        gen = torch.Generator().manual_seed(3)
        t = sum(lengths)
        cu_cpu = torch.tensor((0,) + tuple(lengths)).cumsum(0)
        cu = cu_cpu.to(device)
        k = torch.nn.functional.normalize(torch.randn(t, h, kd, generator=gen), dim=-1).to(torch.bfloat16)
        w = (torch.randn(t, hv, kd, generator=gen) * 0.3 / kd ** 0.5).to(torch.bfloat16)
        u = torch.randn(t, hv, vd, generator=gen).to(torch.bfloat16)
        gc = None
        if gated:  # chunk-local cumulative log2 gates, as fla's cumsum lays them
            step = -torch.rand(t, hv, generator=gen) * 0.05
            gc = torch.empty_like(step)
            for seq, j in chunk_table_host(cu_cpu, 64).tolist():
                a = int(cu_cpu[seq]) + 64 * j
                b = min(a + 64, int(cu_cpu[seq + 1]))
                gc[a:b] = step[a:b].cumsum(0)
        # chain 0: spans 0-4 (seam, body, seam, body, question); chain 1: spans 5-7
        cu_chains = torch.tensor([0, 5, 8])
        h0 = torch.randn(2, hv, kd, vd, generator=gen) if init else None
        record_rows = torch.tensor([0, 1, -1, 2, 3, -1, 4, 5]) if record else None
        num_records = 6 if record else None
        span_chunk, num_chunks = span_chunk_rows(cu, cu_cpu)
        ref = scan_chain_wy_reference(k, w, u, gc, cu_cpu, num_chunks, cu_chains, h0, record_rows=record_rows,
                                      num_records=num_records)
        dev = lambda x: None if x is None else x.to(device)  # noqa: E731
        nested = scan_chain_wy_triton(dev(k), dev(w), dev(u), dev(gc), cu, span_chunk, num_chunks,
                                      cu_chains.to(device), dev(h0), long_spans=True,
                                      record_rows=dev(record_rows), num_records=num_records)
        table = chunk_walk_table(cu, cu_cpu)
        flat = walk_chains_flat(dev(k), dev(w), dev(u), dev(gc), table, cu_chains.to(device), dev(h0),
                                dev(record_rows), num_records)
        assert len(flat) == len(nested) == (4 if record else 3)
        assert flat[0].dtype == u.dtype and flat[1].dtype == w.dtype and flat[2].dtype == torch.float32
        assert flat[1].shape == nested[1].shape
        rel = lambda a, b: float((a.double().cpu() - b.double().cpu()).norm() / b.double().norm())  # noqa: E731
        to_ref = max(rel(a, b) for a, b in zip(flat, ref))
        to_nested = max(rel(a, b) for a, b in zip(flat, nested))
        return to_ref, to_nested
""")


@pytest.mark.parametrize("gated,init,record", [(True, True, True), (False, False, False), (True, False, True)])
def test_flat_walk_matches_under_interpreter(gated, init, record):
    script = CASE + (f"to_ref, to_nested = case('cpu', {gated}, {init}, {record})\n"
                     "assert to_nested < 1e-5, to_nested\nprint(to_ref)\n")
    # the walk rounds the state and v_new to bf16 for its products, as fla's state pass does
    assert interpreted_error(script) < 2e-2


@pytest.mark.skipif(not CUDA, reason="Triton kernels compile for CUDA")
@pytest.mark.parametrize("gated,init,record", [(True, True, True), (True, False, False)])
def test_flat_walk_matches_on_cuda(gated, init, record):
    namespace: dict = {}
    exec(CASE, namespace)  # noqa: S102 - the same case as the interpreter test
    to_ref, to_nested = namespace["case"]("cuda", gated, init, record, kd=128, vd=128)
    assert to_ref < 2e-2 and to_nested < 1e-5
