import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.ops.moe import moe_experts, route_topk_softmax


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
