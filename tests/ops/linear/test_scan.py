"""Tests for hypic/ops/linear/scan.py: the scans along chains of affine summaries (the reference
path; the Triton scan against it is in test_fla_paths.py)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.ops.linear.scan import gather_chain, scan_chain, scan_chain_from
from hypic.ops.linear.summary import DenseSummary, SummaryTable, apply_summary, summary_addresses
from tests.ops.linear.test_summary import HV, KINDS, K, V, close, random_summary

pytestmark = pytest.mark.usefixtures("single_thread_torch")


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


def test_scan_chain_from_two_sources_equals_the_gathered_chain():
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
