"""GPU time of the short-span Triton kernels at the all-hit 32k shape (Qwen3.5-35B-A3B: 64 seams
of 8 tokens + a 64-token question, 16 key heads, 32 value heads, K = V = 128, bf16 inputs).

    python3 benchmarks/short_span_kernel_h200.py --out OUT   # -> OUT/short_span_kernel.json

For comparison, the kernels they replace (fla's summary kernel and state pass on the same 65
spans) appear in session 5's all-hit profile: 0.343 and 0.279 ms per layer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F

from _timing import event_times_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    from hypic.ops.linear.short_span import short_span_rows, short_span_state_pass_triton, short_span_summary_triton

    dev = torch.device("cuda")
    lengths = [8] * 64 + [64]
    t, h, hv, kd, vd = sum(lengths), 16, 32, 128, 128
    gen = torch.Generator(device=dev).manual_seed(0)
    k = F.normalize(torch.randn(t, h, kd, device=dev, generator=gen), dim=-1).bfloat16()
    w = (torch.randn(t, hv, kd, device=dev, generator=gen) * 0.1).bfloat16()
    u = torch.randn(t, hv, vd, device=dev, generator=gen).bfloat16()
    gc = -torch.rand(t, hv, device=dev, generator=gen) * 0.05
    h0 = torch.randn(len(lengths), hv, kd, vd, device=dev, generator=gen)
    cu_cpu = torch.tensor([0] + lengths).cumsum(0)
    cu = cu_cpu.to(dev)
    table = short_span_rows(cu, cu_cpu, 64)
    rows = {"spans": len(lengths), "tokens": t,
            "summary_ms": statistics.median(event_times_ms(
                lambda: short_span_summary_triton(k, w, u, gc, cu, table, 64), repeats=20)),
            "state_pass_ms": statistics.median(event_times_ms(
                lambda: short_span_state_pass_triton(w, u, h0, cu, table, 64), repeats=20))}
    print(json.dumps(rows), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "short_span_kernel.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
