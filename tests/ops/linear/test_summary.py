"""Tests for hypic/ops/linear/summary.py (structured affine summaries and their algebra) and
hypic/ops/linear/scan.py (the scans along chains of them)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.ops.linear.summary import (
    DenseSummary,
    DiagonalSummary,
    ScalarSummary,
    apply_summary,
    compose,
    identity_summary,
)
from hypic.ops.linear.scan import scan_chain

pytestmark = pytest.mark.usefixtures("single_thread_torch")

HV, K, V = 3, 5, 4
KINDS = ["scalar", "diagonal", "dense"]


def random_summary(kind, num, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    state = torch.randn(num, HV, K, V, generator=gen, dtype=dtype)
    if kind == "scalar":
        return ScalarSummary(-torch.rand(num, HV, generator=gen, dtype=dtype), state)
    if kind == "diagonal":
        return DiagonalSummary(-torch.rand(num, HV, K, generator=gen, dtype=dtype), state)
    trans = torch.eye(K, dtype=dtype) + 0.3 * torch.randn(num, HV, K, K, generator=gen, dtype=dtype)
    return DenseSummary(trans, state)


def dense_t(summary):
    """T materialised as K x K (test oracle only)."""
    if isinstance(summary, ScalarSummary):
        return torch.exp(summary.log_decay)[..., None, None] * torch.eye(K, dtype=summary.dtype)
    if isinstance(summary, DiagonalSummary):
        return torch.diag_embed(torch.exp(summary.log_decay))
    return summary.transition


def close(a, b, tol=1e-12):
    return (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("kind", KINDS)
def test_apply_and_compose_match_dense_algebra(kind):
    s1, s2 = random_summary(kind, 4, 1), random_summary(kind, 4, 2)
    x = torch.randn(4, HV, K, V, dtype=torch.float64)
    assert close(apply_summary(s1, x), dense_t(s1) @ x + s1.state)
    c = compose(s2, s1)
    assert type(c) is type(s1)
    assert close(dense_t(c), dense_t(s2) @ dense_t(s1))
    assert close(apply_summary(c, x), apply_summary(s2, apply_summary(s1, x)))


@pytest.mark.parametrize("kind", KINDS)
def test_compose_is_associative_and_identity_is_neutral(kind):
    a, b, c = (random_summary(kind, 2, s) for s in (3, 4, 5))
    left, right = compose(c, compose(b, a)), compose(compose(c, b), a)
    assert close(dense_t(left), dense_t(right)) and close(left.state, right.state)
    ident = identity_summary(a, 2)
    for s in (compose(ident, a), compose(a, ident)):
        assert close(dense_t(s), dense_t(a)) and close(s.state, a.state)
    x = torch.randn(2, HV, K, V, dtype=torch.float64)
    assert torch.equal(apply_summary(ident, x), x)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=15, deadline=None)
@given(chain_lengths=st.lists(st.integers(0, 6), min_size=1, max_size=5), seed=st.integers(0, 1000), with_init=st.booleans())
def test_scan_chain_matches_sequential_application(kind, chain_lengths, seed, with_init):
    total = sum(chain_lengths)
    summaries = random_summary(kind, total, seed)
    cu_chains = torch.tensor([0] + torch.tensor(chain_lengths).cumsum(0).tolist())
    init = torch.randn(len(chain_lengths), HV, K, V, dtype=torch.float64) if with_init else None
    incoming, final = scan_chain(summaries, cu_chains, init)
    assert incoming.shape == (total, HV, K, V) and final.shape == (len(chain_lengths), HV, K, V)
    for b, length in enumerate(chain_lengths):
        state = init[b : b + 1] if with_init else torch.zeros(1, HV, K, V, dtype=torch.float64)
        for i in range(cu_chains[b], cu_chains[b] + length):
            assert close(incoming[i : i + 1], state)
            state = apply_summary(summaries.index(torch.tensor([i])), state)
        assert close(final[b : b + 1], state)


@pytest.mark.parametrize("kind", KINDS)
def test_index_cat_to_and_nbytes(kind):
    s = random_summary(kind, 5, 7, dtype=torch.float32)
    t_numel = {"scalar": HV, "diagonal": HV * K, "dense": HV * K * K}[kind]
    assert s.nbytes == 4 * 5 * (t_numel + HV * K * V)
    assert s.num_spans == 5
    picked = s.index(torch.tensor([4, 0]))
    assert torch.equal(picked.state[0], s.state[4])
    joined = type(s).cat([picked, s])
    assert joined.num_spans == 7 and joined.nbytes == picked.nbytes + s.nbytes
    assert s.to("cpu").state.device.type == "cpu"


def test_bad_arguments_raise_value_error():
    s = random_summary("dense", 2, 0)
    d = random_summary("diagonal", 2, 0)
    x = torch.zeros(2, HV, K, V, dtype=torch.float64)
    bad_calls = [
        lambda: ScalarSummary(torch.zeros(2, HV), x),  # fp32 decay with an fp64 state
        lambda: ScalarSummary(torch.zeros(2, HV + 1, dtype=torch.float64), x),
        lambda: DiagonalSummary(torch.zeros(2, HV, K + 1, dtype=torch.float64), x),
        lambda: DenseSummary(torch.zeros(2, HV, K, V, dtype=torch.float64), x),
        lambda: DenseSummary(torch.zeros(2, HV, K, K, dtype=torch.float16), x.half()),
        lambda: compose(s, d),
        lambda: compose(s, s.index(torch.tensor([0]))),
        lambda: apply_summary(s, x[:1]),
        lambda: apply_summary(s, x[..., :2]),
        lambda: identity_summary(s, -1),
        lambda: scan_chain(s, torch.tensor([0, 1])),  # chains do not cover the 2 spans
        lambda: scan_chain(s, torch.tensor([0, 2]), x),  # 2 initial states for 1 chain
        lambda: scan_chain(s, torch.tensor([0.0, 2.0])),
        lambda: s.index(torch.tensor([0.0])),
        lambda: DenseSummary.cat([s, d]),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()



def test_scan_chain_from_two_sources_equals_the_gathered_chain():
    from hypic.ops.linear.scan import gather_chain, scan_chain_from

    gen = torch.Generator().manual_seed(3)
    m, hv, k, v = 6, 2, 4, 3
    full = DenseSummary(torch.randn(m, hv, k, k, generator=gen, dtype=torch.float64) / 2,
                        torch.randn(m, hv, k, v, generator=gen, dtype=torch.float64))
    first, second = full.index(torch.tensor([4, 0, 2])), full.index(torch.tensor([5, 1, 3]))
    source = torch.tensor([1, -2, 2, -3, 0, -1])
    chain = gather_chain(first, second, source)
    assert torch.equal(chain.transition, full.transition) and torch.equal(chain.state, full.state)
    cu = torch.tensor([0, 2, 6])
    init = torch.randn(2, hv, k, v, generator=gen, dtype=torch.float64)
    got = scan_chain_from(first, second, source, cu, init)
    want = scan_chain(full, cu, init)
    assert all(torch.allclose(a, b) for a, b in zip(got, want))
    with pytest.raises(ValueError, match="source must be a 1-D int64"):
        scan_chain_from(first, second, source.int(), cu)
    with pytest.raises(ValueError, match="one structure"):
        scan_chain_from(first, DenseSummary(second.transition[:, :1], second.state[:, :1]), source, cu)
    with pytest.raises(ValueError, match="cu_chains"):
        scan_chain_from(first, second, source, cu.float())
    with pytest.raises(ValueError, match="initial_states"):
        scan_chain_from(first, second, source, cu, init[:1])


@pytest.mark.parametrize("kind", KINDS)
def test_summary_table_and_recorded_rows_match_the_full_scan(kind):
    """Bodies as a SummaryTable of one-span summaries (read in place on GPU, stacked here) and
    only some incoming states kept (``record_rows``) give the rows of the full scan."""
    from hypic.ops.linear.scan import scan_chain_from
    from hypic.ops.linear.summary import SummaryTable, summary_addresses

    full = random_summary(kind, 7, seed=11)
    first = full.index(torch.tensor([0, 3, 6]))
    items = tuple(full.index(torch.tensor([i])) for i in (1, 2, 4, 5))
    source = torch.tensor([0, -1, -2, 1, -3, -4, 2])  # = spans 0..6 of `full`
    cu = torch.tensor([0, 3, 7])
    init = torch.randn(2, HV, K, V, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    want_inc, want_fin = scan_chain(full, cu, init)
    record = torch.tensor([0, -1, 3, 1, -1, -1, 2])
    table = SummaryTable(items)
    inc, fin = scan_chain_from(first, table, source, cu, init, record_rows=record, num_records=5)
    assert inc.shape[0] == 5 and torch.equal(fin, want_fin)
    for span, row in enumerate(record.tolist()):
        if row >= 0:
            assert torch.equal(inc[row], want_inc[span])
    assert torch.equal(inc[4], torch.zeros_like(inc[4]))  # a row no span names
    inc2, fin2 = scan_chain(full, cu, init, record_rows=record, num_records=5)
    assert torch.equal(inc2, inc) and torch.equal(fin2, fin)
    # addresses only for contiguous fp32 one-span summaries on the asked device
    assert summary_addresses(items[0], torch.device("cpu")) is None  # fp64
    one32 = type(items[0])(*(t.float().clone() for t in items[0].parts()))
    assert summary_addresses(one32, torch.device("cpu")) == tuple(t.data_ptr() for t in one32.parts())
    assert summary_addresses(one32, torch.device("meta")) is None
    with pytest.raises(ValueError, match="record_rows"):
        scan_chain(full, cu, record_rows=record[:3], num_records=5)
    with pytest.raises(ValueError, match="num_records"):
        scan_chain(full, cu, record_rows=record)
    with pytest.raises(ValueError, match="num_records needs record_rows"):
        scan_chain(full, cu, num_records=3)
    with pytest.raises(ValueError, match="at least one item"):
        SummaryTable(())
    with pytest.raises(ValueError, match="addresses"):
        SummaryTable(items, torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="one structure"):
        other = random_summary("scalar" if kind != "scalar" else "dense", 1, seed=2)
        scan_chain_from(first, SummaryTable((other,)), source, cu)
