"""Where a dense chain-scan step's time goes: one step ``h <- T_i h + S_i`` (fp32, K = V = 128,
32 value heads) written several ways in a bare Triton loop, timed per step over a chain of
bodies, each result against a float64 scan.

Session 12 measured the engine's fused scan at ~6 us per dense step, about 13% of an SM's TF32
tensor rate, and found that one-pass TF32 halves the scan (0.48 against 0.90 ms per layer) while
prefetching T one step ahead in registers made it slower: the step looks bound by its chain of
dependent MMAs, not by memory. The variants test that:

* ``tf32x3``: ``tl.dot(T, h, input_precision="tf32x3")`` (the engine's step);
* ``tf32``: one TF32 pass (not accurate enough for the engine: fla keeps such chains in tf32x3);
* ``split3``: tf32x3 by hand, T and h split into TF32 high and low parts and the three products
  in separate accumulators, summed at the end (independent MMA chains the scheduler can overlap);
* ``halves``: h kept as two 64-row halves and T as four 64 x 64 blocks, each output half the sum of
  two independent half-length tf32x3 products;
* ``ieee``: fp32 FMAs, no tensor cores;
* ``bf16x3``: the engine's ``fp32_dot`` with ``SPLIT`` 1: T and h split into bf16 high and low
  parts, three bf16 MMAs (16 of K per instruction where TF32 takes 8: half of tf32x3's MMAs);
* ``fp16x3``: the same split in fp16 (11 significant bits per part, so tf32x3's accuracy, but
  fp16's range: for measurement only).

    python3 benchmarks/scan_step_h200.py --out OUT   # -> OUT/scan_step.json, a table
    TRITON_INTERPRET=1 python3 benchmarks/scan_step_h200.py --smoke   # CPU check of the variants
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import triton
import triton.language as tl

from hypic.ops.linear._triton_scan_kernel import fp32_dot

VARIANTS = ("tf32x3", "tf32", "split3", "halves", "ieee", "bf16x3", "fp16x3")


@triton.jit
def _tf32_parts(x):
    hi = (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)  # 10 mantissa bits kept
    return hi, x - hi


@triton.jit
def _fp16x3_dot(a, b):
    a_hi = a.to(tl.float16)
    a_lo = (a - a_hi.to(tl.float32)).to(tl.float16)
    b_hi = b.to(tl.float16)
    b_lo = (b - b_hi.to(tl.float32)).to(tl.float16)
    out = tl.dot(a_lo, b_hi, out_dtype=tl.float32)
    out = tl.dot(a_hi, b_lo, out, out_dtype=tl.float32)
    return tl.dot(a_hi, b_hi, out, out_dtype=tl.float32)


@triton.jit
def chain_kernel(trans, state, out, num_steps, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 BV: tl.constexpr, VARIANT: tl.constexpr, SPLIT: tl.constexpr):
    i_v = tl.program_id(0)
    i_h = tl.program_id(1).to(tl.int64)
    o_v = i_v * BV + tl.arange(0, BV)
    HALF: tl.constexpr = K // 2
    o_k = tl.arange(0, K)
    o_a = tl.arange(0, HALF)
    if VARIANT == 3:
        h0 = tl.zeros([HALF, BV], dtype=tl.float32)
        h1 = tl.zeros([HALF, BV], dtype=tl.float32)
    else:
        h = tl.zeros([K, BV], dtype=tl.float32)
    i = num_steps * 0
    while i < num_steps:
        base_t = trans + (i * HV + i_h) * K * K
        base_s = state + (i * HV + i_h) * K * V
        if VARIANT == 3:
            t00 = tl.load(base_t + o_a[:, None] * K + o_a[None, :])
            t01 = tl.load(base_t + o_a[:, None] * K + HALF + o_a[None, :])
            t10 = tl.load(base_t + (HALF + o_a[:, None]) * K + o_a[None, :])
            t11 = tl.load(base_t + (HALF + o_a[:, None]) * K + HALF + o_a[None, :])
            s0 = tl.load(base_s + o_a[:, None] * V + o_v[None, :])
            s1 = tl.load(base_s + (HALF + o_a[:, None]) * V + o_v[None, :])
            n0 = tl.dot(t00, h0, input_precision="tf32x3") + tl.dot(t01, h1, input_precision="tf32x3") + s0
            n1 = tl.dot(t10, h0, input_precision="tf32x3") + tl.dot(t11, h1, input_precision="tf32x3") + s1
            h0 = n0
            h1 = n1
        else:
            b_t = tl.load(base_t + o_k[:, None] * K + o_k[None, :])
            b_s = tl.load(base_s + o_k[:, None] * V + o_v[None, :])
            if VARIANT == 0:
                h = tl.dot(b_t, h, input_precision="tf32x3") + b_s
            elif VARIANT == 1:
                h = tl.dot(b_t, h, input_precision="tf32") + b_s
            elif VARIANT == 2:
                t_hi, t_lo = _tf32_parts(b_t)
                h_hi, h_lo = _tf32_parts(h)
                a = tl.dot(t_hi, h_hi, input_precision="tf32")
                b = tl.dot(t_hi, h_lo, input_precision="tf32")
                c = tl.dot(t_lo, h_hi, input_precision="tf32")
                h = a + (b + c) + b_s
            elif VARIANT == 4:
                h = tl.dot(b_t, h, input_precision="ieee") + b_s
            elif VARIANT == 5:
                h = fp32_dot(b_t, h, "tf32x3", SPLIT) + b_s
            else:
                h = _fp16x3_dot(b_t, h) + b_s
        i += 1
    if VARIANT == 3:
        tl.store(out + (i_h * K + o_a[:, None]) * V + o_v[None, :], h0)
        tl.store(out + (i_h * K + HALF + o_a[:, None]) * V + o_v[None, :], h1)
    else:
        tl.store(out + (i_h * K + o_k[:, None]) * V + o_v[None, :], h)


def run_variant(trans, state, variant: str, block_v: int, num_warps: int) -> torch.Tensor:
    num_steps, hv, k, _ = trans.shape
    v = state.shape[-1]
    out = torch.full((hv, k, v), float("nan"), device=trans.device)
    chain_kernel[(v // block_v, hv)](trans, state, out, num_steps, HV=hv, K=k, V=v, BV=block_v,
                                     VARIANT=VARIANTS.index(variant), num_warps=num_warps,
                                     SPLIT=2 if os.environ.get("TRITON_INTERPRET") == "1" else 1)
    return out


def problem(num_steps: int, hv: int, k: int, v: int, device: str):
    gen = torch.Generator(device="cpu").manual_seed(0)
    eye = torch.eye(k)
    trans = 0.97 * eye + 0.02 * torch.randn(num_steps, hv, k, k, generator=gen) / k ** 0.5 * 8
    state = torch.randn(num_steps, hv, k, v, generator=gen)
    ref = torch.zeros(hv, k, v, dtype=torch.float64)
    for i in range(num_steps):
        ref = trans[i].double() @ ref + state[i].double()
    return trans.to(device), state.to(device), ref


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a = a.double().cpu()
    return float((a - b).norm() / b.norm())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="tiny CPU check under TRITON_INTERPRET=1")
    args = ap.parse_args()
    if args.smoke:
        trans, state, ref = problem(3, 2, 32, 32, "cpu")
        for variant in VARIANTS:
            err = rel(run_variant(trans, state, variant, 16, 4), ref)
            print(f"{variant:>8} rel err {err:.2e}")
            if variant == "fp16x3":
                continue  # the interpreter's fp16 dot is not checked here
            assert err < (1e-2 if variant == "tf32" else 1e-4 if variant == "bf16x3" else 1e-5), variant
        return
    from _timing import event_times_ms

    trans, state, ref = problem(args.steps, 32, 128, 128, "cuda")
    rows = []
    for variant in VARIANTS:
        for block_v, num_warps in ((32, 8), (32, 4), (16, 4), (64, 8)):
            fn = lambda: run_variant(trans, state, variant, block_v, num_warps)  # noqa: E731
            try:
                err = rel(fn(), ref)
                ms = statistics.median(event_times_ms(fn, repeats=args.repeats))
            except Exception as exc:  # a variant that does not compile (shared memory) is reported
                rows.append(dict(variant=variant, block_v=block_v, num_warps=num_warps, error=repr(exc)[:200]))
                continue
            rows.append(dict(variant=variant, block_v=block_v, num_warps=num_warps, ms=ms,
                             us_per_step=ms * 1e3 / args.steps, rel_err=err))
            print(json.dumps(rows[-1]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "scan_step.json"), "w") as f:
        json.dump({"steps": args.steps, "heads": 32, "key_dim": 128, "value_dim": 128, "rows": rows}, f, indent=1)
    print(f"\n{'variant':>8} {'BV':>3} {'warps':>5} {'ms':>7} {'us/step':>8} {'rel err':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:>8} {r['block_v']:>3} {r['num_warps']:>5}  failed: {r['error'][:80]}")
        else:
            print(f"{r['variant']:>8} {r['block_v']:>3} {r['num_warps']:>5} {r['ms']:>7.3f} {r['us_per_step']:>8.2f} "
                  f"{r['rel_err']:>8.1e}")


if __name__ == "__main__":
    main()
