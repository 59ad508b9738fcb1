"""GPU time of one Gated DeltaNet layer's chain at the Qwen3.5-35B-A3B shape (32 value heads, 16
key heads, K = V = 128) when its live spans run through the chain kernel's long-span walk
(``long_spans``: fla's state pass chunk by chunk, bf16 products) against what ran before:

* ``cold``: a cold prefill of N segments of 512 tokens, each split into its 8-token seam and
  504-token body, then a 64-token question (one chain of 2N + 1 live spans). ``scan``: every
  span's summary (fla's summary kernel), the chain scan, fla's state pass from the scanned states
  (``HYPIC_CHAIN_LONG=scan``); ``fused``: one chain walk (``HYPIC_CHAIN_LONG=fused``, the
  default); each with and without the written bodies' summaries a store write adds (fla's summary
  kernel over every span, ``HYPIC_COLD_SUMMARIES=fla``; or T alone from it and S from the
  walk's recorded states, ``=walk``; errors against a float64 walk of the same WY factors, of
  the summaries and of the state a body hands on after another prefix, ``T p + S``); and
  ``one_run``: fla's plain forward of the same tokens as one sequence (what ``full_recompute``
  runs).
* ``seams``: the all-hit shape (N cached bodies, each after its 8-token seam, then the question):
  the seams applied by the one-chunk WY step (the default, h split for an fp32-accurate ``W h``)
  or by the long-span walk (h rounded to bf16 as fla's prefill does), scans alone.

Outputs and final states are compared with each other and with float64 references.

    python3 benchmarks/chain_long_h200.py --out OUT   # -> OUT/chain_long.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F

from _timing import env_vars, event_times_ms

H, HV, KD, VD = 16, 32, 128, 128


def inputs(t, gen, dev):
    q = F.normalize(torch.randn(t, H, KD, device=dev, generator=gen), dim=-1).bfloat16()
    k = F.normalize(torch.randn(t, H, KD, device=dev, generator=gen), dim=-1).bfloat16()
    v = torch.randn(t, HV, VD, device=dev, generator=gen).bfloat16()
    g = F.logsigmoid(torch.randn(t, HV, device=dev, generator=gen) + 3.0)
    beta = torch.sigmoid(torch.randn(t, HV, device=dev, generator=gen)).bfloat16()
    return q, k, v, g, beta


def span_summaries_float64(k, w, u, g, cu_spans, spans, chunk_size: int = 64, device="cpu"):
    """Float64 zero-start summaries of ``spans`` from their WY factors (plain loop, on ``device``):
    per span, S walked from zero and T from the identity by ``h <- exp2(g_last) h + (K *
    exp2(g_last - g))^T (U - W h)`` (T without U), chunk by chunk from the span's first token."""
    f64 = lambda x: None if x is None else x.detach().to(device, torch.float64)  # noqa: E731
    k, w, u, g = f64(k), f64(w), f64(u), f64(g)
    bounds = [int(x) for x in cu_spans.tolist()]
    num_heads, key_dim, value_dim = w.shape[1], w.shape[2], u.shape[2]
    key_heads = torch.arange(num_heads, device=device) // (num_heads // k.shape[1])
    out_t, out_s = [], []
    for s in [int(x) for x in spans.tolist()]:
        a, b = bounds[s], bounds[s + 1]
        h = torch.cat([torch.zeros(num_heads, key_dim, value_dim, dtype=torch.float64, device=device),
                       torch.eye(key_dim, dtype=torch.float64, device=device).expand(num_heads, key_dim, key_dim)],
                      dim=-1)
        for t0 in range(a, b, chunk_size):
            t1 = min(t0 + chunk_size, b)
            uu = torch.cat([u[t0:t1], torch.zeros(t1 - t0, num_heads, key_dim, dtype=torch.float64, device=device)],
                           dim=-1)
            vn = uu - torch.einsum("thk,hkv->thv", w[t0:t1], h)
            if g is not None:
                g_last = g[t1 - 1]
                vn = vn * torch.exp2(g_last[None, :] - g[t0:t1])[..., None]
                h = torch.exp2(g_last)[:, None, None] * h
            h = h + torch.einsum("thk,thv->hkv", k[t0:t1][:, key_heads], vn)
        out_s.append(h[..., :value_dim])
        out_t.append(h[..., value_dim:])
    if not out_t:
        return (torch.empty(0, num_heads, key_dim, key_dim, dtype=torch.float64),
                torch.empty(0, num_heads, key_dim, value_dim, dtype=torch.float64))
    return torch.stack(out_t), torch.stack(out_s)


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def cold_shape(n: int, dev):
    """A cold 32k-style request of n segments (8-token seam + 504-token body each) and a 64-token
    question, one chain: ``(lengths, tokens, cu_spans on the host, on dev, cu_chains on dev)``."""
    lengths = [8, 504] * n + [64]
    cu_cpu = torch.tensor([0] + lengths).cumsum(0)
    return lengths, sum(lengths), cu_cpu, cu_cpu.to(dev), torch.tensor([0, len(lengths)], device=dev)


def cold(n: int, repeats: int) -> dict:
    from hypic.ops.linear import gated_delta

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    lengths, t, cu_cpu, cu, cu_chains = cold_shape(n, dev)
    q, k, v, g, beta = inputs(t, gen, dev)

    bodies = torch.arange(1, 2 * n, 2, device=dev)  # the written spans, as a cold forward asks

    def chain(impl, summarize, mode="fla"):
        def fn():
            with env_vars(HYPIC_CHAIN_LONG=impl, HYPIC_COLD_SUMMARIES=mode):
                return gated_delta.gated_delta_chain_forward_and_summarize(
                    q, k, v, g, beta, cu_seqlens=cu, cu_chains=cu_chains, cu_seqlens_cpu=cu_cpu, summarize=summarize,
                    summary_spans=bodies)
        return fn

    one_cu_cpu = torch.tensor([0, t])
    one_cu = one_cu_cpu.to(dev)

    def one_run():
        return gated_delta.gated_delta_forward(q, k, v, g, beta, cu_seqlens=one_cu, cu_seqlens_cpu=one_cu_cpu)

    o_s, f_s, s_s, _ = chain("scan", True)()
    o_f, f_f, s_ff, _ = chain("fused", True, "fla")()  # fla's summary kernel: [S | T] of every span
    _, _, s_fd, _ = chain("fused", True, "walk")()  # T from it, S from the walk's states
    # float64 reference of the written spans' summaries, from the same WY factors
    from hypic.ops.linear import fla_paths

    _, _, k4, gc, w, u = fla_paths._wy_prepare(k, v, g, beta, cu, cu_cpu)
    t_ref, s_ref = span_summaries_float64(k4[0], w[0], u[0], gc[0], cu_cpu, bodies.cpu())
    o_1, f_1 = one_run()
    # what a body hands on when reused after another prefix: T p + S, p a state of the walk's scale
    p = f_f.double().cpu().expand(len(bodies), -1, -1, -1) * (1.0 + 0.1 * torch.randn(
        len(bodies), HV, KD, VD, dtype=torch.float64))
    handed = lambda summ: torch.matmul(summ.transition.double().cpu(), p) + summ.state.double().cpu()  # noqa: E731
    handed_ref = torch.matmul(t_ref, p) + s_ref
    med = lambda fn: statistics.median(event_times_ms(fn, repeats=repeats))  # noqa: E731
    row = {"case": "cold", "segments": n, "live_tokens": t, "spans": len(lengths),
           "scan_ms": med(chain("scan", False)), "scan_summaries_ms": med(chain("scan", True)),
           "fused_ms": med(chain("fused", False)), "fused_summaries_ms": med(chain("fused", True, "fla")),
           "fused_summaries_from_states_ms": med(chain("fused", True, "walk")),
           "summary_T_err_fla": rel(s_ff.transition, t_ref), "summary_S_err_fla": rel(s_ff.state, s_ref),
           "summary_T_err_from_states": rel(s_fd.transition, t_ref),
           "summary_S_err_from_states": rel(s_fd.state, s_ref),
           "handed_on_err_fla": rel(handed(s_ff), handed_ref),
           "handed_on_err_from_states": rel(handed(s_fd), handed_ref),
           "one_run_ms": med(one_run),
           "o_fused_vs_scan": rel(o_f, o_s), "final_fused_vs_scan": rel(f_f, f_s),
           "o_fused_vs_one_run": rel(o_f, o_1), "final_fused_vs_one_run": rel(f_f, f_1),
           "o_scan_vs_one_run": rel(o_s, o_1), "final_scan_vs_one_run": rel(f_s, f_1),
           "summary_T_fused_vs_scan": rel(s_ff.transition, s_s.transition),
           "summary_S_fused_vs_scan": rel(s_ff.state, s_s.state)}
    print(json.dumps(row), flush=True)
    return row


def seams(n: int, repeats: int) -> dict:
    from hypic.ops.linear import fla_paths
    from hypic.ops.linear._fla_common import span_chunk_rows
    from hypic.ops.linear.short_span import short_span_rows
    from hypic.ops.linear.summary import DenseSummary, SummaryTable, scan_chain_from, summary_addresses
    from hypic.ops.linear.triton_scan import scan_chain_wy_triton

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1)
    lengths = [8] * n + [64]
    t = sum(lengths)
    cu_cpu = torch.tensor([0] + lengths).cumsum(0)
    cu = cu_cpu.to(dev)
    q, k, v, g, beta = inputs(t, gen, dev)
    eye = torch.eye(KD, device=dev)
    bodies = [DenseSummary(0.9 * eye + 0.01 * torch.randn(1, HV, KD, KD, device=dev, generator=gen),
                           torch.randn(1, HV, KD, VD, device=dev, generator=gen)) for _ in range(n)]
    addresses = torch.tensor([summary_addresses(b, dev) for b in bodies], device=dev).T.contiguous()
    table = SummaryTable(tuple(bodies), addresses)
    source_host = []
    for j in range(n):
        source_host += [j, -j - 1]
    source_host.append(n)
    source = torch.tensor(source_host, device=dev)
    cu_chains = torch.tensor([0, len(source_host)], device=dev)
    _, _, k4, gc, w, u = fla_paths._wy_prepare(k, v, g, beta, cu, cu_cpu)
    spans = short_span_rows(cu, cu_cpu, 64, classes=False)
    span_chunk, num_chunks = span_chunk_rows(cu, cu_cpu)

    def short():
        return scan_chain_wy_triton(k4[0], w[0], u[0], gc[0], cu, spans.span_chunk, spans.chunk_spans.shape[0],
                                    cu_chains, second=table, source=source)

    def long():
        return scan_chain_wy_triton(k4[0], w[0], u[0], gc[0], cu, span_chunk, num_chunks, cu_chains, second=table,
                                    source=source, long_spans=True)

    live = fla_paths._zero_start_summary(k4, w, u, gc, cu, cu_cpu)
    _, f_ref = scan_chain_from(DenseSummary(live.transition.double().cpu(), live.state.double().cpu()),
                               DenseSummary(torch.cat([b.transition for b in bodies]).double().cpu(),
                                            torch.cat([b.state for b in bodies]).double().cpu()),
                               source.cpu(), cu_chains.cpu())
    a, b = short(), long()
    med = lambda fn: statistics.median(event_times_ms(fn, repeats=repeats))  # noqa: E731
    row = {"case": "seams", "bodies": n, "live_tokens": t, "short_ms": med(short), "long_ms": med(long),
           "v_new_long_vs_short": rel(b[0], a[0]), "h_long_vs_short": rel(b[1], a[1]),
           "final_err_short": rel(a[2], f_ref), "final_err_long": rel(b[2], f_ref)}
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--segments", default="64,16", help="segments (cold) / cached bodies (seams) per request")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    rows = []
    for n in (int(x) for x in args.segments.split(",")):
        rows.append(cold(n, args.repeats))
        rows.append(seams(n, args.repeats))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "chain_long.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'case':>6} {'n':>4} {'scan':>8} {'scan+S':>8} {'fused':>8} {'fused+S':>8} {'+S(h)':>8} "
          f"{'one run':>8} {'o diff':>8} {'fin diff':>8} {'T err':>8} {'S err':>8} {'S(h) err':>8} "
          f"{'hand fla':>8} {'hand S(h)':>9}")
    for r in rows:
        if r["case"] == "cold":
            print(f"{'cold':>6} {r['segments']:>4} {r['scan_ms']:>8.3f} {r['scan_summaries_ms']:>8.3f} "
                  f"{r['fused_ms']:>8.3f} {r['fused_summaries_ms']:>8.3f} {r['fused_summaries_from_states_ms']:>8.3f} "
                  f"{r['one_run_ms']:>8.3f} {r['o_fused_vs_scan']:>8.1e} {r['final_fused_vs_scan']:>8.1e} "
                  f"{r['summary_T_err_fla']:>8.1e} {r['summary_S_err_fla']:>8.1e} "
                  f"{r['summary_S_err_from_states']:>8.1e} "
                  f"{r['handed_on_err_fla']:>8.1e} {r['handed_on_err_from_states']:>9.1e}")
        else:
            print(f"{'seams':>6} {r['bodies']:>4} short {r['short_ms']:.3f} ms long {r['long_ms']:.3f} ms; final err "
                  f"short {r['final_err_short']:.1e} long {r['final_err_long']:.1e}")


if __name__ == "__main__":
    main()
