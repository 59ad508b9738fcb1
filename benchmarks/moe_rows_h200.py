"""Routed-expert GEMMs at a cached request's token counts on one GPU: ``torch._grouped_mm`` (the
grouped path) against the row-block Triton kernel (hypic.ops.moe_rows), with a sweep of the
kernel's tiles.

Qwen3.5-35B-A3B expert shapes (256 experts, hidden 2048, intermediate 512, top-8), bf16 random
weights and random softmax routing. Per token count: the whole MoE call of each path (sort, both
GEMMs, combine) and, for the rows kernel, each GEMM alone per tile config; GB/s counts the weights
of the experts that got rows (what the GEMMs must stream) plus the activations. The whole calls are timed as CUDA graph replays (as the
engine runs them: inside the row-wise phases' graphs), so host launch time does not count. Also
the relative error of each path against an fp32 evaluation of the same bf16 operands.

    python3 benchmarks/moe_rows_h200.py --out OUT     (writes OUT/moe_rows.json, prints tables)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics

import torch

from hypic.ops.moe import moe_experts, route_topk_softmax
from hypic.ops import moe_rows
from hypic.ops.moe_grouped import expert_ends

from _timing import event_times_ms  # benchmarks/, the script's folder

EXPERTS, HIDDEN, INTER, TOP_K = 256, 2048, 512, 8


def reference_fp32(x, gate_up, down, weights, ids):
    """fp32 evaluation of the bf16 operands, one expert at a time (no [R, 2I, H] blow-up)."""
    out = torch.zeros(x.shape, device=x.device, dtype=torch.float32)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        gate, up = (x[tok].float() @ gate_up[e].float().T).chunk(2, dim=-1)
        h = torch.nn.functional.silu(gate) * up
        out.index_add_(0, tok, (h @ down[e].float().T) * weights[tok, slot].float()[:, None])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tokens", default="64,192,576,670,1024,2048,4096,8192")
    ap.add_argument("--sweep-tokens", default="192,576,670")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    gate_up = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, device=dev) / HIDDEN ** 0.5).bfloat16()
    down = (torch.randn(EXPERTS, HIDDEN, INTER, device=dev) / INTER ** 0.5).bfloat16()
    res = {"device": torch.cuda.get_device_name(), "experts": EXPERTS, "hidden": HIDDEN, "inter": INTER,
           "top_k": TOP_K, "sweep": [], "paths": []}

    def case(tokens):
        x = torch.randn(tokens, HIDDEN, device=dev).bfloat16()
        weights, ids = route_topk_softmax(torch.randn(tokens, EXPERTS, device=dev), TOP_K, renormalize=True)
        return x, weights.bfloat16(), ids

    def weight_bytes(ids):
        used = ids.unique().numel()
        return used * 3 * INTER * HIDDEN * 2, used

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
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "moe_rows.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
