"""Routed-expert GEMMs at a cached request's token counts on one GPU: ``torch._grouped_mm`` (the
grouped path) against the row-block Triton kernel (hypic.ops.moe_rows), with a sweep of the
kernel's tiles, or (``--variants``) of its kernel variants.

Qwen3.5-35B-A3B expert shapes (256 experts, hidden 2048, intermediate 512, top-8), bf16 random
weights and random softmax routing. Per token count: the whole MoE call of each path (sort, both
GEMMs, combine) and, for the rows kernel, each GEMM alone per tile config; GB/s counts the weights
of the experts that got rows (what the GEMMs must stream) plus the activations. The whole calls are
timed as CUDA graph replays (as the engine runs them: inside the row-wise phases' graphs), so host
launch time does not count. Also
the relative error of each path against an fp32 evaluation of the same bf16 operands.

    python3 benchmarks/moe_rows_h200.py --out OUT     (writes OUT/moe_rows.json, prints tables)

``--variants``: instead, each GEMM alone (gate_up, down) for every config of ``GATE_UP_VARIANTS``
/ ``DOWN_VARIANTS`` (swap-AB, the stream kernel with and without TMA descriptors; the current
kernel at its default tiles first) at ``--variant-tokens`` (576, 192, 1024): GPU time between
CUDA events behind a sleep kernel (so the host's launch, a TMA descriptor's encoding included,
does not count), median of ``--repeats``, TB/s of the weights streamed (1.6 GB a layer: far more
than L2, no flush needed), and each variant's output against the current kernel's (max abs
difference, relative error; rows left unwritten show as NaN). Then the whole MoE call as a CUDA
graph replay with the current configs and with the fastest correct pair. Prints tables and
writes OUT/moe_rows_variants.json (after every token count, so a timeout keeps what was done);
``--budget-s`` stops the sweep early (the rest marked skipped). ``--compile-only`` (no GPU
needed): compiles every variant for sm_90 with the local Triton and prints shared memory,
registers and what the PTX uses (wgmma, cp.async, TMA), e.g. to prune configs that do not fit.

    python3 benchmarks/moe_rows_h200.py --variants --out OUT

``--variants --smoke``: the same sweep on the CPU through Triton's interpreter at toy shapes (8
experts, hidden 64, intermediate 32, fp16; wall-clock times, no graphs), to check the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # this tree's hypic (not an installed one) and tests/

from hypic.ops.moe import moe_experts, route_topk_softmax  # noqa: E402
from hypic.ops import moe_rows  # noqa: E402
from hypic.ops.moe_grouped import expert_ends  # noqa: E402

from _timing import event_times_ms  # noqa: E402  (benchmarks/, the script's folder)

EXPERTS, HIDDEN, INTER, TOP_K = 256, 2048, 512, 8
DTYPE = torch.bfloat16
SMOKE = False  # --smoke: CPU, the interpreter, toy shapes (set in main)
H200_SMEM_BYTES = 232448  # the most shared memory one block may have on sm_90 (227 KiB)

# Variant configs per GEMM (RowsConfig fields; block_m: the current default for the token count
# unless given). Shapes: gate_up streams [2 x BN, KD 2048] per tile (SwiGLU: gate and up
# blocks), down [BN, KD 512]. Chosen to separate the effects: swap-AB alone (wgmma), the stream
# kernel's flat loop alone (pointers, no swap), TMA alone (group 1), then combinations with deeper
# pipelines and larger contiguous blocks. `--compile-only` lists their shared memory.
SWAP, STREAM, STREAM_SWAP = dict(swap_ab=True), dict(kernel="stream"), dict(kernel="stream", swap_ab=True)
GATE_UP_VARIANTS = [
    dict(SWAP, block_n=64, block_k=128, num_stages=3),
    dict(SWAP, block_n=64, block_k=128, num_stages=4),
    dict(SWAP, block_n=64, block_k=64, num_stages=6),
    dict(SWAP, block_n=128, block_k=64, num_stages=4, num_warps=8),
    dict(SWAP, block_n=64, block_k=128, num_stages=4, block_m=64),   # taller rows (skewed routing) at little cost?
    dict(STREAM, group_n=8, block_n=64, block_k=128, num_stages=3),  # flat loop, mma.sync
    dict(STREAM_SWAP, group_n=8, block_n=64, block_k=128, num_stages=3),
    dict(STREAM_SWAP, group_n=4, block_n=64, block_k=128, num_stages=4),
    dict(STREAM_SWAP, group_n=1, block_n=64, block_k=128, num_stages=4, tma=True),   # TMA alone
    dict(STREAM_SWAP, group_n=8, block_n=64, block_k=128, num_stages=3, tma=True),
    dict(STREAM_SWAP, group_n=8, block_n=64, block_k=128, num_stages=4, tma=True),
    dict(STREAM_SWAP, group_n=2, block_n=64, block_k=128, num_stages=4, tma=True),
    dict(STREAM_SWAP, group_n=8, block_n=64, block_k=64, num_stages=6, tma=True),
    dict(STREAM_SWAP, group_n=4, block_n=128, block_k=64, num_stages=5, num_warps=8, tma=True),
    dict(STREAM_SWAP, group_n=8, block_n=64, block_k=256, num_stages=2, tma=True),
    dict(STREAM, group_n=8, block_n=64, block_k=128, num_stages=4, tma=True),         # TMA, mma.sync
]
DOWN_VARIANTS = [
    dict(SWAP, block_n=64, block_k=128, num_stages=3),
    dict(SWAP, block_n=64, block_k=128, num_stages=4),
    dict(SWAP, block_n=128, block_k=128, num_stages=3, num_warps=8),
    dict(STREAM, group_n=4, block_n=64, block_k=512, num_stages=2),   # whole rows, rows loaded once, mma.sync
    dict(STREAM_SWAP, group_n=4, block_n=64, block_k=512, num_stages=2),
    dict(STREAM_SWAP, group_n=8, block_n=64, block_k=128, num_stages=4),
    dict(STREAM_SWAP, group_n=1, block_n=64, block_k=512, num_stages=3, tma=True),   # TMA alone
    dict(STREAM_SWAP, group_n=4, block_n=64, block_k=512, num_stages=2, tma=True),
    dict(STREAM_SWAP, group_n=8, block_n=64, block_k=512, num_stages=3, tma=True),
    dict(STREAM_SWAP, group_n=32, block_n=64, block_k=512, num_stages=3, tma=True),  # one program per expert
    dict(STREAM_SWAP, group_n=8, block_n=64, block_k=256, num_stages=4, tma=True),
    dict(STREAM_SWAP, group_n=16, block_n=128, block_k=256, num_stages=2, num_warps=8, tma=True),
    dict(STREAM_SWAP, group_n=8, block_n=128, block_k=128, num_stages=4, num_warps=8, tma=True),
    dict(STREAM_SWAP, group_n=4, block_n=64, block_k=128, num_stages=6, tma=True),
    dict(STREAM, group_n=4, block_n=64, block_k=512, num_stages=2, tma=True),          # TMA, mma.sync
]


def reference_fp32(x, gate_up, down, weights, ids):
    """fp32 evaluation of the bf16 operands, one expert at a time (no [R, 2I, H] blow-up)."""
    out = torch.zeros(x.shape, device=x.device, dtype=torch.float32)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        gate, up = (x[tok].float() @ gate_up[e].float().T).chunk(2, dim=-1)
        h = torch.nn.functional.silu(gate) * up
        out.index_add_(0, tok, (h @ down[e].float().T) * weights[tok, slot].float()[:, None])
    return out


def variant_config(variant: dict, tokens: int) -> moe_rows.RowsConfig:
    base = moe_rows.default_config(tokens * TOP_K, EXPERTS)
    return moe_rows.RowsConfig(**dict(dict(block_m=base.block_m), **variant))


def short(config: moe_rows.RowsConfig) -> str:
    """``stream swap tma g8 m32 n64 k128 w4 s4``: a config in one column."""
    parts = [config.kernel] + ["swap"] * config.swap_ab + ["tma"] * config.tma
    parts += [f"g{config.group_n}"] * (config.kernel == "stream")
    parts += [f"m{config.block_m}", f"n{config.block_n}", f"k{config.block_k}", f"w{config.num_warps}",
              f"s{config.num_stages}"]
    return " ".join(parts)


def gpu_times_ms(fn, repeats: int):
    """GPU time of each of ``repeats`` calls of ``fn`` between CUDA events, each behind a sleep
    kernel that keeps the GPU busy while the host launches (Triton's launcher, a TMA descriptor's
    encoding): the events then time the kernel alone. One untimed call first (compiles)."""
    fn()
    if SMOKE:  # wall clock on the CPU
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return times
    return event_times_ms(fn, repeats, lead_sleep_cycles=1_000_000)  # ~0.5 ms: longer than any launch


def sweep_variants(args, gate_up, down, case, res):
    """Each GEMM alone per variant and token count; then whole calls, current vs fastest pair."""
    dev = gate_up.device
    t_start = time.time()
    expert_bytes = {"gate_up": gate_up[0].numel() * gate_up.element_size(),
                    "down": down[0].numel() * down.element_size()}
    print(f"{'tokens':>6} {'gemm':7} {'config':40} {'ms':>7} {'TB/s':>5} {'x cur':>5} {'max abs':>8} "
          f"{'rel err':>8} {'compile s':>9}", flush=True)
    for tokens in [int(t) for t in args.variant_tokens.split(",")]:
        x, weights, ids = case(tokens)
        rows = tokens * TOP_K
        sorted_ids, order = torch.sort(ids.reshape(-1), stable=True)
        ends = expert_ends(sorted_ids, EXPERTS)
        a_row_of = order // TOP_K
        used = ids.unique().numel()
        current = moe_rows.default_config(rows, EXPERTS)
        # the current kernel's rows: what every variant must reproduce (down's input for every down variant)
        hidden_ref = torch.empty(rows, INTER, device=dev, dtype=DTYPE)
        moe_rows.rows_gemm(x, a_row_of, gate_up, hidden_ref, ends, swiglu=True, config=current)
        out_ref = torch.empty(rows, HIDDEN, device=dev, dtype=DTYPE)
        moe_rows.rows_gemm(hidden_ref, None, down, out_ref, ends, swiglu=False, config=current)
        best = {}
        for gemm, variants in (("gate_up", GATE_UP_VARIANTS), ("down", DOWN_VARIANTS)):
            ref = hidden_ref if gemm == "gate_up" else out_ref
            out = torch.empty_like(ref)
            table = []
            # {}: the current kernel at its default tiles; TMA variants last (a bad descriptor could
            # fault and take the CUDA context, and every later config, with it)
            for variant in [{}] + sorted(variants, key=lambda v: v.get("tma", False)):
                config = variant_config(variant, tokens)
                row = {"tokens": tokens, "gemm": gemm, "config": dataclasses.asdict(config), "current": not variant,
                       "experts_used": used, "weight_bytes": used * expert_bytes[gemm]}
                if time.time() - t_start > args.budget_s:
                    row["skipped"] = "budget"
                    res["variants"].append(row)
                    continue
                if gemm == "gate_up":
                    def call(config=config):
                        moe_rows.rows_gemm(x, a_row_of, gate_up, out, ends, swiglu=True, config=config)
                else:
                    def call(config=config):
                        moe_rows.rows_gemm(hidden_ref, None, down, out, ends, swiglu=False, config=config)
                try:
                    out.fill_(float("nan"))  # rows a variant leaves unwritten show as NaN
                    t0 = time.time()
                    call()
                    if not SMOKE:
                        torch.cuda.synchronize()
                    row["first_call_s"] = time.time() - t0  # compilation, mostly
                    diff = (out.float() - ref.float())
                    row["max_abs_diff"] = float(diff.abs().max())
                    row["rel_err"] = float(diff.norm() / ref.float().norm())
                    row["ms"] = statistics.median(gpu_times_ms(call, args.repeats))
                except Exception as err:  # noqa: BLE001 - a config that does not compile or launch
                    row["error"] = repr(err)[:300]
                    print(f"{tokens:6d} {gemm:7} {short(config):40} error {row['error'][:120]}", flush=True)
                    res["variants"].append(row)
                    if not context_alive():
                        print("the CUDA context is gone (a fault): stopping; results so far saved", flush=True)
                        save(args, res, "moe_rows_variants.json")
                        return res
                    continue
                row["tbs"] = row["weight_bytes"] / row["ms"] / 1e9
                row["ok"] = bool(row["rel_err"] < 1e-2)  # NaN (unwritten rows) fails too
                res["variants"].append(row)
                table.append(row)
            cur = next((r for r in table if r["current"]), None)
            for row in sorted(table, key=lambda r: r["ms"]):
                speedup = cur["ms"] / row["ms"] if cur else float("nan")
                flag = "" if row["ok"] else "  WRONG"
                print(f"{tokens:6d} {gemm:7} {short(moe_rows.RowsConfig(**row['config'])):40} {row['ms']:7.4f} "
                      f"{row['tbs']:5.2f} {speedup:5.2f} {row['max_abs_diff']:8.1e} {row['rel_err']:8.1e} "
                      f"{row['first_call_s']:9.1f}{flag}", flush=True)
            ok = [r for r in table if r["ok"]]
            if ok:
                best[gemm] = min(ok, key=lambda r: r["ms"])
                if cur:
                    res["best"].append(dict(tokens=tokens, gemm=gemm, config=best[gemm]["config"],
                                            ms=best[gemm]["ms"], tbs=best[gemm]["tbs"], current_ms=cur["ms"],
                                            current_tbs=cur["tbs"]))
            save(args, res, "moe_rows_variants.json")
        if len(best) == 2 and time.time() - t_start < args.budget_s:
            try:
                res["whole_calls"].append(whole_calls(args, x, gate_up, down, weights, ids, tokens, current, best))
            except Exception as err:  # noqa: BLE001 - e.g. a variant that does not capture
                res["whole_calls"].append(dict(tokens=tokens, error=repr(err)[:300]))
                print(f"whole call at {tokens} tokens: error {repr(err)[:200]}", flush=True)
        save(args, res, "moe_rows_variants.json")
    for row in res["best"]:
        print(f"best {row['gemm']:7} at {row['tokens']:5d} tokens: {short(moe_rows.RowsConfig(**row['config']))} "
              f"{row['ms']:.4f} ms, {row['tbs']:.2f} TB/s (current {row['current_ms']:.4f} ms, "
              f"{row['current_tbs']:.2f} TB/s)", flush=True)
    return res


def context_alive() -> bool:
    """Whether CUDA still works after a failed config (a fault is sticky: every later call fails)."""
    if SMOKE:
        return True
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return True
    except Exception:  # noqa: BLE001
        return False


def whole_calls(args, x, gate_up, down, weights, ids, tokens, current, best):
    """The whole MoE call (sort, both GEMMs, mix) as a CUDA graph replay: current configs against
    the fastest correct gate_up and down variants (also: the variants capture)."""
    pairs = {"current": (current, current),
             "best": tuple(moe_rows.RowsConfig(**best[g]["config"]) for g in ("gate_up", "down"))}
    row = {"tokens": tokens, "configs": {k: [dataclasses.asdict(c) for c in v] for k, v in pairs.items()}}
    outs = {}
    for name, (up_cfg, down_cfg) in pairs.items():
        def call(up_cfg=up_cfg, down_cfg=down_cfg):
            return moe_rows.moe_experts_rows(x, gate_up, down, weights, ids, config=up_cfg, down_config=down_cfg)

        if SMOKE:  # no graphs on the CPU
            outs[name] = call()
            row[f"{name}_ms"] = statistics.median(gpu_times_ms(call, args.repeats))
            continue
        call()  # compiled already; warms the allocator before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs[name] = call()
        row[f"{name}_ms"] = statistics.median(event_times_ms(graph.replay, args.repeats))
    diff = outs["best"].float() - outs["current"].float()
    row["best_rel_err"] = float(diff.norm() / outs["current"].float().norm())
    clock = "wall clock" if SMOKE else "graph replay"
    print(f"whole call at {tokens} tokens ({clock}): current {row['current_ms']:.4f} ms, best pair "
          f"{row['best_ms']:.4f} ms ({short(pairs['best'][0])} | {short(pairs['best'][1])}), "
          f"rel diff {row['best_rel_err']:.1e}", flush=True)
    return row


def compile_only(args):
    """Every variant compiled for sm_90 with the local Triton (no GPU): shared memory, registers,
    what the PTX uses. The same specialisation as a launch (tests/ops/test_moe_rows.py)."""
    import re
    import subprocess
    import tempfile

    import triton

    from tests.ops.test_moe_rows import compile_rows_sm90

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    print(f"triton {triton.__version__}, sm_90; block_m of {args.compile_tokens} tokens")
    print(f"{'gemm':7} {'config':40} {'smem B':>7} {'fits':>4} {'regs':>4} {'spill':>5} {'wgmma':>5} "
          f"{'mma.sync':>8} {'cp.async':>8} {'tma':>3}")
    for gemm, variants in (("gate_up", GATE_UP_VARIANTS), ("down", DOWN_VARIANTS)):
        for variant in [{}] + variants:
            config = variant_config(variant, args.compile_tokens)
            try:
                kernel = compile_rows_sm90(config, gemm == "gate_up", INTER, HIDDEN)
            except Exception as err:  # noqa: BLE001
                print(f"{gemm:7} {short(config):40} error {repr(err)[:150]}")
                continue
            ptx = kernel.asm["ptx"]
            regs = spill = -1
            with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:  # registers: ptxas -v, where it takes this PTX
                f.write(ptx)
                f.flush()
                run = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True,
                                     text=True)
                if re.search(r"Used (\d+) registers", run.stderr):
                    regs = int(re.search(r"Used (\d+) registers", run.stderr).group(1))
                    spill = int((re.search(r"(\d+) bytes spill stores", run.stderr) or [0, 0])[1])
            shared = kernel.metadata.shared
            print(f"{gemm:7} {short(config):40} {shared:7d} {'yes' if shared <= H200_SMEM_BYTES else 'NO':>4} "
                  f"{regs:4d} {spill:5d} {ptx.count('wgmma.mma_async'):5d} {ptx.count('mma.sync'):8d} "
                  f"{ptx.count('cp.async.cg'):8d} {ptx.count('cp.async.bulk.tensor'):3d}", flush=True)


def save(args, res, name):
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, name), "w") as f:
        json.dump(res, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tokens", default="64,192,576,670,1024,2048,4096,8192")
    ap.add_argument("--sweep-tokens", default="192,576,670")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--variants", action="store_true", help="sweep the kernel variants instead (see above)")
    ap.add_argument("--variant-tokens", default="576,192,1024")
    ap.add_argument("--budget-s", type=float, default=200.0, help="--variants: stop sweeping after this long")
    ap.add_argument("--compile-only", action="store_true", help="compile the variants for sm_90 here, no GPU")
    ap.add_argument("--compile-tokens", type=int, default=576)
    ap.add_argument("--smoke", action="store_true", help="--variants on the CPU (interpreter), toy shapes")
    args = ap.parse_args()
    if args.compile_only:
        compile_only(args)
        return
    dev = "cuda"
    if args.smoke:
        global EXPERTS, HIDDEN, INTER, DTYPE, SMOKE
        if not args.variants:
            ap.error("--smoke runs --variants only")
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton's import (moe_rows imports it lazily)
        # fp16: the interpreter's bf16 dots are not faithful
        EXPERTS, HIDDEN, INTER, DTYPE, SMOKE, dev = 8, 64, 32, torch.float16, True, "cpu"
        args.variant_tokens, args.repeats = "4,40", 2
    torch.manual_seed(0)
    gate_up = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, device=dev) / HIDDEN ** 0.5).to(DTYPE)
    down = (torch.randn(EXPERTS, HIDDEN, INTER, device=dev) / INTER ** 0.5).to(DTYPE)
    res = {"device": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(), "experts": EXPERTS, "hidden": HIDDEN,
           "inter": INTER, "top_k": TOP_K, "sweep": [], "paths": []}

    def case(tokens):
        x = torch.randn(tokens, HIDDEN, device=dev).to(DTYPE)
        weights, ids = route_topk_softmax(torch.randn(tokens, EXPERTS, device=dev), TOP_K, renormalize=True)
        return x, weights.to(DTYPE), ids

    def weight_bytes(ids):
        used = ids.unique().numel()
        return used * 3 * INTER * HIDDEN * 2, used

    if args.variants:
        import triton

        res.update(triton=triton.__version__, torch=torch.__version__, repeats=args.repeats, variants=[],
                   best=[], whole_calls=[])
        sweep_variants(args, gate_up, down, case, res)
        return

    # 1. tile sweep of each GEMM alone
    for tokens in [int(t) for t in args.sweep_tokens.split(",")]:
        x, weights, ids = case(tokens)
        rows = tokens * TOP_K
        sorted_ids, order = torch.sort(ids.reshape(-1), stable=True)
        wbytes, used = weight_bytes(ids)
        hidden_rows = torch.empty(rows, INTER, device=dev, dtype=torch.bfloat16)
        rows_out = torch.empty(rows, HIDDEN, device=dev, dtype=torch.bfloat16)
        ends = expert_ends(sorted_ids, EXPERTS)
        for bm, bn, bk, stages, warps in itertools.product((16, 32, 64), (64, 128), (64, 128), (3, 4), (4,)):
            cfg = moe_rows.RowsConfig(block_m=bm, block_n=bn, block_k=bk, num_stages=stages, num_warps=warps)
            row = {"tokens": tokens, "config": cfg.__dict__}
            try:
                up_ms = statistics.median(event_times_ms(lambda: moe_rows.rows_gemm(
                    x, order // TOP_K, gate_up, hidden_rows, ends, swiglu=True, config=cfg), args.repeats))
                down_ms = statistics.median(event_times_ms(lambda: moe_rows.rows_gemm(
                    hidden_rows, None, down, rows_out, ends, swiglu=False, config=cfg), args.repeats))
            except Exception as err:  # noqa: BLE001 - a config that does not compile (shared memory)
                row["error"] = repr(err)[:200]
                res["sweep"].append(row)
                continue
            row.update(gate_up_ms=up_ms, down_ms=down_ms,
                       gate_up_gbs=wbytes * 2 / 3 / up_ms / 1e6, down_gbs=wbytes / 3 / down_ms / 1e6)
            res["sweep"].append(row)
        ok = [r for r in res["sweep"] if r["tokens"] == tokens and "error" not in r]
        for key in ("gate_up_ms", "down_ms"):
            best = min(ok, key=lambda r: r[key])
            print(f"sweep tokens {tokens}: best {key} {best[key]:.4f} ms with {best['config']}", flush=True)

    # 2. whole MoE call, grouped vs rows (default config), and errors
    print(f"{'tokens':>7} {'used':>5} {'grouped ms':>11} {'GB/s':>6} {'rows ms':>8} {'GB/s':>6} "
          f"{'err grouped':>11} {'err rows':>9}")
    for tokens in [int(t) for t in args.tokens.split(",")]:
        x, weights, ids = case(tokens)
        wbytes, used = weight_bytes(ids)
        total = wbytes + tokens * HIDDEN * 2 * 2
        row = {"tokens": tokens, "experts_used": used, "weight_bytes": wbytes,
               "rows_config": moe_rows.default_config(tokens * TOP_K, EXPERTS).__dict__}
        ref = reference_fp32(x, gate_up, down, weights, ids) if tokens <= 2048 else None
        for impl in ("grouped", "rows"):
            def call(impl=impl):
                return moe_experts(x, gate_up, down, weights, ids, impl=impl)

            call()  # compiles, warms the allocator, before the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call()
            ms = statistics.median(event_times_ms(graph.replay, args.repeats))
            row[f"{impl}_ms"], row[f"{impl}_gbs"] = ms, total / ms / 1e6
            if ref is not None:
                got = moe_experts(x, gate_up, down, weights, ids, impl=impl).float()
                row[f"{impl}_rel_err"] = float((got - ref).norm() / ref.norm())
        res["paths"].append(row)
        print(f"{tokens:7d} {used:5d} {row['grouped_ms']:11.4f} {row['grouped_gbs']:6.0f} {row['rows_ms']:8.4f} "
              f"{row['rows_gbs']:6.0f} {row.get('grouped_rel_err', float('nan')):11.2e} "
              f"{row.get('rows_rel_err', float('nan')):9.2e}", flush=True)
    save(args, res, "moe_rows.json")


if __name__ == "__main__":
    main()
