"""Tests for hypic/ops/linear/simple_gla.py (simple GLA, RetNet, lightning, plain linear attention)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.ops.linear.simple_gla import simple_gla_decode, simple_gla_forward, simple_gla_summarize
from hypic.ops.linear.summary import ScalarSummary
from tests.ops.linear import family_cases as fc

pytestmark = pytest.mark.usefixtures("single_thread_torch")

DTYPES = st.sampled_from([torch.float64, torch.float32])
FAMILIES = [fc.SIMPLE_GLA, fc.RETNET, fc.LINEAR]
FAMILY_IDS = [f.name for f in FAMILIES]


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
@settings(max_examples=10, deadline=None)
@given(lengths=fc.SEGMENTATIONS, seed=st.integers(0, 2**16), dtype=DTYPES)
def test_composed_summaries_equal_straight_run(family, lengths, seed, dtype):
    fc.check_composition(family, lengths, seed, dtype)


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
@settings(max_examples=3, deadline=None)
@given(lengths=st.lists(st.integers(0, 140), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_forward_matches_naive_recurrence(family, lengths, seed):
    fc.check_matches_naive(family, lengths, seed)


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
@pytest.mark.parametrize("with_initial", [False, True])
def test_forward_and_summarize_equals_separate_calls(family, with_initial):
    fc.check_forward_and_summarize(family, [70, 0, 3, 130], seed=11, with_initial=with_initial)


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
def test_decode_matches_forward(family):
    fc.check_decode(family, num_seqs=2, steps=5, seed=8, dtype=torch.float64)


@pytest.mark.parametrize("family", [fc.SIMPLE_GLA, fc.RETNET], ids=["simple_gla", "retnet"])
def test_naive_addition_is_wrong_with_decay(family):
    assert fc.naive_addition_error(family, seed=0) > 0.1


def test_naive_addition_is_right_for_undecayed_linear_attention():
    assert fc.naive_addition_error(fc.LINEAR, seed=0) < 1e-12


def test_summary_is_scalar_per_head():
    tok, const = fc.RETNET.make(40, 0, torch.float32)
    s = simple_gla_summarize(tok["k"], tok["v"], g_gamma=const["g_gamma"], cu_seqlens=fc.cu([10, 30]))
    assert isinstance(s, ScalarSummary)
    assert s.log_decay.shape == (2, fc.HV)
    assert torch.allclose(s.log_decay[1], 30 * const["g_gamma"])
    assert s.nbytes == 4 * 2 * fc.HV * (1 + fc.K * fc.V)


def test_bad_arguments_raise_value_error():
    tok, const = fc.SIMPLE_GLA.make(10, 1, torch.float32)
    q, k, v, g = tok["q"], tok["k"], tok["v"], tok["g"]
    gamma = fc.retnet_gamma(fc.HV, torch.float32)
    cu = fc.cu([10])
    bad_calls = [
        lambda: simple_gla_forward(q, k, v, cu_seqlens=cu),  # neither gate
        lambda: simple_gla_forward(q, k, v, g, g_gamma=gamma, cu_seqlens=cu),  # both
        lambda: simple_gla_forward(q, k, v, g[..., None], cu_seqlens=cu),
        lambda: simple_gla_forward(q, k, v, g_gamma=gamma[:2], cu_seqlens=cu),
        lambda: simple_gla_forward(q, k, v, g_gamma=gamma[None], cu_seqlens=cu),
        lambda: simple_gla_forward(q, k[:, :, :4], v, g, cu_seqlens=cu),
        lambda: simple_gla_decode(q[:2], k[:2], v[:2], g[:1], torch.zeros(2, fc.HV, fc.K, fc.V)),
        lambda: simple_gla_summarize(k, v, g.double().half(), cu_seqlens=cu),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()
