"""Tests for hypic/ops/linear/mamba2.py (Mamba2 / SSD on the scalar-decay recurrence)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.ops.linear.mamba2 import mamba2_decode, mamba2_forward, mamba2_summarize
from hypic.ops.linear.summary import ScalarSummary
from tests.ops.linear import family_cases as fc

pytestmark = pytest.mark.usefixtures("single_thread_torch")

FAMILY = fc.MAMBA2
DTYPES = st.sampled_from([torch.float64, torch.float32])


@settings(max_examples=20, deadline=None)
@given(lengths=fc.SEGMENTATIONS, seed=st.integers(0, 2**16), dtype=DTYPES)
def test_composed_summaries_equal_straight_run(lengths, seed, dtype):
    fc.check_composition(FAMILY, lengths, seed, dtype)


@settings(max_examples=4, deadline=None)
@given(lengths=st.lists(st.integers(0, 140), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_forward_matches_naive_recurrence(lengths, seed):
    fc.check_matches_naive(FAMILY, lengths, seed)


def test_matches_ssd_definition():
    # Straight from the SSD definition with mamba_ssm's (headdim, dstate) state layout:
    # h_t = exp(dt A) h + dt x B^T ; y = h C + D x.
    tok, const = FAMILY.make(25, 9, torch.float64)
    group = fc.HV // fc.G_GROUPS
    h = torch.zeros(fc.HV, fc.HEADDIM, fc.DSTATE, dtype=torch.float64)
    ys = []
    for t in range(25):
        for head in range(fc.HV):
            b = tok["B"][t, head // group]
            dt, x = tok["dt"][t, head], tok["x"][t, head]
            h[head] = torch.exp(dt * const["A"][head]) * h[head] + dt * x[:, None] * b[None, :]
        ys.append(torch.einsum("hpn,hn->hp", h, tok["C"][t].repeat_interleave(group, 0)) + const["D"][:, None] * tok["x"][t])
    y, final = FAMILY.forward(tok, const, fc.cu([25]), None)
    assert fc.rel_err(y, torch.stack(ys)) < 1e-12
    assert fc.rel_err(final[0], h.transpose(-1, -2)) < 1e-12


@pytest.mark.parametrize("with_initial", [False, True])
def test_forward_and_summarize_equals_separate_calls(with_initial):
    fc.check_forward_and_summarize(FAMILY, [70, 0, 3, 130], seed=11, with_initial=with_initial)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decode_matches_forward(dtype):
    fc.check_decode(FAMILY, num_seqs=2, steps=6, seed=10, dtype=dtype)


def test_naive_addition_is_wrong():
    assert fc.naive_addition_error(FAMILY, seed=0) > 0.1


def test_summary_is_scalar_closed_form():
    tok, const = FAMILY.make(30, 0, torch.float32)
    s = mamba2_summarize(tok["B"], tok["x"], tok["dt"], const["A"], cu_seqlens=fc.cu([12, 18]))
    assert isinstance(s, ScalarSummary)
    assert s.state.shape == (2, fc.HV, fc.DSTATE, fc.HEADDIM)
    assert torch.allclose(s.log_decay[0], const["A"] * tok["dt"][:12].sum(0))


def test_bad_arguments_raise_value_error():
    tok, const = FAMILY.make(10, 1, torch.float32)
    C, B, x, dt, A, D = tok["C"], tok["B"], tok["x"], tok["dt"], const["A"], const["D"]
    cu = fc.cu([10])
    bad_calls = [
        lambda: mamba2_forward(C, B, x, dt[:, :2], A, D, cu_seqlens=cu),
        lambda: mamba2_forward(C, B, x, dt, A[:2], D, cu_seqlens=cu),
        lambda: mamba2_forward(C, B, x, dt, A, D[:1], cu_seqlens=cu),
        lambda: mamba2_forward(C.expand(-1, 3, -1), B.expand(-1, 3, -1), x, dt, A, D, cu_seqlens=cu),
        lambda: mamba2_forward(C[:, :, :4], B, x, dt, A, D, cu_seqlens=cu),
        lambda: mamba2_forward(C, B, x, dt.half(), A, D, cu_seqlens=cu),
        lambda: mamba2_decode(C[:2], B[:2], x[:2], dt[:2], A, torch.zeros(2, fc.HV, fc.HEADDIM, fc.DSTATE), D),
        lambda: mamba2_summarize(B, x, dt, A, cu_seqlens=fc.cu([9])),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()
