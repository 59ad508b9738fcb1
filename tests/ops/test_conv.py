"""Tests for hypic/ops/conv.py (short causal depthwise conv with explicit state)."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.ops import conv
from hypic.ops.conv import causal_conv1d, causal_conv1d_update

pytestmark = pytest.mark.usefixtures("single_thread_torch")

D, W = 5, 4


def cu(lengths):
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.long)


def make(num_tokens, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, D, generator=gen, dtype=dtype)
    weight = torch.randn(D, W, generator=gen, dtype=dtype)
    bias = torch.randn(D, generator=gen, dtype=dtype)
    return x, weight, bias


def reference(x, weight, bias, state, activation):
    """One sequence with torch's grouped conv1d over (state ++ x)."""
    seq = torch.cat([state, x.transpose(0, 1)], dim=1)[None]  # [1, D, W-1+L]
    y = F.conv1d(seq, weight[:, None, :], bias, groups=D)[0].transpose(0, 1)
    return F.silu(y) if activation == "silu" else y


def true_tail(x, end):
    """Last W-1 inputs before token ``end`` (zeros before the start), as a state [D, W-1]."""
    padded = torch.cat([x.new_zeros(W - 1, D), x[:end]], dim=0)
    return padded[-(W - 1) :].transpose(0, 1)


@pytest.mark.parametrize("activation", ["silu", None])
def test_varlen_matches_conv1d_reference(activation):
    lengths = [7, 1, 0, 2, 40]
    x, weight, bias = make(sum(lengths), 0)
    state = torch.randn(len(lengths), D, W - 1, dtype=torch.float64)
    y, final = causal_conv1d(x, weight, bias, cu_seqlens=cu(lengths), initial_state=state, activation=activation)
    bounds = cu(lengths).tolist()
    for n in range(len(lengths)):
        xs = x[bounds[n] : bounds[n + 1]]
        if xs.shape[0] > 0:
            want = reference(xs, weight, bias, state[n], activation)
            assert torch.allclose(y[bounds[n] : bounds[n + 1]], want, rtol=1e-12, atol=1e-12)
        tail = torch.cat([state[n], xs.transpose(0, 1)], dim=1)[:, -(W - 1) :]
        assert torch.equal(final[n], tail)


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=8), seed=st.integers(0, 1000))
def test_segment_from_true_tail_equals_straight_run(lengths, seed):
    total = sum(lengths)
    x, weight, bias = make(total, seed)
    y_full, final_full = causal_conv1d(x, weight, bias, cu_seqlens=cu([total]))
    bounds = cu(lengths).tolist()
    # Each segment started from the true tail of what precedes it (conv warm-up) ...
    tails = torch.stack([true_tail(x, bounds[n]) for n in range(len(lengths))])
    y_seg, finals = causal_conv1d(x, weight, bias, cu_seqlens=cu(lengths), initial_state=tails)
    assert torch.allclose(y_seg, y_full, rtol=1e-12, atol=1e-12)
    # ... and each segment's stored final state is the next segment's true tail,
    # including segments shorter than W - 1 that carry part of the incoming state.
    for n in range(len(lengths)):
        assert torch.equal(finals[n], true_tail(x, bounds[n + 1]))
    assert torch.equal(finals[-1], final_full[0])


def test_short_span_carries_initial_state():
    state = torch.arange(D * (W - 1), dtype=torch.float32).reshape(1, D, W - 1)
    x = torch.full((1, D), -1.0)
    _, final = causal_conv1d(x, torch.ones(D, W), cu_seqlens=cu([1]), initial_state=state)
    assert torch.equal(final[0, :, : W - 2], state[0, :, 1:])
    assert torch.equal(final[0, :, W - 2], x[0])
    empty_y, empty_final = causal_conv1d(x[:0], torch.ones(D, W), cu_seqlens=cu([0]), initial_state=state)
    assert empty_y.shape == (0, D) and torch.equal(empty_final, state)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_update_steps_match_forward(dtype):
    x, weight, bias = make(12, 3, dtype)
    lengths = [6, 6]
    state0 = torch.randn(2, D, W - 1, dtype=torch.float64).to(dtype)
    y, final = causal_conv1d(x, weight, bias, cu_seqlens=cu(lengths), initial_state=state0)
    state = state0
    for t in range(6):
        y_t, state = causal_conv1d_update(x[[t, 6 + t]], state, weight, bias)
        tol = 1e-12 if dtype == torch.float64 else 1e-2
        assert torch.allclose(y_t.double(), y[[t, 6 + t]].double(), rtol=tol, atol=tol)
        assert y_t.dtype == dtype
    assert torch.equal(state, final)


def test_bad_arguments_raise_value_error():
    x, weight, bias = make(6, 0, torch.float32)
    state = torch.zeros(1, D, W - 1)
    c = cu([6])
    bad_calls = [
        lambda: causal_conv1d(x[None], weight, cu_seqlens=c),
        lambda: causal_conv1d(x, weight[:3], cu_seqlens=c),
        lambda: causal_conv1d(x, weight[:, :, None], cu_seqlens=c),
        lambda: causal_conv1d(x, weight, bias[:2], cu_seqlens=c),
        lambda: causal_conv1d(x, weight, cu_seqlens=c, initial_state=state.double()),
        lambda: causal_conv1d(x, weight, cu_seqlens=c, initial_state=state[..., :2]),
        lambda: causal_conv1d(x, weight, cu_seqlens=cu([2, 2]), initial_state=state),
        lambda: causal_conv1d(x, weight, cu_seqlens=cu([5])),
        lambda: causal_conv1d(x, weight, cu_seqlens=c, activation="relu"),
        lambda: causal_conv1d(x.long(), weight, cu_seqlens=c),
        lambda: causal_conv1d_update(x[:1], state[:, :3], weight),
        lambda: causal_conv1d_update(x[:2], state, weight),
        lambda: causal_conv1d_update(x[:1], state.half(), weight),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()


def test_gather_rows_of_cat_equals_cat_then_index(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    x, extra = torch.randn(7, 5, generator=gen), torch.randn(4, 5, generator=gen)
    index = torch.tensor([0, 10, 6, 7, 3, 8, 8, 1])
    assert torch.equal(conv.gather_rows_of_cat(x, extra, index), torch.cat([x, extra]).index_select(0, index))
    # a large x (past SMALL_CAT_BYTES): the two gathers instead of the concatenation
    monkeypatch.setattr(conv, "SMALL_CAT_BYTES", 0)
    assert torch.equal(conv.gather_rows_of_cat(x, extra, index), torch.cat([x, extra]).index_select(0, index))
    # an empty source on either side
    assert torch.equal(conv.gather_rows_of_cat(x[:0], extra, index[:3] % 4), extra.index_select(0, index[:3] % 4))
    assert torch.equal(conv.gather_rows_of_cat(x, extra[:0], index % 7), x.index_select(0, index % 7))


@pytest.mark.parametrize("with_init", [False, True])
def test_conv_final_state_matches_the_forward(with_init):
    """The final-state helper the GPU path uses equals the reference forward's final state,
    spans shorter than W-1 (which keep part of the incoming state) included."""
    gen = torch.Generator().manual_seed(1)
    lengths = [1, 0, 9, 2, 5]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
    x = torch.randn(sum(lengths), 6, generator=gen)
    weight = torch.randn(6, 4, generator=gen)
    init = torch.randn(len(lengths), 6, 3, generator=gen) if with_init else None
    _, final = conv.causal_conv1d(x, weight, None, cu_seqlens=cu, initial_state=init)
    assert torch.equal(conv.conv_final_state(x, init, cu, 3), final)
    y, none = conv.causal_conv1d(x, weight, None, cu_seqlens=cu, initial_state=init, output_final_state=False)
    assert none is None and torch.equal(y, conv.causal_conv1d(x, weight, None, cu_seqlens=cu, initial_state=init)[0])


def test_cu_seqlens_cpu_is_checked_on_the_host():
    x, weight = torch.randn(5, 4), torch.randn(4, 4)
    cu = torch.tensor([0, 2, 5])
    y, _ = conv.causal_conv1d(x, weight, cu_seqlens=cu, cu_seqlens_cpu=cu.clone())
    assert torch.equal(y, conv.causal_conv1d(x, weight, cu_seqlens=cu)[0])
    with pytest.raises(ValueError, match="cu_seqlens_cpu must be int64"):
        conv.causal_conv1d(x, weight, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="cu_seqlens_cpu must end"):
        conv.causal_conv1d(x, weight, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor([0, 2, 4]))
    with pytest.raises(ValueError, match="cu_seqlens_cpu must be a CPU tensor"):
        conv.causal_conv1d(x, weight, cu_seqlens=cu, cu_seqlens_cpu=[0, 2, 5])
