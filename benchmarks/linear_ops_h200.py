"""Linear-attention state algebra on the GPU: accuracy of the fla paths, timing, cache bytes.

Usage (H200):  python3 benchmarks/linear_ops_h200.py --out benchmarks/results
               add --quick for fewer repetitions, shorter accuracy inputs, no GLA/DeltaNet timing
CPU plumbing:  python3 benchmarks/linear_ops_h200.py --dry-run --out /tmp/x   (tiny shapes,
               reference only: the "fast" side is the reference itself, so errors are ~0)

Sections (each variant in its own try/except; a failure is recorded in the JSON and the run goes on):
  (a) accuracy: every family's fast path (hypic.ops.linear.fla_paths) against the CPU float64
      reference on the same (bf16-rounded) inputs: outputs, final states, S, T, the state composed
      from span summaries vs a straight run, and naive addition (T dropped) for contrast;
  (b) timing at Qwen3.5-35B-A3B GDN shapes (16 key heads, 32 value heads, K = V = 128, bf16),
      32k tokens as 64 segments of 512: varlen forward alone, summaries alone, forward + summaries,
      64-span chain scan; CUDA events, median of 10 after 3 warm-ups; other families at their shapes;
  (c) bytes per cached segment per layer for each family at its real shapes (assumptions noted);
  (d) JSON with device, versions and every number, written after each section, plus a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hypic.ops.linear import delta, gated_delta, gla, kda, mamba2, simple_gla  # noqa: E402
from hypic.ops.linear.summary import DenseSummary, DiagonalSummary, ScalarSummary  # noqa: E402
from hypic.ops.linear.summary import scan_chain as ref_scan_chain  # noqa: E402

SECTIONS = ("bytes", "gdn", "scan", "accuracy", "families")
RESULTS: dict = {"meta": {}, "accuracy": {}, "timing_ms": {}, "bytes_per_segment_per_layer": {}, "errors": {}}
OUT_PATH = None


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def save() -> None:
    if OUT_PATH is None:
        return
    with open(OUT_PATH, "w") as fh:
        json.dump(RESULTS, fh, indent=2, sort_keys=True, default=str)


def guarded(section: str, name: str, fn, into=None):
    """Run one variant; record its error text and carry on. ``into=(dict, key)`` stores the result
    there *before* the JSON is saved, so a call cut off right after still keeps it."""
    t0 = time.perf_counter()
    try:
        out = fn()
        log(f"{section}/{name}: ok ({time.perf_counter() - t0:.1f}s)")
        if into is not None:
            into[0][into[1]] = out
        return out
    except Exception as err:  # noqa: BLE001 - the benchmark must keep going
        text = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=6)}"
        RESULTS["errors"][f"{section}/{name}"] = text[-4000:]
        log(f"{section}/{name}: FAILED {type(err).__name__}: {str(err)[:300]}")
        return None
    finally:
        save()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a64 - b64).norm() / b64.norm().clamp_min(1e-300))


# --------------------------------------------------------------------------------------------
# inputs (realistic gates: most heads decay slowly, some fast; beta in (0, 1))
# --------------------------------------------------------------------------------------------

def cu_from_lengths(lengths, device) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.long, device=device)


def make_inputs(family: str, shape: dict, num_tokens: int, device, dtype, seed: int = 0) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    h, hv, kd, vd = shape["H"], shape["HV"], shape["K"], shape["V"]
    t = num_tokens
    head_bias = torch.linspace(2.0, 6.0, hv)  # per-head spread of decay speeds
    if family == "mamba2":
        g_groups = shape["G"]
        x = rnd(t, hv, vd)
        dt = F.softplus(rnd(t, hv) - 2.0)
        a = -torch.exp(torch.linspace(-2.0, 1.0, hv))
        return dict(
            C=rnd(t, g_groups, kd).to(dtype).to(device), B=rnd(t, g_groups, kd).to(dtype).to(device),
            x=x.to(dtype).to(device), dt=dt.float().to(device), A=a.float().to(device),
            D=rnd(hv).float().to(device),
        )
    out = dict(
        q=F.normalize(rnd(t, h, kd), dim=-1).to(dtype).to(device),
        k=F.normalize(rnd(t, h, kd), dim=-1).to(dtype).to(device),
        v=rnd(t, hv, vd).to(dtype).to(device),
    )
    if family in ("gated_delta", "simple_gla"):
        out["g"] = F.logsigmoid(rnd(t, hv) + head_bias).float().to(device)
    if family in ("kda", "gla"):
        out["g"] = F.logsigmoid(rnd(t, hv, kd) + head_bias[:, None]).float().to(device)
    if family in ("gated_delta", "delta", "kda"):
        out["beta"] = torch.sigmoid(rnd(t, hv)).to(dtype).to(device)
    return out


def gate_args(family: str, x: dict) -> tuple:
    return {
        "gated_delta": (x.get("g"), x.get("beta")), "delta": (x.get("beta"),),
        "kda": (x.get("g"), x.get("beta")), "gla": (x.get("g"),), "simple_gla": (x.get("g"),),
    }[family]


def call_forward(mod, family, x, cu, init):
    if family == "mamba2":
        return mod.mamba2_forward(x["C"], x["B"], x["x"], x["dt"], x["A"], x["D"], cu_seqlens=cu, initial_state=init)
    fn = getattr(mod, f"{family}_forward")
    return fn(x["q"], x["k"], x["v"], *gate_args(family, x), cu_seqlens=cu, initial_state=init)


def call_summarize(mod, family, x, cu):
    if family == "mamba2":
        return mod.mamba2_summarize(x["B"], x["x"], x["dt"], x["A"], cu_seqlens=cu)
    return getattr(mod, f"{family}_summarize")(x["k"], x["v"], *gate_args(family, x), cu_seqlens=cu)


def call_decode(mod, family, x, state):
    n = state.shape[0]
    sl = {key: (val[:n] if val.dim() >= 2 else val) for key, val in x.items()}  # A, D stay [HV]
    if family == "mamba2":
        return mod.mamba2_decode(sl["C"], sl["B"], sl["x"], sl["dt"], sl["A"], state, sl["D"])
    return getattr(mod, f"{family}_decode")(sl["q"], sl["k"], sl["v"], *gate_args(family, sl), state)


def transition_of(summary) -> torch.Tensor:
    return summary.transition if isinstance(summary, DenseSummary) else summary.log_decay


REF_MODULES = {"gated_delta": gated_delta, "delta": delta, "kda": kda, "gla": gla,
               "simple_gla": simple_gla, "mamba2": mamba2}

# Real shapes (per layer). H: key heads (Mamba2: B/C groups G), HV: value heads, K: key dim (Mamba2:
# dstate), V: value dim (Mamba2: headdim), conv: channels of the short conv (0 = none).
SHAPES = {
    "gated_delta": dict(H=16, HV=32, K=128, V=128, conv=2 * 16 * 128 + 32 * 128,
                        model="Qwen3.5-35B-A3B GDN (16 key heads, 32 value heads, 128/128)"),
    "kda": dict(H=32, HV=32, K=128, V=128, conv=3 * 32 * 128,
                model="Kimi-Linear KDA (32 heads x 128; q,k,v short convs)"),
    "simple_gla": dict(H=16, HV=16, K=128, V=128, conv=0,
                       model="Ring-mini-linear-2.0 lightning (16 heads x 128, scalar decay)"),
    "simple_gla_minimax": dict(H=64, HV=64, K=128, V=128, conv=0,
                               model="MiniMax-M1 lightning (64 heads x 128, scalar decay)"),
    "mamba2": dict(H=8, G=8, HV=128, K=128, V=64, conv=128 * 64 + 2 * 8 * 128,
                   model="Nemotron-H-like Mamba2 (ASSUMED: 128 heads, headdim 64, dstate 128, 8 groups)"),
    "gla": dict(H=16, HV=16, K=128, V=128, conv=0,
                model="GLA/HGRN2 research model (ASSUMED: 16 heads x 128)"),
    "delta": dict(H=16, HV=16, K=128, V=128, conv=3 * 16 * 128,
                  model="DeltaNet research model (ASSUMED: 16 heads x 128, q/k/v short convs)"),
}

REAL_SHAPES = {name: dict(shape) for name, shape in SHAPES.items()}  # --dry-run shrinks SHAPES only


# --------------------------------------------------------------------------------------------
# (a) accuracy
# --------------------------------------------------------------------------------------------

def accuracy_family(family: str, fast, device, dtype, lengths) -> dict:
    shape = SHAPES[family]
    num_tokens = sum(lengths)
    x = make_inputs(family, shape, num_tokens, device, dtype, seed=1)
    x64 = {key: val.detach().cpu().double() for key, val in x.items()}
    cu = cu_from_lengths(lengths, device)
    cu_cpu = cu.cpu()
    n = len(lengths)
    hv, kd, vd = shape["HV"], shape["K"], shape["V"]
    gen = torch.Generator().manual_seed(7)
    init = torch.randn(n, hv, kd, vd, generator=gen).to(device)
    ref = REF_MODULES[family]
    res: dict = {"lengths": list(lengths), "dtype": str(dtype)}

    o_ref, f_ref = call_forward(ref, family, x64, cu_cpu, init.cpu().double())
    o, f = call_forward(fast, family, x, cu, init)
    res["forward_output_rel"] = rel(o, o_ref)
    res["forward_final_state_rel"] = rel(f, f_ref)

    s_ref = call_summarize(ref, family, x64, cu_cpu)
    s = call_summarize(fast, family, x, cu)
    res["summary_S_rel"] = rel(s.state, s_ref.state)
    res["summary_T_rel"] = rel(transition_of(s), transition_of(s_ref))
    res["summary_type"] = type(s).__name__

    combined = getattr(fast, f"{family}_forward_and_summarize", None)
    if combined is not None:
        o2, f2, s2 = combined(x["q"], x["k"], x["v"], *gate_args(family, x), cu_seqlens=cu, initial_state=init)
        res["combined_with_init"] = dict(output_rel=rel(o2, o_ref), final_rel=rel(f2, f_ref),
                                         S_rel=rel(s2.state, s_ref.state),
                                         T_rel=rel(transition_of(s2), transition_of(s_ref)))
        # zero start: the final states are S(C|0) (CPU reference); outputs vs the fast forward
        o3, f3, s3 = combined(x["q"], x["k"], x["v"], *gate_args(family, x), cu_seqlens=cu, initial_state=None)
        o_zero, _ = call_forward(fast, family, x, cu, None)
        res["combined_zero_init"] = dict(output_vs_fast_forward_rel=rel(o3, o_zero),
                                         final_vs_ref_S_rel=rel(f3, s_ref.state),
                                         S_rel=rel(s3.state, s_ref.state),
                                         T_rel=rel(transition_of(s3), transition_of(s_ref)))

    # composition: the spans as ONE sequence, started from one state, vs a scan over summaries
    one = torch.tensor([0, num_tokens], dtype=torch.long)
    h0 = init[:1]
    _, straight_ref = call_forward(ref, family, x64, one, h0.cpu().double())
    _, straight_fast = call_forward(fast, family, x, one.to(device), h0)
    _, composed = fast.scan_chain(s, torch.tensor([0, n], dtype=torch.long, device=device), h0)
    _, composed_ref = ref_scan_chain(s_ref, torch.tensor([0, n], dtype=torch.long), h0.cpu().double())
    naive = h0.double().cpu() + s_ref.state.sum(0, keepdim=True)
    res["straight_fast_vs_ref_rel"] = rel(straight_fast, straight_ref)
    res["composed_fast_vs_straight_ref_rel"] = rel(composed, straight_ref)
    res["composed_fast_vs_straight_fast_rel"] = rel(composed, straight_fast)
    res["composed_ref64_vs_straight_ref64_rel"] = rel(composed_ref, straight_ref)
    res["naive_addition_vs_straight_ref_rel"] = rel(naive, straight_ref)

    dec_state = f[: min(n, 3)].contiguous()
    od, sd = call_decode(fast, family, x, dec_state)
    odr, sdr = call_decode(ref, family, x64, dec_state.cpu().double())
    res["decode_output_rel"] = rel(od, odr)
    res["decode_state_rel"] = rel(sd, sdr)
    return res


def accuracy_dispatch(device, dtype) -> dict:
    """Public reference functions on CUDA tensors must route to fla_paths (same numbers)."""
    from hypic.ops.linear import fla_paths

    x = make_inputs("gated_delta", SHAPES["gated_delta"], 200, device, dtype, seed=3)
    cu = cu_from_lengths([120, 80], device)
    o1, f1 = gated_delta.gated_delta_forward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens=cu)
    o2, f2 = fla_paths.gated_delta_forward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens=cu)
    return {"public_vs_fla_paths_output_rel": rel(o1, o2), "public_vs_fla_paths_state_rel": rel(f1, f2)}


# --------------------------------------------------------------------------------------------
# (b) timing
# --------------------------------------------------------------------------------------------

def bench_ms(fn, device, reps: int = 10, warmup: int = 3) -> dict:
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "reps": reps}


def timing_gdn(fast, device, dtype, num_segments, seg_len, reps) -> dict:
    shape = SHAPES["gated_delta"]
    num_tokens = num_segments * seg_len
    x = make_inputs("gated_delta", shape, num_tokens, device, dtype, seed=2)
    cu = cu_from_lengths([seg_len] * num_segments, device)
    q, k, v, g, beta = x["q"], x["k"], x["v"], x["g"], x["beta"]
    init = torch.randn(num_segments, shape["HV"], shape["K"], shape["V"], device=device) * 0.1
    out: dict = {"num_tokens": num_tokens, "num_segments": num_segments, "segment_len": seg_len,
                 "shape": {k_: shape[k_] for k_ in ("H", "HV", "K", "V")}, "dtype": str(dtype)}
    r = lambda fn: bench_ms(fn, device, reps=reps)  # noqa: E731

    out["forward_varlen"] = guarded("timing", "gdn_forward", lambda: r(
        lambda: fast.gated_delta_forward(q, k, v, g, beta, cu_seqlens=cu)))
    out["forward_varlen_with_init"] = guarded("timing", "gdn_forward_init", lambda: r(
        lambda: fast.gated_delta_forward(q, k, v, g, beta, cu_seqlens=cu, initial_state=init)))
    out["summaries"] = guarded("timing", "gdn_summaries", lambda: r(
        lambda: fast.gated_delta_summarize(k, v, g, beta, cu_seqlens=cu)))
    combined = getattr(fast, "gated_delta_forward_and_summarize", None)
    if combined is not None:
        out["forward_and_summaries_zero_init"] = guarded("timing", "gdn_combined_zero", lambda: r(
            lambda: combined(q, k, v, g, beta, cu_seqlens=cu)))
        out["forward_and_summaries_with_init"] = guarded("timing", "gdn_combined_init", lambda: r(
            lambda: combined(q, k, v, g, beta, cu_seqlens=cu, initial_state=init)))
    if device.type == "cuda":
        out["breakdown"] = guarded("timing", "gdn_breakdown", lambda: gdn_breakdown(fast, x, cu, reps))
    fwd = (out.get("forward_varlen") or {}).get("median_ms")
    for key in ("forward_and_summaries_zero_init", "forward_and_summaries_with_init", "summaries"):
        val = (out.get(key) or {}).get("median_ms")
        if fwd and val:
            out[f"{key}_over_forward"] = val / fwd

    # accuracy at full scale: composed vs straight (one 32k sequence), and naive addition
    def full_scale_errors():
        summ = fast.gated_delta_summarize(k, v, g, beta, cu_seqlens=cu)
        one = torch.tensor([0, num_tokens], dtype=torch.long, device=device)
        _, straight = fast.gated_delta_forward(q, k, v, g, beta, cu_seqlens=one)
        _, composed = fast.scan_chain(summ, torch.tensor([0, num_segments], dtype=torch.long, device=device))
        naive = summ.state.sum(0, keepdim=True)
        return {"composed_vs_straight_rel": rel(composed, straight),
                "naive_addition_vs_straight_rel": rel(naive, straight)}

    out["full_scale_state_errors"] = guarded("timing", "gdn_full_scale_errors", full_scale_errors)
    return out


def gdn_breakdown(fast, x, cu, reps) -> dict:
    """Kernel-level split of forward + summaries (private fla calls, as used by fla_paths)."""
    q4, k4, v4, beta3 = (t.unsqueeze(0) for t in (x["q"], x["k"], x["v"], x["beta"]))
    g3 = x["g"].unsqueeze(0)
    ci = fast._chunk_indices(cu)
    n = cu.numel() - 1
    device = x["q"].device
    gc = fast._local_cumsum(g3, cu, ci)
    w, u = fast._wy_intra(k4, v4, gc, beta3, cu, ci)
    scale = x["k"].shape[-1] ** -0.5
    r = lambda fn: bench_ms(fn, device, reps=reps)["median_ms"]  # noqa: E731
    return {
        "cumsum": r(lambda: fast._local_cumsum(g3, cu, ci)),
        "wy_intra": r(lambda: fast._wy_intra(k4, v4, gc, beta3, cu, ci)),
        "state_and_output": r(lambda: fast._wy_state_and_output(x["q"].unsqueeze(0), k4, w, u, gc, None, cu, ci, scale)),
        "cp_summary_full": r(lambda: fast._cp_summaries(k4, w, u, gc, None, cu, n, transition_only=False)),
        "cp_summary_transition_only": r(lambda: fast._cp_summaries(k4, w, u, gc, None, cu, n, transition_only=True)),
    }


def timing_scan(fast, device, num_segments, reps) -> dict:
    from hypic.ops.linear.triton_scan import scan_chain_torch, scan_chain_triton

    shape = SHAPES["gated_delta"]
    hv, kd, vd = shape["HV"], shape["K"], shape["V"]
    gen = torch.Generator().manual_seed(5)
    # contractive dense T like real GDN segments (spectral radius < 1), S of unit scale
    base = torch.randn(num_segments, hv, kd, kd, generator=gen) / kd ** 0.5
    trans = (0.9 * torch.linalg.matrix_exp(0.5 * (base - base.transpose(-1, -2)))).to(device)
    state = torch.randn(num_segments, hv, kd, vd, generator=gen).to(device)
    dense = DenseSummary(trans, state)
    cu1 = torch.tensor([0, num_segments], dtype=torch.long, device=device)
    cu8 = torch.arange(0, num_segments + 1, max(1, num_segments // 8), dtype=torch.long, device=device)
    r = lambda fn: bench_ms(fn, device, reps=reps)  # noqa: E731
    out: dict = {"num_segments": num_segments, "shape": {"HV": hv, "K": kd, "V": vd}}
    out["fast_one_chain"] = guarded("timing", "scan_fast", lambda: r(lambda: fast.scan_chain(dense, cu1)))
    if device.type == "cuda":
        out["triton_ieee_one_chain"] = guarded("timing", "scan_ieee", lambda: r(
            lambda: scan_chain_triton(dense, cu1, None, precision="ieee")))
        out["fast_8_chains"] = guarded("timing", "scan_8_chains", lambda: r(lambda: fast.scan_chain(dense, cu8)))
    out["torch_batched_one_chain"] = guarded("timing", "scan_torch", lambda: r(lambda: scan_chain_torch(dense, cu1)))

    def loop():
        h = torch.zeros(hv, kd, vd, device=device)
        for i in range(num_segments):
            h = trans[i] @ h + state[i]
        return h

    out["python_loop_bmm"] = guarded("timing", "scan_python_loop", lambda: r(loop))

    def errors():
        d64 = DenseSummary(dense.transition.double(), dense.state.double())
        inc64, fin64 = scan_chain_torch(d64, cu1)
        inc, fin = fast.scan_chain(dense, cu1)
        res = {"fast_final_rel": rel(fin, fin64), "fast_incoming_rel": rel(inc, inc64)}
        if device.type == "cuda":
            inc_i, fin_i = scan_chain_triton(dense, cu1, None, precision="ieee")
            res["ieee_final_rel"] = rel(fin_i, fin64)
        for name, summ in (("scalar", ScalarSummary(-torch.rand(num_segments, hv, device=device), state)),
                           ("diagonal", DiagonalSummary(-torch.rand(num_segments, hv, kd, device=device), state))):
            i64, f64 = scan_chain_torch(type(summ)(summ.log_decay.double(), summ.state.double()), cu8)
            i32, f32 = fast.scan_chain(summ, cu8)
            res[f"{name}_final_rel"] = rel(f32, f64)
            res[f"{name}_incoming_rel"] = rel(i32, i64)
            res[f"{name}_fast_ms"] = bench_ms(lambda: fast.scan_chain(summ, cu1), device, reps=reps)["median_ms"]
        return res

    out["errors"] = guarded("timing", "scan_errors", errors)
    return out


def timing_family(fast, family, device, dtype, num_segments, seg_len, reps) -> dict:
    shape = SHAPES[family]
    x = make_inputs(family, shape, num_segments * seg_len, device, dtype, seed=4)
    cu = cu_from_lengths([seg_len] * num_segments, device)
    r = lambda fn: bench_ms(fn, device, reps=reps)  # noqa: E731
    out = {"shape": {k_: v_ for k_, v_ in shape.items() if k_ != "model"}, "model": shape["model"],
           "num_tokens": num_segments * seg_len}
    out["forward_varlen"] = guarded("timing", f"{family}_forward", lambda: r(
        lambda: call_forward(fast, family, x, cu, None)))
    out["summaries"] = guarded("timing", f"{family}_summaries", lambda: r(
        lambda: call_summarize(fast, family, x, cu)))
    combined = getattr(fast, f"{family}_forward_and_summarize", None)
    if combined is not None:
        out["forward_and_summaries_zero_init"] = guarded("timing", f"{family}_combined", lambda: r(
            lambda: combined(x["q"], x["k"], x["v"], *gate_args(family, x), cu_seqlens=cu)))
    return out


# --------------------------------------------------------------------------------------------
# (c) bytes per cached segment per layer
# --------------------------------------------------------------------------------------------

def bytes_per_segment() -> dict:
    structure = {"gated_delta": "dense", "delta": "dense", "kda": "dense", "gla": "diagonal",
                 "simple_gla": "scalar", "simple_gla_minimax": "scalar", "mamba2": "scalar"}
    conv_width = 4
    out = {}
    for family, kind in structure.items():
        s = REAL_SHAPES[family]
        hv, kd, vd = s["HV"], s["K"], s["V"]
        state = torch.zeros(1, hv, kd, vd)
        if kind == "dense":
            summ = DenseSummary(torch.zeros(1, hv, kd, kd), state)
        elif kind == "diagonal":
            summ = DiagonalSummary(torch.zeros(1, hv, kd), state)
        else:
            summ = ScalarSummary(torch.zeros(1, hv), state)
        conv_tail = s["conv"] * (conv_width - 1) * 2  # last W-1 conv inputs, bf16
        out[family] = {
            "model": s["model"], "T_structure": kind,
            "summary_bytes_fp32": summ.nbytes,
            "S_bytes": state.numel() * 4, "T_bytes": summ.nbytes - state.numel() * 4,
            "conv_tail_bytes_bf16": conv_tail,
            "total_bytes": summ.nbytes + conv_tail,
            "total_MiB": (summ.nbytes + conv_tail) / 2 ** 20,
        }
    return out


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------

def versions() -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__}
    for mod in ("triton", "fla"):
        try:
            info[mod] = getattr(__import__(mod), "__version__", "?")
        except Exception as err:  # noqa: BLE001
            info[mod] = f"unavailable: {type(err).__name__}"
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    else:
        info["device"] = "cpu"
    return info


def print_table() -> None:
    print("\n=== accuracy (relative errors vs CPU float64 reference) ===")
    keys = ["forward_output_rel", "forward_final_state_rel", "summary_S_rel", "summary_T_rel",
            "composed_fast_vs_straight_ref_rel", "naive_addition_vs_straight_ref_rel", "decode_state_rel"]
    print(f"{'family':<14}" + "".join(f"{k[:22]:>24}" for k in keys))
    for fam, res in RESULTS["accuracy"].items():
        if isinstance(res, dict) and "summary_S_rel" in res:
            print(f"{fam:<14}" + "".join(f"{res.get(k, float('nan')):>24.3e}" for k in keys))
    print("\n=== timing (median ms) ===")
    for name, res in RESULTS["timing_ms"].items():
        if not isinstance(res, dict):
            continue
        for key, val in res.items():
            if isinstance(val, dict) and "median_ms" in val:
                print(f"  {name:<14} {key:<40} {val['median_ms']:10.3f}")
            elif isinstance(val, float):
                print(f"  {name:<14} {key:<40} {val:10.4g}")
            elif isinstance(val, dict):
                for k2, v2 in val.items():
                    if isinstance(v2, float):
                        print(f"  {name:<14} {key + '.' + k2:<40} {v2:10.4g}")
    print("\n=== bytes per cached segment per layer ===")
    for fam, res in RESULTS["bytes_per_segment_per_layer"].items():
        print(f"  {fam:<20} T {res['T_structure']:<8} summary {res['summary_bytes_fp32']:>10} B"
              f"  conv tail {res['conv_tail_bytes_bf16']:>7} B  total {res['total_MiB']:.3f} MiB  ({res['model']})")
    if RESULTS["errors"]:
        print(f"\n{len(RESULTS['errors'])} variant(s) failed: " + ", ".join(RESULTS["errors"]))


def main() -> int:
    global OUT_PATH
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results", help="directory for the JSON results")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, shorter accuracy inputs, no GLA/DeltaNet timing")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, reference only")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)} (run in that order)")
    parser.add_argument("--families", default="gated_delta,kda,delta,gla,simple_gla,mamba2",
                        help="comma-separated families for the accuracy section (several processes can "
                             "split them; each writes linear_ops_h200[_TAG].json)")
    parser.add_argument("--tag", default="", help="suffix of the JSON file name")
    args = parser.parse_args()
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    bad = sorted(set(families) - {"gated_delta", "kda", "delta", "gla", "simple_gla", "mamba2"})
    if bad:
        parser.error(f"unknown families {bad}")
    sections = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {SECTIONS}")
    os.makedirs(args.out, exist_ok=True)
    OUT_PATH = os.path.join(args.out, ("linear_ops_dry_run" if args.dry_run else "linear_ops_h200")
                            + (f"_{args.tag}" if args.tag else "") + ".json")
    started = time.perf_counter()

    if args.dry_run:
        device, dtype = torch.device("cpu"), torch.float32
        fast = _RefShim()
        for fam in SHAPES:  # tiny shapes
            SHAPES[fam] = dict(SHAPES[fam], H=2, HV=4, K=16, V=8, G=2) if fam == "mamba2" else \
                dict(SHAPES[fam], H=2, HV=4, K=16, V=8)
        acc_lengths, num_segments, seg_len, reps = [37, 5, 70], 8, 32, 2
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: use --dry-run on CPU", flush=True)
            return 2
        from hypic.ops.linear import fla_paths as fast

        device, dtype = torch.device("cuda"), torch.bfloat16
        acc_lengths = [300, 77, 200, 135] if not args.quick else [130, 77, 64]
        num_segments, seg_len, reps = 64, 512, (5 if args.quick else 10)
    RESULTS["meta"] = {"versions": versions(), "args": vars(args), "dtype": str(dtype),
                       "timing_method": "CUDA events, median after 3 warm-ups" if device.type == "cuda" else "perf_counter"}
    log(f"device {RESULTS['meta']['versions'].get('device')}; out {OUT_PATH}")
    save()

    if "bytes" in sections:
        if guarded("bytes", "all", bytes_per_segment, into=(RESULTS, "bytes_per_segment_per_layer")) is None:
            RESULTS["bytes_per_segment_per_layer"] = {}

    # GDN first: the headline numbers
    if "gdn" in sections:
        guarded("timing", "gdn", lambda: timing_gdn(fast, device, dtype, num_segments, seg_len, reps),
                into=(RESULTS["timing_ms"], "gated_delta_qwen35"))
    if "scan" in sections:
        guarded("timing", "scan", lambda: timing_scan(fast, device, num_segments, reps),
                into=(RESULTS["timing_ms"], "scan_chain"))

    if "accuracy" in sections:
        for family in families:
            guarded("accuracy", family, lambda f=family: accuracy_family(f, fast, device, dtype, acc_lengths),
                    into=(RESULTS["accuracy"], family))
        if device.type == "cuda" and "gated_delta" in families:
            guarded("accuracy", "dispatch", lambda: accuracy_dispatch(device, dtype),
                    into=(RESULTS["accuracy"], "dispatch"))

    if "families" in sections:
        timing_families = ("kda", "simple_gla", "mamba2") if args.quick else ("kda", "simple_gla", "mamba2", "gla", "delta")
        for family in timing_families:
            guarded("timing", family, lambda f=family: timing_family(fast, f, device, dtype, num_segments, seg_len, reps),
                    into=(RESULTS["timing_ms"], family))

    RESULTS["meta"]["wall_s"] = time.perf_counter() - started
    save()
    print_table()
    log(f"done in {RESULTS['meta']['wall_s']:.1f}s; JSON: {OUT_PATH}")
    return 0


class _RefShim:
    """--dry-run stand-in for fla_paths: the reference functions themselves (plumbing check)."""

    def __getattr__(self, name):
        if name == "scan_chain":
            return ref_scan_chain
        family = name.split("_forward")[0].split("_summarize")[0].split("_decode")[0]
        if name.endswith("_forward_and_summarize"):
            raise AttributeError(name)
        module = REF_MODULES.get(family)
        if module is None or not hasattr(module, name):
            raise AttributeError(name)
        return getattr(module, name)


if __name__ == "__main__":
    sys.exit(main())
