"""The row-block MoE path (hypic.ops.moe_rows) against the per-expert reference in hypic.ops.moe.

CPU: the expert ends, the config checks and the dispatch rule; the Triton kernel itself through
``TRITON_INTERPRET=1`` in a subprocess when Triton is installed (fp16: the interpreter's bf16
arithmetic is not faithful). CUDA: bf16 against the reference at the 35B-A3B expert shapes, with
NaN-poisoned output rows. Every kernel variant of ``RowsConfig`` (swap-AB, the stream kernel with and
without TMA descriptors) both ways, against the reference and against the default kernel; and
each variant compiled for the H200 (sm_90) on the CPU, which the interpreter does not check.
"""

from __future__ import annotations

import math
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
    with pytest.raises(ValueError, match="kernel"):
        RowsConfig(kernel="fused")
    with pytest.raises(ValueError, match="swap_ab"):
        RowsConfig(swap_ab=1)
    with pytest.raises(ValueError, match="group_n"):
        RowsConfig(kernel="stream", group_n=3)
    with pytest.raises(ValueError, match="need kernel='stream'"):
        RowsConfig(group_n=2)
    with pytest.raises(ValueError, match="need kernel='stream'"):
        RowsConfig(tma=True)
    with pytest.raises(ValueError, match="block_n <= 256"):
        RowsConfig(kernel="stream", tma=True, block_n=512)
    default = RowsConfig()  # today's kernel and tiles
    assert (default.kernel, default.swap_ab, default.group_n, default.tma) == ("tiles", False, 1, False)
    assert default_config(192 * 8, 256).block_m == 16  # 8k all-hit: 6 rows per expert
    assert default_config(576 * 8, 256).block_m == 32  # 32k all-hit: 18
    assert default_config(670 * 8, 256).block_m == 32  # 32k rag: 21
    assert default_config(1024 * 8, 256).block_m == 64
    assert rows_preferred(576 * 8, 256) and rows_preferred(1024 * 8, 256)
    assert not rows_preferred(2048 * 8, 256) and not rows_preferred(32768 * 8, 256)


def test_env_configs_for_ab_runs(monkeypatch):
    from hypic.ops import moe_rows
    from hypic.ops.moe_rows import CONFIG_ENV, default_configs, parse_config

    monkeypatch.delenv(CONFIG_ENV, raising=False)
    base = default_config(576 * 8, 256)
    assert default_configs(576 * 8, 256) == (base, base)
    monkeypatch.setenv(CONFIG_ENV, "kernel=stream,swap_ab=1,group_n=8,tma=1,num_stages=4|swap_ab=1")
    up, down = default_configs(576 * 8, 256)
    assert up == RowsConfig(block_m=32, kernel="stream", swap_ab=True, group_n=8, tma=True, num_stages=4)
    assert down == RowsConfig(block_m=32, swap_ab=True)
    monkeypatch.setenv(CONFIG_ENV, "block_m=64|")
    assert default_configs(192 * 8, 256) == (RowsConfig(block_m=64), RowsConfig(block_m=16))
    for bad, match in (("swap_ab=1", "GATE_UP_SPEC"), ("colour=red|", "field=value"), ("swap_ab|", "field=value"),
                       ("tma=yes|", "tma must be 0 or 1"), ("block_n=big|", "integer"), ("block_n=24|", "block_n")):
        monkeypatch.setenv(CONFIG_ENV, bad)
        with pytest.raises(ValueError, match=match):
            default_configs(576 * 8, 256)
    assert parse_config("", 16) == RowsConfig()
    # the routed path takes the pair: gate_up's config for the first GEMM, down's for the second
    seen = []
    monkeypatch.setattr(moe_rows, "rows_gemm", lambda *a, config, **k: seen.append(config))
    monkeypatch.setattr(moe_rows, "mix_sorted_rows", lambda *a: None)
    monkeypatch.setenv(CONFIG_ENV, "swap_ab=1|num_stages=4")
    moe_rows.moe_experts_rows(torch.zeros(4, 8), torch.zeros(3, 6, 8), torch.zeros(3, 8, 3), torch.ones(4, 2),
                              torch.zeros(4, 2, dtype=torch.long))
    assert seen == [RowsConfig(swap_ab=True), RowsConfig(num_stages=4)]


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

    def case(dtype, device, tokens, experts, top_k, hidden, inter, block_m, used=None, seed=0, variant=None,
             down_variant=None):
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
        # small tiles by default; a variant's fields (kernel, swap_ab, group_n, tma, tiles) override
        # them, down_variant's for the second GEMM (default: the first's)
        small = dict(block_m=block_m, block_n=16, block_k=32)
        config = moe_rows.RowsConfig(**dict(small, **(variant or {})))
        down_config = moe_rows.RowsConfig(**dict(small, **(down_variant or variant or {})))
        # the two launches alone, into NaN-poisoned rows: every sorted row is written
        sorted_ids, order = torch.sort(ids_d.reshape(-1), stable=True)
        ends = expert_ends(sorted_ids, experts)

        def launches(config, down_config):
            hidden_rows = torch.full((tokens * top_k, inter), float("nan"), device=device, dtype=dtype)
            moe_rows.rows_gemm(dev[0], order // top_k, dev[1], hidden_rows, ends, swiglu=True, config=config)
            rows_out = torch.full((tokens * top_k, hidden), float("nan"), device=device, dtype=dtype)
            moe_rows.rows_gemm(hidden_rows, None, dev[2], rows_out, ends, swiglu=False, config=down_config)
            assert not torch.isnan(hidden_rows).any() and not torch.isnan(rows_out).any()
            return hidden_rows, rows_out

        got = launches(config, down_config)
        worst = 0.0
        if variant or down_variant:  # also against the default kernel's rows (at its small tiles)
            base = moe_rows.RowsConfig(**small)
            for mine, theirs in zip(got, launches(base, base)):
                worst = max(worst, float((mine.double() - theirs.double()).norm() / theirs.double().norm()))
        out = moe_rows.moe_experts_rows(*dev, ids_d, config=config, down_config=down_config)
        assert out.dtype == dtype and out.shape == ref.shape and not torch.isnan(out).any()
        return max(worst, float((out.cpu().double() - ref).norm() / ref.norm()))

    def variant_cases(variant):
        # 8 experts, 4 of them empty (at both ends and inside), the others ~20 rows each: two row
        # blocks of 16; partial column tiles (inter 24, hidden 48); fp32 with a down contraction
        # (inter 64) of two blocks of 32
        worst = case(torch.float16, "cpu", 40, 8, 2, 64, 32, 16, used=[1, 2, 4, 6], seed=1, variant=variant)
        worst = max(worst, case(torch.float16, "cpu", 9, 6, 4, 48, 24, 32, seed=2, variant=variant))
        return max(worst, case(torch.float32, "cpu", 12, 8, 2, 32, 64, 16, seed=3, variant=variant))
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


# Each kernel variant at small tiles: one contraction block per tile (block_k 64 >= hidden 64 or
# 48: the activation rows loaded once) and several; one column tile per program and several.
VARIANTS = {
    "tiles_swap": [dict(swap_ab=True), dict(swap_ab=True, block_k=64)],
    "stream": [dict(kernel="stream"), dict(kernel="stream", group_n=4), dict(kernel="stream", group_n=2, swap_ab=True),
               dict(kernel="stream", group_n=4, block_k=64, swap_ab=True)],
    "stream_tma": [dict(kernel="stream", tma=True), dict(kernel="stream", group_n=4, tma=True, swap_ab=True),
                   dict(kernel="stream", group_n=2, block_k=64, tma=True)],
}


@pytest.mark.parametrize("family", sorted(VARIANTS))
def test_rows_kernel_variants_interpreted(family):
    """Every variant against the reference and against the default kernel's rows."""
    script = CASE + f"variants = {VARIANTS[family]!r}\n" + textwrap.dedent("""
        descriptors = []  # the TMA variants run through descriptors, not the pointer fallback
        real_descriptor = moe_rows._weight_descriptor
        moe_rows._weight_descriptor = lambda w, config: descriptors.append(1) or real_descriptor(w, config)
        worst = max(variant_cases(v) for v in variants)
        assert bool(descriptors) == any(v.get("tma") for v in variants)
        print(worst)
    """)
    assert interpreted_error(script) < 2e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only")
@pytest.mark.parametrize("tokens,block_m", [(192, 16), (576, 32), (576, 16), (2048, 64)])
def test_rows_kernel_cuda_bf16(tokens, block_m):
    namespace = {}
    exec(CASE, namespace)
    # 35B-A3B expert shapes (H 2048, I 512), 64 experts to keep the fp64 reference quick
    err = namespace["case"](torch.bfloat16, "cuda", tokens, 64, 8, 2048, 512, block_m, seed=tokens)
    assert err < 1e-2, err


# The variants at the H200's tiles: (gate_up, down); block_k 512 is the down GEMM's whole
# contraction in one block (too much shared memory for gate_up's two weight blocks a stage).
CUDA_VARIANTS = [(dict(swap_ab=True, block_n=64, block_k=128), None),
                 (dict(kernel="stream", group_n=8, swap_ab=True, block_n=64, block_k=128, num_stages=4), None),
                 (dict(kernel="stream", group_n=8, swap_ab=True, tma=True, block_n=64, block_k=128, num_stages=4),
                  dict(kernel="stream", group_n=4, swap_ab=True, tma=True, block_n=64, block_k=512, num_stages=2)),
                 (dict(kernel="stream", group_n=4, block_n=64, block_k=128, num_stages=3),
                  dict(kernel="stream", group_n=4, block_n=64, block_k=512, num_stages=2))]


def variant_id(pair):
    return "_".join("-".join(f"{k}={v[k]}" for k in sorted(v)) for v in pair if v)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only")
@pytest.mark.parametrize("pair", CUDA_VARIANTS, ids=variant_id)
def test_rows_kernel_variants_cuda_bf16(pair):
    namespace = {}
    exec(CASE, namespace)
    # 72 rows per expert: three row blocks of 32
    err = namespace["case"](torch.bfloat16, "cuda", 576, 64, 8, 2048, 512, 32, seed=5, variant=pair[0],
                            down_variant=pair[1])
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
    fn = _kernel(config.kernel)
    tma = config.kernel == "stream" and config.tma
    constexprs = dict(N=num_cols, KD=contraction, GATHER=swiglu, SWIGLU=swiglu, BM=config.block_m,
                      BN=config.block_n, BK=config.block_k, SWAP_AB=config.swap_ab)
    if config.kernel == "stream":
        tiles = triton.cdiv(num_cols, config.block_n)
        constexprs.update(GROUP=math.gcd(config.group_n, tiles), TMA=tma)
    types = dict(a="*bf16", a_row_of="*i64", w="*bf16", out="*bf16", ends="*i64", stride_a="i32", stride_we="i32",
                 stride_wn="i32", stride_out="i32")
    if tma:
        types["w"] = f"tensordesc<bf16[{config.block_n},{config.block_k}]>"
    signature = {a: "constexpr" if a in constexprs else types[a] for a in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
             if a not in constexprs and not types[a].startswith("tensordesc")}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=config.num_warps, num_stages=config.num_stages))


@pytest.mark.parametrize("pair", [(dict(), None)] + CUDA_VARIANTS, ids=lambda p: variant_id(p) or "default")
def test_rows_kernel_variants_compile_for_sm90(pair):
    """Both GEMMs of each variant compile for the H200, pipelined (cp.async or TMA copies), with
    wgmma where the swapped tile's M is 64 rows of weights."""
    pytest.importorskip("triton")
    for swiglu, variant in ((True, pair[0]), (False, pair[1] or pair[0])):
        config = RowsConfig(**dict(dict(block_m=32), **variant))
        ptx = compile_rows_sm90(config, swiglu).asm["ptx"]
        assert "cp.async" in ptx  # pipelined: cp.async (activations, pointer weights) or TMA bulk copies
        if config.tma:
            assert "cp.async.bulk.tensor" in ptx
        if config.swap_ab:
            assert "wgmma" in ptx


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only")
def test_auto_dispatch_picks_rows_for_few_rows_per_expert(monkeypatch):
    import hypic.ops.moe as moe_module

    calls = []
    real = moe_module.moe_experts_rows
    monkeypatch.setattr(moe_module, "moe_experts_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.delenv("HYPIC_MOE_IMPL", raising=False)
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    gate_up = torch.randn(4, 128, 256, device="cuda", dtype=torch.bfloat16)
    down = torch.randn(4, 256, 64, device="cuda", dtype=torch.bfloat16)
    weights, ids = route_topk_softmax(torch.randn(8, 4, device="cuda"), 2, renormalize=True)
    moe_experts(x, gate_up, down, weights.bfloat16(), ids)
    assert calls == [1]
