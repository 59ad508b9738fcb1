"""Tests for hypic/ops/linear/summary.py (structured affine summaries and their algebra)."""

import pytest
import torch

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
