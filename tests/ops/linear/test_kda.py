"""Tests for hypic/ops/linear/kda.py (KDA: per-channel gate, transition (I - b k k^T) Diag(a))."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.ops.linear.kda import kda_decode, kda_forward, kda_summarize
from hypic.ops.linear.summary import DenseSummary
from tests.ops.linear import family_cases as fc

pytestmark = pytest.mark.usefixtures("single_thread_torch")

FAMILY = fc.KDA
DTYPES = st.sampled_from([torch.float64, torch.float32])


@settings(max_examples=20, deadline=None)
@given(lengths=fc.SEGMENTATIONS, seed=st.integers(0, 2**16), dtype=DTYPES)
def test_composed_summaries_equal_straight_run(lengths, seed, dtype):
    fc.check_composition(FAMILY, lengths, seed, dtype)


@settings(max_examples=4, deadline=None)
@given(lengths=st.lists(st.integers(0, 140), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_forward_matches_naive_recurrence(lengths, seed):
    fc.check_matches_naive(FAMILY, lengths, seed)


def test_strong_per_channel_decay_stays_finite_and_exact():
    # Cumulative log decays far below -88 inside one chunk would overflow exp(-b) in a naive
    # factorisation; the sub-chunk scheme only ever exponentiates non-positive differences.
    tok, _ = FAMILY.make(130, 4, torch.float64)
    tok["g"] = tok["g"] * 200.0
    h0 = fc.random_state(FAMILY, 1, 4, torch.float64)
    out, final = FAMILY.forward(tok, {}, fc.cu([130]), h0)
    out_ref, final_ref = FAMILY.naive(tok, {}, fc.cu([130]), h0)
    assert torch.isfinite(out).all()
    assert fc.rel_err(out, out_ref) < 1e-12 and fc.rel_err(final, final_ref) < 1e-12


@pytest.mark.parametrize("with_initial", [False, True])
def test_forward_and_summarize_equals_separate_calls(with_initial):
    fc.check_forward_and_summarize(FAMILY, [70, 0, 3, 130], seed=11, with_initial=with_initial)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decode_matches_forward(dtype):
    fc.check_decode(FAMILY, num_seqs=2, steps=6, seed=6, dtype=dtype)


def test_naive_addition_is_wrong():
    assert fc.naive_addition_error(FAMILY, seed=0) > 0.1


def test_summary_is_dense():
    tok, _ = FAMILY.make(20, 0, torch.float32)
    s = kda_summarize(tok["k"], tok["v"], tok["g"], tok["beta"], cu_seqlens=fc.cu([5, 0, 15]))
    assert isinstance(s, DenseSummary) and s.num_spans == 3
    # The empty span is the identity.
    assert torch.equal(s.transition[1], torch.eye(fc.K).expand(fc.HV, fc.K, fc.K))
    assert torch.count_nonzero(s.state[1]) == 0


def test_bad_arguments_raise_value_error():
    tok, _ = FAMILY.make(10, 1, torch.float32)
    q, k, v, g, beta = tok["q"], tok["k"], tok["v"], tok["g"], tok["beta"]
    cu = fc.cu([10])
    bad_calls = [
        lambda: kda_forward(q, k, v, g[..., 0], beta, cu_seqlens=cu),  # scalar gate
        lambda: kda_forward(q, k, v, g[..., :3], beta, cu_seqlens=cu),
        lambda: kda_forward(q, k, v, g.half(), beta, cu_seqlens=cu),
        lambda: kda_forward(q, k, v, g, None, cu_seqlens=cu),
        lambda: kda_forward(q[..., :4], k[..., :4], v, g, beta, cu_seqlens=cu),
        lambda: kda_decode(q[:2], k[:2], v[:2], g[:2], beta[:1], torch.zeros(2, fc.HV, fc.K, fc.V)),
        lambda: kda_summarize(k, v, g, beta, cu_seqlens=cu[None]),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()
