"""Tests of ``simple_gla_chain_forward``: live spans between cached bodies for the scalar-decay
families (lightning attention), float64 on the CPU: the live outputs, the chains' final states, the
written spans' summaries and the recorded states equal a plain forward over each whole chain whose
bodies are given only as (scalar) summaries. CUDA: the same problem in bf16 on the fast paths (fla's
chunked kernels, the Triton scan) against the float64 CPU reference."""

from __future__ import annotations

import textwrap

import pytest
import torch

from hypic.ops.linear.scan import scan_chain
from hypic.ops.linear.simple_gla import simple_gla_chain_forward, simple_gla_forward, simple_gla_summarize
from hypic.ops.linear.summary import ScalarSummary, SummaryTable
from tests.interpreter import interpreted_error
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


# ------------------------------------------------------------------------------------------
# Bodies whose keys carry RoPE, moved to where they now start (Ring-linear)
# ------------------------------------------------------------------------------------------

ROPE_PIECES = [[("live", 3), ("body", 70), ("live", 8), ("body", 7), ("live", 5)],
               [("body", 6), ("live", 1), ("live", 64)]]


def test_rotated_bodies_equal_a_forward_whose_keys_carry_rope_at_their_true_positions():
    """Bodies summarised at position 0 and moved by ``body_rotation`` (the RoPE tables of each
    body's start) give what a forward over the whole chains gives with every key rotated at its
    true position; without the rotation they do not."""
    from hypic.ops.rope import RotaryEmbedding, apply_rotary

    live_order = [0, 1, 2, 3, 4]
    full, cu_full, live, cu_live, body, cu_body, source, cu_chains = chain_problem(
        ROPE_PIECES, live_order, seed=6, h=H, hv=H, kd=K, vd=V)
    rotary = RotaryEmbedding(K, K // 2, 10000.0)
    pos, live_pos, body_pos, body_starts = 0, [], [], []
    for chain_start, chain in zip(cu_full.tolist(), ROPE_PIECES):
        pos = chain_start
        for kind, n in chain:
            (live_pos if kind == "live" else body_pos).append(torch.arange(pos - chain_start, pos - chain_start + n))
            if kind == "body":
                body_starts.append(pos - chain_start)
            pos += n
    whole_pos = torch.cat([torch.arange(n) for n in (cu_full[1:] - cu_full[:-1]).tolist()])

    def rope(x, positions):
        return apply_rotary(x, *rotary.cos_sin(positions, torch.float64))

    o_full, final_full = simple_gla_forward(full["q"], rope(full["k"], whole_pos), full["v"], g_gamma=GAMMA,
                                            cu_seqlens=cu_full, scale=0.7)
    at_zero = torch.cat([torch.arange(n) for n in (cu_body[1:] - cu_body[:-1]).tolist()])
    summ = simple_gla_summarize(rope(body["k"], at_zero), body["v"], g_gamma=GAMMA, cu_seqlens=cu_body)
    live_k = rope(live["k"], torch.cat(live_pos))
    rotation = rotary.cos_sin(torch.tensor(body_starts), torch.float64)
    args = dict(g_gamma=GAMMA, cu_seqlens=cu_live, cu_chains=cu_chains, source=source, scale=0.7)
    o, final, _, _ = simple_gla_chain_forward(live["q"], live_k, live["v"], bodies=summ, body_rotation=rotation,
                                              **args)
    rows = live_rows(ROPE_PIECES, live_order)
    assert rel(o, o_full[rows]) < 1e-12 and rel(final, final_full) < 1e-12
    table = SummaryTable([summ.index(torch.tensor([i])) for i in range(summ.num_spans)])
    o_t, final_t, _, _ = simple_gla_chain_forward(live["q"], live_k, live["v"], bodies=table,
                                                  body_rotation=rotation, **args)
    assert torch.equal(o_t, o) and torch.equal(final_t, final)
    o_kept, _, _, _ = simple_gla_chain_forward(live["q"], live_k, live["v"], bodies=summ, **args)
    assert rel(o_kept, o_full[rows]) > 1e-3
    with pytest.raises(ValueError, match="body_rotation needs bodies"):
        simple_gla_chain_forward(live["q"], live_k, live["v"], g_gamma=GAMMA, cu_seqlens=cu_live,
                                 cu_chains=torch.tensor([0, 5]), body_rotation=rotation)


# ------------------------------------------------------------------------------------------
# The chain walk (one-chunk live spans, constant decay) against the float64 reference
# ------------------------------------------------------------------------------------------

WALK_CASE = textwrap.dedent("""
    import torch
    from hypic.ops.linear import _fla_scalar_chain
    from hypic.ops.linear.simple_gla import simple_gla_chain_forward, simple_gla_summarize
    from hypic.ops.linear.summary import ScalarSummary, SummaryTable, summary_addresses
    from hypic.ops.rope import RotaryEmbedding

    def case(dtype, device, rotate=True, table=True, with_init=True, lengths=(8, 0, 1, 64, 8, 20, 17), heads=4,
             kd=32, vd=24, parts=False):
        gen = torch.Generator().manual_seed(7)
        t = sum(lengths)
        cu_cpu = torch.tensor((0,) + tuple(lengths)).cumsum(0)
        unit = lambda *shape: torch.nn.functional.normalize(torch.randn(*shape, generator=gen), dim=-1)  # noqa: E731
        q, k, v = unit(t, heads, kd), unit(t, heads, kd), torch.randn(t, heads, vd, generator=gen)
        gamma = -torch.tensor([0.02, 0.3, 1e-4, 0.05, 0.7, 0.001, 0.1, 0.01][:heads])
        body_lengths = (30, 70, 5, 12)
        cu_body = torch.tensor((0,) + body_lengths).cumsum(0)
        summ = simple_gla_summarize(unit(sum(body_lengths), heads, kd).double(),
                                    torch.randn(sum(body_lengths), heads, vd, generator=gen).double(),
                                    g_gamma=gamma.double(), cu_seqlens=cu_body)
        init = torch.randn(2, heads, kd, vd, generator=gen) if with_init else None
        # chain 0: live 1, body 0, live 0, body 1, live 5; chain 1: body 2, live 2, live 3, body 3, live 4, live 6
        source = torch.tensor([1, -1, 0, -2, 5, -3, 2, 3, -4, 4, 6])
        cu_chains = torch.tensor([0, 5, 11])
        rotary = RotaryEmbedding(kd, kd // 2, 10000.0)
        shifts = torch.tensor([37, 0, 513, 2049])
        rotation = rotary.cos_sin(shifts, torch.float64) if rotate else None
        d = lambda x: None if x is None else x.double()  # noqa: E731
        o_ref, final_ref, _, _ = simple_gla_chain_forward(
            d(q), d(k), d(v), g_gamma=gamma.double(), cu_seqlens=cu_cpu, cu_chains=cu_chains, source=source,
            bodies=summ, initial_states=d(init), scale=0.7, body_rotation=rotation)
        dev = lambda x: None if x is None else x.to(device)  # noqa: E731
        items = [ScalarSummary(summ.log_decay[i:i + 1].float().to(device).clone(),
                               summ.state[i:i + 1].float().to(device).clone()) for i in range(summ.num_spans)]
        if table:
            addresses = torch.tensor([summary_addresses(it, torch.device(device)) for it in items]).T.contiguous()
            bodies = SummaryTable(items, addresses.to(device))
        else:
            bodies = ScalarSummary.cat(items)
        got_rotation = None if rotation is None else tuple(x.float().to(device) for x in rotation)
        o, final = _fla_scalar_chain.simple_gla_chain_walk(
            q.to(device, dtype), k.to(device, dtype), v.to(device, dtype), gamma.to(device),
            cu_seqlens=cu_cpu.to(device), cu_chains=cu_chains.to(device), source=source.to(device), bodies=bodies,
            initial_states=dev(init), scale=0.7, cu_seqlens_cpu=cu_cpu, body_rotation=got_rotation)
        assert o.dtype == dtype and o.shape == v.shape and final.dtype == torch.float32
        rel = lambda a, b: float((a.double().cpu() - b).norm() / b.norm())  # noqa: E731
        errors = (rel(o, o_ref), rel(final, final_ref))
        return errors if parts else max(errors)
""")


@pytest.mark.parametrize("rotate,table,with_init", [(True, True, True), (True, False, False), (False, True, False)])
def test_chain_walk_matches_reference_under_interpreter(rotate, table, with_init):
    """The walk (bodies read through their addresses or from a stacked copy, rotated on load or
    not, with or without initial states) against the float64 reference."""
    script = WALK_CASE + f"print(case(torch.float32, 'cpu', rotate={rotate}, table={table}, with_init={with_init}))\n"
    assert interpreted_error(script) < 1e-5


@pytest.mark.cuda
@pytest.mark.parametrize("rotate,table", [(True, True), (False, True), (True, False)])
def test_chain_walk_matches_reference_on_cuda(rotate, table):
    namespace: dict = {}
    exec(WALK_CASE, namespace)  # noqa: S102 - the interpreter test's case
    o_err, final_err = namespace["case"](torch.bfloat16, "cuda", rotate=rotate, table=table, heads=8, kd=128,
                                         vd=128, parts=True)
    assert o_err < 2e-2 and final_err < 1e-2


@pytest.mark.cuda
def test_chain_forward_takes_the_walk_on_cuda_without_a_host_sync(monkeypatch):
    """A cached request's shape on CUDA (one-chunk live spans, a constant decay, nothing to
    summarise or record): the op runs the walk and reads nothing back to the host."""
    from hypic.ops.linear import _fla_scalar_chain, fla_paths

    full, cu_full, live, cu_live, body, cu_body, source, cu_chains = chain_problem(
        [[("live", 8), ("body", 40), ("live", 8), ("body", 9), ("live", 30)]], [0, 1, 2], seed=8, h=4, hv=4,
        kd=64, vd=64)
    gamma = -torch.tensor([0.02, 0.3, 1e-4, 0.05])
    summ = simple_gla_summarize(body["k"], body["v"], g_gamma=gamma.double(), cu_seqlens=cu_body)
    dev = torch.device("cuda")
    calls = []
    walk = fla_paths.simple_gla_chain_walk
    monkeypatch.setattr(fla_paths, "simple_gla_chain_walk", lambda *a, **kw: calls.append(1) or walk(*a, **kw))
    args = dict(g_gamma=gamma.to(dev), cu_seqlens=cu_live.to(dev), cu_chains=cu_chains.to(dev),
                source=source.to(dev), bodies=ScalarSummary(summ.log_decay.float().to(dev), summ.state.float().to(dev)),
                cu_seqlens_cpu=cu_live)
    qkv = {n: t.to(dev, torch.bfloat16) for n, t in live.items() if n in "qkv"}
    simple_gla_chain_forward(**qkv, **args)  # compiles the kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o, final, _, _ = simple_gla_chain_forward(**qkv, **args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(calls) == 2 and _fla_scalar_chain.scalar_chain_takes(
        qkv["q"], qkv["k"], qkv["v"], None, args["g_gamma"], args["cu_seqlens"], cu_live)
    ref = simple_gla_chain_forward(live["q"], live["k"], live["v"], g_gamma=gamma.double(), cu_seqlens=cu_live,
                                   cu_chains=cu_chains, source=source, bodies=summ)
    assert rel(o, ref[0]) < 2e-2 and rel(final, ref[1]) < 1e-2
