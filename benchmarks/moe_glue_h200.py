"""The small kernels around a cached request's big ones, at the all-hit 32k shape on one GPU
(576 live tokens: 64 seams of 8 tokens and a 64-token question; Qwen3.5-35B-A3B widths):

* the routed MoE layer's glue: ``moe_routed`` with ``HYPIC_MOE_ROUTE=fused`` (routing,
  bucketing and mixing in three Triton launches, hypic.ops.moe_route) against ``torch`` (softmax +
  ``topk`` + the radix sort and its bookkeeping + the compiled combine), each whole call as a CUDA
  graph replay (as the engine runs it) and each fused launch alone; the outputs compared;
* the short conv of the seams (hypic.ops.conv_short) per tile config, with and without the runs'
  initial states.

GPU times are CUDA-event medians over ``--repeats`` replays/calls.

    cd benchmarks && python3 moe_glue_h200.py --out OUT     (writes OUT/moe_glue.json, prints tables)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from hypic.ops import conv_short, moe_route
from hypic.ops.fused import recording_graph
from hypic.ops.moe import moe_routed

from _timing import env_vars, event_times_ms  # benchmarks/, the script's folder

EXPERTS, HIDDEN, INTER, TOP_K = 256, 2048, 512, 8
CONV_DIM, CONV_WIDTH = 8192, 4


def graph_of(fn):
    """``fn`` captured into a CUDA graph (after two warm-up calls, compiling inside
    :func:`recording_graph` as the engine's row-wise phases do) and its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), recording_graph():
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), recording_graph():
        out = fn()
    return graph, out


def median(fn, repeats):
    return statistics.median(event_times_ms(fn, repeats))


def moe_case(tokens: int, repeats: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen).bfloat16()
    gate_up = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, device="cuda", generator=gen) / HIDDEN ** 0.5).bfloat16()
    down = (torch.randn(EXPERTS, HIDDEN, INTER, device="cuda", generator=gen) / INTER ** 0.5).bfloat16()
    logits = torch.randn(tokens, EXPERTS, device="cuda", generator=gen).bfloat16()
    row = {"tokens": tokens}
    outs = {}
    for impl in moe_route.ROUTE_IMPLS:
        with env_vars(**{moe_route.ROUTE_ENV: impl}):
            graph, out = graph_of(lambda: moe_routed(x, logits, gate_up, down, TOP_K, True))
            row[f"{impl}_ms"] = median(graph.replay, repeats)
            outs[impl] = out.float().clone()
    ref = outs["torch"]
    row["fused_vs_torch_rel"] = float((outs["fused"] - ref).norm() / ref.norm())
    w, ids = moe_route.route_topk(logits, TOP_K, True)
    row["route_ms"] = median(lambda: moe_route.route_topk(logits, TOP_K, True), repeats)
    row["bucket_ms"] = median(lambda: moe_route.bucket_rows(ids, EXPERTS), repeats)
    ends, row_token, inverse = moe_route.bucket_rows(ids, EXPERTS)
    rows_out = torch.randn(tokens * TOP_K, HIDDEN, device="cuda", generator=gen).bfloat16()
    out = torch.empty_like(x)
    row["mix_ms"] = median(lambda: moe_route.mix_rows(rows_out, inverse, w, out), repeats)
    return row


def conv_case(repeats: int) -> list:
    seams, seam_tokens, query_tokens = 64, 8, 64
    lengths = [seam_tokens] * seams + [query_tokens]
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0)
    tokens = int(cu[-1])
    x = torch.randn(tokens, CONV_DIM, device="cuda").bfloat16()
    weight = torch.randn(CONV_DIM, CONV_WIDTH, device="cuda").bfloat16()
    init = torch.randn(len(lengths), CONV_DIM, CONV_WIDTH - 1, device="cuda").bfloat16()
    rows = []
    default = (conv_short.BLOCK_T, conv_short.BLOCK_D, conv_short.NUM_WARPS)
    ref = None
    try:
        for bt, bd, warps in [default, (16, 128, 4), (32, 256, 4), (64, 128, 4), (16, 256, 4), (32, 128, 8),
                              (64, 256, 8), (8, 512, 4), (16, 512, 8)]:
            conv_short.BLOCK_T, conv_short.BLOCK_D, conv_short.NUM_WARPS = bt, bd, warps
            for with_state in (True, False):
                fn = lambda: conv_short.short_conv(x, weight, None, cu_seqlens=cu,  # noqa: E731
                                                   initial_state=init if with_state else None,
                                                   output_final_state=False)[0]
                y = fn()
                if with_state:
                    ref = y if ref is None else ref
                rows.append({"block_t": bt, "block_d": bd, "num_warps": warps, "state": with_state,
                             "ms": median(fn, repeats),
                             "max_diff": float((y.float() - ref.float()).abs().max()) if with_state else None})
    finally:
        conv_short.BLOCK_T, conv_short.BLOCK_D, conv_short.NUM_WARPS = default
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tokens", default="192,576,1024")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(), "moe": [], "conv": []}
    print(f"{'tokens':>6} {'fused ms':>9} {'torch ms':>9} {'route':>7} {'bucket':>7} {'mix':>7} {'rel diff':>9}")
    for tokens in [int(t) for t in args.tokens.split(",")]:
        r = moe_case(tokens, args.repeats)
        res["moe"].append(r)
        print(f"{tokens:6d} {r['fused_ms']:9.4f} {r['torch_ms']:9.4f} {r['route_ms']:7.4f} {r['bucket_ms']:7.4f} "
              f"{r['mix_ms']:7.4f} {r['fused_vs_torch_rel']:9.2e}", flush=True)
    res["conv"] = conv_case(args.repeats)
    print(f"{'BT':>4} {'BD':>4} {'warps':>5} {'state':>5} {'ms':>8} {'max diff':>9}")
    for r in res["conv"]:
        diff = "" if r["max_diff"] is None else f"{r['max_diff']:9.2e}"
        print(f"{r['block_t']:4d} {r['block_d']:4d} {r['num_warps']:5d} {str(r['state']):>5} {r['ms']:8.4f} {diff}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "moe_glue.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
