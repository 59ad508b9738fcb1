"""Tests for hypic/ops/linear/gla.py (GLA / HGRN2: diagonal transition)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.ops.linear.gla import gla_decode, gla_forward, gla_summarize
from hypic.ops.linear.summary import DiagonalSummary
from tests.ops.linear import family_cases as fc

pytestmark = pytest.mark.usefixtures("single_thread_torch")

FAMILY = fc.GLA
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
    fc.check_decode(FAMILY, num_seqs=2, steps=6, seed=7, dtype=dtype)


def test_naive_addition_is_wrong():
    assert fc.naive_addition_error(FAMILY, seed=0) > 0.1


def test_summary_is_diagonal_closed_form():
    tok, _ = FAMILY.make(70, 0, torch.float64)
    s = gla_summarize(tok["k"], tok["v"], tok["g"], cu_seqlens=fc.cu([30, 40]))
    assert isinstance(s, DiagonalSummary)
    assert s.log_decay.shape == (2, fc.HV, fc.K)
    assert torch.allclose(s.log_decay[1], tok["g"][30:].sum(0), rtol=0, atol=1e-12)
    assert s.nbytes == 8 * 2 * fc.HV * fc.K * (1 + fc.V)


def test_hgrn2_usage_matches_naive():
    # HGRN2: g = logsigmoid(f), k = 1 - exp(g), run through the GLA recurrence.
    gen = torch.Generator().manual_seed(3)
    f = torch.randn(50, fc.HV, fc.K, generator=gen, dtype=torch.float64) + 3.0
    g = F.logsigmoid(f)
    tok = {
        "q": torch.randn(50, fc.HV, fc.K, generator=gen, dtype=torch.float64),
        "k": (1 - torch.exp(g)),
        "v": torch.randn(50, fc.HV, fc.V, generator=gen, dtype=torch.float64),
        "g": g,
    }
    h0 = torch.zeros(1, fc.HV, fc.K, fc.V, dtype=torch.float64)
    out, final = gla_forward(tok["q"], tok["k"], tok["v"], tok["g"], cu_seqlens=fc.cu([50]), scale=1.0)
    out_ref, final_ref = fc._naive_generic(tok, fc.cu([50]), h0, "g", False, scale=1.0)
    assert fc.rel_err(out, out_ref) < 1e-12 and fc.rel_err(final, final_ref) < 1e-12


def test_bad_arguments_raise_value_error():
    tok, _ = FAMILY.make(10, 1, torch.float32)
    q, k, v, g = tok["q"], tok["k"], tok["v"], tok["g"]
    cu = fc.cu([10])
    bad_calls = [
        lambda: gla_forward(q, k, v, g[..., 0], cu_seqlens=cu),
        lambda: gla_forward(q, k, v, g[:, :2], cu_seqlens=cu),
        lambda: gla_forward(q, k, v, g.bfloat16(), cu_seqlens=cu),
        lambda: gla_forward(q, k, v[:, :3], g[:, :3], cu_seqlens=cu),
        lambda: gla_decode(q[:2], k[:2], v[:2], g[:2], torch.zeros(2, fc.HV, fc.K, fc.V + 1)),
        lambda: gla_summarize(k, v, g[:9], cu_seqlens=cu),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()
