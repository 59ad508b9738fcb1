"""The row-block MoE path (hypic.ops.moe_rows) against the per-expert reference in hypic.ops.moe.

CPU: the expert ends, the config checks and the dispatch rule; the Triton kernel itself through
``TRITON_INTERPRET=1`` in a subprocess when Triton is installed (fp16: the interpreter's bf16
arithmetic is not faithful), and compiled for the H200 (sm_90) on the CPU, which the interpreter
does not check. CUDA: bf16 against the reference at the 35B-A3B expert shapes, with NaN-poisoned
output rows.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from hypic.ops.moe import moe_experts, route_topk_softmax
from hypic.ops.moe_grouped import expert_ends
from hypic.ops.moe_rows import RowsConfig, default_config, rows_preferred, rows_supported
from tests.interpreter import interpreted_error


def test_expert_ends_count_each_experts_rows():
    sorted_ids = torch.tensor([0, 0, 2, 2, 2, 4])
    assert expert_ends(sorted_ids, 6).tolist() == [2, 2, 5, 5, 6, 6]  # empty experts 1, 3, 5
    assert expert_ends(torch.zeros(0, dtype=torch.int64), 3).tolist() == [0, 0, 0]


def test_config_checks_and_defaults():
    with pytest.raises(ValueError, match="block_m"):
        RowsConfig(block_m=24)
    with pytest.raises(ValueError, match="block_k"):
        RowsConfig(block_k=8)
    with pytest.raises(ValueError, match="num_warps"):
        RowsConfig(num_warps=3)
    with pytest.raises(ValueError, match="num_stages"):
        RowsConfig(num_stages=0)
    assert default_config(192 * 8, 256).block_m == 16  # 8k all-hit: 6 rows per expert
    assert default_config(576 * 8, 256).block_m == 32  # 32k all-hit: 18
    assert default_config(670 * 8, 256).block_m == 32  # 32k rag: 21
    assert default_config(1024 * 8, 256).block_m == 64
    assert rows_preferred(576 * 8, 256) and rows_preferred(1024 * 8, 256)
    assert not rows_preferred(2048 * 8, 256) and not rows_preferred(32768 * 8, 256)


def test_rows_path_refused_on_cpu_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    gate_up = torch.randn(3, 16, 16, dtype=torch.bfloat16)
    down = torch.randn(3, 16, 8, dtype=torch.bfloat16)
    weights, ids = route_topk_softmax(torch.randn(4, 3), 2, renormalize=True)
    assert not rows_supported(x, gate_up, down)
    with pytest.raises(ValueError, match="rows MoE path unsupported"):
        moe_experts(x, gate_up, down, weights.bfloat16(), ids, impl="rows")


CASE = textwrap.dedent("""
    import torch
    from hypic.ops.moe import moe_experts, route_topk_softmax
    from hypic.ops import moe_rows
    from hypic.ops.moe_grouped import expert_ends

    def case(dtype, device, tokens, experts, top_k, hidden, inter, block_m, used=None, seed=0):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(tokens, hidden, generator=gen)
        gate_up = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5
        down = torch.randn(experts, hidden, inter, generator=gen) / inter ** 0.5
        logits = torch.randn(tokens, experts, generator=gen, dtype=torch.float64)
        if used is not None:
            banned = torch.ones(experts, dtype=torch.bool)
            banned[list(used)] = False
            logits[:, banned] = -1e9
        weights, ids = route_topk_softmax(logits, top_k, renormalize=True)
        ops = [t.to(dtype) for t in (x, gate_up, down, weights)]
        # the reference on the rounded operands, in float64: only the path's own rounding differs
        ref = moe_experts(*(t.double() for t in ops), ids, impl="reference")
        dev = [t.to(device) for t in ops]
        ids_d = ids.to(device)
        # small tiles: several column tiles and contraction blocks at these widths
        config = moe_rows.RowsConfig(block_m=block_m, block_n=16, block_k=32)
        # the two launches alone, into NaN-poisoned rows: every sorted row is written
        sorted_ids, order = torch.sort(ids_d.reshape(-1), stable=True)
        ends = expert_ends(sorted_ids, experts)

        hidden_rows = torch.full((tokens * top_k, inter), float("nan"), device=device, dtype=dtype)
        moe_rows.rows_gemm(dev[0], order // top_k, dev[1], hidden_rows, ends, swiglu=True, config=config)
        rows_out = torch.full((tokens * top_k, hidden), float("nan"), device=device, dtype=dtype)
        moe_rows.rows_gemm(hidden_rows, None, dev[2], rows_out, ends, swiglu=False, config=config)
        assert not torch.isnan(hidden_rows).any() and not torch.isnan(rows_out).any()
        out = moe_rows.moe_experts_rows(*dev, ids_d, config=config)
        assert out.dtype == dtype and out.shape == ref.shape and not torch.isnan(out).any()
        return float((out.cpu().double() - ref).norm() / ref.norm())
""")


def test_rows_kernel_interpreted():
    script = CASE + textwrap.dedent("""
        worst = 0.0
        # several blocks per expert and partial blocks; empty experts at both ends and inside;
        # hidden and intermediate not multiples of the tiles
        worst = max(worst, case(torch.float16, "cpu", 40, 8, 2, 48, 24, 16, used=[1, 2, 4, 6], seed=1))
        worst = max(worst, case(torch.float16, "cpu", 9, 6, 4, 32, 16, 32, seed=2))
        worst = max(worst, case(torch.float32, "cpu", 30, 5, 1, 40, 20, 16, seed=3))
        print(worst)
    """)
    assert interpreted_error(script) < 2e-3


@pytest.mark.cuda
@pytest.mark.parametrize("tokens,block_m", [(192, 16), (576, 32), (576, 16), (2048, 64)])
def test_rows_kernel_cuda_bf16(tokens, block_m):
    namespace = {}
    exec(CASE, namespace)
    # 35B-A3B expert shapes (H 2048, I 512), 64 experts to keep the fp64 reference quick
    err = namespace["case"](torch.bfloat16, "cuda", tokens, 64, 8, 2048, 512, block_m, seed=tokens)
    assert err < 1e-2, err


def compile_rows_sm90(config: RowsConfig, swiglu: bool, inter: int = 512, hidden: int = 2048):
    """The kernel ``rows_gemm`` launches for ``config`` (bf16, 35B-A3B shapes), compiled for sm_90
    as the JIT would specialise it: every pointer and stride a multiple of 16 (Triton pipelines
    only loads it can prove aligned: without these hints it compiles another, unpipelined kernel)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hypic.ops.moe_rows import _kernel

    num_cols, contraction = (inter, hidden) if swiglu else (hidden, inter)
    fn = _kernel()
    constexprs = dict(N=num_cols, KD=contraction, GATHER=swiglu, SWIGLU=swiglu, BM=config.block_m,
                      BN=config.block_n, BK=config.block_k)
    types = dict(a="*bf16", a_row_of="*i64", w="*bf16", out="*bf16", ends="*i64", stride_a="i32", stride_we="i32",
                 stride_wn="i32", stride_out="i32")
    signature = {a: "constexpr" if a in constexprs else types[a] for a in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if a not in constexprs}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=config.num_warps, num_stages=config.num_stages))


def test_rows_kernel_compiles_for_sm90_pipelined():
    """Both GEMMs at the default tiles compile for the H200 with pipelined (cp.async) loads."""
    pytest.importorskip("triton")
    for swiglu in (True, False):
        assert "cp.async" in compile_rows_sm90(default_config(576 * 8, 256), swiglu).asm["ptx"]


@pytest.mark.cuda
def test_auto_dispatch_picks_rows_for_few_rows_per_expert(monkeypatch):
    import hypic.ops.moe as moe_module

    calls = []
    real = moe_module.moe_experts_rows
    monkeypatch.setattr(moe_module, "moe_experts_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    gate_up = torch.randn(4, 128, 256, device="cuda", dtype=torch.bfloat16)
    down = torch.randn(4, 256, 64, device="cuda", dtype=torch.bfloat16)
    weights, ids = route_topk_softmax(torch.randn(8, 4, device="cuda"), 2, renormalize=True)
    moe_experts(x, gate_up, down, weights.bfloat16(), ids)
    assert calls == [1]
