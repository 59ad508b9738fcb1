"""The small kernels around a cached request's big ones, at the all-hit 32k shape on one GPU
(576 live tokens: 64 seams of 8 tokens and a 64-token question; Qwen3.5-35B-A3B widths):

* the routed MoE layer's glue: ``moe_routed`` with ``HYPIC_MOE_ROUTE=fused`` (routing,
  bucketing and mixing in three Triton launches, hypic.ops.moe_route) against ``torch`` (softmax +
  ``topk`` + the radix sort and its bookkeeping + the compiled combine), each whole call as a CUDA
  graph replay (as the engine runs it) and each fused launch alone; the outputs compared;
* the short conv of the seams (hypic.ops.conv_short) per tile config, with and without the runs'
  initial states;
* with ``--route-configs "BT,warps;..."`` / ``--bucket-configs "BT,warps;..."``: ``route_topk`` and
  ``bucket_rows`` alone per launch configuration (tokens a program or tile, warps), the module
  default first, at each token count; the routing on contiguous logits and on the model's
  layout (the router's columns of the MoE block's fused GEMM output, row stride 1,288), each
  config's outputs checked against the default's (ids, ends, rows exactly; weights' max diff).

GPU times are CUDA-event medians over ``--repeats`` replays/calls. The configs' times are the
kernels alone: a ~0.5 ms sleep kernel ahead of each call keeps the GPU busy while the host
launches (the eager ``route``/``bucket``/``mix`` columns of the first table include the launch).

    cd benchmarks && python3 moe_glue_h200.py --out OUT     (writes OUT/moe_glue.json, prints tables)
    cd benchmarks && python3 moe_glue_h200.py --out OUT --route-configs "1,1;2,1;4,1;4,2;8,2;16,4" \
        --bucket-configs "256,4;512,8;1024,4;1024,8;1024,16;2048,16"
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
FUSED_COLS, ROUTER_COL = 1288, 1024  # the MoE block's fused GEMM output: [gate 512 | up 512 | router 256 | 1 | pad]
LEAD_SLEEP_CYCLES = 1_000_000        # ~0.5 ms at the H200's clock: longer than any launch


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


def kernel_median_us(fn, repeats):
    """GPU time of ``fn``'s kernels alone (a sleep ahead of each call hides the launch), us."""
    return 1e3 * statistics.median(event_times_ms(fn, repeats, lead_sleep_cycles=LEAD_SLEEP_CYCLES))


def parse_configs(text: str, launch) -> list:
    """``"BT,warps;BT,warps"`` -> validated ``(block_tokens, num_warps)`` pairs (``launch``:
    :func:`moe_route.route_launch` or :func:`moe_route.bucket_launch`, which raise ValueError)."""
    configs = []
    for item in (part.strip() for part in text.split(";")):
        if not item:
            continue
        fields = item.split(",")
        if len(fields) != 2:
            raise ValueError(f"a config is 'block_tokens,num_warps', got {item!r}")
        configs.append(launch(int(fields[0]), int(fields[1])))
    return configs


def config_cases(tokens: int, repeats: int, route_configs: list, bucket_configs: list) -> tuple:
    """Rows of route_topk and bucket_rows alone per launch config, the default first, each
    checked against the default's outputs."""
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    logits = torch.randn(tokens, EXPERTS, device="cuda", generator=gen).bfloat16()
    fused = torch.randn(tokens, FUSED_COLS, device="cuda", generator=gen).bfloat16()
    fused[:, ROUTER_COL:ROUTER_COL + EXPERTS] = logits
    layouts = {"contiguous": logits, "fused": fused[:, ROUTER_COL:ROUTER_COL + EXPERTS]}
    route_rows, bucket_rows = [], []
    for layout, view in layouts.items():
        ref_w, ref_ids = moe_route.route_topk(view, TOP_K, True)
        for block_tokens, num_warps in [moe_route.route_launch()] + route_configs:
            fn = lambda: moe_route.route_topk(view, TOP_K, True, block_tokens=block_tokens,  # noqa: E731
                                              num_warps=num_warps)
            w, ids = fn()
            route_rows.append({"tokens": tokens, "layout": layout, "stride": view.stride(0),
                               "block_tokens": block_tokens, "num_warps": num_warps,
                               "us": kernel_median_us(fn, repeats), "ids_equal": bool(torch.equal(ids, ref_ids)),
                               "max_weight_diff": float((w - ref_w).abs().max())})
    ids = moe_route.route_topk(logits, TOP_K, True)[1]
    ref = moe_route.bucket_rows(ids, EXPERTS)
    for block_tokens, num_warps in [moe_route.bucket_launch()] + bucket_configs:
        fn = lambda: moe_route.bucket_rows(ids, EXPERTS, block_tokens=block_tokens, num_warps=num_warps)  # noqa: E731
        out = fn()
        bucket_rows.append({"tokens": tokens, "block_tokens": block_tokens, "num_warps": num_warps,
                            "single_tile": tokens <= block_tokens, "us": kernel_median_us(fn, repeats),
                            "equal": all(torch.equal(a, b) for a, b in zip(out, ref))})
    return route_rows, bucket_rows


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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tokens", default="192,576,1024")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--route-configs", default="",
                    help='route_topk launch configs to time, "block_tokens,num_warps;..." (default: none)')
    ap.add_argument("--bucket-configs", default="",
                    help='bucket_rows launch configs to time, "block_tokens,num_warps;..." (default: none)')
    ap.add_argument("--configs-only", action="store_true",
                    help="time the launch configs alone, without the whole-call and conv parts")
    args = ap.parse_args()
    try:  # bad configs fail here, before any GPU work
        route_configs = parse_configs(args.route_configs, moe_route.route_launch)
        bucket_configs = parse_configs(args.bucket_configs, moe_route.bucket_launch)
    except ValueError as err:
        ap.error(str(err))
    token_counts = [int(t) for t in args.tokens.split(",")]
    res = {"device": torch.cuda.get_device_name(), "moe": [], "conv": [], "route_configs": [], "bucket_configs": []}
    if not args.configs_only:
        print(f"{'tokens':>6} {'fused ms':>9} {'torch ms':>9} {'route':>7} {'bucket':>7} {'mix':>7} {'rel diff':>9}")
        for tokens in token_counts:
            r = moe_case(tokens, args.repeats)
            res["moe"].append(r)
            print(f"{tokens:6d} {r['fused_ms']:9.4f} {r['torch_ms']:9.4f} {r['route_ms']:7.4f} {r['bucket_ms']:7.4f} "
                  f"{r['mix_ms']:7.4f} {r['fused_vs_torch_rel']:9.2e}", flush=True)
    if route_configs or bucket_configs:
        for tokens in token_counts:
            route_rows, bucket_rows = config_cases(tokens, args.repeats, route_configs, bucket_configs)
            res["route_configs"] += route_rows
            res["bucket_configs"] += bucket_rows
        print("route_topk alone (kernel us; the first row of each layout is the default)")
        print(f"{'tokens':>6} {'layout':>10} {'BT':>4} {'warps':>5} {'us':>8} {'ids eq':>6} {'w diff':>9}")
        for r in res["route_configs"]:
            print(f"{r['tokens']:6d} {r['layout']:>10} {r['block_tokens']:4d} {r['num_warps']:5d} {r['us']:8.2f} "
                  f"{str(r['ids_equal']):>6} {r['max_weight_diff']:9.2e}")
        print("bucket_rows alone (kernel us; the first row of each token count is the default)")
        print(f"{'tokens':>6} {'BT':>5} {'warps':>5} {'single':>6} {'us':>8} {'equal':>6}")
        for r in res["bucket_configs"]:
            print(f"{r['tokens']:6d} {r['block_tokens']:5d} {r['num_warps']:5d} {str(r['single_tile']):>6} "
                  f"{r['us']:8.2f} {str(r['equal']):>6}")
    if not args.configs_only:
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
