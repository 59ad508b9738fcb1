"""Tests for hypic/ops/linear/low_rank.py: factored summaries of short spans against the dense
reference, their application without T, the mixed chain scan; and the chunked reference's
length-grouped chunks (hypic/ops/linear/_chunked.py) against one chunk length for all spans."""

import pytest
import torch

from hypic.ops.linear import _chunked
from hypic.ops.linear.gated_delta import gated_delta_forward, gated_delta_summarize
from hypic.ops.linear.low_rank import (
    LowRankSummary,
    apply_low_rank,
    gated_delta_low_rank_summarize,
    low_rank_is_smaller,
    scan_chain_mixed,
)
from hypic.ops.linear.scan import scan_chain_from
from hypic.ops.linear.summary import apply_summary

pytestmark = pytest.mark.usefixtures("single_thread_torch")
H, HV, K, V = 2, 4, 16, 8


def inputs(lengths, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    k = torch.nn.functional.normalize(torch.randn(n, H, K, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(n, HV, V, generator=g, dtype=dtype)
    gate = -torch.rand(n, HV, generator=g, dtype=dtype) * 0.4
    beta = torch.rand(n, HV, generator=g, dtype=dtype)
    cu = torch.tensor([0] + list(lengths)).cumsum(0)
    return k, v, gate, beta, cu


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_factored_summaries_equal_the_dense_ones(dtype, tol):
    lengths = [1, 5, 16, 17, 33, 64]
    k, v, g, beta, cu = inputs(lengths, dtype=dtype)
    dense = gated_delta_summarize(k, v, g, beta, cu_seqlens=cu)
    low = gated_delta_low_rank_summarize(k, v, g, beta, cu_seqlens=cu)
    state = torch.randn(1, HV, K, V, dtype=dtype, generator=torch.Generator().manual_seed(3))
    for i, (n, s) in enumerate(zip(lengths, low)):
        assert isinstance(s, LowRankSummary) and s.rank == n and s.num_spans == 1 and s.dtype == dtype
        assert s.nbytes == dtype.itemsize * HV * (1 + n * (2 * K + V))
        one = dense.index(torch.tensor([i]))
        torch.testing.assert_close(s.transition, one.transition, rtol=0, atol=tol)
        torch.testing.assert_close(s.state, one.state, rtol=0, atol=tol)
        torch.testing.assert_close(apply_low_rank(s, state), apply_summary(one, state), rtol=0, atol=10 * tol)
        torch.testing.assert_close(s.dense().transition, one.transition, rtol=0, atol=tol)
    with pytest.raises(ValueError, match="1 to 64"):
        gated_delta_low_rank_summarize(*inputs([65])[:4], cu_seqlens=torch.tensor([0, 65]))


def test_apply_never_forms_t(monkeypatch):
    (s,) = gated_delta_low_rank_summarize(*inputs([7])[:4], cu_seqlens=torch.tensor([0, 7]))
    monkeypatch.setattr(LowRankSummary, "transition", property(lambda self: pytest.fail("T formed")))
    apply_low_rank(s, torch.zeros(1, HV, K, V, dtype=torch.float64))


def test_factored_is_chosen_only_when_smaller():
    assert low_rank_is_smaller(1, 64, 64) and low_rank_is_smaller(42, 64, 64) and not low_rank_is_smaller(43, 64, 64)
    assert low_rank_is_smaller(85, 128, 128) is False  # beyond one chunk
    assert low_rank_is_smaller(64, 128, 128) and not low_rank_is_smaller(0, 128, 128)


def test_mixed_chain_scan_equals_the_dense_scan():
    lengths = [3, 9, 5, 12, 7, 4]
    k, v, g, beta, cu = inputs(lengths, seed=5)
    live_cu = torch.tensor([0, 3, 12, 17, 29, 36, 40])
    live = gated_delta_summarize(k, v, g, beta, cu_seqlens=live_cu)
    bodies_in = inputs([6, 11, 2], seed=8)
    dense_bodies = gated_delta_summarize(*bodies_in[:4], cu_seqlens=bodies_in[4])
    factored = gated_delta_low_rank_summarize(*bodies_in[:4], cu_seqlens=bodies_in[4])
    mixed = [factored[0], dense_bodies.index(torch.tensor([1])), factored[2]]
    # two chains: live 0, body 0, live 1, body 1, live 2 | live 3, body 2, live 4, live 5
    source = torch.tensor([0, -1, 1, -2, 2, 3, -3, 4, 5])
    cu_chains = torch.tensor([0, 5, 9])
    init = torch.randn(2, HV, K, V, dtype=torch.float64)
    rows = torch.tensor([0, -1, 1, -1, 2, 3, -1, 4, 5])
    want = scan_chain_from(live, dense_bodies, source, cu_chains, init, record_rows=rows, num_records=6)
    got = scan_chain_mixed(live, mixed, source, cu_chains, init, record_rows=rows, num_records=6)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_chain_forward_with_factored_bodies_equals_dense_bodies():
    from hypic.ops.linear.gated_delta import gated_delta_chain_forward

    lengths = [4, 9, 6]
    q = torch.nn.functional.normalize(torch.randn(19, H, K, dtype=torch.float64), dim=-1)
    k, v, g, beta, cu = inputs(lengths, seed=2)
    bodies_in = inputs([5, 13], seed=4)
    dense = gated_delta_summarize(*bodies_in[:4], cu_seqlens=bodies_in[4])
    factored = gated_delta_low_rank_summarize(*bodies_in[:4], cu_seqlens=bodies_in[4])
    source, cu_chains = torch.tensor([0, -1, 1, -2, 2]), torch.tensor([0, 5])
    want = gated_delta_chain_forward(q, k, v, g, beta, cu_seqlens=cu, cu_chains=cu_chains, source=source, bodies=dense)
    got = gated_delta_chain_forward(q, k, v, g, beta, cu_seqlens=cu, cu_chains=cu_chains, source=source,
                                    bodies=list(factored))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("lengths", [[0, 3, 70, 9, 16, 33, 1], [5], [64, 64], [8, 8, 200]])
def test_length_grouped_chunks_equal_one_chunk_length(lengths):
    k, v, g, beta, cu = inputs(lengths, seed=7)
    q = torch.nn.functional.normalize(torch.randn_like(k), dim=-1)
    kx = k.repeat_interleave(HV // H, dim=1)
    qx = q.repeat_interleave(HV // H, dim=1)
    bounds = cu.tolist()
    init = torch.randn(len(lengths), HV, K, V, dtype=torch.float64)
    for kw in (dict(), dict(with_transition=True), dict(with_zero_start=True, with_transition=True)):
        want = _chunked.chunked_recurrence(qx, kx, v, g, beta, bounds, init, 0.3, chunk_size=64, **kw)
        got = _chunked.chunked_recurrence(qx, kx, v, g, beta, bounds, init, 0.3, **kw)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-11)
    assert [_chunked.chunk_size_for(n) for n in (0, 1, 8, 9, 32, 33, 500)] == [8, 8, 8, 16, 32, 64, 64]
    o, final = gated_delta_forward(q, k, v, g, beta, cu_seqlens=cu, initial_state=init)
    assert o.shape == v.shape and final.shape == init.shape
