"""The fused glue (hypic.ops.fused): compiled graphs against the eager reference math, and the dispatch."""

from __future__ import annotations

import pytest
import torch

from hypic.ops import fused, moe, norms, rope


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _cases(x, gate, w):
    """name -> (args, eager math) for every function the fused path compiles."""
    return {
        "rms_norm_zero_centered": ((x, w, 1e-6), norms.rms_norm_zero_centered_math),
        "add_rms_norm_zero_centered": ((x, gate, w, 1e-6), norms._ADD_RMS_NORM_ZERO_CENTERED),
        "gated_rms_norm": ((x, gate, w + 1, 1e-6), norms.gated_rms_norm_math),
        "l2_normalize": ((x, 1e-6), norms.l2_normalize_math),
        "rms_norm": ((x, w + 1, 1e-6), norms.rms_norm_math),
        "add_rms_norm": ((x, gate, w + 1, 1e-6), norms._ADD_RMS_NORM),
        "group_rms_norm_sigmoid_gated": ((x, gate, w + 1, 2, 1e-6), norms.group_rms_norm_sigmoid_gated_math),
        "swiglu": ((x, gate), fused.swiglu_math),
        "sigmoid_gate": ((x, gate), fused.sigmoid_gate_math),
        "add_sigmoid_gated": ((x, gate, gate[..., :1]), fused.add_sigmoid_gated_math),
    }


def _row_cases(num_tokens, dtype, gen):
    """The glue that compiles only inside CUDA graphs, on its own shapes."""
    b, a = (torch.randn(num_tokens, 6, generator=gen) * 2).to(dtype), torch.randn(num_tokens, 6, generator=gen).to(dtype)
    a_log, dt_bias = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    # distinct logits a whole unit apart in every row: no near-tie for the two softmaxes' last
    # bits to order differently (the ids are compared exactly)
    order = torch.stack([torch.randperm(16, generator=gen) for _ in range(num_tokens)])
    logits = (order.float() * 0.5 - 4 + 0.1 * torch.rand(num_tokens, 16, generator=gen)).to(dtype)
    q = torch.randn(num_tokens, 3, 32, generator=gen).to(dtype)
    cos, sin = torch.randn(num_tokens, 8, generator=gen).to(dtype), torch.randn(num_tokens, 8, generator=gen).to(dtype)
    return {
        "gdn_gates": ((b, a, a_log, dt_bias), fused.gdn_gates_math),
        "route_topk_softmax": ((logits, 4, True), moe.route_topk_softmax_math),
        "route_sigmoid_grouped": ((logits, torch.linspace(-0.2, 0.2, 16, dtype=dtype), 4, 4, 2, True, 2.5),
                                  moe.route_sigmoid_grouped_math),
        "apply_rotary (partial)": ((q, cos, sin), rope.apply_rotary_math),
        "apply_rotary (whole head)": ((q[..., :8].contiguous(), cos, sin), rope.apply_rotary_math),
    }


@pytest.fixture(scope="module")
def toolchain():
    """The compiled math runs on CPU through inductor's C++ backend: the same graphs the CUDA path
    compiles to Triton. Skip (with the reason) where no compiler toolchain works."""
    def probe(a):  # not the code under test: a failure of that must fail the tests, not skip them
        return a * 2 + 1

    try:
        torch.compile(probe, fullgraph=True)(torch.ones(2, 4))
    except Exception as err:  # pragma: no cover - depends on the machine's compiler
        pytest.skip(f"torch.compile unavailable here: {type(err).__name__}: {err}")


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("num_tokens", [1, 37, 300])
def test_compiled_glue_matches_the_eager_reference(toolchain, dtype, tol, num_tokens):
    gen = torch.Generator().manual_seed(num_tokens)
    x = (torch.randn(num_tokens, 4, 64, generator=gen) * 3).to(dtype)
    gate = torch.randn(num_tokens, 4, 64, generator=gen).to(dtype)
    w = (torch.randn(64, generator=gen) * 0.1).to(dtype)
    cases = {**_cases(x, gate, w), **_row_cases(num_tokens, dtype, gen)}
    for name, (args, eager) in cases.items():
        ref = eager(*args)
        out = fused.compile_graph(eager)(*args)  # the graph itself: no eager fallback
        refs = ref if isinstance(ref, tuple) else (ref,)
        outs = out if isinstance(out, tuple) else (out,)
        assert len(outs) == len(refs), name
        for o, r in zip(outs, refs):
            assert o.dtype == r.dtype and o.shape == r.shape, name
            assert torch.isfinite(o).all(), name
            # bf16: both round the same fp32 value; a reordered reduction may flip a last bit.
            assert _rel(o, r) < tol, (name, _rel(o, r))


class _FakeCuda:
    """Just what dispatch reads of a tensor: where it lives and how big it is."""

    is_cuda = True

    def __init__(self, numel: int) -> None:
        self._numel = numel

    def numel(self) -> int:
        return self._numel


def test_dispatch_by_device_and_size():
    # CPU tensors keep the eager reference (the fused path is for CUDA).
    x = torch.randn(3, 8)
    assert fused.dispatch(norms.l2_normalize_math, x) is norms.l2_normalize_math
    assert torch.equal(norms.l2_normalize(x), norms.l2_normalize_math(x, 1e-6))
    # CUDA tensors: the compiled graph from MIN_COMPILED_ELEMENTS elements on, the eager math
    # below it (where the compiled call's host cost exceeds the GPU time it saves).
    big, small = _FakeCuda(fused.MIN_COMPILED_ELEMENTS), _FakeCuda(fused.MIN_COMPILED_ELEMENTS - 1)
    assert fused.dispatch(norms.l2_normalize_math, big) is fused.compiled(norms.l2_normalize_math)
    assert fused.dispatch(norms.l2_normalize_math, small) is norms.l2_normalize_math
    assert fused.dispatch(norms.l2_normalize_math, small, eager=norms.l2_normalize) is norms.l2_normalize


def test_dispatch_inside_a_graph_recording():
    """Inside recording_graph (a CUDA graph's warm-up and capture) CUDA glue of any size runs
    compiled, graph_only functions too; outside, graph_only functions stay eager at any size.
    CPU stays eager."""
    small, big = _FakeCuda(8), _FakeCuda(fused.MIN_COMPILED_ELEMENTS)
    math, eager = fused.swiglu_math, norms.l2_normalize
    assert fused.dispatch(math, big, graph_only=True) is math
    assert fused.dispatch(math, small, eager=eager) is eager
    with fused.recording_graph():
        with fused.recording_graph():  # nested (a capture inside a warm-up's context)
            assert fused.dispatch(math, small) is fused.compiled(math)
        assert fused.dispatch(math, small, graph_only=True) is fused.compiled(math)
        assert fused.dispatch(math, torch.randn(3, 8), graph_only=True) is math  # CPU: the reference
    assert fused.dispatch(math, small, eager=eager) is eager  # the context has ended
    with pytest.raises(RuntimeError, match="boom"):
        with fused.recording_graph():
            raise RuntimeError("boom")
    assert fused.dispatch(math, small, eager=eager) is eager  # ended by the error too

    # the flag is per thread: a capture on one thread does not change another's glue
    import threading

    seen = []
    with fused.recording_graph():
        worker = threading.Thread(target=lambda: seen.append(fused.dispatch(math, small, eager=eager)))
        worker.start()
        worker.join()
    assert seen == [eager]


def test_gdn_gates_match_the_model_maths_and_check_shapes():
    gen = torch.Generator().manual_seed(0)
    b, a = torch.randn(5, 4, generator=gen), torch.randn(5, 4, generator=gen)
    a_log, dt_bias = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    g, beta = fused.gdn_gates(b.bfloat16(), a.bfloat16(), a_log, dt_bias)
    assert g.dtype == beta.dtype == torch.float32
    bf, af = b.bfloat16().float(), a.bfloat16().float()
    torch.testing.assert_close(beta, torch.sigmoid(bf))
    torch.testing.assert_close(g, -a_log.exp() * torch.nn.functional.softplus(af + dt_bias))
    assert (g <= 0).all()
    g64, _ = fused.gdn_gates(b.double(), a.double(), a_log.double(), dt_bias.double())
    assert g64.dtype == torch.float64
    with pytest.raises(ValueError, match="must both be"):
        fused.gdn_gates(b, a[:, :2], a_log, dt_bias)
    with pytest.raises(ValueError, match="A_log"):
        fused.gdn_gates(b, a, a_log[:2], dt_bias)


def test_shape_errors():
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match="swiglu"):
        fused.swiglu(x, x[:2])
    with pytest.raises(ValueError, match="add_sigmoid_gated: h"):
        fused.add_sigmoid_gated(x, x[:2], x[:, :1])
    with pytest.raises(ValueError, match="add_sigmoid_gated: gate"):
        fused.add_sigmoid_gated(x, x, x[:, :2])
    with pytest.raises(ValueError, match="sigmoid_gate"):
        fused.sigmoid_gate(x, x[:, :4])


def test_a_failing_compiler_falls_back_to_the_eager_math(monkeypatch):
    """Compiled glue is the default on CUDA: a toolchain that cannot compile must not stop
    serving. The first call warns and returns the eager result; later calls use the eager
    function. Errors of the math itself still propagate."""
    def broken_compile(fn):
        def graph(*args):
            raise RuntimeError("no compiler here")
        return graph

    def math(a, b):
        return a * 2 + b

    monkeypatch.setattr(fused, "compile_graph", broken_compile)
    monkeypatch.setattr(fused, "_COMPILED", {})
    x = torch.randn(3, 4)
    with pytest.warns(RuntimeWarning, match="compiling math failed .*no compiler here"):
        assert torch.equal(fused.compiled(math)(x, x), math(x, x))
    assert fused.compiled(math) is math
    monkeypatch.setattr(fused, "_COMPILED", {})
    with pytest.raises(RuntimeError, match="size of tensor"):  # the eager math fails too: its error
        fused.compiled(math)(x, torch.randn(5, 4))
