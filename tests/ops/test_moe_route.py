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

from hypic import envs
from hypic.ops import moe_route
from hypic.ops.moe import moe_experts, moe_routed, route_topk_softmax
from tests.interpreter import interpreted_error


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


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 192, 576, 1024])
def test_fused_routing_cuda_bf16(tokens):
    namespace = {}
    exec(CASE, namespace)
    # 35B-A3B routing and expert shapes (256 experts, top-8, H 2048, I 512)
    err = namespace["case"](torch.bfloat16, "cuda", tokens, 256, 8, 2048, 512, seed=tokens)
    assert err < 1e-2, err


def test_stride_align():
    assert [moe_route._stride_align(s) for s in (0, 1, 37, 40, 1288, 256, 4096)] == [1, 1, 1, 8, 8, 16, 16]



def compile_sm90(fn, types: dict, constexprs: dict, num_warps: int, aligned: set):
    """``fn`` compiled for sm_90 without a GPU, as the JIT would specialise it: the ``aligned``
    arguments marked multiples of 16 (the JIT marks every pointer and int that is)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {a: "constexpr" if a in constexprs else types[a] for a in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if a in aligned}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))


def _sm90_compiles():
    pytest.importorskip("triton")
    if envs.triton_interpret():
        pytest.skip("compiles for sm_90: needs Triton's JIT, not the interpreter")
    from hypic.ops import _moe_route_kernel

    return _moe_route_kernel


@pytest.mark.parametrize("stride", [256, 1288])
def test_route_kernel_compiles_for_sm90_vectorised_within_a_warp(stride):
    """The default routing launch at the 35B-A3B shape, on contiguous logits (stride 256) and on
    the router's columns of the MoE block's fused GEMM output (stride 1,288, which the JIT does
    not mark: not a multiple of 16): 16-byte loads, the rounds' integer reductions as
    ``redux.sync``, and no reduction through shared memory (one barrier at most, the store's)."""
    kernels = _sm90_compiles()
    types = dict(logits="*bf16", weights="*fp32", ids="*i32", num_tokens="i32", stride_logits="i32")
    constexprs = dict(E=256, EP=256, K=8, KP=8, BT=moe_route.ROUTE_BLOCK_TOKENS, RENORM=True,
                      STRIDE_ALIGN=moe_route._stride_align(stride))
    aligned = {"logits", "weights", "ids"} | ({"stride_logits"} if stride % 16 == 0 else set())
    ptx = compile_sm90(kernels.route_topk_kernel, types, constexprs, moe_route.ROUTE_NUM_WARPS, aligned).asm["ptx"]
    assert "ld.global.v4.b32" in ptx and "redux.sync.max" in ptx and "redux.sync.min" in ptx
    assert ptx.count("bar.sync") <= 1, ptx.count("bar.sync")


@pytest.mark.parametrize("single_tile", [True, False])
def test_bucket_kernel_compiles_for_sm90(single_tile):
    kernels = _sm90_compiles()
    types = dict(ids="*i32", ends="*i64", row_token="*i64", inverse="*i64", num_tokens="i32")
    constexprs = dict(K=8, KP=8, BT=moe_route.BUCKET_BLOCK_TOKENS, SINGLE_TILE=single_tile)
    ptx = compile_sm90(kernels.bucket_rows_kernel, types, constexprs, moe_route.BUCKET_NUM_WARPS,
                       {"ids", "ends", "row_token", "inverse"}).asm["ptx"]
    assert "st.global" in ptx

EDGE_CASE = textwrap.dedent("""
    import torch
    from hypic.ops import moe_route
    from hypic.ops.moe_grouped import sort_rows_by_expert

    class PoisonedTorch:
        # torch for moe_route, but every torch.empty poisoned (NaN, or -7 for integers): an
        # output element a launch leaves unwritten fails the comparisons
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def empty(*args, **kwargs):
            out = torch.empty(*args, **kwargs)
            return out.fill_(float("nan") if out.is_floating_point() else -7)

    moe_route.torch = PoisonedTorch()

    def reference_route(logits, top_k, renormalize):
        # the stable sort of the fp32 softmax, largest first: of equal probabilities the lowest
        # expert first (the kernel's rule for ties, which torch.topk leaves open)
        probs = torch.softmax(logits.float(), dim=-1)
        weights, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
        weights, ids = weights[:, :top_k], ids[:, :top_k]
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids

    def check_route(logits, top_k, renormalize):
        ref_w, ref_ids = reference_route(logits, top_k, renormalize)
        w, ids = moe_route.route_topk(logits, top_k, renormalize)
        assert ids.dtype == torch.int32 and w.dtype == torch.float32
        assert torch.equal(ids.long(), ref_ids), (ids, ref_ids)
        err = float((w - ref_w).abs().max()) if w.numel() else 0.0
        assert err < 1e-6, err
        return ids, err

    def check_bucket(ids, num_experts):
        top_k = ids.shape[1]
        order, ref_ends = sort_rows_by_expert(ids.long(), num_experts)
        ref_inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
        ends, row_token, inverse = moe_route.bucket_rows(ids, num_experts)
        assert torch.equal(ends, ref_ends), (ends, ref_ends)
        assert torch.equal(row_token, order // top_k)
        assert torch.equal(inverse, ref_inverse)

    def distinct_logits(tokens, experts, gen):
        return torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)]).float() / 16 - 8

    def distinct_ids(tokens, experts, top_k, gen):
        return torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).int()
""")


def test_route_edge_cases_interpreted():
    script = EDGE_CASE + textwrap.dedent("""
        gen = torch.Generator().manual_seed(5)
        worst = 0.0
        # one token; top-1
        worst = max(worst, check_route(distinct_logits(1, 12, gen), 3, True)[1])
        worst = max(worst, check_route(distinct_logits(5, 7, gen), 1, True)[1])
        # ties: lowest expert first among equal probabilities (all equal; two equal pairs; a
        # top-k boundary inside a run of equal ones), fp32 and bf16 logits
        ties = torch.zeros(6, 10)
        ties[1] = torch.tensor([0., 2., 1., 2., 0., 1., 1., 3., 3., 0.])
        ties[2, 4:] = 1.0
        ties[3] = -torch.arange(10.0) % 3
        ties[4] = torch.tensor([5., 5., 5., 5., 5., 5., 5., 5., 5., 4.])
        ties[5] = torch.tensor([-1e4, -1e4, 0., -1e4, 0., 0., -1e4, 0., 0., -1e4])
        for dtype in (torch.float32, torch.bfloat16):
            for top_k in (1, 4, 10):
                worst = max(worst, check_route(ties.to(dtype), top_k, True)[1])
        # logits as a column block of a wider output (the MoE block's fused GEMM): row strides
        # 40 (a multiple of 8, not 16: the stride hint) and 37 (odd), and a transposed view
        # (copied to unit column stride first)
        wide = distinct_logits(19, 40, gen).half()
        worst = max(worst, check_route(wide[:, 16:28], 3, True)[1])
        odd = distinct_logits(19, 37, gen)
        worst = max(worst, check_route(odd[:, 5:17], 3, False)[1])
        worst = max(worst, check_route(distinct_logits(12, 19, gen).t(), 3, True)[1])
        # NaN logits: still K distinct experts in range (bucket_rows relies on it)
        nan = distinct_logits(4, 12, gen)
        nan[0, 3] = float("nan")
        nan[1] = float("nan")
        nan[2, 0] = float("inf")
        _, ids = moe_route.route_topk(nan, 5, True)
        assert ((ids >= 0) & (ids < 12)).all() and all(len(set(r)) == 5 for r in ids.tolist()), ids
        print(worst)
    """)
    assert interpreted_error(script) < 1e-6


def test_bucket_edge_cases_interpreted():
    script = EDGE_CASE + textwrap.dedent("""
        gen = torch.Generator().manual_seed(6)
        # only experts 0, 5, 6 and 11 get rows
        banned = torch.stack([torch.tensor([0, 5, 6, 11])[torch.randperm(4, generator=gen)[:3]] for _ in range(37)])
        check_bucket(banned.int(), 12)
        # one token; top-k = E (every expert once a token)
        check_bucket(distinct_ids(1, 12, 3, gen), 12)
        check_bucket(distinct_ids(9, 6, 6, gen), 6)
        # every token on the same experts (the ties of equal logits): the other experts empty
        check_bucket(torch.arange(8, dtype=torch.int32).repeat(50, 1), 16)
        # more tokens than one tile: the tiled loop, with a partial last tile
        check_bucket(distinct_ids(moe_route.BUCKET_BLOCK_TOKENS + 77, 5, 2, gen), 5)
        # routed ids straight from route_topk (ties included)
        logits = torch.zeros(30, 12)
        logits[::3, 5:] = 2.0
        ids, _ = check_route(logits, 4, True)
        check_bucket(ids, 12)
        # no tokens
        ends, row_token, inverse = moe_route.bucket_rows(torch.zeros(0, 4, dtype=torch.int32), 6)
        assert torch.equal(ends, torch.zeros(6, dtype=torch.int64)) and row_token.numel() == inverse.numel() == 0
        print(0.0)
    """)
    assert interpreted_error(script) == 0.0


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 192, 576, 1024, 1500])
def test_route_and_bucket_on_the_models_layout_cuda(tokens):
    namespace = {}
    exec(EDGE_CASE, namespace)
    gen = torch.Generator().manual_seed(tokens)
    logits = namespace["distinct_logits"](tokens, 256, gen).cuda()
    # the model's layout: the router's columns of the MoE block's fused GEMM output (stride 1,288)
    fused = torch.zeros(tokens, 1288, device="cuda", dtype=torch.bfloat16)
    fused[:, 1024:1280] = logits.bfloat16()
    for view in (logits.bfloat16(), fused[:, 1024:1280], logits):
        ids, _ = namespace["check_route"](view, 8, True)
        namespace["check_bucket"](ids, 256)
