"""The fused routing, bucketing and mixing of the row-block MoE path (hypic.ops.moe_route) against
the ops they replace: ``route_topk_softmax``, ``sort_rows_by_expert`` (+ the inverse permutation)
and ``combine_slots``, and the whole routed layer against the per-expert reference.

CPU: ``moe_routed``'s checks and its fallback (the separate ops); the kernels through
``TRITON_INTERPRET=1`` in a subprocess (fp16/fp32 operands: the interpreter's bf16 dot is not
faithful). CUDA: bf16 at the 35B-A3B expert shapes.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from hypic.ops import moe_route
from hypic.ops.moe import moe_experts, moe_routed, route_topk_softmax
from tests.interpreter import interpreted_error


def test_route_env_is_validated(monkeypatch):
    monkeypatch.setenv(moe_route.ROUTE_ENV, "sorted")
    with pytest.raises(ValueError, match=moe_route.ROUTE_ENV):
        moe_route.route_impl()
    monkeypatch.delenv(moe_route.ROUTE_ENV)
    assert moe_route.route_impl() == "fused"


def test_moe_routed_checks_its_operands():
    x = torch.randn(4, 16)
    gate_up = torch.randn(3, 16, 16)
    down = torch.randn(3, 16, 8)
    with pytest.raises(ValueError, match="router_logits must be"):
        moe_routed(x, torch.randn(4, 5), gate_up, down, 2, True)
    with pytest.raises(ValueError, match="router_logits must be"):
        moe_routed(x, torch.randn(3, 3), gate_up, down, 2, True)
    with pytest.raises(ValueError, match="rank-2"):
        moe_routed(x, torch.randn(4, 3, 1), gate_up, down, 2, True)
    with pytest.raises(ValueError, match="down must be"):
        moe_routed(x, torch.randn(4, 3), gate_up, torch.randn(3, 16, 4), 2, True)
    with pytest.raises(ValueError, match="impl must be"):
        moe_routed(x, torch.randn(4, 3), gate_up, down, 2, True, impl="fast")
    with pytest.raises(ValueError, match="top_k"):
        moe_routed(x, torch.randn(4, 3), gate_up, down, 4, True)


@pytest.mark.parametrize("renormalize", [True, False])
def test_moe_routed_on_cpu_is_the_separate_ops(monkeypatch, renormalize):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, 16, generator=gen)
    gate_up = torch.randn(5, 24, 16, generator=gen)
    down = torch.randn(5, 16, 12, generator=gen)
    logits = torch.randn(9, 5, generator=gen)
    weights, ids = route_topk_softmax(logits, 2, renormalize)
    expected = moe_experts(x, gate_up, down, weights.to(x.dtype), ids, impl="reference")
    assert torch.equal(moe_routed(x, logits, gate_up, down, 2, renormalize), expected)


CASE = textwrap.dedent("""
    import torch
    from hypic.ops import moe_route
    from hypic.ops.moe import moe_experts, moe_routed, route_topk_softmax
    from hypic.ops.moe_grouped import combine_slots, sort_rows_by_expert

    def case(dtype, device, tokens, experts, top_k, hidden, inter, used=None, renormalize=True, seed=0):
        gen = torch.Generator().manual_seed(seed)
        # distinct logits in every row, exact in bf16 (k / 16 - 8 for a permutation k of 0..E-1):
        # the top-k has no ties, whose order torch.topk leaves open
        logits = torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)]).float() / 16 - 8
        if used is not None:  # experts outside `used` get no rows (empty experts in the bucketing)
            banned = torch.ones(experts, dtype=torch.bool)
            banned[list(used)] = False
            logits[:, banned] -= 30.0
        logits_d = logits.to(device=device, dtype=dtype)
        ref_w, ref_ids = route_topk_softmax(logits_d.float(), top_k, renormalize)
        # routing: same experts in the same order, weights to fp32 rounding
        w, ids = moe_route.route_topk(logits_d, top_k, renormalize)
        assert ids.dtype == torch.int32 and w.dtype == torch.float32
        assert torch.equal(ids.long(), ref_ids), (ids, ref_ids)
        err_w = float((w - ref_w).abs().max())
        assert err_w < 1e-6, err_w
        # bucketing: exactly the stable sort by expert, its ends and inverse permutation
        order, ref_ends = sort_rows_by_expert(ref_ids, experts)
        ends, row_token, inverse = moe_route.bucket_rows(ids, experts)
        assert torch.equal(ends, ref_ends) and torch.equal(row_token, order // top_k)
        ref_inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=device))
        assert torch.equal(inverse, ref_inverse)
        # mixing: the combine of the same rows, into a NaN-poisoned output
        rows = torch.randn(tokens * top_k, hidden, generator=gen).to(device=device, dtype=dtype)
        out = torch.full((tokens, hidden), float("nan"), device=device, dtype=dtype)
        moe_route.mix_rows(rows, inverse, w, out)
        ref_mix = combine_slots(rows.double(), inverse, w.to(dtype).double())
        err_mix = float((out.double() - ref_mix).norm() / ref_mix.norm())
        assert not torch.isnan(out).any() and err_mix < 2e-3, err_mix
        # the whole layer against the reference on the rounded operands, in float64
        x = torch.randn(tokens, hidden, generator=gen).to(device=device, dtype=dtype)
        gate_up = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5).to(device=device, dtype=dtype)
        down = (torch.randn(experts, hidden, inter, generator=gen) / inter ** 0.5).to(device=device, dtype=dtype)
        ref = moe_experts(x.double(), gate_up.double(), down.double(), ref_w.to(dtype).double(), ref_ids,
                          impl="reference")
        got = moe_routed(x, logits_d, gate_up, down, top_k, renormalize, impl="rows")
        assert got.dtype == dtype and got.shape == ref.shape and not torch.isnan(got).any()
        return max(err_w, err_mix, float((got.double() - ref).norm() / ref.norm()))
""")


def test_fused_routing_interpreted():
    script = CASE + textwrap.dedent("""
        worst = 0.0
        # experts and top-k not powers of two, tokens not a multiple of the routing block
        worst = max(worst, case(torch.float16, "cpu", 37, 12, 3, 48, 24, seed=1))
        # empty experts at both ends and inside; no renormalisation
        worst = max(worst, case(torch.float16, "cpu", 21, 10, 2, 40, 20, used=[1, 2, 5, 7], renormalize=False,
                                seed=2))
        # the 35B-A3B routing shape (256 experts, top-8) with more rows than one bucketing block
        worst = max(worst, case(torch.float16, "cpu", 150, 256, 8, 32, 16, seed=3))
        # one token, top-1
        worst = max(worst, case(torch.float16, "cpu", 1, 4, 1, 16, 16, seed=4))
        print(worst)
    """)
    assert interpreted_error(script) < 2e-3


def test_no_tokens_interpreted():
    script = textwrap.dedent("""
        import torch
        from hypic.ops.moe import moe_routed
        x = torch.zeros(0, 16, dtype=torch.float16)
        out = moe_routed(x, torch.zeros(0, 4), torch.zeros(4, 32, 16, dtype=torch.float16),
                         torch.zeros(4, 16, 16, dtype=torch.float16), 2, True, impl="rows")
        assert out.shape == (0, 16)
        print(0.0)
    """)
    assert interpreted_error(script) == 0.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only")
@pytest.mark.parametrize("tokens", [1, 192, 576, 1024])
def test_fused_routing_cuda_bf16(tokens):
    namespace = {}
    exec(CASE, namespace)
    # 35B-A3B routing and expert shapes (256 experts, top-8, H 2048, I 512)
    err = namespace["case"](torch.bfloat16, "cuda", tokens, 256, 8, 2048, 512, seed=tokens)
    assert err < 1e-2, err
