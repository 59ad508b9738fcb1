"""Launch configs of the all-hit request's small per-layer kernels, one launch at a time, at the
all-hit 32k shape (Qwen3.5-35B-A3B: 64 seams of 8 tokens + a 64-token question, 16 key heads,
32 value heads, K = V = 128, 8192 conv channels, bf16):

* ``short_conv_kernel`` (hypic.ops.conv_short) over its tile / warps / binary-search depth;
* ``short_wy_kernel`` and ``short_output_kernel`` (hypic.ops.linear.short_wy) per tile class
  (the 16-row seams, the 64-row question) over warps (and the output's V block).

Each launch is timed behind a sleep kernel (``event_times_ms(lead_sleep_cycles=...)``), so the
numbers are GPU time, not eager launch latency. Every variant's output is compared with the
default config's (max abs diff, expected 0 or rounding-level).

    cd benchmarks && python3 short_kernels_h200.py --out OUT   # -> OUT/short_kernels.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F

from _timing import event_times_ms

SLEEP = 200_000  # cycles (~0.1 ms): the host's launch is hidden behind it


def med(fn, repeats=30):
    return statistics.median(event_times_ms(fn, repeats=repeats, lead_sleep_cycles=SLEEP))


def conv_variants(dev, rows):
    import triton

    from hypic.ops._conv_short_kernel import short_conv_kernel

    lengths = [8] * 64 + [64]
    t, d, width = sum(lengths), 8192, 4
    gen = torch.Generator(device=dev).manual_seed(0)
    x_full = torch.randn(t, d + 4096, device=dev, generator=gen).bfloat16()
    x = x_full[:, :d]  # a column block of a fused projection, as in the model
    weight = torch.randn(d, width, device=dev, generator=gen).bfloat16()
    state = torch.randn(len(lengths), d, width - 1, device=dev, generator=gen).bfloat16()
    cu = torch.tensor([0] + lengths, device=dev).cumsum(0)
    ref = None
    for bt, bd, warps, log_n in [(16, 128, 4, 16), (8, 128, 2, 8), (8, 128, 2, 16), (8, 64, 2, 8), (8, 128, 1, 8),
                                 (16, 64, 2, 8), (4, 128, 1, 8), (8, 256, 4, 8)]:
        y = torch.full((t, d), float("nan"), device=dev, dtype=x.dtype)

        def launch():
            short_conv_kernel[(triton.cdiv(t, bt), triton.cdiv(d, bd))](
                x, weight, x, state, cu, y, t, len(lengths), x.stride(0), y.stride(0), D=d, W=width, HAS_BIAS=False,
                HAS_STATE=True, SILU=True, BT=bt, BD=bd, LOG_N=log_n, num_warps=warps)

        ms = med(launch)
        if ref is None:
            ref = y.clone()
        rows.append({"kernel": "short_conv", "BT": bt, "BD": bd, "warps": warps, "LOG_N": log_n, "ms": ms,
                     "max_abs_diff": (y.float() - ref.float()).abs().max().item()})
        print(json.dumps(rows[-1]), flush=True)


def allhit_inputs(dev, seed: int):
    """The linear layer's WY inputs at the all-hit 32k shape: ``(lengths, (H, HV, K, V), (q, k,
    v, g, beta, h_states, cu_cpu, cu, span table))``."""
    from hypic.ops.linear.short_span import short_span_rows

    lengths = [8] * 64 + [64]
    t, h, hv, kd, vd = sum(lengths), 16, 32, 128, 128
    gen = torch.Generator(device=dev).manual_seed(seed)
    q = F.normalize(torch.randn(t, h, kd, device=dev, generator=gen), dim=-1).bfloat16()
    k = F.normalize(torch.randn(t, h, kd, device=dev, generator=gen), dim=-1).bfloat16()
    v = torch.randn(t, hv, vd, device=dev, generator=gen).bfloat16()
    g = -torch.rand(t, hv, device=dev, generator=gen) * 0.05
    beta = torch.rand(t, hv, device=dev, generator=gen).bfloat16()
    h_states = torch.randn(len(lengths), hv, kd, vd, device=dev, generator=gen).bfloat16()
    cu_cpu = torch.tensor([0] + lengths).cumsum(0)
    cu = cu_cpu.to(dev)
    return lengths, (h, hv, kd, vd), (q, k, v, g, beta, h_states, cu_cpu, cu, short_span_rows(cu, cu_cpu, 64))


def wy_variants(dev, rows):
    from hypic.ops.linear._short_wy_kernel import short_output_kernel, short_wy_kernel

    lengths, (h, hv, kd, vd), (q, k, v, g, beta, h_states, cu_cpu, cu, table) = allhit_inputs(dev, seed=0)
    t = sum(lengths)
    for tile_rows, ids in table.tiles:
        ref_w = ref_o = None
        for warps, block_c in ((4, 128), (2, 128), (8, 128), (4, 64), (8, 64), (8, 32), (2, 64)):
            gc = torch.full((t, hv), float("nan"), device=dev)
            w = torch.full((t, hv, kd), float("nan"), device=dev, dtype=k.dtype)
            u = torch.full((t, hv, vd), float("nan"), device=dev, dtype=v.dtype)

            def launch_wy():
                short_wy_kernel[(ids.shape[0], hv)](
                    k, v, g, beta, cu, ids, gc, w, u, H=h, HV=hv, K=kd, V=vd, BV=vd, BT=tile_rows,
                    LOG2_BT=tile_rows.bit_length() - 1, USE_G=True,
                    INV_PRECISION="ieee" if tile_rows <= 16 else "tf32x3", IO_PRECISION="tf32", BC=block_c,
                    num_warps=warps)

            ms = med(launch_wy)
            rows_of = torch.cat([torch.arange(cu_cpu[s], cu_cpu[s + 1]) for s in ids.tolist()]).to(dev)
            got = u.index_select(0, rows_of).float()
            ref_w = got if ref_w is None else ref_w
            rows.append({"kernel": "short_wy", "tile_rows": tile_rows, "spans": ids.shape[0], "warps": warps,
                         "BC": block_c, "ms": ms, "max_abs_diff": (got - ref_w).abs().max().item()})
            print(json.dumps(rows[-1]), flush=True)
            if block_c != 128:
                continue  # the output kernel has no BC: timed once per warps
            for block_v in (64, 32, 128):
                o = torch.full((t, hv, vd), float("nan"), device=dev, dtype=v.dtype)

                def launch_o():
                    short_output_kernel[(ids.shape[0], hv, -(-vd // block_v))](
                        q, k, u, h_states, gc, cu, ids, table.span_chunk, o, 0.088, H=h, HV=hv, K=kd, V=vd,
                        BT=tile_rows, BV=block_v, USE_G=True, num_warps=warps)

                ms = med(launch_o)
                got = o.index_select(0, rows_of).float()
                ref_o = got if ref_o is None else ref_o
                rows.append({"kernel": "short_output", "tile_rows": tile_rows, "spans": ids.shape[0], "warps": warps,
                             "BV": block_v, "ms": ms, "max_abs_diff": (got - ref_o).abs().max().item()})
                print(json.dumps(rows[-1]), flush=True)


def overlap_variants(dev, rows):
    """Both tile sizes through the dispatchers, one after another or the 64-row size on a side
    stream (``HYPIC_SHORT_TILE_OVERLAP``), inside a CUDA graph as the engine replays them."""
    from _timing import env_vars

    from hypic.ops.linear.short_wy import short_span_output_triton, short_span_wy_triton

    _, _, (q, k, v, g, beta, h_states, _, cu, table) = allhit_inputs(dev, seed=1)
    outs = {}
    for value in ("0", "1"):
        with env_vars(HYPIC_SHORT_TILE_OVERLAP=value):
            def run():
                gc, w, u = short_span_wy_triton(k, v, g, beta, cu, table)
                return w, u, short_span_output_triton(q, k, u, h_states, gc, cu, table, 0.088)

            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                run()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs[value] = run()
            ms = med(graph.replay)
        same = all(torch.equal(a, b) for a, b in zip(outs[value], outs["0"]))
        rows.append({"kernel": "wy+output graph", "overlap": value, "ms": ms, "max_abs_diff": 0.0 if same else 1.0})
        print(json.dumps(rows[-1]), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    conv_variants(dev, rows)
    wy_variants(dev, rows)
    overlap_variants(dev, rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "short_kernels.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print(f"{'kernel':13s} {'config':40s} {'ms':>8s} {'diff':>9s}")
    for r in rows:
        cfg = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("kernel", "ms", "max_abs_diff"))
        print(f"{r['kernel']:13s} {cfg:40s} {r['ms']:8.4f} {r['max_abs_diff']:9.2e}")


if __name__ == "__main__":
    main()
