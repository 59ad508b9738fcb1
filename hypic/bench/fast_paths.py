"""Micro-benchmark of the MoE and attention fast paths against their references.

    python3 -m hypic.bench.fast_paths --json moe_attn_h200.json        # CUDA, model shapes
    python3 -m hypic.bench.fast_paths --tiny                           # CPU smoke run

Shapes are Qwen3.5-35B-A3B's (hidden 2048, 256 experts, top-8, expert intermediate 512; 16 query
heads, 2 kv heads, head dim 256), bf16 on CUDA. Per case and implementation it records the first
call (compile included), the steady-state time, TFLOP/s from the FLOP count below, peak memory,
and - on CUDA - whether one steady-state call ran with no host synchronisation
(``torch.cuda.set_sync_debug_mode("error")``).

FLOPs: MoE ``6 * T * k * H * I`` (two grouped GEMMs, 2 FLOPs per multiply-add); attention
``4 * Hq * D * pairs`` with ``pairs`` the number of allowed (query, key) pairs.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable, Dict, List, Optional

import torch

import hypic.ops.attention as attention_module
from hypic.ops.attention import varlen_attention
from hypic.ops.moe import moe_experts, route_topk_softmax


def _time(fn: Callable[[], torch.Tensor], device: torch.device, reps: int) -> Dict[str, float]:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    sync()
    start = time.perf_counter()
    fn()
    sync()
    first_ms = (time.perf_counter() - start) * 1e3
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return {"first_call_ms": first_ms, "ms": (time.perf_counter() - start) * 1e3 / reps}


def _sync_free(fn: Callable[[], torch.Tensor], device: torch.device) -> Optional[str]:
    """None on CPU; "yes", or the error of the first synchronising op, on CUDA."""
    if device.type != "cuda":
        return None
    # Drop the cached block mask so the layout checks and the mask build are covered too.
    attention_module._mask_cache = None
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        return "yes"
    except RuntimeError as err:
        return f"no: {str(err).splitlines()[0]}"
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _record(rows: List[dict], case: str, impl: str, flops: float, fn, device, reps: int) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    row = {"case": case, "impl": impl, **_time(fn, device, reps)}
    row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
    row["sync_free"] = _sync_free(fn, device)
    if device.type == "cuda":
        row["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    rows.append(row)
    print(json.dumps(row), flush=True)


def bench_moe(rows, device, dtype, tokens_list, hidden, inter, experts, top_k, reps):
    gen = torch.Generator(device="cpu").manual_seed(0)
    gate_up = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(device, dtype)
    down = (torch.randn(experts, hidden, inter, generator=gen) / inter**0.5).to(device, dtype)
    for tokens in tokens_list:
        x = torch.randn(tokens, hidden, generator=gen).to(device, dtype)
        weights, ids = route_topk_softmax(torch.randn(tokens, experts, generator=gen).to(device), top_k, True)
        weights = weights.to(dtype)
        flops = 6.0 * tokens * top_k * hidden * inter
        for impl in ("reference", "grouped"):
            _record(rows, f"moe T={tokens}", impl, flops,
                    lambda impl=impl: moe_experts(x, gate_up, down, weights, ids, impl=impl), device, reps)


def _attention_case(device, dtype, num_q, num_k, heads, kv_heads, head_dim, interleave):
    """One sequence: keys at positions 0..num_k-1 in order; queries the last num_q positions
    (index-causal), or (interleave) num_q positions spread evenly over the sequence - the PIC
    layout with live tokens between cached segments."""
    gen = torch.Generator(device="cpu").manual_seed(1)
    if interleave:
        pos_q = torch.linspace(0, num_k - 1, num_q).round().long().unique()
        num_q = pos_q.numel()
    else:
        pos_q = torch.arange(num_k - num_q, num_k)
    q = torch.randn(num_q, heads, head_dim, generator=gen).to(device, dtype)
    k = torch.randn(num_k, kv_heads, head_dim, generator=gen).to(device, dtype)
    v = torch.randn(num_k, kv_heads, head_dim, generator=gen).to(device, dtype)
    layout = dict(cu_seqlens_q=torch.tensor([0, num_q], device=device),
                  cu_seqlens_k=torch.tensor([0, num_k], device=device),
                  positions_q=pos_q.to(device), positions_k=torch.arange(num_k, device=device))
    pairs = float((pos_q + 1).sum())
    return q, k, v, layout, pairs


def bench_attention(rows, device, dtype, cases, heads, kv_heads, head_dim, reps):
    for name, num_q, num_k, interleave in cases:
        q, k, v, layout, pairs = _attention_case(device, dtype, num_q, num_k, heads, kv_heads, head_dim, interleave)
        flops = 4.0 * heads * head_dim * pairs
        impls = ["reference", "flex"] + ([] if interleave or device.type != "cuda" else ["flash"])
        for impl in impls:
            extra = dict(index_causal=True, max_seqlen_q=q.shape[0], max_seqlen_k=num_k) if impl == "flash" else {}
            _record(rows, f"attention {name} Tq={q.shape[0]} Tk={num_k}", impl, flops,
                    lambda impl=impl, extra=extra: varlen_attention(q, k, v, **layout, impl=impl, **extra),
                    device, reps)


def main(argv: Optional[List[str]] = None) -> List[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny fp32 shapes (CPU smoke run)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    rows: List[dict] = []
    if args.tiny:
        device, dtype = torch.device("cpu"), torch.float32
        bench_moe(rows, device, dtype, [8, 64], 32, 16, 8, 2, args.reps)
        bench_attention(rows, device, dtype, [("cold", 40, 40, False), ("pic", 8, 300, True)], 4, 2, 16, args.reps)
    else:
        if not torch.cuda.is_available():
            parser.error("model shapes need CUDA; use --tiny on CPU")
        device, dtype = torch.device("cuda"), torch.bfloat16
        bench_moe(rows, device, dtype, [64, 4096, 32768], 2048, 512, 256, 8, args.reps)
        bench_attention(rows, device, dtype,
                        [("cold", 32768, 32768, False), ("all_hit_question", 64, 32832, False),
                         ("pic_live_interleaved", 192, 32832, True)],
                        16, 2, 256, args.reps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(torch.cuda.get_device_name() if device.type == "cuda" else "cpu"),
                       "torch": torch.__version__, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
