"""cuDNN square causal path (hypic.ops.attention_cudnn): when it applies, how varlen_attention
dispatches to it, its fallback when cuDNN refuses, and - on a CUDA sm90+ machine - the kernel
against the reference."""

import pytest
import torch

from hypic.ops import attention_cudnn
from hypic.ops.attention import varlen_attention
from tests.ops.test_attention import _case

pytestmark = pytest.mark.usefixtures("single_thread_torch")


def _square(gen, lens, hq, hkv, d, dtype):
    """Cold prefill layout: each sequence's queries are all of its keys, positions 0..n-1."""
    return _case(gen, lens, [0] * len(lens), hq, hkv, d, d, dtype, False)


def test_supported_only_for_square_long_sequences_on_cuda():
    q = torch.zeros(4096, 4, 8)
    # CPU tensors never take it, whatever the layout.
    assert not attention_cudnn.cudnn_square_causal_supported(q, q, [0, 4096], [0, 4096])


def test_explicit_cudnn_errors_where_it_cannot_run_and_auto_runs_the_reference():
    q, k, v, cu_q, cu_k, pq, pk = _square(torch.Generator().manual_seed(0), [5, 3], 4, 2, 8, torch.float64)
    args = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, positions_q=pq, positions_k=pk)
    host = dict(cu_seqlens_q_host=cu_q.tolist(), cu_seqlens_k_host=cu_k.tolist())
    with pytest.raises(ValueError, match="impl='cudnn' needs index_causal=True"):
        varlen_attention(q, k, v, **args, **host, impl="cudnn", index_causal=True)
    ref = varlen_attention(q, k, v, **args, impl="reference")
    # CPU fp64: no kernel takes it, whatever the layout promises
    torch.testing.assert_close(varlen_attention(q, k, v, **args, **host, index_causal=True), ref, atol=0, rtol=0)


def test_a_refusing_cudnn_warns_once_and_disables_the_path(monkeypatch):
    monkeypatch.setattr(attention_cudnn, "_disabled_reason", None)

    def refuse(*args, **kwargs):
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(attention_cudnn.F, "scaled_dot_product_attention", refuse)
    q = torch.randn(6, 4, 8)
    with pytest.warns(RuntimeWarning, match="cuDNN attention unavailable"):
        assert attention_cudnn.cudnn_square_causal_attention(q, q[:, :2], q[:, :2], cu_seqlens_host=[0, 6],
                                                             scale=0.3) is None
    assert attention_cudnn._disabled_reason is not None
    # Once disabled, no layout qualifies (varlen_attention then takes flash).
    assert not attention_cudnn.cudnn_square_causal_supported(q, q, [0, 6], [0, 6])


@pytest.mark.cuda
def test_cudnn_kernel_matches_reference_and_auto_takes_it(monkeypatch):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the cuDNN SDPA path is for CUDA sm90+")
    gen = torch.Generator().manual_seed(3)
    lens = [attention_cudnn.MIN_SEQUENCE_TOKENS + 37, attention_cudnn.MIN_SEQUENCE_TOKENS]
    case = _square(gen, lens, 16, 2, 256, torch.float32)
    q, k, v = (t.cuda().bfloat16() for t in case[:3])
    cu_q, cu_k, pq, pk = (t.cuda() for t in case[3:])
    args = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, positions_q=pq, positions_k=pk, index_causal=True,
                max_seqlen_q=max(lens), max_seqlen_k=max(lens),
                cu_seqlens_q_host=case[3].tolist(), cu_seqlens_k_host=case[4].tolist())
    calls = []
    real = attention_cudnn.cudnn_square_causal_attention

    def spy(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr("hypic.ops.attention.cudnn_square_causal_attention", spy)
    out = varlen_attention(q, k, v, **args)
    assert calls, "auto dispatch did not take the cuDNN path for a square causal layout"
    ref = varlen_attention(q.float(), k.float(), v.float(), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                           positions_q=pq, positions_k=pk, impl="reference")
    err = float((out.float() - ref).norm() / ref.norm())
    assert out.shape == ref.shape and torch.isfinite(out).all()
    assert err < 1e-2, err
    flash = varlen_attention(q, k, v, **{**args, "impl": "flash"})
    assert float((out.float() - flash.float()).norm() / flash.float().norm()) < 1e-2
