"""One Gated DeltaNet layer of a cold PIC prefill's write forward on the GPU, per
``HYPIC_COLD_SUMMARIES`` mode: GPU time, a kernel table, and how far the modes' summaries lie
from each other (Qwen3.5-35B-A3B widths: 16 key heads, 32 value heads, K = V = 128).

The shape is a cold 32k request in 512-token segments: N segments, each its 8-token seam and
504-token body (the body written), then a 64-token question, one chain. Timed: fla's plain one-run
forward (what ``full_recompute`` runs), the chain walk without summaries, and the write op in
each mode (``fla``: the walk and fla's ``[S | T]`` launch; ``walk``: the walk recording its
states, T of the written spans from hypic's kernel on a side stream beside the walk, S
derived; ``walk_inline``: that T launched in line, ``HYPIC_TRANSITION_OVERLAP=0``;
``walk_fla_t``: T from fla's ``V = 0`` launch, ``HYPIC_TRANSITION_IMPL=fla``). The first bodies'
summaries are checked against a float64 walk of the same WY factors, on the GPU, under two gate
regimes (``--gate-biases``).

    python3 benchmarks/cold_write_h200.py --out OUT   # -> OUT/cold_write.json, OUT/cold_write_profile.txt
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F

from _timing import env_vars, event_times_ms
from chain_long_h200 import KD, cold_shape, inputs, rel, span_summaries_float64

REFERENCE_BODIES = 4  # bodies whose summaries are checked against a float64 walk (on the GPU)
SUMMARIZING = ("fla", "walk_fla_t", "walk_inline", "walk")
TIMED = ("one_run_plain", "walk_no_summaries") + SUMMARIZING


def layer(n: int, gate_bias: float, repeats: int, profile: bool):
    """One row (and kernel tables when ``profile``) at ``n`` segments, gates ``logsigmoid(x +
    gate_bias)``: 3 decays ~0.95 a token (T of a 504-token body is ~0, S is the state after it),
    7 ~0.999 (T stays large: S = h_after - T h_before cancels)."""
    from hypic.ops.linear import fla_paths, gated_delta

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    lengths, t, cu_cpu, cu, cu_chains = cold_shape(n, dev)
    bodies_cpu = torch.arange(1, 2 * n, 2)
    bodies = bodies_cpu.to(dev)  # the written spans, an index tensor as a cold layout passes them
    q, k, v, _, beta = inputs(t, gen, dev)
    g = F.logsigmoid(torch.randn(t, 32, device=dev, generator=gen) + gate_bias)
    one_cpu = torch.tensor([0, t])
    one = one_cpu.to(dev)

    def write(mode, summarize=True, transition="triton", overlap="1"):
        def fn():
            with env_vars(HYPIC_COLD_SUMMARIES=mode, HYPIC_TRANSITION_IMPL=transition,
                          HYPIC_TRANSITION_OVERLAP=overlap):
                return gated_delta.gated_delta_chain_forward_and_summarize(
                    q, k, v, g, beta, cu_seqlens=cu, cu_chains=cu_chains, cu_seqlens_cpu=cu_cpu,
                    summarize=summarize, summary_spans=bodies)
        return fn

    def plain():
        return gated_delta.gated_delta_forward(q, k, v, g, beta, cu_seqlens=one, cu_seqlens_cpu=one_cpu)

    cases = {"one_run_plain": plain, "walk_no_summaries": write("walk", summarize=False),
             "fla": write("fla"), "walk_fla_t": write("walk", transition="fla"),
             "walk_inline": write("walk", overlap="0"), "walk": write("walk")}
    outs = {name: fn() for name, fn in cases.items()}
    _, _, k4, gc, w, u = fla_paths._wy_prepare(k, v, g, beta, cu, cu_cpu)
    t_ref, s_ref = span_summaries_float64(k4[0], w[0], u[0], gc[0], cu_cpu, bodies_cpu[:REFERENCE_BODIES],
                                          device=dev)
    med = lambda fn: statistics.median(event_times_ms(fn, repeats=repeats))  # noqa: E731
    row = {"segments": n, "gate_bias": gate_bias, "live_tokens": t, "spans": len(lengths)}
    for name, fn in cases.items():
        row[f"{name}_ms"] = med(fn)
    o_plain = outs["one_run_plain"][0]
    base = outs["fla"]
    nr = REFERENCE_BODIES
    for name in SUMMARIZING:
        o, final, summ, _ = outs[name]
        row[f"{name}_T_err"] = rel(summ.transition[:nr], t_ref)
        row[f"{name}_S_err"] = rel(summ.state[:nr], s_ref)
        if name != "fla":
            row[f"{name}_S_vs_fla"] = rel(summ.state, base[2].state)
            row[f"{name}_o_vs_plain"] = rel(o, o_plain)
            row[f"{name}_final_vs_fla"] = rel(final, base[1])
    # T beside the output kernel or in line: the same launch, so the same summaries
    row["overlap_vs_inline_T"] = rel(outs["walk"][2].transition, outs["walk_inline"][2].transition)
    row["T_ref_norm_ratio"] = float(t_ref.norm() / (torch.eye(KD, dtype=torch.float64, device=dev).norm()
                                                    * (t_ref.shape[0] * t_ref.shape[1]) ** 0.5))
    print(json.dumps(row), flush=True)
    tables = []
    for name in (("walk_inline", "walk") if profile else ()):
        fn = cases[name]
        fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
        tables.append(f"== {name}, gate bias {gate_bias} (3 calls) ==\n"
                      + prof.key_averages().table(sort_by="cuda_time_total", row_limit=16, max_name_column_width=60))
    return row, tables


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--segments", type=int, default=64)
    ap.add_argument("--gate-biases", default="3,7")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    rows, tables = [], []
    for i, bias in enumerate(float(b) for b in args.gate_biases.split(",")):
        row, tab = layer(args.segments, bias, args.repeats, profile=i == 0)
        rows.append(row)
        tables += tab
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cold_write.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(args.out, "cold_write_profile.txt"), "w") as f:
        f.write("\n\n".join(tables))
    print(f"{'bias':>5} " + " ".join(f"{n:>18}" for n in TIMED) + "   (ms per layer)")
    for r in rows:
        print(f"{r['gate_bias']:>5} " + " ".join(f"{r[n + '_ms']:>18.3f}" for n in TIMED))
    print(f"{'bias':>5} {'|T|/|I|':>8} " + " ".join(f"{m + ' T/S err':>22}" for m in SUMMARIZING)
          + "   (vs float64, first bodies)")
    for r in rows:
        print(f"{r['gate_bias']:>5} {r['T_ref_norm_ratio']:>8.3f} "
              + " ".join(f"{r[m + '_T_err']:>10.1e} {r[m + '_S_err']:>11.1e}" for m in SUMMARIZING))
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
