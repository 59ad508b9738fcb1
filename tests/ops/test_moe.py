import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.ops.moe import moe_experts, route_sigmoid_grouped, route_topk_softmax


def _per_token_reference(x, gate_up, down, weights, ids):
    out = torch.zeros_like(x)
    inter = gate_up.shape[1] // 2
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = F.silu(gate_up[e, :inter] @ x[t]) * (gate_up[e, inter:] @ x[t])
            out[t] += weights[t, j] * (down[e] @ h)
    return out


@settings(max_examples=20, deadline=None)
@given(tokens=st.integers(0, 12), experts=st.integers(1, 6), top_k=st.integers(1, 3),
       renorm=st.booleans(), seed=st.integers(0, 1000))
def test_grouped_experts_match_per_token_loop(tokens, experts, top_k, renorm, seed):
    top_k = min(top_k, experts)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, 6, generator=gen, dtype=torch.float64)
    gate_up = torch.randn(experts, 10, 6, generator=gen, dtype=torch.float64)
    down = torch.randn(experts, 6, 5, generator=gen, dtype=torch.float64)
    logits = torch.randn(tokens, experts, generator=gen, dtype=torch.float64)
    weights, ids = route_topk_softmax(logits, top_k, renorm)
    got = moe_experts(x, gate_up, down, weights, ids)
    torch.testing.assert_close(got, _per_token_reference(x, gate_up, down, weights, ids), atol=1e-10, rtol=0)


def test_routing_softmax_topk_and_renormalisation():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [3.0, 0.0, 0.0, 0.0]])
    w, ids = route_topk_softmax(logits, 2, renormalize=False)
    probs = logits.softmax(-1)
    assert ids[0].tolist() == [3, 2] and int(ids[1, 0]) == 0
    torch.testing.assert_close(w[0], probs[0, [3, 2]])
    w2, _ = route_topk_softmax(logits, 2, renormalize=True)
    torch.testing.assert_close(w2.sum(-1), torch.ones(2))
    assert w.dtype == torch.float32


def test_validation():
    x = torch.zeros(3, 4)
    gu, dn = torch.zeros(2, 6, 4), torch.zeros(2, 4, 3)
    w, ids = torch.ones(3, 1), torch.zeros(3, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="down must be"):
        moe_experts(x, gu, torch.zeros(2, 3, 4), w, ids)
    with pytest.raises(ValueError, match=r"lie in \[0, 2\)"):
        moe_experts(x, gu, dn, w, ids + 5)
    with pytest.raises(ValueError, match="topk_weights"):
        moe_experts(x, gu, dn, torch.ones(3, 2), ids)
    with pytest.raises(ValueError, match="top_k"):
        route_topk_softmax(torch.zeros(3, 2), 3, True)


def _grouped_reference(logits, bias, top_k, groups, topk_groups, scaling):
    """Ring-linear's gate written per token: sigmoid scores, groups ranked by the sum of their two
    best biased scores, the best experts of the kept groups, the plain scores renormalised (a
    single expert keeps its score) and scaled."""
    weights, ids = [], []
    experts_per_group = logits.shape[1] // groups
    for row in logits:
        scores = torch.sigmoid(row)
        biased = scores + bias
        group_score = [sorted(biased[g * experts_per_group:(g + 1) * experts_per_group].tolist())[-2:]
                       for g in range(groups)]
        kept = sorted(range(groups), key=lambda g: -sum(group_score[g]))[:topk_groups]
        allowed = [e for e in range(logits.shape[1]) if e // experts_per_group in kept]
        chosen = sorted(allowed, key=lambda e: -float(biased[e]))[:top_k]
        w = scores[chosen]
        weights.append((w / w.sum() if top_k > 1 else w) * scaling)
        ids.append(chosen)
    return torch.stack(weights), torch.tensor(ids)


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(1, 9), seed=st.integers(0, 1000), top_k=st.integers(1, 4))
def test_sigmoid_grouped_routing_matches_the_per_token_gate(tokens, seed, top_k):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, 16, generator=gen, dtype=torch.float64) * 2
    bias = torch.randn(16, generator=gen, dtype=torch.float64) * 0.5
    weights, ids = route_sigmoid_grouped(logits, bias, top_k, num_groups=4, topk_groups=2, scaling=2.5)
    want_w, want_ids = _grouped_reference(logits, bias, top_k, 4, 2, 2.5)
    # the same experts (order may differ between equal scores: compare as sets with their weights)
    for t in range(tokens):
        got = dict(zip(ids[t].tolist(), weights[t].tolist()))
        want = dict(zip(want_ids[t].tolist(), want_w[t].tolist()))
        assert got.keys() == want.keys()
        for e in got:
            assert abs(got[e] - want[e]) < 1e-12
    # the bias picks experts but does not weigh them: a huge bias on expert 0 selects it with its
    # own sigmoid score
    big = torch.zeros(16, dtype=torch.float64)
    big[0] = 100.0
    w, i = route_sigmoid_grouped(logits[:1], big, 1, num_groups=4, topk_groups=2, renormalize=False)
    assert int(i[0, 0]) == 0 and abs(float(w[0, 0]) - float(torch.sigmoid(logits[0, 0]))) < 1e-12


def test_sigmoid_grouped_routing_validation():
    logits = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="num_groups"):
        route_sigmoid_grouped(logits, None, 2, num_groups=3, topk_groups=1)
    with pytest.raises(ValueError, match="two best experts"):
        route_sigmoid_grouped(logits, None, 1, num_groups=8, topk_groups=1)
    with pytest.raises(ValueError, match="top_k must be in"):
        route_sigmoid_grouped(logits, None, 5, num_groups=4, topk_groups=2)
    with pytest.raises(ValueError, match="expert_bias"):
        route_sigmoid_grouped(logits, torch.zeros(7), 2)
    w, ids = route_sigmoid_grouped(logits.float(), None, 2)
    assert w.dtype == torch.float32 and ids.dtype == torch.int64
