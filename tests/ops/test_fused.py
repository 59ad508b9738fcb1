"""The opt-in fused glue (hypic.ops.fused): compiled graphs against the eager reference math."""

from __future__ import annotations

import pytest
import torch

from hypic.ops import fused, norms


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _cases(x, gate, w):
    """name -> (args, eager math) for every function the fused path compiles."""
    return {
        "rms_norm_zero_centered": ((x, w, 1e-6), norms.rms_norm_zero_centered_math),
        "add_rms_norm_zero_centered": ((x, gate, w, 1e-6), norms._ADD_RMS_NORM_ZERO_CENTERED),
        "gated_rms_norm": ((x, gate, w + 1, 1e-6), norms.gated_rms_norm_math),
        "l2_normalize": ((x, 1e-6), norms.l2_normalize_math),
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
    for name, (args, eager) in _cases(x, gate, w).items():
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


def test_switch_and_dispatch(monkeypatch):
    monkeypatch.delenv(fused.COMPILE_ENV, raising=False)
    assert fused.compile_glue_enabled() is True  # on by default (measured faster on the H200)
    monkeypatch.setenv(fused.COMPILE_ENV, "0")
    assert fused.compile_glue_enabled() is False
    monkeypatch.setenv(fused.COMPILE_ENV, "1")
    # CPU tensors keep the eager reference whatever the switch says (the fused path is for CUDA).
    x = torch.randn(3, 8)
    assert fused.dispatch(norms.l2_normalize_math, x) is norms.l2_normalize_math
    assert torch.equal(norms.l2_normalize(x), norms.l2_normalize_math(x, 1e-6))
    # CUDA tensors: the compiled graph from MIN_COMPILED_ELEMENTS elements on, the eager math
    # below it (where the compiled call's host cost exceeds the GPU time it saves).
    big, small = _FakeCuda(fused.MIN_COMPILED_ELEMENTS), _FakeCuda(fused.MIN_COMPILED_ELEMENTS - 1)
    assert fused.dispatch(norms.l2_normalize_math, big) is fused.compiled(norms.l2_normalize_math)
    assert fused.dispatch(norms.l2_normalize_math, small) is norms.l2_normalize_math
    assert fused.dispatch(norms.l2_normalize_math, small, eager=norms.l2_normalize) is norms.l2_normalize
    monkeypatch.setenv(fused.COMPILE_ENV, "0")
    assert fused.dispatch(norms.l2_normalize_math, big) is norms.l2_normalize_math
    monkeypatch.setenv(fused.COMPILE_ENV, "yes")
    with pytest.raises(ValueError, match="HYPIC_COMPILE_GLUE must be 0 or 1"):
        norms.l2_normalize(x)


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
