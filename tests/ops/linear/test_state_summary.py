"""Tests of :mod:`hypic.ops.linear.state_summary`: a written span's zero-start state read off the
states a forward walked it with, ``S(C|0) = h_after - T_C h_before``.

CPU (float64): the record and exit rows for spans inside and at the end of chains; the identity
itself through the reference chain op (its recorded states and T give the zero-start S that
``gated_delta_summarize`` computes directly). Kernel: against the torch reference under the
Triton interpreter and on CUDA. CUDA: the cold write path of the chain op (S from the walk's
states, T beside the walk), against the float64 CPU reference.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from hypic.ops.linear import gated_delta
from hypic.ops.linear.state_summary import (
    written_span_rows,
    zero_start_from_states,
    zero_start_from_states_reference,
)
from tests.interpreter import interpreted_error
from tests.ops.linear.test_transition import PROBLEM
from tests.ops.linear.test_chain_forward import HV, K, V, chain_problem, rel

# every element live: a cold prefill's chains (seam, body, seam, body, question) and a second
# request whose last written body ends its chain
COLD = [[("live", 3), ("live", 20), ("live", 3), ("live", 17), ("live", 5)],
        [("live", 2), ("live", 11)]]


def test_written_span_rows_inside_and_at_the_end_of_chains():
    cu_chains = torch.tensor([0, 5, 7])
    record_rows, num_records, rows = written_span_rows(cu_chains, (1, 7), 7)
    assert num_records == 7 and record_rows.tolist() == list(range(7))
    # span 4 ends chain 0 and span 6 chain 1: their states after are the finals
    assert rows.tolist() == [[1, 2, 3, 4, 5, 6], [2, 3, 4, -1, 6, -2]]
    _, _, rows = written_span_rows(cu_chains, torch.tensor([6, 1, 3]), 7)
    assert rows.tolist() == [[6, 1, 3], [-2, 2, 4]]
    _, _, rows = written_span_rows(cu_chains, (3, 3), 7)
    assert rows.shape == (2, 0)
    with pytest.raises(ValueError, match="within the 7 spans"):
        written_span_rows(cu_chains, (2, 8), 7)
    with pytest.raises(ValueError, match="1-d index tensor"):
        written_span_rows(cu_chains, torch.tensor([[1]]), 7)


@pytest.mark.parametrize("spans", [(1, 7), (0, 5), (3, 4), torch.tensor([1, 3, 6])])
def test_states_around_a_span_give_its_zero_start_summary(spans):
    _, _, live, cu_live, _, _, _, cu_chains = chain_problem(COLD, list(range(7)))
    init = torch.randn(2, HV, K, V, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    record_rows, num_records, rows = written_span_rows(cu_chains, spans, 7)
    _, final, _, incoming = gated_delta.gated_delta_chain_forward_and_summarize(
        **live, cu_seqlens=cu_live, cu_chains=cu_chains, initial_states=init, record_rows=record_rows,
        num_records=num_records)
    own = gated_delta.gated_delta_summarize(live["k"], live["v"], live["g"], live["beta"], cu_seqlens=cu_live)
    trans = own.transition.index_select(0, rows[0])
    derived = zero_start_from_states_reference(trans, incoming, final, rows)
    assert derived.dtype == torch.float64
    assert rel(derived, own.state.index_select(0, rows[0])) < 1e-10
    # the wrapper falls back to the reference off CUDA
    assert torch.equal(zero_start_from_states(trans, incoming, final, rows), derived)


def test_reference_checks_its_shapes():
    t = torch.zeros(2, 3, 4, 4)
    inc, fin, rows = torch.zeros(3, 3, 4, 5), torch.zeros(1, 3, 4, 5), torch.tensor([[0, 1], [1, -1]])
    assert zero_start_from_states_reference(t, inc, fin, rows).shape == (2, 3, 4, 5)
    with pytest.raises(ValueError, match="rows must be"):
        zero_start_from_states_reference(t, inc, fin, rows[0])
    with pytest.raises(ValueError, match="trans must be"):
        zero_start_from_states_reference(t[:1], inc, fin, rows)
    with pytest.raises(ValueError, match="incoming must be"):
        zero_start_from_states_reference(t, inc[..., :2, :], fin, rows)
    with pytest.raises(ValueError, match="final must be"):
        zero_start_from_states_reference(t, inc, fin[..., :2], rows)


KERNEL_CASE = textwrap.dedent("""
    import torch
    from hypic.ops.linear.state_summary import zero_start_from_states, zero_start_from_states_reference

    def kernel_case(device, nw=3, hv=2, kd=128, vd=64):
        gen = torch.Generator().manual_seed(0)
        trans = torch.randn(nw, hv, kd, kd, generator=gen) / kd ** 0.5
        incoming = torch.randn(nw + 1, hv, kd, vd, generator=gen)
        final = torch.randn(2, hv, kd, vd, generator=gen)
        # span 0 enters with row 2 and leaves with row 1, span 1 leaves with chain 1's final
        rows = torch.tensor([[2, 0, 3], [1, -2, 0]])[:, :nw]
        ref = zero_start_from_states_reference(trans.double(), incoming.double(), final.double(), rows)
        final[0].fill_(float("nan"))  # NaN-poison: no span leaves with chain 0's final state
        d = lambda x: x.to(device)  # noqa: E731
        out = zero_start_from_states(d(trans), d(incoming), d(final), d(rows))
        assert out.dtype == torch.float32 and out.shape == ref.shape and torch.isfinite(out).all()
        return float((out.double().cpu() - ref).norm() / ref.norm())
""")


def test_kernel_matches_reference_under_interpreter():
    assert interpreted_error(KERNEL_CASE + "print(kernel_case('cpu'))\n") < 1e-4


@pytest.mark.cuda
def test_kernel_matches_reference_on_cuda():
    namespace: dict = {}
    exec(KERNEL_CASE, namespace)  # noqa: S102 - the same case as the interpreter test
    assert namespace["kernel_case"]("cuda") < 1e-4


def targets_for(num_spans, hv, kd, vd, device, layers=3, row=1):
    """Summary targets laid out as the entry writer lays them: per span one T and one S buffer
    over ``layers`` linear layers, NaN-poisoned, the targets layer row ``row`` of each; returns
    ``(table, t_buffers, s_buffers)``."""
    from hypic.ops.linear.summary import DenseSummary, SummaryTable

    nan = float("nan")
    t_buf = [torch.full((layers, 1, hv, kd, kd), nan, device=device) for _ in range(num_spans)]
    s_buf = [torch.full((layers, 1, hv, kd, vd), nan, device=device) for _ in range(num_spans)]
    items = [DenseSummary(transition=t[row], state=s[row]) for t, s in zip(t_buf, s_buf)]
    addresses = torch.tensor([[t[row].data_ptr() for t in t_buf], [s[row].data_ptr() for s in s_buf]],
                             device=device)
    return SummaryTable(items, addresses), t_buf, s_buf


TARGETS_CASE = PROBLEM + textwrap.dedent("""
    from hypic.ops.linear.state_summary import zero_start_from_states, zero_start_from_states_into
    from hypic.ops.linear.transition import wy_transitions_beside
    from tests.ops.linear.test_state_summary import targets_for

    def targets_case(device, dtype=torch.float32):
        # T from the transition kernel and then S from the state kernel, written through the
        # targets' address table, against the two kernels' own outputs: the worst absolute
        # difference (0: the same kernels, the same bits); the targets' other rows untouched.
        k, w, g, cu = wy_problem([8, 130, 8, 70, 5], kd=32, dtype=dtype)
        d = lambda x: x.to(device)  # noqa: E731
        k, w, g, cu = d(k), d(w), d(g.float()), d(cu)
        hv, kd, vd = w.shape[1], w.shape[2], 16
        spans = torch.tensor([3, 1], device=device)
        gen = torch.Generator().manual_seed(1)
        incoming = d(torch.randn(5, hv, kd, vd, generator=gen))
        final = d(torch.randn(1, hv, kd, vd, generator=gen))
        rows = d(torch.tensor([[3, 1], [-1, 2]]))  # span 3 leaves with the final state
        trans = wy_transitions_beside(k, w, g, cu, spans, overlap=False).launch().result()
        state = zero_start_from_states(trans, incoming, final, rows)
        table, t_buf, s_buf = targets_for(2, hv, kd, vd, device)
        beside = wy_transitions_beside(k, w, g, cu, spans, overlap=False, into=table).launch()
        assert beside.result() is None and beside.written_into is table
        zero_start_from_states_into(table, incoming, final, rows)
        for buf in t_buf + s_buf:
            assert torch.isnan(buf[0]).all() and torch.isnan(buf[2]).all()
        err = 0.0
        for i, item in enumerate(table.items):
            err = max(err, float((item.transition[0] - trans[i]).abs().max()),
                      float((item.state[0] - state[i]).abs().max()))
        return err
""")


def test_kernels_write_into_targets_under_interpreter():
    assert interpreted_error(TARGETS_CASE + "print(targets_case('cpu'))\n") == 0.0


@pytest.mark.cuda
def test_kernels_write_into_targets_on_cuda():
    namespace: dict = {}
    exec(TARGETS_CASE, namespace)  # noqa: S102 - the same case as the interpreter test
    assert namespace["targets_case"]("cuda", torch.bfloat16) == 0.0


def test_targets_are_checked():
    from hypic.ops.linear.summary import DenseSummary, SummaryTable, check_summary_targets, write_summaries_into

    table, _, _ = targets_for(2, 2, 8, 4, "cpu")
    check_summary_targets(table, 2, 2, 8, 4, "cpu")
    with pytest.raises(ValueError, match="hold 2 items for 3 spans"):
        check_summary_targets(table, 3, 2, 8, 4, "cpu")
    with pytest.raises(ValueError, match=r"state must be \(1, 2, 8, 5\)"):
        check_summary_targets(table, 2, 2, 8, 5, "cpu")
    with pytest.raises(ValueError, match="must be a SummaryTable"):
        check_summary_targets(table.items, 2, 2, 8, 4, "cpu")
    with pytest.raises(ValueError, match="address table"):
        check_summary_targets(SummaryTable(table.items), 2, 2, 8, 4, "cpu", need_addresses=True)
    rows = DenseSummary(transition=torch.randn(2, 2, 8, 8, dtype=torch.float64),
                        state=torch.randn(2, 2, 8, 4, dtype=torch.float64))
    write_summaries_into(table, rows)  # converting to the targets' fp32
    assert torch.equal(table.items[1].state[0], rows.state[1].float())
    with pytest.raises(ValueError, match="3 summaries for 2 targets"):
        write_summaries_into(table, DenseSummary(transition=torch.randn(3, 2, 8, 8), state=torch.randn(3, 2, 8, 4)))


def test_chain_op_writes_into_targets_on_cpu():
    """The reference chain op with ``summary_out``: the summaries it would return are in the
    targets and None is returned; the request is checked (summarize, the targets' count)."""
    pieces = [[("live", 8), ("live", 40), ("live", 8), ("live", 30), ("live", 6)]]
    _, _, live, cu_live, _, _, _, cu_chains = chain_problem(pieces, list(range(5)), h=2, hv=4, kd=16, vd=8)
    live = {key: x.float() for key, x in live.items()}
    spans = torch.tensor([1, 3])
    o, final, want, _ = gated_delta.gated_delta_chain_forward_and_summarize(
        **live, cu_seqlens=cu_live, cu_chains=cu_chains, summary_spans=spans)
    table, _, _ = targets_for(2, 4, 16, 8, "cpu")
    o2, final2, got, _ = gated_delta.gated_delta_chain_forward_and_summarize(
        **live, cu_seqlens=cu_live, cu_chains=cu_chains, summary_spans=spans, summary_out=table)
    assert got is None and torch.equal(o, o2) and torch.equal(final, final2)
    for i, item in enumerate(table.items):
        assert torch.equal(item.transition[0], want.transition[i]) and torch.equal(item.state[0], want.state[i])
    with pytest.raises(ValueError, match="needs summarize=True"):
        gated_delta.gated_delta_chain_forward_and_summarize(
            **live, cu_seqlens=cu_live, cu_chains=cu_chains, summary_spans=spans, summary_out=table,
            summarize=False)
    with pytest.raises(ValueError, match="hold 2 items for 3 spans"):
        gated_delta.gated_delta_chain_forward_and_summarize(
            **live, cu_seqlens=cu_live, cu_chains=cu_chains, summary_spans=(0, 3), summary_out=table)


@pytest.mark.cuda
def test_cold_write_path_on_cuda():
    """A cold prefill's write op on CUDA (every element live, 512-token segments after 8-token
    seams, the bodies written), against the float64 CPU reference."""
    pieces = [[("live", 8), ("live", 504), ("live", 8), ("live", 504), ("live", 64)],
              [("live", 8), ("live", 200)]]
    dims = dict(h=2, hv=4, kd=128, vd=128)
    _, _, live, cu_live, _, _, _, cu_chains = chain_problem(pieces, list(range(7)), **dims)
    spans = torch.tensor([1, 3, 6])  # the bodies: every other span, as a cold layout writes them
    o_ref, final_ref, s_ref, _ = gated_delta.gated_delta_chain_forward_and_summarize(
        **live, cu_seqlens=cu_live, cu_chains=cu_chains, summary_spans=spans)
    dev = "cuda"
    live_d = {key: x.to(dev, torch.bfloat16 if key != "g" else torch.float32) for key, x in live.items()}
    o, final, s, inc = gated_delta.gated_delta_chain_forward_and_summarize(
        **live_d, cu_seqlens=cu_live.to(dev), cu_chains=cu_chains.to(dev), cu_seqlens_cpu=cu_live,
        summary_spans=spans.to(dev))
    assert inc is None and s.num_spans == 3
    assert s.transition.dtype == torch.float32 and s.state.dtype == torch.float32
    assert rel(o.cpu(), o_ref) < 2e-2 and rel(final.cpu(), final_ref) < 2e-2
    assert rel(s.transition.cpu(), s_ref.transition) < 2e-2
    assert rel(s.state.cpu(), s_ref.state) < 2e-2


@pytest.mark.cuda
def test_cold_write_path_into_targets_on_cuda():
    """The cold write op on CUDA with ``summary_out`` (the entry writer's layout: layer row 1 of
    per-write buffers, NaN-poisoned): T and S written by the kernels equal what the op returns
    without targets, the other rows untouched, the outputs the same."""
    pieces = [[("live", 8), ("live", 504), ("live", 8), ("live", 504), ("live", 64)],
              [("live", 8), ("live", 200)]]
    dims = dict(h=2, hv=4, kd=128, vd=128)
    _, _, live, cu_live, _, _, _, cu_chains = chain_problem(pieces, list(range(7)), **dims)
    dev = "cuda"
    live_d = {key: x.to(dev, torch.bfloat16 if key != "g" else torch.float32) for key, x in live.items()}
    args = dict(cu_seqlens=cu_live.to(dev), cu_chains=cu_chains.to(dev), cu_seqlens_cpu=cu_live,
                summary_spans=torch.tensor([1, 3, 6], device=dev))
    o, final, want, _ = gated_delta.gated_delta_chain_forward_and_summarize(**live_d, **args)
    table, t_buf, s_buf = targets_for(3, 4, 128, 128, dev)
    o2, final2, got, inc = gated_delta.gated_delta_chain_forward_and_summarize(**live_d, **args, summary_out=table)
    assert got is None and inc is None
    assert torch.equal(o, o2) and torch.equal(final, final2)
    for i, item in enumerate(table.items):
        assert rel(item.transition[0], want.transition[i]) < 1e-6 and rel(item.state[0], want.state[i]) < 1e-6
    for buf in t_buf + s_buf:
        assert torch.isnan(buf[0]).all() and torch.isnan(buf[2]).all()
