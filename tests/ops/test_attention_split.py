"""Tests of hypic.ops.attention_split: the split-KV kernel for queries over keys laid by position.

CPU: the block table, the split count, the dispatch rules and errors; the Triton kernel itself through
``TRITON_INTERPRET=1`` in a subprocess when Triton is installed (fp16: the interpreter's bf16
arithmetic is not faithful). CUDA: against the reference path in bf16, with several splits.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from hypic import envs
from hypic.ops import attention_split
from hypic.ops.attention import varlen_attention
from hypic.ops.attention_split import split_blocks_host, split_supported
from tests.interpreter import interpreted_error


# request 0: 300 keys, queries in three seams (the last one its final tokens); request 1: 70
# keys, queries at its end; request 2: no queries
CASE = textwrap.dedent("""
    import torch
    from hypic.ops import attention_split
    from hypic.ops.attention import varlen_attention

    def case(dtype, device, hq=8, hkv=2, d=32):
        gen = torch.Generator().manual_seed(0)
        qpos = [list(range(10, 18)) + list(range(150, 158)) + list(range(290, 300)), list(range(60, 70)), []]
        lk = [300, 70, 5]
        cu_q = [0]
        for p in qpos:
            cu_q.append(cu_q[-1] + len(p))
        cu_k = [0]
        for n in lk:
            cu_k.append(cu_k[-1] + n)
        pos_q = torch.tensor(sum(qpos, []))
        pos_k = torch.cat([torch.arange(n) for n in lk])
        q = torch.randn(cu_q[-1], hq, d, generator=gen).to(dtype)
        k = torch.randn(cu_k[-1], hkv, d, generator=gen).to(dtype)
        v = torch.randn(cu_k[-1], hkv, d, generator=gen).to(dtype)
        ref = varlen_attention(q.double(), k.double(), v.double(), cu_seqlens_q=torch.tensor(cu_q),
                               cu_seqlens_k=torch.tensor(cu_k), positions_q=pos_q, positions_k=pos_k,
                               impl="reference")
        dev = lambda t: t.to(device)  # noqa: E731
        worst = 0.0
        for min_split in (64, 4096):  # several splits per block, then one
            attention_split.MIN_SPLIT = min_split
            out = varlen_attention(dev(q), dev(k), dev(v), cu_seqlens_q=dev(torch.tensor(cu_q)),
                                   cu_seqlens_k=dev(torch.tensor(cu_k)), positions_q=dev(pos_q),
                                   positions_k=dev(pos_k), impl="split", keys_by_position=True,
                                   cu_seqlens_q_host=cu_q, cu_seqlens_k_host=cu_k)
            assert out.dtype == dtype and out.shape == ref.shape and not torch.isnan(out).any()
            worst = max(worst, float((out.cpu().double() - ref).norm() / ref.norm()))
        return worst
""")


def test_block_table_cuts_each_request_into_blocks():
    table = split_blocks_host([0, 20, 20, 23], [0, 300, 305, 375], block_q=8)
    assert table.tolist() == [[0, 8, 0, 300], [8, 8, 0, 300], [16, 4, 0, 300], [20, 3, 305, 70]]
    assert table.dtype.name == "int32"


def test_split_count_bounded_by_keys_and_partial_memory(monkeypatch):
    attention_split._plan_cache = None
    keys = [0, 32768]
    _, splits, length = attention_split._plan([0, 576], keys, 8, torch.device("cpu"), None, None, 576 * 16 * 257 * 4)
    assert (splits, length) == (16, 2048)  # 32k keys in 2048-key splits
    _, splits, length = attention_split._plan([0, 30000], keys, 8, torch.device("cpu"), None, None,
                                              30000 * 16 * 257 * 4)
    assert splits == 1 and length == 32768  # 30k queries: one split (0.5 GB of fp32 partials would be past the bound)
    _, splits, _ = attention_split._plan([0, 8], [0, 100], 8, torch.device("cpu"), None, None, 8 * 16 * 257 * 4)
    assert splits == 1
    monkeypatch.setattr(attention_split, "MIN_SPLIT", 1024)
    _, splits, length = attention_split._plan([0, 576], keys, 8, torch.device("cpu"), None, None, 576 * 16 * 257 * 4)
    assert (splits, length) == (16, 2048)  # at most MAX_SPLITS
    monkeypatch.setattr(attention_split, "MIN_SPLIT", 4096)
    _, splits, length = attention_split._plan([0, 576], keys, 8, torch.device("cpu"), None, None, 576 * 16 * 257 * 4)
    assert (splits, length) == (8, 4096)


def test_dispatch_rules_on_cpu():
    """CPU tensors never take the kernel (outside Triton's interpreter); an explicit request
    says why, and the automatic choice runs the reference even with the layout promise."""
    q = torch.zeros(4, 8, 32, dtype=torch.bfloat16)
    assert not split_supported(q, q, 2) or envs.triton_interpret()  # CUDA only
    args = dict(cu_seqlens_q=torch.tensor([0, 4]), cu_seqlens_k=torch.tensor([0, 4]),
                positions_q=torch.arange(4), positions_k=torch.arange(4))
    kv = torch.zeros(4, 2, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="impl='split' needs"):
        varlen_attention(q, kv, kv, impl="split", **args)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(4, 4, 16, generator=gen) for _ in range(3))
    want = varlen_attention(q, k, v, impl="reference", **args)
    assert torch.equal(varlen_attention(q, k, v, keys_by_position=True, cu_seqlens_q_host=[0, 4],
                                        cu_seqlens_k_host=[0, 4], **args), want)


def test_kernel_under_interpreter():
    # 128-row blocks: a block holds all three seams of request 0 (its first rows masked past
    # their positions while the block's later rows read on)
    assert interpreted_error(CASE + "print(case(torch.float16, 'cpu'))\n") < 2e-3


@pytest.mark.cuda
@pytest.mark.parametrize("heads", [(8, 2, 32), (16, 2, 256), (4, 4, 64)])
def test_kernel_matches_reference_on_cuda(heads, monkeypatch):
    monkeypatch.setattr(attention_split, "MIN_SPLIT", attention_split.MIN_SPLIT)  # restored after
    namespace: dict = {}
    exec(CASE, namespace)  # noqa: S102 - the same case as the interpreter test
    assert namespace["case"](torch.bfloat16, "cuda", *heads) < 2e-2


MERGE_CASE = textwrap.dedent("""
    import torch
    from hypic.ops.attention_split import merge_splits_torch, merge_splits_triton

    def merge_case(device, out_dtype, splits=5, tq=7, hq=3, dv=32):
        gen = torch.Generator().manual_seed(4)
        o_part = torch.randn(splits, tq, hq, dv, generator=gen)
        lse = torch.randn(splits, tq, hq, generator=gen) * 4
        lse[1:, 2] = float("-inf")  # token 2: only split 0 saw keys
        lse[:, 4, 1] = float("-inf")  # token 4, head 1: no split saw a key -> 0
        lse[3] = float("-inf")  # split 3 saw nothing at all
        want = merge_splits_torch(o_part.clone().double(), lse.double(), torch.empty(tq, hq, dv, dtype=torch.float64))
        out = torch.full((tq, hq, dv), float("nan"), dtype=out_dtype, device=device)  # poisoned
        got = merge_splits_triton(o_part.to(device), lse.to(device), out)
        assert got is out and not torch.isnan(got).any() and torch.all(got[4, 1] == 0)
        return float((got.cpu().double() - want).norm() / want.norm())
""")


def test_merge_kernel_under_interpreter():
    assert interpreted_error(MERGE_CASE + "print(merge_case('cpu', torch.float32))\n") < 1e-6


@pytest.mark.cuda
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_merge_kernel_matches_torch_merge_on_cuda(out_dtype):
    namespace: dict = {}
    exec(MERGE_CASE, namespace)  # noqa: S102 - the same case as the interpreter test
    assert namespace["merge_case"]("cuda", out_dtype, splits=16, tq=70, hq=16, dv=256) < (1e-6 if out_dtype ==
                                                                                            torch.float32 else 1e-2)


def test_merge_rejects_a_mismatched_output():
    o_part, lse = torch.zeros(2, 3, 4, 8), torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="out must be contiguous"):
        attention_split.merge_splits_triton(o_part, lse, torch.zeros(3, 4, 4))
