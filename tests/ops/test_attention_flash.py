"""Flash varlen path (hypic.ops.attention_flash): the layout predicate, the index-causal claim it
rests on (checked on CPU by emulating the kernel's bottom-right causal mask), dispatch errors,
and - on a CUDA machine only - the kernel against the reference."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.ops.attention import varlen_attention
from hypic.ops.attention_flash import index_causal_layout
from tests.ops.test_attention import _case

pytestmark = pytest.mark.usefixtures("single_thread_torch")


def _bottom_right_causal(q, k, v, cu_q, cu_k, scale):
    """What the flash varlen kernel computes: per sequence, query i sees keys j <= i + Lk - Lq."""
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype)
    groups = q.shape[1] // k.shape[1]
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        if q1 == q0:
            continue
        rows = torch.arange(q1 - q0)[:, None] + (k1 - k0) - (q1 - q0)
        mask = torch.arange(k1 - k0)[None, :] <= rows
        kk = k[k0:k1].repeat_interleave(groups, dim=1).transpose(0, 1)
        vv = v[k0:k1].repeat_interleave(groups, dim=1).transpose(0, 1)
        out[q0:q1] = F.scaled_dot_product_attention(q[q0:q1].transpose(0, 1), kk, vv, attn_mask=mask,
                                                    scale=scale).transpose(0, 1)
    return out


def _layout(lens):
    """Index-causal layout: sequence i has keys 0..c+n-1 in order, queries the last n."""
    return _case(torch.Generator().manual_seed(0), [n for n, _ in lens], [c for _, c in lens], 2, 1, 4, 4,
                 torch.float64, False)[3:]


def test_index_causal_layout_predicate():
    assert index_causal_layout(*_layout([(5, 0)]))  # full recompute
    assert index_causal_layout(*_layout([(5, 3), (0, 4), (2, 0)]))  # cached prefix + live suffix
    cu_q, cu_k, pq, pk = _layout([(4, 2), (3, 1)])
    swapped = pk.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert not index_causal_layout(cu_q, cu_k, pq, swapped)  # keys out of order
    assert not index_causal_layout(cu_q, cu_k, pq - 1, pk)  # queries not the last tokens
    gap = pk.clone()
    gap[5] += 10  # a gap in the key positions of sequence 0
    assert not index_causal_layout(cu_q, cu_k, pq, gap)
    # PIC with live tokens interleaved between cached segments: keys reordered by position
    # would be 0..n-1, but the queries are not the last tokens.
    assert not index_causal_layout(torch.tensor([0, 2]), torch.tensor([0, 5]), torch.tensor([1, 3]),
                                   torch.arange(5))


@settings(max_examples=15, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), min_size=1, max_size=4),
       heads=st.sampled_from([(4, 4), (4, 2)]), seed=st.integers(0, 10**6))
def test_position_causal_equals_bottom_right_index_causal_on_such_layouts(lens, heads, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, cu_q, cu_k, pq, pk = _case(gen, [n for n, _ in lens], [c for _, c in lens], heads[0], heads[1], 8,
                                        8, torch.float64, False)
    assert index_causal_layout(cu_q, cu_k, pq, pk)
    out = varlen_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, positions_q=pq, positions_k=pk,
                           scale=0.3, impl="reference")
    torch.testing.assert_close(out, _bottom_right_causal(q, k, v, cu_q, cu_k, 0.3), atol=1e-12, rtol=0)


def test_flash_dispatch_errors_on_cpu():
    q, k, v, cu_q, cu_k, pq, pk = _case(torch.Generator().manual_seed(1), [3], [2], 2, 2, 8, 8,
                                        torch.float32, False)
    args = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, positions_q=pq, positions_k=pk)
    with pytest.raises(ValueError, match="index_causal=True"):
        varlen_attention(q, k, v, **args, impl="flash")
    with pytest.raises(ValueError, match="needs CUDA"):
        varlen_attention(q, k, v, **args, impl="flash", index_causal=True)
    # auto on CPU ignores the hint and runs the reference
    ref = varlen_attention(q, k, v, **args, impl="reference")
    torch.testing.assert_close(varlen_attention(q, k, v, **args, index_causal=True), ref, atol=0, rtol=0)


@pytest.mark.cuda
def test_flash_kernel_matches_reference_on_cuda():
    gen = torch.Generator().manual_seed(2)
    case = _case(gen, [300, 1, 64], [0, 700, 129], 16, 2, 256, 256, torch.float32, False)
    q, k, v = (t.cuda().bfloat16() for t in case[:3])
    cu_q, cu_k, pq, pk = (t.cuda() for t in case[3:])
    args = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, positions_q=pq, positions_k=pk)
    out = varlen_attention(q, k, v, **args, impl="flash", index_causal=True, max_seqlen_q=300, max_seqlen_k=830)
    ref = varlen_attention(q.float(), k.float(), v.float(), **args, impl="reference")
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
