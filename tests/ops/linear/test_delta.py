"""Tests for hypic/ops/linear/delta.py (DeltaNet)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.ops.linear.delta import delta_decode, delta_forward, delta_summarize
from hypic.ops.linear.summary import DenseSummary
from tests.ops.linear import family_cases as fc

pytestmark = pytest.mark.usefixtures("single_thread_torch")

FAMILY = fc.DELTA
DTYPES = st.sampled_from([torch.float64, torch.float32])


@settings(max_examples=20, deadline=None)
@given(lengths=fc.SEGMENTATIONS, seed=st.integers(0, 2**16), dtype=DTYPES)
def test_composed_summaries_equal_straight_run(lengths, seed, dtype):
    fc.check_composition(FAMILY, lengths, seed, dtype)


@settings(max_examples=4, deadline=None)
@given(lengths=st.lists(st.integers(0, 140), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_forward_matches_naive_recurrence(lengths, seed):
    fc.check_matches_naive(FAMILY, lengths, seed)


@pytest.mark.parametrize("with_initial", [False, True])
def test_forward_and_summarize_equals_separate_calls(with_initial):
    fc.check_forward_and_summarize(FAMILY, [70, 0, 3, 130], seed=11, with_initial=with_initial)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decode_matches_forward(dtype):
    fc.check_decode(FAMILY, num_seqs=2, steps=6, seed=5, dtype=dtype)


def test_naive_addition_is_wrong():
    assert fc.naive_addition_error(FAMILY, seed=0) > 0.1


def test_transition_matches_explicit_product():
    tok, _ = FAMILY.make(37, 2, torch.float64)
    s = delta_summarize(tok["k"], tok["v"], tok["beta"], cu_seqlens=fc.cu([37]))
    assert isinstance(s, DenseSummary)
    k = fc.expand_heads(tok["k"], fc.HV)
    want = torch.eye(fc.K, dtype=torch.float64).repeat(fc.HV, 1, 1)
    for t in range(37):
        kt = k[t]  # [HV, K]
        step = torch.eye(fc.K, dtype=torch.float64) - tok["beta"][t][:, None, None] * kt[:, :, None] * kt[:, None, :]
        want = step @ want
    assert fc.rel_err(s.transition[0], want) < 1e-12


def test_bad_arguments_raise_value_error():
    tok, _ = FAMILY.make(10, 1, torch.float32)
    q, k, v, beta = tok["q"], tok["k"], tok["v"], tok["beta"]
    cu = fc.cu([10])
    bad_calls = [
        lambda: delta_forward(q, k, v, beta[:, :2], cu_seqlens=cu),
        lambda: delta_forward(q, k, v, beta[..., None], cu_seqlens=cu),
        lambda: delta_forward(q, k, v[:, :3], beta[:, :3], cu_seqlens=cu),
        lambda: delta_forward(q, k, v, beta, cu_seqlens=torch.tensor([0, 9])),
        lambda: delta_decode(q[:1], k[:1], v[:1], beta[:1], torch.zeros(1, fc.HV, fc.V, fc.K)),
        lambda: delta_summarize(k, v[:9], beta, cu_seqlens=cu),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()
