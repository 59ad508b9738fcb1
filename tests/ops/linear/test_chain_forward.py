"""Tests of ``gated_delta_chain_forward``: live spans between cached bodies (a PIC forward's
linear layer), and its fused GPU kernel (``scan_chain_wy_triton``).

CPU (float64): the live outputs and final states equal a plain forward over each whole chain,
whose bodies are only given as summaries. Kernel: the fused scan against the reference
composition (closed-form summaries, scan, one-chunk state pass), under the Triton interpreter and
on CUDA. CUDA: the op's fla path against the CPU reference, for one-chunk spans and for spans
longer than a chunk (walked chunk by chunk).
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from hypic.ops.linear import gated_delta
from hypic.ops.linear.summary import DenseSummary, SummaryTable
from tests.interpreter import interpreted_error
from tests.ops.linear.chain_cases import HV, K, V, chain_problem, live_rows, tokens


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


PIECES = [[("live", 3), ("body", 5), ("live", 2), ("body", 7), ("live", 4)],
          [("body", 6), ("live", 1), ("live", 5)]]
LIVE_ORDER = [3, 0, 4, 2, 1]  # live spans numbered out of chain order


@pytest.mark.parametrize("as_table", [False, True])
@pytest.mark.parametrize("with_init", [False, True])
def test_reference_equals_forward_of_whole_chains(as_table, with_init):
    full, cu_full, live, cu_live, body, cu_body, source, cu_chains = chain_problem(PIECES, LIVE_ORDER)
    init = torch.randn(2, HV, K, V, dtype=torch.float64) if with_init else None
    o_full, final_full = gated_delta.gated_delta_forward(**full, cu_seqlens=cu_full, initial_state=init)
    summ = gated_delta.gated_delta_summarize(body["k"], body["v"], body["g"], body["beta"], cu_seqlens=cu_body)
    bodies = SummaryTable([summ.index(torch.tensor([i])) for i in range(summ.num_spans)]) if as_table else summ
    o, final = gated_delta.gated_delta_chain_forward(**live, cu_seqlens=cu_live, cu_chains=cu_chains, source=source,
                                                     bodies=bodies, initial_states=init)
    assert rel(o, o_full[live_rows(PIECES, LIVE_ORDER)]) < 1e-10
    assert rel(final, final_full) < 1e-10


def test_live_only_chains_and_contract_errors():
    full, cu_full, *_ = chain_problem([[("live", 3), ("live", 2)], [("live", 4)]], [0, 1, 2])
    cu_chains = torch.tensor([0, 2, 3])
    o_ref, final_ref = gated_delta.gated_delta_forward(**full, cu_seqlens=torch.tensor([0, 5, 9]))
    # the live spans split each chain: spans [0,3) [3,5) [5,9), chains of 2 and 1 spans
    o, final = gated_delta.gated_delta_chain_forward(**full, cu_seqlens=torch.tensor([0, 3, 5, 9]),
                                                     cu_chains=cu_chains)
    assert rel(o, o_ref) < 1e-10 and rel(final, final_ref) < 1e-10
    with pytest.raises(ValueError, match="both or neither"):
        gated_delta.gated_delta_chain_forward(**full, cu_seqlens=torch.tensor([0, 3, 5, 9]), cu_chains=cu_chains,
                                              source=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="must hold the 3 live spans"):
        gated_delta.gated_delta_chain_forward(**full, cu_seqlens=torch.tensor([0, 3, 5, 9]),
                                              cu_chains=torch.tensor([0, 2]))


# ------------------------------------------------------------------------------------------
# The fused kernel against the reference composition
# ------------------------------------------------------------------------------------------

# Both kernel cases hand the kernel its cached bodies one way or the other: dense summaries, or
# one-span copies read in place through an address table (as the store holds them).
BODIES_ON = textwrap.dedent("""
    def bodies_on(bodies, device, table):
        import torch
        from hypic.ops.linear.summary import DenseSummary, SummaryTable, summary_addresses

        bodies = bodies.to(device)
        if not table:
            return bodies
        items = [DenseSummary(*(x.clone() for x in bodies.index(torch.tensor([j], device=device)).parts()))
                 for j in range(bodies.num_spans)]
        addresses = torch.tensor([summary_addresses(it, torch.device(device)) for it in items]).T.contiguous()
        return SummaryTable(items, addresses.to(device))
""")

KERNEL_CASE = BODIES_ON + textwrap.dedent("""
    import torch
    from hypic.ops.linear.scan import scan_chain_from
    from hypic.ops.linear.short_span import short_span_rows, short_span_state_pass, short_span_summary
    from hypic.ops.linear.summary import DenseSummary
    from hypic.ops.linear.triton_scan import scan_chain_wy_triton

    def case(dtype, device, gated=True, lengths=(8, 0, 1, 64, 8, 20, 17), h=2, hv=4, kd=32, vd=24, table=True,
             parts=False):
        gen = torch.Generator().manual_seed(5)
        t = sum(lengths)
        cu_cpu = torch.tensor((0,) + tuple(lengths)).cumsum(0)
        cu = cu_cpu.to(device)
        k = torch.nn.functional.normalize(torch.randn(t, h, kd, generator=gen), dim=-1).to(dtype)
        w = (torch.randn(t, hv, kd, generator=gen) * 0.3).to(dtype)
        u = torch.randn(t, hv, vd, generator=gen).to(dtype)
        gc = (-torch.rand(t, hv, generator=gen).cumsum(0) * 0.1) if gated else None
        nb = 4
        bodies = DenseSummary(torch.randn(nb, hv, kd, kd, generator=gen) * 0.5 / kd ** 0.5,
                              torch.randn(nb, hv, kd, vd, generator=gen))
        init = torch.randn(2, hv, kd, vd, generator=gen)
        # chain 0: live 1, body 0, live 0, body 1, live 5; chain 1: body 2, live 2, live 3, body 3, live 4, live 6
        source = torch.tensor([1, -1, 0, -2, 5, -3, 2, 3, -4, 4, 6])
        cu_chains = torch.tensor([0, 5, 11])
        # reference: float64 on the CPU
        d = lambda x: None if x is None else x.double()  # noqa: E731
        ref_table = short_span_rows(cu_cpu, cu_cpu, 64)
        s_live, t_live = short_span_summary(d(k), d(w), d(u), d(gc), ref_table)
        rows = torch.where(source >= 0, source, torch.full_like(source, -1))
        inc, fin = scan_chain_from(DenseSummary(t_live, s_live), DenseSummary(d(bodies.transition), d(bodies.state)),
                                   source, cu_chains, d(init), record_rows=rows, num_records=len(lengths))
        v_ref, h_ref = short_span_state_pass(d(w), d(u), inc, ref_table)
        # fused kernel
        dev = lambda x: None if x is None else x.to(device)  # noqa: E731
        table_ = short_span_rows(cu, cu_cpu, 64, classes=False)
        second = bodies_on(bodies, device, table)
        v_new, h, final = scan_chain_wy_triton(dev(k), dev(w), dev(u), dev(gc), cu, table_.span_chunk,
                                               table_.chunk_spans.shape[0], cu_chains.to(device), dev(init),
                                               second=second, source=source.to(device))
        assert v_new.dtype == u.dtype and h.dtype == w.dtype and final.dtype == torch.float32
        rel = lambda a, b: float((a.double().cpu() - b).norm() / b.norm())  # noqa: E731
        errors = (rel(v_new, v_ref), rel(h, h_ref), rel(final, fin))
        return errors if parts else max(errors)
""")


@pytest.mark.parametrize("gated,table", [(True, True), (False, False)])
def test_fused_kernel_matches_reference_under_interpreter(gated, table):
    script = KERNEL_CASE + f"print(case(torch.float16, 'cpu', gated={gated}, table={table}))\n"
    assert interpreted_error(script) < 2e-3


# Seams before bodies of 16 tokens (the kernel's seam block: applied with the body in one step),
# 0 (an empty seam) and 17 (one token over: two steps); chain 1 starts on a body.
BOUNDARY_LENGTHS = (16, 0, 1, 17, 8, 20, 64)


@pytest.mark.parametrize("gated", [True, False])
def test_seam_and_body_in_one_step_under_interpreter(gated):
    """A seam of at most 16 tokens and the body after it in one step of the walk (a longer seam
    and an empty one as two): the final state within the fp32 products' error of the float64
    reference."""
    errors = KERNEL_CASE + f"errors = case(torch.float16, 'cpu', gated={gated}, lengths={BOUNDARY_LENGTHS}, parts=True)\n"
    assert interpreted_error(errors + "print(max(errors[:2]))\n") < 2e-3  # v_new and h are fp16 outputs
    assert interpreted_error(errors + "print(errors[2])\n") < 1e-4


@pytest.mark.cuda
@pytest.mark.parametrize("gated,table", [(True, True), (True, False), (False, True)])
def test_fused_kernel_matches_reference_on_cuda(gated, table):
    namespace: dict = {}
    exec(KERNEL_CASE, namespace)  # noqa: S102 - the same case as the interpreter test
    assert namespace["case"](torch.bfloat16, "cuda", gated=gated, kd=128, vd=128, table=table) < 1e-2


@pytest.mark.cuda
def test_seam_and_body_in_one_step_on_cuda():
    namespace: dict = {}
    exec(KERNEL_CASE, namespace)  # noqa: S102 - the interpreter test's case
    v_h_final = namespace["case"](torch.bfloat16, "cuda", lengths=BOUNDARY_LENGTHS, kd=128, vd=128, parts=True)
    # final state on the H200: 1.06e-3 (1.14e-3 with the seam and the body as two steps)
    assert max(v_h_final[:2]) < 1e-2 and v_h_final[2] < 2e-3


# ------------------------------------------------------------------------------------------
# CUDA: the op's fla path against the float64 CPU reference
# ------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("long_span", [False, True])
def test_fla_path_matches_reference(long_span):
    """Every live span in one chunk (the seams' and question's WY step and output from
    short_wy's tiles) or not (fla's WY step, the walk chunk by chunk)."""
    pieces = [[("live", 8), ("body", 100), ("live", 8), ("body", 70), ("live", 100 if long_span else 64)],
              [("body", 90), ("live", 1), ("live", 8)]]
    dims = dict(h=2, hv=4, kd=128, vd=64)
    _, _, live, cu_live, body, cu_body, source, cu_chains = chain_problem(pieces, [3, 0, 4, 2, 1], **dims)
    init = torch.randn(2, 4, 128, 64, dtype=torch.float64)
    summ = gated_delta.gated_delta_summarize(body["k"], body["v"], body["g"], body["beta"], cu_seqlens=cu_body)
    o_ref, final_ref = gated_delta.gated_delta_chain_forward(**live, cu_seqlens=cu_live, cu_chains=cu_chains,
                                                             source=source, bodies=summ, initial_states=init)
    dev = "cuda"
    live_d = {key: x.to(dev, torch.bfloat16 if key != "g" else torch.float32) for key, x in live.items()}
    items = [DenseSummary(*(x.float().to(dev).contiguous() for x in summ.index(torch.tensor([i])).parts()))
             for i in range(summ.num_spans)]
    from hypic.ops.linear.summary import summary_addresses

    addresses = torch.tensor([summary_addresses(it, torch.device(dev)) for it in items], device=dev).T.contiguous()
    o, final = gated_delta.gated_delta_chain_forward(
        **live_d, cu_seqlens=cu_live.to(dev), cu_chains=cu_chains.to(dev), source=source.to(dev),
        bodies=SummaryTable(items, addresses), initial_states=init.float().to(dev), cu_seqlens_cpu=cu_live)
    assert o.dtype == torch.bfloat16 and final.dtype == torch.float32
    assert rel(o.cpu(), o_ref) < 2e-2
    assert rel(final.cpu(), final_ref) < 1e-2


@pytest.mark.cuda
@pytest.mark.parametrize("long_span", [False, True])
def test_written_spans_summaries_from_their_rows_alone_on_cuda(long_span):
    """``summary_spans_host``: the GPU path forms the written spans' summaries from their
    gathered WY rows alone; they equal the rows of every live span's summaries (the former way),
    in the order asked for, and the reference's."""
    pieces = [[("live", 8), ("body", 100), ("live", 100 if long_span else 40), ("body", 70), ("live", 8)],
              [("body", 90), ("live", 1), ("live", 60)]]
    dims = dict(h=2, hv=4, kd=128, vd=64)
    _, _, live, cu_live, body, cu_body, source, cu_chains = chain_problem(pieces, [3, 0, 4, 2, 1], **dims)
    summ = gated_delta.gated_delta_summarize(body["k"], body["v"], body["g"], body["beta"], cu_seqlens=cu_body)
    dev = "cuda"
    live_d = {key: x.to(dev, torch.bfloat16 if key != "g" else torch.float32) for key, x in live.items()}
    items = [DenseSummary(*(x.float().to(dev).contiguous() for x in summ.index(torch.tensor([i])).parts()))
             for i in range(summ.num_spans)]
    from hypic.ops.linear.summary import summary_addresses

    addresses = torch.tensor([summary_addresses(it, torch.device(dev)) for it in items], device=dev).T.contiguous()
    written = (4, 1)  # live spans, out of order: the second chain's long one and the first's middle one
    common = dict(cu_seqlens=cu_live.to(dev), cu_chains=cu_chains.to(dev), source=source.to(dev),
                  bodies=SummaryTable(items, addresses), cu_seqlens_cpu=cu_live,
                  summary_spans=torch.tensor(written, device=dev))
    o_all, final_all, every, _ = gated_delta.gated_delta_chain_forward_and_summarize(**live_d, **common)
    o_rows, final_rows, alone, _ = gated_delta.gated_delta_chain_forward_and_summarize(
        **live_d, **common, summary_spans_host=written)
    assert torch.equal(o_all, o_rows) and torch.equal(final_all, final_rows)
    for a, b in zip(alone.parts(), every.parts()):
        assert a.shape == b.shape and rel(a.cpu(), b.cpu()) < 1e-5
    ref = gated_delta.gated_delta_summarize(live["k"], live["v"], live["g"], live["beta"], cu_seqlens=cu_live)
    for a, b in zip(alone.parts(), ref.index(torch.tensor(written)).parts()):
        assert rel(a.cpu(), b) < 2e-2


def test_summary_spans_host_must_list_summary_spans():
    pieces = [[("live", 8), ("body", 20), ("live", 8)]]
    _, _, live, cu_live, body, cu_body, source, cu_chains = chain_problem(pieces, [1, 0], h=1, hv=2, kd=8, vd=8)
    summ = gated_delta.gated_delta_summarize(body["k"], body["v"], body["g"], body["beta"], cu_seqlens=cu_body)
    common = dict(cu_seqlens=cu_live, cu_chains=cu_chains, source=source, bodies=summ)
    for spans, host in [(None, (0,)), ((0, 2), (1, 0)), (torch.tensor([1]), (0, 1)), (torch.tensor([1]), (5,)),
                        (torch.tensor([1]), [1])]:
        with pytest.raises(ValueError, match="summary_spans_host"):
            gated_delta.gated_delta_chain_forward_and_summarize(**live, **common, summary_spans=spans,
                                                                summary_spans_host=host)
    _, _, got, _ = gated_delta.gated_delta_chain_forward_and_summarize(
        **live, **common, summary_spans=torch.tensor([1, 0]), summary_spans_host=(1, 0))
    assert got.num_spans == 2


# ------------------------------------------------------------------------------------------
# Long live spans: the chain kernel walks them chunk by chunk (a cold prefill's segments)
# ------------------------------------------------------------------------------------------

LONG_CASE = BODIES_ON + textwrap.dedent("""
    import torch
    from hypic.ops.linear._fla_common import chunk_table_host, span_chunk_rows
    from hypic.ops.linear.summary import DenseSummary
    from hypic.ops.linear.triton_scan import scan_chain_wy_reference, scan_chain_wy_triton

    def long_case(dtype, device, gated=True, lengths=(130, 8, 0, 64, 1, 200, 65), h=2, hv=4, kd=32, vd=24,
                  table=True, record=True):
        gen = torch.Generator().manual_seed(7)
        t = sum(lengths)
        cu_cpu = torch.tensor((0,) + tuple(lengths)).cumsum(0)
        cu = cu_cpu.to(device)
        k = torch.nn.functional.normalize(torch.randn(t, h, kd, generator=gen), dim=-1).to(dtype)
        w = (torch.randn(t, hv, kd, generator=gen) * 0.3 / kd ** 0.5).to(dtype)
        u = torch.randn(t, hv, vd, generator=gen).to(dtype)
        gc = None
        if gated:  # chunk-local cumulative log2 gates, as fla's cumsum lays them
            step = -torch.rand(t, hv, generator=gen) * 0.05
            gc = torch.empty_like(step)
            for seq, j in chunk_table_host(cu_cpu, 64).tolist():
                a = int(cu_cpu[seq]) + 64 * j
                b = min(a + 64, int(cu_cpu[seq + 1]))
                gc[a:b] = step[a:b].cumsum(0)
        nb = 3
        bodies = DenseSummary(torch.randn(nb, hv, kd, kd, generator=gen) * 0.5 / kd ** 0.5,
                              torch.randn(nb, hv, kd, vd, generator=gen))
        init = torch.randn(2, hv, kd, vd, generator=gen)
        # chain 0: live 5, body 0, live 0, live 1, body 1, live 3; chain 1: live 2, body 2, live 6, live 4
        source = torch.tensor([5, -1, 0, 1, -2, 3, 2, -3, 6, 4])
        cu_chains = torch.tensor([0, 6, 10])
        record_rows = torch.tensor([-1, 0, 1, -1, -1, 2, -1, 3, -1, 4]) if record else None
        num_records = 5 if record else None
        span_chunk, num_chunks = span_chunk_rows(cu, cu_cpu)
        ref = scan_chain_wy_reference(k, w, u, gc, cu_cpu, num_chunks, cu_chains, init, second=bodies,
                                      source=source, record_rows=record_rows, num_records=num_records)
        dev = lambda x: None if x is None else x.to(device)  # noqa: E731
        second = bodies_on(bodies, device, table)
        out = scan_chain_wy_triton(dev(k), dev(w), dev(u), dev(gc), cu, span_chunk, num_chunks,
                                   cu_chains.to(device), dev(init), second=second, source=source.to(device),
                                   long_spans=True, record_rows=dev(record_rows), num_records=num_records)
        assert len(out) == (4 if record else 3)
        assert out[0].dtype == u.dtype and out[1].dtype == w.dtype and out[2].dtype == torch.float32
        rel = lambda a, b: float((a.double().cpu() - b).norm() / b.norm())  # noqa: E731
        covered = torch.cat([torch.arange(int(cu_cpu[s]), int(cu_cpu[s + 1])) for s in range(len(lengths))])
        errors = [rel(out[0][covered.to(device)], ref[0][covered]), rel(out[1], ref[1]), rel(out[2], ref[2])]
        if record:
            errors.append(rel(out[3], ref[3]))
        return max(errors)
""")


@pytest.mark.parametrize("gated,table,record", [(True, True, True), (False, False, False)])
def test_long_span_kernel_matches_reference_under_interpreter(gated, table, record):
    script = LONG_CASE + f"print(long_case(torch.bfloat16, 'cpu', gated={gated}, table={table}, record={record}))\n"
    # the kernel rounds the state and v_new to bf16 for its products, as fla's state pass does
    assert interpreted_error(script) < 2e-2


def test_long_span_reference_is_the_chunked_recurrence():
    """The plain-loop reference against the token-by-token delta rule it stands for: WY factors
    of real tokens (from the float64 summaries' own chunked form) walked in chunks give the
    same final state as a plain forward over the whole chain."""
    from hypic.ops.linear.triton_scan import scan_chain_wy_reference

    gen = torch.Generator().manual_seed(3)
    x = tokens(150, gen, torch.float64)
    cu = torch.tensor([0, 70, 150])
    wy = _wy_factors_float64(x, cu)
    _, final_ref = gated_delta.gated_delta_forward(**x, cu_seqlens=torch.tensor([0, 150]))
    _, _, final = scan_chain_wy_reference(x["k"], wy["w"], wy["u"], wy["g"], cu, 4, torch.tensor([0, 2]))
    assert rel(final, final_ref) < 1e-10


def _wy_factors_float64(x, cu, chunk=64):
    """fla's WY factors of gated delta-rule tokens, in float64 on the CPU: per chunk,
    ``A = (I + tril(diag(beta) (K K^T * Gamma), -1))^-1``, ``w = A diag(beta exp2(g)) K`` and
    ``u = A diag(beta) V``, with g the chunk-local cumulative log2 gate and
    ``Gamma[i, j] = exp2(g_i - g_j)``."""
    n, hv = x["v"].shape[0], x["v"].shape[1]
    ratio = hv // x["k"].shape[1]
    kk = x["k"].repeat_interleave(ratio, dim=1)
    g2 = x["g"] / torch.log(torch.tensor(2.0, dtype=torch.float64))
    gc = torch.empty_like(g2)
    w = torch.empty(n, hv, kk.shape[-1], dtype=torch.float64)
    u = torch.empty_like(x["v"])
    bounds = cu.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        for t0 in range(a, b, chunk):
            t1 = min(t0 + chunk, b)
            gl = g2[t0:t1].cumsum(0)  # [L, HV]
            gc[t0:t1] = gl
            for head in range(hv):
                kc, vc, bc, gh = kk[t0:t1, head], x["v"][t0:t1, head], x["beta"][t0:t1, head], gl[:, head]
                gamma = torch.exp2(gh[:, None] - gh[None, :])
                a_mat = torch.tril((bc[:, None] * (kc @ kc.T)) * gamma, -1)
                inv = torch.linalg.inv(torch.eye(t1 - t0, dtype=torch.float64) + a_mat)
                w[t0:t1, head] = inv @ ((bc * torch.exp2(gh))[:, None] * kc)
                u[t0:t1, head] = inv @ (bc[:, None] * vc)
    return dict(w=w, u=u, g=gc)


def test_chain_forward_and_summarize_reference():
    """The write-path op: outputs as the chain forward, the live spans' zero-start summaries, and
    the recorded entering states equal to a plain forward over each chain's tokens before them."""
    full, cu_full, live, cu_live, body, cu_body, source, cu_chains = chain_problem(PIECES, LIVE_ORDER)
    init = torch.randn(2, HV, K, V, dtype=torch.float64)
    summ = gated_delta.gated_delta_summarize(body["k"], body["v"], body["g"], body["beta"], cu_seqlens=cu_body)
    args = dict(cu_seqlens=cu_live, cu_chains=cu_chains, source=source, bodies=summ, initial_states=init)
    o_ref, final_ref = gated_delta.gated_delta_chain_forward(**live, **args)
    # chain elements 2 (live, after a body) and 6 (the second chain's 2nd element) recorded
    record_rows = torch.tensor([-1, -1, 0, -1, -1, -1, 1, -1])
    o, final, summary, incoming = gated_delta.gated_delta_chain_forward_and_summarize(
        **live, **args, record_rows=record_rows, num_records=2)
    assert rel(o, o_ref) < 1e-12 and rel(final, final_ref) < 1e-12
    own = gated_delta.gated_delta_summarize(live["k"], live["v"], live["g"], live["beta"], cu_seqlens=cu_live)
    assert rel(summary.transition, own.transition) < 1e-12 and rel(summary.state, own.state) < 1e-12
    # chain 0's first 3 + 5 tokens; chain 1's first 6 tokens
    sub = {key: x[:8] for key, x in full.items()}
    _, before0 = gated_delta.gated_delta_forward(**sub, cu_seqlens=torch.tensor([0, 8]), initial_state=init[:1])
    start1 = int(cu_full[1])
    sub = {key: x[start1:start1 + 6] for key, x in full.items()}
    _, before1 = gated_delta.gated_delta_forward(**sub, cu_seqlens=torch.tensor([0, 6]), initial_state=init[1:])
    assert rel(incoming[0], before0[0]) < 1e-10 and rel(incoming[1], before1[0]) < 1e-10
    o2, _, none_summary, none_records = gated_delta.gated_delta_chain_forward_and_summarize(
        **live, **args, summarize=False)
    assert none_summary is None and none_records is None and rel(o2, o_ref) < 1e-12
    with pytest.raises(ValueError, match="num_records"):
        gated_delta.gated_delta_chain_forward_and_summarize(**live, **args, record_rows=record_rows)
    with pytest.raises(ValueError, match="one per chain element"):
        gated_delta.gated_delta_chain_forward_and_summarize(**live, **args, record_rows=record_rows[:3],
                                                            num_records=2)
    with pytest.raises(ValueError, match="without record_rows"):
        gated_delta.gated_delta_chain_forward_and_summarize(**live, **args, num_records=2)


@pytest.mark.cuda
@pytest.mark.parametrize("gated,table,record", [(True, True, True), (False, True, False), (True, False, True)])
def test_long_span_kernel_matches_reference_on_cuda(gated, table, record):
    namespace: dict = {}
    exec(LONG_CASE, namespace)  # noqa: S102 - the same case as the interpreter test
    assert namespace["long_case"](torch.bfloat16, "cuda", gated=gated, kd=128, vd=128, table=table,
                                  record=record) < 2e-2


@pytest.mark.cuda
def test_chain_forward_and_summarize_on_cuda():
    """The write path on CUDA (long live spans walked in the chain kernel) against the float64
    CPU reference."""
    pieces = [[("live", 8), ("live", 504), ("body", 70), ("live", 8), ("live", 130)],
              [("live", 200), ("body", 90), ("live", 1), ("live", 64)]]
    dims = dict(h=2, hv=4, kd=128, vd=64)
    _, _, live, cu_live, body, cu_body, source, cu_chains = chain_problem(pieces, [0, 1, 2, 3, 4, 5, 6], **dims)
    init = torch.randn(2, 4, 128, 64, dtype=torch.float64)
    summ = gated_delta.gated_delta_summarize(body["k"], body["v"], body["g"], body["beta"], cu_seqlens=cu_body)
    record_rows = torch.tensor([-1, 0, -1, 1, -1, -1, -1, 2, -1])
    spans = torch.tensor([1, 4, 0, 6])  # a 504-token body, a 130-token span, a seam, the last
    o_ref, final_ref, s_ref, inc_ref = gated_delta.gated_delta_chain_forward_and_summarize(
        **live, cu_seqlens=cu_live, cu_chains=cu_chains, source=source, bodies=summ, initial_states=init,
        summary_spans=spans, record_rows=record_rows, num_records=3)
    dev = "cuda"
    live_d = {key: x.to(dev, torch.bfloat16 if key != "g" else torch.float32) for key, x in live.items()}
    o, final, s, inc = gated_delta.gated_delta_chain_forward_and_summarize(
        **live_d, cu_seqlens=cu_live.to(dev), cu_chains=cu_chains.to(dev), source=source.to(dev),
        bodies=DenseSummary(*(x.float().to(dev) for x in summ.parts())), initial_states=init.float().to(dev),
        cu_seqlens_cpu=cu_live, summary_spans=spans.to(dev), record_rows=record_rows.to(dev), num_records=3)
    assert o.dtype == torch.bfloat16 and final.dtype == torch.float32
    assert rel(o.cpu(), o_ref) < 2e-2
    assert rel(final.cpu(), final_ref) < 2e-2
    assert rel(inc.cpu(), inc_ref) < 2e-2
    assert rel(s.transition.cpu(), s_ref.transition) < 2e-2 and rel(s.state.cpu(), s_ref.state) < 2e-2


def test_summary_spans_select_and_order_the_summaries():
    full, cu_full, live, cu_live, body, cu_body, source, cu_chains = chain_problem(PIECES, LIVE_ORDER)
    summ = gated_delta.gated_delta_summarize(body["k"], body["v"], body["g"], body["beta"], cu_seqlens=cu_body)
    args = dict(cu_seqlens=cu_live, cu_chains=cu_chains, source=source, bodies=summ)
    _, _, every, _ = gated_delta.gated_delta_chain_forward_and_summarize(**live, **args)
    _, _, some, _ = gated_delta.gated_delta_chain_forward_and_summarize(**live, **args,
                                                                       summary_spans=torch.tensor([4, 1]))
    assert some.num_spans == 2
    assert torch.equal(some.transition, every.transition[[4, 1]]) and torch.equal(some.state, every.state[[4, 1]])
    _, _, run, _ = gated_delta.gated_delta_chain_forward_and_summarize(**live, **args, summary_spans=(1, 4))
    assert torch.equal(run.transition, every.transition[1:4]) and torch.equal(run.state, every.state[1:4])
    with pytest.raises(ValueError, match="summary_spans"):
        gated_delta.gated_delta_chain_forward_and_summarize(**live, **args, summary_spans=torch.tensor([[0]]))
    with pytest.raises(ValueError, match="as a range"):
        gated_delta.gated_delta_chain_forward_and_summarize(**live, **args, summary_spans=(2, 9))
