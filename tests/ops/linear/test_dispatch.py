"""Tests for hypic/ops/linear/_dispatch.py (lazy CUDA fast-path lookup)."""

import subprocess
import sys
import types

import pytest
import torch

from hypic.ops.linear import _dispatch

pytestmark = pytest.mark.usefixtures("single_thread_torch")


class _FakeCuda:
    is_cuda = True


def test_cpu_tensors_never_look_for_a_fast_path(monkeypatch):
    monkeypatch.setattr(_dispatch, "_FAST_MODULE", "hypic.ops.linear._no_such_module_")
    assert _dispatch.cuda_fast_path("gated_delta_forward", torch.zeros(1), None) is None


def test_missing_module_or_function_means_reference(monkeypatch):
    monkeypatch.setattr(_dispatch, "_FAST_MODULE", "hypic.ops.linear._no_such_module_")
    assert _dispatch.cuda_fast_path("gated_delta_forward", _FakeCuda()) is None
    fake = types.ModuleType("_hypic_fake_fast_paths")
    fake.gated_delta_forward = lambda *a, **k: "fast"
    monkeypatch.setitem(sys.modules, "_hypic_fake_fast_paths", fake)
    monkeypatch.setattr(_dispatch, "_FAST_MODULE", "_hypic_fake_fast_paths")
    assert _dispatch.cuda_fast_path("gated_delta_forward", _FakeCuda())() == "fast"
    assert _dispatch.cuda_fast_path("kda_forward", _FakeCuda()) is None


def test_broken_fast_module_is_not_silently_ignored(monkeypatch):
    # A fast-path module that fails on a missing dependency of its own must surface the error.
    monkeypatch.setattr(_dispatch, "_FAST_MODULE", "_hypic_broken_fast_paths")

    def fail_import(name, *args, **kwargs):
        raise ModuleNotFoundError("No module named 'fla'", name="fla")

    monkeypatch.setattr(_dispatch.importlib, "import_module", fail_import)
    with pytest.raises(ModuleNotFoundError):
        _dispatch.cuda_fast_path("x", _FakeCuda())


def test_cpu_run_imports_neither_fla_nor_triton():
    code = (
        "import sys, torch\n"
        "from hypic.ops.linear.gated_delta import gated_delta_forward, gated_delta_summarize\n"
        "from hypic.ops.conv import causal_conv1d\n"
        "q = torch.nn.functional.normalize(torch.randn(5, 1, 4), dim=-1)\n"
        "g, b = -torch.rand(5, 1), torch.rand(5, 1)\n"
        "cu = torch.tensor([0, 5])\n"
        "gated_delta_forward(q, q, torch.randn(5, 1, 3), g, b, cu_seqlens=cu)\n"
        "gated_delta_summarize(q, torch.randn(5, 1, 3), g, b, cu_seqlens=cu)\n"
        "causal_conv1d(torch.randn(5, 2), torch.randn(2, 4), cu_seqlens=cu)\n"
        "bad = [m for m in ('fla', 'triton', 'hypic.ops.linear.fla_paths') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(__import__("pathlib").Path(__file__).parents[3]))
