"""One Gated DeltaNet layer of a cold PIC prefill's write forward on the GPU, per
``HYPIC_COLD_SUMMARIES`` mode: GPU time, a kernel table, and how far the modes' summaries lie
from each other (Qwen3.5-35B-A3B widths: 16 key heads, 32 value heads, K = V = 128).

The shape is a cold 32k request in 512-token segments: N segments, each its 8-token seam and
504-token body (the body written), then a 64-token question, one chain. Timed: fla's plain one-run
forward (what ``full_recompute`` runs), the chain walk without summaries, and the write op in
each mode (``fla``: the walk and fla's ``[S | T]`` launch; ``walk``: the walk recording its
states, T from fla's kernel, S derived; ``one_run``: fla's one-run forward, T from fla's kernel
on the spans' chunking, S from the run's chunk states). No float64 reference here (its CPU loop
takes minutes on the device host); ``chain_long_h200.py`` has one.

    python3 benchmarks/cold_write_h200.py --out OUT   # -> OUT/cold_write.json, OUT/cold_write_profile.txt
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from _timing import env_vars, event_times_ms
from chain_long_h200 import inputs, rel


def main():
    from hypic.ops.linear import gated_delta

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--segments", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    dev = torch.device("cuda")
    n = args.segments
    gen = torch.Generator(device=dev).manual_seed(0)
    lengths = [8, 504] * n + [64]
    t = sum(lengths)
    cu_cpu = torch.tensor([0] + lengths).cumsum(0)
    cu = cu_cpu.to(dev)
    cu_chains_cpu = torch.tensor([0, len(lengths)])
    cu_chains = cu_chains_cpu.to(dev)
    bodies_cpu = torch.arange(1, 2 * n, 2)
    bodies = bodies_cpu.to(dev)
    q, k, v, g, beta = inputs(t, gen, dev)
    one_cpu = torch.tensor([0, t])
    one = one_cpu.to(dev)

    def write(mode, summarize=True):
        def fn():
            with env_vars(HYPIC_COLD_SUMMARIES=mode):
                return gated_delta.gated_delta_chain_forward_and_summarize(
                    q, k, v, g, beta, cu_seqlens=cu, cu_chains=cu_chains, cu_seqlens_cpu=cu_cpu,
                    summarize=summarize, summary_spans=bodies, cu_chains_cpu=cu_chains_cpu,
                    summary_spans_cpu=bodies_cpu)
        return fn

    def plain():
        return gated_delta.gated_delta_forward(q, k, v, g, beta, cu_seqlens=one, cu_seqlens_cpu=one_cpu)

    cases = {"one_run_plain": plain, "walk_no_summaries": write("walk", summarize=False),
             "fla": write("fla"), "walk": write("walk"), "one_run": write("one_run")}
    outs = {name: fn() for name, fn in cases.items()}
    med = lambda fn: statistics.median(event_times_ms(fn, repeats=args.repeats))  # noqa: E731
    row = {"segments": n, "live_tokens": t, "spans": len(lengths)}
    for name, fn in cases.items():
        row[f"{name}_ms"] = med(fn)
    o_plain = outs["one_run_plain"][0]
    base = outs["fla"]
    for name in ("walk", "one_run"):
        o, final, summ, _ = outs[name]
        row[f"{name}_T_vs_fla"] = rel(summ.transition, base[2].transition)
        row[f"{name}_S_vs_fla"] = rel(summ.state, base[2].state)
        row[f"{name}_o_vs_plain"] = rel(o, o_plain)
        row[f"{name}_final_vs_fla"] = rel(final, base[1])
    print(json.dumps(row), flush=True)
    tables = []
    for name in ("fla", "walk", "one_run"):
        fn = cases[name]
        fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
        tables.append(f"== {name} (3 calls) ==\n"
                      + prof.key_averages().table(sort_by="cuda_time_total", row_limit=16, max_name_column_width=60))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cold_write.json"), "w") as f:
        json.dump(row, f, indent=1)
    with open(os.path.join(args.out, "cold_write_profile.txt"), "w") as f:
        f.write("\n\n".join(tables))
    print(f"{'case':>20} {'ms':>8}")
    for name in cases:
        print(f"{name:>20} {row[name + '_ms']:>8.3f}")
    for name in ("walk", "one_run"):
        print(f"{name}: T vs fla {row[name + '_T_vs_fla']:.1e}, S vs fla {row[name + '_S_vs_fla']:.1e}, "
              f"o vs plain {row[name + '_o_vs_plain']:.1e}, final vs fla {row[name + '_final_vs_fla']:.1e}")
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
