"""Tests of ``simple_gla_chain_forward``: live spans between cached bodies for the scalar-decay
families (lightning attention), float64 on the CPU: the live outputs, the chains' final states, the
written spans' summaries and the recorded states equal a plain forward over each whole chain whose
bodies are given only as (scalar) summaries. CUDA: the same problem in bf16 on the fast paths (fla's
chunked kernels, the Triton scan) against the float64 CPU reference."""

from __future__ import annotations

import pytest
import torch

from hypic.ops.linear.scan import scan_chain
from hypic.ops.linear.simple_gla import simple_gla_chain_forward, simple_gla_forward, simple_gla_summarize
from hypic.ops.linear.summary import ScalarSummary, SummaryTable
from tests.ops.linear.chain_cases import chain_problem, live_rows

pytestmark = pytest.mark.usefixtures("single_thread_torch")

H, K, V = 3, 16, 8
# two chains of live pieces and cached bodies (spans past a 64-token chunk); live spans numbered
# out of chain order
PIECES = [[("live", 3), ("body", 70), ("live", 2), ("body", 7), ("live", 65)],
          [("body", 6), ("live", 1), ("live", 5)]]
LIVE_ORDER = [3, 0, 4, 2, 1]


def rel(a, b):
    return float((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm().clamp_min(1e-30))


def problem(seed=0, heads=H):
    """The chains' q, k, v (one head count: lightning has no GVA), as chain_problem lays them out."""
    full, cu_full, live, cu_live, body, cu_body, source, cu_chains = chain_problem(
        PIECES, LIVE_ORDER, seed=seed, h=heads, hv=heads, kd=K, vd=V)
    pick = lambda d, names: {n: d[n] for n in names}  # noqa: E731
    return (pick(full, "qkv"), cu_full, pick(live, "qkv"), cu_live, pick(body, "kv"), cu_body, source, cu_chains,
            live_rows(PIECES, LIVE_ORDER))


GAMMA = -torch.tensor([0.02, 0.3, 1e-4], dtype=torch.float64)


@pytest.mark.parametrize("as_table", [False, True])
@pytest.mark.parametrize("with_init", [False, True])
def test_chain_forward_equals_forward_of_whole_chains(as_table, with_init):
    full, cu_full, live, cu_live, body, cu_body, source, cu_chains, live_rows = problem()
    init = torch.randn(2, H, K, V, dtype=torch.float64) if with_init else None
    o_full, final_full = simple_gla_forward(**full, g_gamma=GAMMA, cu_seqlens=cu_full, initial_state=init, scale=0.7)
    summ = simple_gla_summarize(body["k"], body["v"], g_gamma=GAMMA, cu_seqlens=cu_body)
    bodies = SummaryTable([summ.index(torch.tensor([i])) for i in range(summ.num_spans)]) if as_table else summ
    o, final, written, records = simple_gla_chain_forward(
        **live, g_gamma=GAMMA, cu_seqlens=cu_live, cu_chains=cu_chains, source=source, bodies=bodies,
        initial_states=init, scale=0.7, summarize=True, summary_spans=(1, 3))
    assert records is None
    assert rel(o, o_full[live_rows]) < 1e-12
    assert rel(final, final_full) < 1e-12
    # the written spans' summaries are their zero-start summaries, T = length * log decay
    want = simple_gla_summarize(live["k"], live["v"], g_gamma=GAMMA, cu_seqlens=cu_live)
    assert isinstance(written, ScalarSummary) and written.num_spans == 2
    assert rel(written.state, want.state[1:3]) < 1e-12
    lengths = (cu_live[1:] - cu_live[:-1]).double()
    assert rel(written.log_decay, lengths[1:3, None] * GAMMA[None]) < 1e-12


def test_recorded_states_are_the_states_entering_elements():
    full, cu_full, live, cu_live, body, cu_body, source, cu_chains, live_rows = problem(seed=1)
    summ = simple_gla_summarize(body["k"], body["v"], g_gamma=GAMMA, cu_seqlens=cu_body)
    record_rows = torch.tensor([-1, 0, -1, 1, -1, 2, -1, -1])  # elements 1, 3 and 5 (a body)
    _, _, written, records = simple_gla_chain_forward(
        **live, g_gamma=GAMMA, cu_seqlens=cu_live, cu_chains=cu_chains, source=source, bodies=summ,
        record_rows=record_rows, num_records=3)
    assert written is None
    # the reference: the whole chains' states at those elements' starts
    starts = [[0, 3, 73, 75, 82], [0, 6, 7]]
    want = []
    for chain, element in ((0, 1), (0, 3), (1, 0)):
        n = starts[chain][element]
        a = int(cu_full[chain])
        if n == 0:
            want.append(torch.zeros(H, K, V, dtype=torch.float64))
            continue
        _, s = simple_gla_forward(full["q"][a:a + n], full["k"][a:a + n], full["v"][a:a + n], g_gamma=GAMMA,
                                  cu_seqlens=torch.tensor([0, n]))
        want.append(s[0])
    assert rel(records, torch.stack(want)) < 1e-12


def test_chains_of_live_spans_only():
    """No bodies: each chain is its live spans in order (a cold forward with writes)."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(40, H, d, generator=gen, dtype=torch.float64) for d in (K, K, V))
    cu = torch.tensor([0, 10, 25, 40])
    o, final, _, _ = simple_gla_chain_forward(q, k, v, g_gamma=GAMMA, cu_seqlens=cu, cu_chains=torch.tensor([0, 2, 3]))
    o_ref, final_ref = simple_gla_forward(q, k, v, g_gamma=GAMMA, cu_seqlens=torch.tensor([0, 25, 40]))
    assert rel(o, o_ref) < 1e-12 and rel(final, final_ref) < 1e-12


def test_chain_forward_checks_its_arguments():
    full, cu_full, live, cu_live, body, cu_body, source, cu_chains, _ = problem()
    summ = simple_gla_summarize(body["k"], body["v"], g_gamma=GAMMA, cu_seqlens=cu_body)
    args = dict(g_gamma=GAMMA, cu_seqlens=cu_live, cu_chains=cu_chains)
    with pytest.raises(ValueError, match="source and bodies"):
        simple_gla_chain_forward(**live, **args, source=source)
    with pytest.raises(ValueError, match="summary_spans needs summarize"):
        simple_gla_chain_forward(**live, **args, source=source, bodies=summ, summary_spans=(0, 1))
    with pytest.raises(ValueError, match="record_rows must be"):
        simple_gla_chain_forward(**live, **args, source=source, bodies=summ, record_rows=torch.tensor([0]),
                                 num_records=1)
    with pytest.raises(ValueError, match="exactly one of g"):
        simple_gla_chain_forward(**live, cu_seqlens=cu_live, cu_chains=cu_chains)


@pytest.mark.cuda
def test_chain_forward_on_cuda_matches_the_float64_reference():
    """bf16 q/k/v on CUDA (fla's chunked forward and summaries, the Triton scan with scalar T,
    bodies read through an address table) against the float64 CPU path."""
    full, cu_full, live, cu_live, body, cu_body, source, cu_chains, live_rows = problem(seed=2, heads=4)
    gamma = -torch.tensor([0.02, 0.3, 1e-4, 0.05])
    summ = simple_gla_summarize(body["k"], body["v"], g_gamma=gamma.double(), cu_seqlens=cu_body)
    ref = simple_gla_chain_forward(**live, g_gamma=gamma.double(), cu_seqlens=cu_live, cu_chains=cu_chains,
                                   source=source, bodies=summ, summarize=True)
    dev = torch.device("cuda")
    items = [ScalarSummary(summ.log_decay[i:i + 1].float().to(dev).clone(), summ.state[i:i + 1].float().to(dev).clone())
             for i in range(summ.num_spans)]
    addresses = torch.tensor([[it.log_decay.data_ptr() for it in items], [it.state.data_ptr() for it in items]],
                             dtype=torch.int64, device=dev)
    got = simple_gla_chain_forward(
        **{n: t.to(dev, torch.bfloat16) for n, t in live.items()}, g_gamma=gamma.to(dev),
        cu_seqlens=cu_live.to(dev), cu_chains=cu_chains.to(dev), source=source.to(dev),
        bodies=SummaryTable(items, addresses), summarize=True, cu_seqlens_cpu=cu_live)
    assert rel(got[0], ref[0]) < 2e-2  # outputs: bf16 inputs and output
    assert rel(got[1], ref[1]) < 1e-2  # final states: fp32 accumulation of bf16 products
    assert rel(got[2].state, ref[2].state) < 1e-2
    assert rel(got[2].log_decay, ref[2].log_decay) < 1e-6
    # the scan alone, fp32 on the device: the scalar T applied exactly
    incoming, final = scan_chain(ScalarSummary(summ.log_decay.float().to(dev), summ.state.float().to(dev)),
                                 torch.tensor([0, summ.num_spans], device=dev))
    inc_ref, final_ref = scan_chain(summ, torch.tensor([0, summ.num_spans]))
    assert rel(final, final_ref) < 1e-6 and rel(incoming, inc_ref) < 1e-6
