"""Tests of :mod:`hypic.ops.linear.state_summary`: a written span's zero-start state read off the
states a forward walked it with, ``S(C|0) = h_after - T_C h_before``.

CPU (float64): the record and exit rows for spans inside and at the end of chains; the identity
itself through the reference chain op (its recorded states and T give the zero-start S that
``gated_delta_summarize`` computes directly). Kernel: against the torch reference under the
Triton interpreter and on CUDA; the same for the states carried part-way into a chunk. CUDA: the
cold write path of the chain op in each ``HYPIC_COLD_SUMMARIES`` mode, against the float64 CPU
reference.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from hypic.ops.linear import gated_delta
from hypic.ops.linear._fla_cold import written_bounds
from hypic.ops.linear.state_summary import (
    cold_summaries_mode,
    position_table,
    states_at_positions,
    states_at_positions_reference,
    written_span_rows,
    zero_start_from_states,
    zero_start_from_states_reference,
)
from hypic.ops.linear.triton_scan import scan_chain_wy_reference
from tests.interpreter import interpreted_error
from tests.ops.linear.test_chain_forward import CUDA, HV, K, V, _wy_factors_float64, chain_problem, rel, tokens

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


def test_chain_op_checks_the_host_copies():
    _, _, live, cu_live, _, _, _, cu_chains = chain_problem(COLD, list(range(7)))
    args = dict(**live, cu_seqlens=cu_live, cu_chains=cu_chains)
    spans = torch.tensor([1, 3])
    _, _, with_copies, _ = gated_delta.gated_delta_chain_forward_and_summarize(
        **args, summary_spans=spans, cu_chains_cpu=cu_chains.clone(), summary_spans_cpu=spans.clone())
    _, _, plain, _ = gated_delta.gated_delta_chain_forward_and_summarize(**args, summary_spans=spans)
    assert torch.equal(with_copies.state, plain.state)
    with pytest.raises(ValueError, match="cu_chains_cpu must copy"):
        gated_delta.gated_delta_chain_forward_and_summarize(**args, cu_chains_cpu=cu_chains[:2])
    with pytest.raises(ValueError, match="host copy of a summary_spans index tensor"):
        gated_delta.gated_delta_chain_forward_and_summarize(**args, summary_spans=(1, 3), summary_spans_cpu=spans)
    with pytest.raises(ValueError, match="summary_spans_cpu must be a 1-D CPU tensor"):
        gated_delta.gated_delta_chain_forward_and_summarize(**args, summary_spans=spans,
                                                            summary_spans_cpu=spans[None])


def test_env_switch(monkeypatch):
    monkeypatch.delenv("HYPIC_COLD_SUMMARIES", raising=False)
    assert cold_summaries_mode() == "walk"
    for mode in ("one_run", "walk", "fla"):
        monkeypatch.setenv("HYPIC_COLD_SUMMARIES", mode)
        assert cold_summaries_mode() == mode
    monkeypatch.setenv("HYPIC_COLD_SUMMARIES", "1")
    with pytest.raises(ValueError, match="HYPIC_COLD_SUMMARIES"):
        cold_summaries_mode()


def test_written_bounds_share_positions_and_end_chains_with_finals():
    cu_spans = [0, 3, 23, 26, 43, 48, 50, 61]
    positions, rows = written_bounds(cu_spans, [0, 5, 7], [1, 3, 6, 4])
    # span 1 enters at 3 and leaves at 23; span 3 [26, 43); span 6 ends chain 1, span 4 chain 0
    assert positions == [3, 23, 26, 43, 50]
    assert rows == [[0, 2, 4, 3], [1, 3, -2, -1]]
    with pytest.raises(ValueError, match="not one of the 7 spans"):
        written_bounds(cu_spans, [0, 5, 7], [7])


def test_position_table_lays_chunks_sequence_by_sequence():
    cu = torch.tensor([0, 130, 200])  # sequence 0: chunks 0-2 (64, 64, 2), sequence 1: chunks 3-4
    assert position_table(cu, [0, 8, 64, 129, 130, 199], 64) == [[0, 0, 1, 2, 3, 4], [0, 0, 64, 128, 130, 194],
                                                                [0, 8, 0, 1, 0, 5]]
    with pytest.raises(ValueError, match="not inside a sequence"):
        position_table(cu, [200], 64)


def _chunked_run(n, seed=0, dtype=torch.float64):
    """One sequence of gated delta-rule tokens, its float64 WY factors and its chunked state
    pass (states entering each chunk, v_new), as fla's one-run forward has them."""
    gen = torch.Generator().manual_seed(seed)
    x = tokens(n, gen, dtype)
    cu = torch.tensor([0, n])
    wy = _wy_factors_float64(x, cu)
    v_new, h_chunks, final = scan_chain_wy_reference(x["k"], wy["w"], wy["u"], wy["g"], cu, -(-n // 64),
                                                     torch.tensor([0, 1]))
    return x, wy, v_new, h_chunks, final


def test_states_at_positions_reference_is_the_forward_up_to_there():
    x, wy, v_new, h_chunks, _ = _chunked_run(150)
    positions = [0, 8, 64, 71, 149]
    table = torch.tensor(position_table(torch.tensor([0, 150]), positions, 64))
    states = states_at_positions_reference(h_chunks, v_new, x["k"], wy["g"], table)
    for p, state in zip(positions, states):
        if p == 0:
            assert float(state.abs().max()) == 0.0
            continue
        _, ref = gated_delta.gated_delta_forward(**{key: t[:p] for key, t in x.items()}, cu_seqlens=torch.tensor([0, p]))
        assert rel(state, ref[0]) < 1e-10


def test_one_run_bounds_give_the_written_spans_zero_start_summaries():
    """What the one-run cold path computes, in float64 references: the run's chunk states carried
    to the written spans' bounds (seams of 8 tokens, spans not chunk-aligned, the last span
    ending the chain) and T from the spans' own summaries give the zero-start S."""
    x, wy, v_new, h_chunks, final = _chunked_run(150)
    cu_spans = [0, 8, 70, 78, 150]
    spans = [1, 3]
    positions, rows = written_bounds(cu_spans, [0, 4], spans)
    table = torch.tensor(position_table(torch.tensor([0, 150]), positions, 64))
    states = states_at_positions_reference(h_chunks, v_new, x["k"], wy["g"], table)
    own = gated_delta.gated_delta_summarize(x["k"], x["v"], x["g"], x["beta"], cu_seqlens=torch.tensor(cu_spans))
    derived = zero_start_from_states_reference(own.transition[spans], states, final, torch.tensor(rows))
    assert rel(derived, own.state[spans]) < 1e-10


KERNEL_CASE = textwrap.dedent("""
    import torch
    from hypic.ops.linear.state_summary import zero_start_from_states, zero_start_from_states_reference

    def kernel_case(device, precision, nw=3, hv=2, kd=128, vd=64):
        gen = torch.Generator().manual_seed(0)
        trans = torch.randn(nw, hv, kd, kd, generator=gen) / kd ** 0.5
        incoming = torch.randn(nw + 1, hv, kd, vd, generator=gen)
        final = torch.randn(2, hv, kd, vd, generator=gen)
        # span 0 enters with row 2 and leaves with row 1, span 1 leaves with chain 1's final
        rows = torch.tensor([[2, 0, 3], [1, -2, 0]])[:, :nw]
        ref = zero_start_from_states_reference(trans.double(), incoming.double(), final.double(), rows)
        final[0].fill_(float("nan"))  # NaN-poison: no span leaves with chain 0's final state
        d = lambda x: x.to(device)  # noqa: E731
        out = zero_start_from_states(d(trans), d(incoming), d(final), d(rows), precision=precision)
        assert out.dtype == torch.float32 and out.shape == ref.shape and torch.isfinite(out).all()
        return float((out.double().cpu() - ref).norm() / ref.norm())
""")


@pytest.mark.parametrize("precision", ["bf16x3", "ieee"])
def test_kernel_matches_reference_under_interpreter(precision):
    assert interpreted_error(KERNEL_CASE + f"print(kernel_case('cpu', {precision!r}))\n") < 1e-4


@pytest.mark.skipif(not CUDA, reason="Triton kernels compile for CUDA")
@pytest.mark.parametrize("precision", ["bf16x3", "tf32x3"])
def test_kernel_matches_reference_on_cuda(precision):
    namespace: dict = {}
    exec(KERNEL_CASE, namespace)  # noqa: S102 - the same case as the interpreter test
    assert namespace["kernel_case"]("cuda", precision) < 1e-4


POSITIONS_CASE = textwrap.dedent("""
    import torch
    from hypic.ops.linear.state_summary import position_table, states_at_positions, states_at_positions_reference

    def positions_case(device, dtype=torch.bfloat16, gated=True, hv=4, h=2, kd=128, vd=64, n=150):
        gen = torch.Generator().manual_seed(0)
        chunks = -(-n // 64)
        hc = torch.randn(chunks, hv, kd, vd, generator=gen).to(dtype)
        v_new = torch.randn(n, hv, vd, generator=gen).to(dtype)
        k = torch.nn.functional.normalize(torch.randn(n, h, kd, generator=gen), dim=-1).to(dtype)
        g = None
        if gated:
            g = torch.empty(n, hv)
            for a in range(0, n, 64):
                g[a:a + 64] = (-torch.rand(min(64, n - a), hv, generator=gen) * 0.1).cumsum(0)
        table = torch.tensor(position_table(torch.tensor([0, n]), [0, 8, 63, 64, 100, 149], 64))
        ref = states_at_positions_reference(hc, v_new, k, g, table)
        d = lambda x: None if x is None else x.to(device)  # noqa: E731
        out = states_at_positions(d(hc), d(v_new), d(k), d(g), d(table), 64)
        assert out.dtype == torch.float32 and out.shape == ref.shape
        return float((out.double().cpu() - ref).norm() / ref.norm())
""")


@pytest.mark.parametrize("gated", [True, False])
def test_positions_kernel_matches_reference_under_interpreter(gated):
    # the kernel rounds v_new * decay to the keys' dtype for its product, as fla's chunk step does
    assert interpreted_error(POSITIONS_CASE + f"print(positions_case('cpu', gated={gated}))\n") < 1e-2


@pytest.mark.skipif(not CUDA, reason="Triton kernels compile for CUDA")
def test_positions_kernel_matches_reference_on_cuda():
    namespace: dict = {}
    exec(POSITIONS_CASE, namespace)  # noqa: S102 - the same case as the interpreter test
    assert namespace["positions_case"]("cuda") < 1e-2


@pytest.mark.skipif(not CUDA, reason="fla kernels need CUDA")
@pytest.mark.parametrize("mode", ["one_run", "walk", "fla"])
def test_cold_write_path_on_cuda(monkeypatch, mode):
    """A cold prefill's write op on CUDA (every element live, 512-token segments after 8-token
    seams, the bodies written) in each ``HYPIC_COLD_SUMMARIES`` mode, against the float64 CPU
    reference."""
    monkeypatch.setenv("HYPIC_COLD_SUMMARIES", mode)
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
        summary_spans=spans.to(dev), cu_chains_cpu=cu_chains, summary_spans_cpu=spans)
    assert inc is None and s.num_spans == 3
    assert s.transition.dtype == torch.float32 and s.state.dtype == torch.float32
    assert rel(o.cpu(), o_ref) < 2e-2 and rel(final.cpu(), final_ref) < 2e-2
    assert rel(s.transition.cpu(), s_ref.transition) < 2e-2
    assert rel(s.state.cpu(), s_ref.state) < 2e-2
