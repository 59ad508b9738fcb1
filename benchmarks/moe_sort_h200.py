"""GPU time of sorting a MoE layer's (token, slot) assignments by expert, with the ids cast to
int64 (sessions 9-12) against the narrowest key dtype (:func:`hypic.ops.moe_grouped.sort_key_dtype`:
uint8 for 256 experts; CUDA's radix sort makes one pass per 8 key bits). Qwen3.5-35B-A3B routing
(256 experts, top-8) at the all-hit requests' live token counts; each sort in a CUDA graph
replayed 50 times between events (launch costs out), and the orders compared.

    python3 benchmarks/moe_sort_h200.py --out OUT   # -> OUT/moe_sort.json, a table
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from hypic.ops.moe_grouped import expert_ends, sort_key_dtype


def replay_ms(fn, replays: int = 50) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tokens", default="192,576,1024,2048")
    args = ap.parse_args()
    experts, top_k = 256, 8
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(tokens)
        ids = torch.topk(torch.rand(tokens, experts, device="cuda", generator=gen), top_k, dim=-1).indices
        flat = ids.reshape(-1)
        row = {"tokens": tokens, "rows": flat.numel()}
        orders = {}
        for name, dtype in (("int64", torch.int64), ("narrow", sort_key_dtype(experts))):
            def sort(dtype=dtype):
                sorted_ids, order = torch.sort(flat.to(dtype), stable=True)
                return order, expert_ends(sorted_ids, experts)
            orders[name] = sort()
            row[f"{name}_ms"] = replay_ms(sort)
        row["same_order"] = bool(torch.equal(orders["int64"][0], orders["narrow"][0]))
        row["same_ends"] = bool(torch.equal(orders["int64"][1], orders["narrow"][1]))
        rows.append(row)
        print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "moe_sort.json"), "w") as f:
        json.dump({"experts": experts, "top_k": top_k, "key_dtype": str(sort_key_dtype(experts)), "rows": rows}, f,
                  indent=1)
    print(f"{'tokens':>6} {'rows':>6} {'int64 ms':>9} {'narrow ms':>9} same")
    for r in rows:
        print(f"{r['tokens']:>6} {r['rows']:>6} {r['int64_ms']:>9.4f} {r['narrow_ms']:>9.4f} "
              f"{r['same_order'] and r['same_ends']}")


if __name__ == "__main__":
    main()
