"""The chain walk's Triton kernels compiled for the H200 (sm_90) on this CPU-only machine.

Triton's interpreter (the other kernel tests) runs the kernels' Python, not their compiled form:
it does not check what only the compiler checks, e.g. that a loop-carried value keeps its type
(a seam compose kernel, since removed, passed every interpreter test and then failed to compile on
the device). Compiling needs no GPU: Triton's NVIDIA backend and its bundled ptxas run anywhere.
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

PTR = {"trans": "*fp32", "state": "*fp32", "init": "*fp32", "incoming": "*fp32", "final": "*fp32",
       "cu_chains": "*i64", "table": "*i64", "source": "*i64", "record": "*i64", "k": "*bf16", "w": "*bf16",
       "u": "*bf16", "g": "*fp32", "cu_spans": "*i64", "span_chunk": "*i64", "v_new": "*bf16", "h_chunks": "*bf16",
       "num_table": "i64", "t_base": "i64", "s_base": "i64", "rows": "*i64", "out": "*fp32", "NW": "i64",
       "spans": "*i64", "out_base": "i64", "base": "*fp32", "base16": "*bf16", "num_tensors": "i32",
       "rot_cos": "*fp32", "rot_sin": "*fp32"}
# Qwen3.5-35B-A3B's linear layers: 16 key heads, 32 value heads, K = V = 128; W read, no rotation
DIMS = dict(H=16, HV=32, K=128, V=128, BK=128, BS=16, USE_G=True, T_UNIT=64, S_UNIT=64, HAS_W=True, ROTATE=False,
            RD=0)


def compile_sm90(fn, constexprs, num_warps=8, num_stages=None):
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as err:  # pragma: no cover - a Triton without these APIs
        pytest.skip(f"this Triton cannot compile ahead of time: {err}")
    names = fn.arg_names
    signature = {a: ("constexpr" if a in constexprs else PTR[a]) for a in names}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    options = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


# (0, True, False, True): a cold prefill's walk recording the states around its written spans;
# t_packed: the bodies' T stored as bf16 planes (hypic/ops/linear/t_planes.py), fused or not
@pytest.mark.parametrize("fuse,long_wy,source,record,t_packed", [
    (0, False, True, False, False), (1, False, True, False, False), (1, True, True, False, False),
    (0, True, False, True, False), (1, False, True, False, True), (0, False, True, False, True),
    (0, True, True, True, True)])
def test_chain_kernel_compiles_for_sm90(fuse, long_wy, source, record, t_packed):
    from hypic.ops.linear._triton_scan_kernel import scan_chain_kernel

    constexprs = dict(DIMS, BV=32, MODE=0, HAS_INIT=False, INTERPRET=False, HAS_SOURCE=source, HAS_RECORD=record,
                      HAS_WY=True, LONG_WY=long_wy, BT=64, FUSE=fuse, T_PACKED=t_packed)
    assert compile_sm90(scan_chain_kernel, constexprs).asm["ptx"]


@pytest.mark.parametrize("rotate", [True, False])
def test_scalar_walk_compiles_for_sm90(rotate):
    """The walk of a constant-decay family (hypic/ops/linear/_fla_scalar_chain.py) at
    Ring-mini-linear-2.0's shapes (16 heads, K = V = 128, RoPE on 64 key dims): scalar T, no W,
    the bodies' S rotated on load or not, in the config its scalar mode is pruned to."""
    from hypic.ops.linear._triton_scan_kernel import scan_chain_kernel

    constexprs = dict(DIMS, H=16, HV=16, BV=32, MODE=2, HAS_INIT=False, INTERPRET=False, HAS_SOURCE=True,
                      HAS_RECORD=False, HAS_WY=True, LONG_WY=False, BT=64, FUSE=0, T_PACKED=False, HAS_W=False,
                      ROTATE=rotate, RD=64 if rotate else 0)
    assert compile_sm90(scan_chain_kernel, constexprs, num_warps=4, num_stages=2).asm["ptx"]


def test_pack_planes_kernel_compiles_for_sm90():
    """The in-place packing of written entries' T (a whole K = 128 head per program)."""
    from hypic.ops.linear._t_planes_kernel import pack_planes_kernel

    ptx = compile_sm90(pack_planes_kernel, dict(KK=128 * 128, BLOCK=128 * 128)).asm["ptx"]
    assert "bar.sync" in ptx or "barrier.sync" in ptx  # every load before the in-place stores


@pytest.mark.parametrize("bv,table", [(32, False), (64, True)])
def test_zero_start_from_states_kernel_compiles_for_sm90(bv, table):
    """Also with T read and S written through a store entries' address table (TABLE)."""
    from hypic.ops.linear._state_summary_kernel import zero_start_from_states_kernel

    constexprs = dict(HV=32, K=128, V=128, BK=128, BV=bv, BKK=32, INTERPRET=False, TABLE=table)
    assert compile_sm90(zero_start_from_states_kernel, constexprs).asm["ptx"]


def test_cold_walk_compiles_with_deeper_pipelines_for_sm90():
    """The configs a chain of live spans alone is tuned over (three stages, no T tile)."""
    from hypic.ops.linear._triton_scan_kernel import scan_chain_kernel

    constexprs = dict(DIMS, BV=64, MODE=0, HAS_INIT=False, INTERPRET=False, HAS_SOURCE=False, HAS_RECORD=True,
                      HAS_WY=True, LONG_WY=True, BT=64, FUSE=0, T_PACKED=False)
    assert compile_sm90(scan_chain_kernel, constexprs, num_warps=4, num_stages=3).asm["ptx"]


@pytest.mark.parametrize("bc,num_warps,out_table", [(32, 2, False), (64, 4, False), (64, 4, True)])
def test_wy_transition_kernel_compiles_for_sm90(bc, num_warps, out_table):
    """The written spans' T (hypic/ops/linear/transition.py) in the configs it is tuned over, also
    written through an address table (OUT_TABLE)."""
    from hypic.ops.linear._transition_kernel import wy_transition_kernel

    constexprs = dict(H=16, HV=32, K=128, BK=128, BC=bc, BT=64, USE_G=True, INTERPRET=False, OUT_TABLE=out_table)
    assert compile_sm90(wy_transition_kernel, constexprs, num_warps=num_warps, num_stages=3).asm["ptx"]


@pytest.mark.parametrize("rows,gated,warps,block_c", [(16, True, 2, 128), (64, True, 4, 128), (64, True, 8, 32),
                                                      (16, False, 4, 64)])
def test_short_wy_kernels_compile_for_sm90(rows, gated, warps, block_c):
    """short_wy's WY step (its inverse: ieee dots at 16 rows, 3xTF32 above; w and u in column
    blocks of BC) and output kernel, at launch configs the dispatcher and the benchmark use."""
    from hypic.ops.linear._short_wy_kernel import short_output_kernel, short_wy_kernel

    PTR.update({"v": "*bf16", "beta": "*bf16", "cu": "*i64", "span_ids": "*i64", "gc": "*fp32", "q": "*bf16",
                "h": "*bf16", "o": "*bf16", "scale": "fp32", "span_chunk": "*i32"})
    wy = dict(H=16, HV=32, K=128, V=128, BV=128, BT=rows, LOG2_BT=rows.bit_length() - 1, USE_G=gated,
              INV_PRECISION="ieee" if rows <= 16 else "tf32x3", IO_PRECISION="tf32", BC=block_c)
    assert compile_sm90(short_wy_kernel, wy, num_warps=warps).asm["ptx"]
    out = dict(H=16, HV=32, K=128, V=128, BT=rows, BV=64, USE_G=gated)
    assert compile_sm90(short_output_kernel, out, num_warps=warps).asm["ptx"]
