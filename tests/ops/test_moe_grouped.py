"""Grouped-GEMM MoE path (hypic.ops.moe_grouped) against the per-expert reference in hypic.ops.moe."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hypic.ops.moe as moe_module
from hypic.ops.moe import moe_experts, route_topk_softmax
from hypic.ops.moe_grouped import grouped_mm_supported
from tests.ops.test_attention import poison_fresh_buffers

pytestmark = pytest.mark.usefixtures("single_thread_torch")

HIDDEN, INTER = 16, 8  # multiples of 8 elements: 16-byte aligned strides in bf16 and fp32


def _random_case(gen, tokens, experts, top_k, used_experts=None, dtype=torch.float32):
    """Random activations/weights; routing restricted to ``used_experts`` (others get no rows)."""
    x = torch.randn(tokens, HIDDEN, generator=gen, dtype=dtype)
    gate_up = torch.randn(experts, 2 * INTER, HIDDEN, generator=gen, dtype=dtype) / HIDDEN**0.5
    down = torch.randn(experts, HIDDEN, INTER, generator=gen, dtype=dtype) / INTER**0.5
    logits = torch.randn(tokens, experts, generator=gen, dtype=torch.float64)
    if used_experts is not None:
        banned = torch.ones(experts, dtype=torch.bool)
        banned[list(used_experts)] = False
        logits[:, banned] = -1e9
    weights, ids = route_topk_softmax(logits, top_k, renormalize=True)
    return x, gate_up, down, weights.to(dtype), ids


def _fp64_reference(x, gate_up, down, weights, ids):
    return moe_experts(x.double(), gate_up.double(), down.double(), weights.double(), ids, impl="reference")


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(0, 12), experts=st.integers(1, 10), top_k=st.integers(1, 8), seed=st.integers(0, 10**6))
def test_grouped_fp32_matches_fp64_reference(tokens, experts, top_k, seed):
    top_k = min(top_k, experts)
    gen = torch.Generator().manual_seed(seed)
    x, gate_up, down, weights, ids = _random_case(gen, tokens, experts, top_k)
    got = moe_experts(x, gate_up, down, weights, ids, impl="grouped")
    assert got.shape == x.shape and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _fp64_reference(x, gate_up, down, weights, ids), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("top_k", [1, 8])
def test_grouped_bf16_relative_error_with_empty_experts(top_k):
    """bf16 grouped path vs the fp32 reference; 16 experts of which only 9 receive tokens
    (including the first and the last, so empty groups sit at both ends and in the middle)."""
    gen = torch.Generator().manual_seed(top_k)
    used = [0, 1, 3, 4, 6, 9, 10, 12, 15]
    x, gate_up, down, weights, ids = _random_case(gen, 40, 16, top_k, used_experts=used)
    assert set(ids.unique().tolist()) <= set(used)
    bf = [t.bfloat16() for t in (x, gate_up, down, weights)]
    got = moe_experts(bf[0], bf[1], bf[2], bf[3], ids, impl="grouped")
    assert got.dtype == torch.bfloat16
    # Reference on the bf16-rounded operands, in fp32: isolates the grouped path's own rounding.
    ref = moe_experts(bf[0].float(), bf[1].float(), bf[2].float(), bf[3].float(), ids, impl="reference")
    rel = (got.float() - ref).norm() / ref.norm()
    assert rel < 2e-2, float(rel)


@pytest.mark.parametrize("top_k", [1, 8])
@pytest.mark.parametrize("impl", ["grouped", "reference"])
def test_exact_integer_case_fp32(top_k, impl):
    """Operands chosen so every intermediate is exactly representable in fp32: integer x and
    weights; the gate rows see a +40 bias column so SiLU(gate) == gate exactly (sigmoid(>=25)
    rounds to 1); dyadic mixing weights. Any summation order then gives the same bits."""
    gen = torch.Generator().manual_seed(7 + top_k)
    experts, tokens = 12, 30
    x = torch.randint(-1, 2, (tokens, HIDDEN), generator=gen).float()
    x[:, 0] = 1.0
    gate_up = torch.randint(-1, 2, (experts, 2 * INTER, HIDDEN), generator=gen).float()
    gate_up[:, :INTER, 0] = 40.0
    gate_up[:, INTER:, 0] = 0.0
    down = torch.randint(-1, 2, (experts, HIDDEN, INTER), generator=gen).float()
    ids = torch.stack([torch.randperm(experts - 2, generator=gen)[:top_k] for _ in range(tokens)])  # 2 empty
    weights = 2.0 ** -torch.randint(0, 4, (tokens, top_k), generator=gen).float()
    expected = torch.zeros(tokens, HIDDEN, dtype=torch.float64)
    for t in range(tokens):
        for j in range(top_k):
            e = int(ids[t, j])
            gate = gate_up[e, :INTER].double() @ x[t].double()
            assert bool((gate >= 25).all())
            h = gate * (gate_up[e, INTER:].double() @ x[t].double())
            expected[t] += float(weights[t, j]) * (down[e].double() @ h)
    got = moe_experts(x, gate_up, down, weights, ids, impl=impl)
    assert torch.equal(got.double(), expected)


@pytest.mark.parametrize("impl", ["grouped", "reference"])
def test_nan_poisoned_fresh_buffers_are_fully_overwritten(impl, monkeypatch):
    """Every buffer allocated uninitialised is filled with NaN: a row the op fails to write
    (an empty expert, a dropped slot) would surface as NaN in the output."""
    poison_fresh_buffers(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    for top_k in (1, 8):
        x, gate_up, down, weights, ids = _random_case(gen, 9, 12, top_k, used_experts=range(2, 10))
        got = moe_experts(x, gate_up, down, weights, ids, impl=impl)
        assert not bool(got.isnan().any())
        torch.testing.assert_close(got.double(), _fp64_reference(x, gate_up, down, weights, ids), atol=2e-5, rtol=1e-5)


def test_dispatch_and_validation(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    x, gate_up, down, weights, ids = _random_case(gen, 5, 4, 2)
    calls = []
    real = moe_module.moe_experts_grouped

    def spy(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(moe_module, "moe_experts_grouped", spy)
    moe_experts(x, gate_up, down, weights, ids)  # auto on CPU: the reference
    assert calls == []
    moe_experts(x, gate_up, down, weights, ids, impl="grouped")
    assert calls == [1]
    with pytest.raises(ValueError, match="must be on x's device"):
        moe_experts(x, gate_up.to("meta"), down, weights, ids)
    with pytest.raises(ValueError, match="impl must be one of"):
        moe_experts(x, gate_up, down, weights, ids, impl="fast")
    with pytest.raises(ValueError, match=r"lie in \[0, 4\)"):
        moe_experts(x, gate_up, down, weights, ids + 3, impl="grouped")
    with pytest.raises(ValueError, match=r"lie in \[0, 4\)"):
        moe_experts(x, gate_up, down, weights, ids - 3, impl="grouped")
    # fp64 is not a _grouped_mm dtype; H = 6 breaks 16-byte alignment.
    assert not grouped_mm_supported(x.double(), gate_up.double(), down.double())
    with pytest.raises(ValueError, match="grouped MoE path unsupported"):
        moe_experts(x.double(), gate_up.double(), down.double(), weights, ids, impl="grouped")
    odd = torch.zeros(4, 2 * INTER, 6), torch.zeros(4, 6, INTER)
    assert not grouped_mm_supported(torch.zeros(5, 6), *odd)
    assert grouped_mm_supported(x, gate_up, down)
    assert grouped_mm_supported(x.bfloat16(), gate_up.bfloat16(), down.bfloat16())


@pytest.mark.cuda
def test_cuda_auto_dispatch_is_grouped_sync_free_and_matches_reference():
    gen = torch.Generator().manual_seed(5)
    x, gate_up, down, weights, ids = (t.cuda() for t in _random_case(gen, 300, 64, 8, dtype=torch.float32))
    bf = [t.bfloat16() for t in (x, gate_up, down, weights)]
    assert grouped_mm_supported(*bf[:3])
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = moe_experts(bf[0], bf[1], bf[2], bf[3], ids)  # auto: the grouped path, no host sync
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref = moe_experts(*(t.float() for t in bf), ids, impl="reference")
    assert float((got.float() - ref).norm() / ref.norm()) < 2e-2


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_compiled_combine_matches_the_eager_combine(dtype, tol):
    """The fused path's gather-multiply-sum (compiled on CUDA) against the
    eager gather + bmm, compiled here through inductor's C++ backend; and both against a loop."""
    from hypic.ops.fused import compile_graph
    from hypic.ops.moe_grouped import combine_slots, combine_slots_math

    gen = torch.Generator().manual_seed(7)
    num_tokens, top_k = 29, 3
    rows = torch.randn(num_tokens * top_k, HIDDEN, generator=gen).to(dtype)
    inverse = torch.randperm(num_tokens * top_k, generator=gen)
    mix = torch.rand(num_tokens, top_k, generator=gen).to(dtype)
    loop = torch.stack([sum(mix[t, j].double() * rows[inverse[t * top_k + j]].double() for j in range(top_k))
                        for t in range(num_tokens)])
    eager = combine_slots(rows, inverse, mix)
    try:
        fused = compile_graph(combine_slots_math)(rows, inverse, mix)
    except Exception as err:  # pragma: no cover - depends on the machine's compiler
        pytest.skip(f"torch.compile unavailable here: {type(err).__name__}: {err}")
    for got in (eager, fused, combine_slots_math(rows, inverse, mix)):
        assert got.dtype == dtype and got.shape == (num_tokens, HIDDEN)
        assert float((got.double() - loop).norm() / loop.norm()) < tol


@pytest.mark.parametrize("experts,dtype", [(6, torch.uint8), (256, torch.uint8), (257, torch.int16),
                                           (2 ** 15, torch.int16), (2 ** 15 + 1, torch.int32)])
def test_sort_rows_by_expert_on_narrow_keys_matches_an_int64_sort(experts, dtype):
    from hypic.ops.moe_grouped import expert_ends, sort_key_dtype, sort_rows_by_expert

    assert sort_key_dtype(experts) == dtype
    gen = torch.Generator().manual_seed(experts)
    ids = torch.randint(0, experts, (300, 8), generator=gen)
    ids[:5] = experts - 1  # the largest id must survive the narrow cast
    order, ends = sort_rows_by_expert(ids, experts)
    want_sorted, want_order = torch.sort(ids.reshape(-1), stable=True)
    assert torch.equal(order, want_order)
    assert torch.equal(ends, expert_ends(want_sorted, experts))
    assert ends.dtype == torch.int64 and int(ends[-1]) == ids.numel()
