"""Tests for hypic/ops/linear/gated_delta.py (Gated DeltaNet)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.ops.linear.gated_delta import (
    gated_delta_decode,
    gated_delta_forward,
    gated_delta_summarize,
    gated_delta_summarize_then_forward,
)
from hypic.ops.linear.summary import DenseSummary
from tests.ops.linear import family_cases as fc

pytestmark = pytest.mark.usefixtures("single_thread_torch")

FAMILY = fc.GATED_DELTA
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
    fc.check_decode(FAMILY, num_seqs=3, steps=7, seed=3, dtype=dtype)


def test_naive_addition_is_wrong():
    assert fc.naive_addition_error(FAMILY, seed=0) > 0.1


def test_summary_is_dense_fp32_with_exact_nbytes():
    tok, _ = FAMILY.make(50, 0, torch.bfloat16)
    s = gated_delta_summarize(tok["k"], tok["v"], tok["g"], tok["beta"], cu_seqlens=fc.cu([20, 30]))
    assert isinstance(s, DenseSummary)
    assert s.transition.shape == (2, fc.HV, fc.K, fc.K) and s.state.shape == (2, fc.HV, fc.K, fc.V)
    assert s.state.dtype == torch.float32
    assert s.nbytes == 4 * 2 * fc.HV * fc.K * (fc.K + fc.V)
    o, final = gated_delta_forward(tok["q"], tok["k"], tok["v"], tok["g"], tok["beta"], cu_seqlens=fc.cu([50]))
    assert o.dtype == torch.bfloat16 and final.dtype == torch.float32


def test_summarize_then_forward_equals_separate_calls():
    """The initial states may depend on the summaries (a PIC forward scans them first): the op
    hands its zero-start summaries to the callback and runs the forward from what it returns."""
    tok, _ = FAMILY.make(203, 4, torch.float64)
    cu_seqlens = fc.cu([70, 0, 3, 130])
    mix = torch.randn(fc.HV, fc.K, fc.V, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    seen = []

    def initial_states_from(summary):
        seen.append(summary)
        return summary.state.roll(1, dims=0) * 0.5 + mix  # depends on the summaries

    args = (tok["q"], tok["k"], tok["v"], tok["g"], tok["beta"])
    o, final, summary = gated_delta_summarize_then_forward(*args, cu_seqlens=cu_seqlens,
                                                           initial_states_from=initial_states_from)
    ref_summary = gated_delta_summarize(*args[1:], cu_seqlens=cu_seqlens)
    ref_o, ref_final = gated_delta_forward(*args, cu_seqlens=cu_seqlens,
                                           initial_state=initial_states_from(ref_summary))
    assert len(seen) == 2 and seen[0] is summary
    assert fc.rel_err(summary.state, ref_summary.state) < 1e-12
    assert fc.rel_err(summary.transition, ref_summary.transition) < 1e-12
    assert fc.rel_err(o, ref_o) < 1e-12 and fc.rel_err(final, ref_final) < 1e-12
    with pytest.raises(ValueError, match="initial_states_from must be callable"):
        gated_delta_summarize_then_forward(*args, cu_seqlens=cu_seqlens, initial_states_from=None)
    with pytest.raises(ValueError, match="initial_state"):  # a wrong count of states is rejected
        gated_delta_summarize_then_forward(*args, cu_seqlens=cu_seqlens,
                                           initial_states_from=lambda s: s.state[:2])


def _inputs(num_tokens=10):
    tok, _ = FAMILY.make(num_tokens, 1, torch.float32)
    return tok


def test_bad_arguments_raise_value_error():
    t = _inputs()
    q, k, v, g, beta = t["q"], t["k"], t["v"], t["g"], t["beta"]
    cu = fc.cu([4, 6])
    bad_calls = {
        "q rank": lambda: gated_delta_forward(q[0], k, v, g, beta, cu_seqlens=cu),
        "k shape": lambda: gated_delta_forward(q, k[:, :1], v, g, beta, cu_seqlens=cu),
        "head ratio": lambda: gated_delta_forward(q, k, v[:, :3], g[:, :3], beta[:, :3], cu_seqlens=cu),
        "g shape": lambda: gated_delta_forward(q, k, v, g[:, :2], beta, cu_seqlens=cu),
        "g per channel": lambda: gated_delta_forward(q, k, v, g[..., None].expand(-1, -1, fc.K), beta, cu_seqlens=cu),
        "g dtype": lambda: gated_delta_forward(q, k, v, g.bfloat16(), beta, cu_seqlens=cu),
        "beta missing": lambda: gated_delta_forward(q, k, v, g, None, cu_seqlens=cu),
        "qkv dtypes": lambda: gated_delta_forward(q.double(), k, v, g, beta, cu_seqlens=cu),
        "int values": lambda: gated_delta_forward(q, k, v.long(), g, beta, cu_seqlens=cu),
        "cu end": lambda: gated_delta_forward(q, k, v, g, beta, cu_seqlens=fc.cu([4, 5])),
        "cu start": lambda: gated_delta_forward(q, k, v, g, beta, cu_seqlens=torch.tensor([1, 4, 10])),
        "cu decreasing": lambda: gated_delta_forward(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 6, 4, 10])),
        "cu float": lambda: gated_delta_forward(q, k, v, g, beta, cu_seqlens=cu.float()),
        "state count": lambda: gated_delta_forward(
            q, k, v, g, beta, cu_seqlens=cu, initial_state=torch.zeros(3, fc.HV, fc.K, fc.V)
        ),
        "state dtype": lambda: gated_delta_forward(
            q, k, v, g, beta, cu_seqlens=cu, initial_state=torch.zeros(2, fc.HV, fc.K, fc.V).bfloat16()
        ),
        "decode state": lambda: gated_delta_decode(q[:2], k[:2], v[:2], g[:2], beta[:2], torch.zeros(2, fc.HV, fc.K)),
        "decode count": lambda: gated_delta_decode(
            q[:2], k[:2], v[:2], g[:2], beta[:2], torch.zeros(3, fc.HV, fc.K, fc.V)
        ),
        "summarize beta": lambda: gated_delta_summarize(k, v, g, beta[:5], cu_seqlens=cu),
        "scale type": lambda: gated_delta_forward(q, k, v, g, beta, cu_seqlens=cu, scale="1"),
    }
    for what, call in bad_calls.items():
        with pytest.raises(ValueError):
            call()
            pytest.fail(f"no ValueError for {what}")
