"""GPU time of one linear layer of a cached request at the all-hit shape (Qwen3.5-35B-A3B: 32
value heads, 16 key heads, K = V = 128; N cached bodies, each preceded by its 8-token seam, then a
64-token question), by the two ways the PIC forward has run it:

* ``separate`` (session 7): the live spans' closed-form summaries, the chain scan over them and
  the bodies (read in place), the one-chunk state pass, fla's output kernel;
* ``fused`` (session 8): ``gated_delta_chain_forward``, whose scan applies the live spans from
  their WY factors and writes the output kernel's inputs on the way.

Also the two scans alone (the fused one with its dots in ``tf32x3``, ``bf16x3`` and ``tf32``), and
the fused layer with the scan in ``bf16x3`` (``HYPIC_SCAN_PRECISION``). Outputs are
compared with each other and the final states with a float64 scan of the same summaries.
Session 15: the bf16x3 scan and layer under each ``HYPIC_CHAIN_FUSE_SEAMS`` (0: each seam and
the body after it as two steps, 1: one step, the default), in ``fuse_seams``. (Calls 2-3 of
session 15 also timed a mode 2, since removed; session 19 call 1 timed another mode 2, the
fused step with the next step's body tiles loaded during a step, also removed: at 64 bodies
0.766 ms against mode 1's 0.716; commit a2b8c4c has it.)

    python3 benchmarks/chain_forward_h200.py --out OUT   # -> OUT/chain_forward.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from _timing import env_vars, event_times_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--bodies", default="64,16", help="cached bodies per request, one row each")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    rows = [run(int(n), args.repeats) for n in args.bodies.split(",")]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "chain_forward.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'bodies':>6} {'separate ms':>12} {'fused ms':>9} {'scan+pass ms':>13} {'wy scan ms':>11} "
          f"{'wy tf32 ms':>11} {'wy bf16x3':>10} {'fused bf16x3':>12} {'o rel':>8} {'final rel':>9} "
          f"{'err tf32x3':>10} {'err bf16x3':>10} {'err tf32':>9} "
          + " ".join(f"{'scan/layer ' + m:>15}" for m in ("0", "1")))
    for r in rows:
        print(f"{r['bodies']:>6} {r['separate_ms']:>12.3f} {r['fused_ms']:>9.3f} {r['old_scan_ms']:>13.3f} "
              f"{r['wy_scan_ms']:>11.3f} {r['wy_scan_tf32_ms']:>11.3f} {r['wy_scan_bf16x3_ms']:>10.3f} "
              f"{r['fused_bf16x3_ms']:>12.3f} {r['o_rel_diff']:>8.1e} {r['final_rel_diff']:>9.1e} "
              f"{r['final_rel_err_fused']:>10.1e} {r['final_rel_err_fused_bf16x3']:>10.1e} "
              f"{r['final_rel_err_fused_tf32']:>9.1e} "
              + " ".join(f"{f['scan_ms']:>7.3f}/{f['layer_ms']:<7.3f}" for f in r["fuse_seams"].values()))


def allhit_layer_inputs(nb: int) -> SimpleNamespace:
    """One linear layer's inputs at the all-hit shape on CUDA: ``nb`` 8-token seams and a
    64-token question (``q, k, v, g, beta``, span bounds ``cu`` / ``cu_cpu``), ``nb`` cached
    bodies read in place (``bodies``, ``table``), the chain seam, body, ..., question
    (``source``, ``cu_chains``) and the live spans' record rows (``record``). Shared with
    scan_ablation_h200.py."""
    from hypic.ops.linear.summary import DenseSummary, SummaryTable, summary_addresses

    dev = torch.device("cuda")
    h, hv, kd, vd, seam, question = 16, 32, 128, 128, 8, 64
    gen = torch.Generator(device=dev).manual_seed(0)
    lengths = [seam] * nb + [question]
    t = sum(lengths)
    cu_cpu = torch.tensor([0] + lengths).cumsum(0)
    cu = cu_cpu.to(dev)
    q = F.normalize(torch.randn(t, h, kd, device=dev, generator=gen), dim=-1).bfloat16()
    k = F.normalize(torch.randn(t, h, kd, device=dev, generator=gen), dim=-1).bfloat16()
    v = torch.randn(t, hv, vd, device=dev, generator=gen).bfloat16()
    g = F.logsigmoid(torch.randn(t, hv, device=dev, generator=gen) + 3.0)
    beta = torch.sigmoid(torch.randn(t, hv, device=dev, generator=gen)).bfloat16()
    eye = torch.eye(kd, device=dev)
    bodies = [DenseSummary(0.9 * eye + 0.01 * torch.randn(1, hv, kd, kd, device=dev, generator=gen),
                           torch.randn(1, hv, kd, vd, device=dev, generator=gen)) for _ in range(nb)]
    addresses = torch.tensor([summary_addresses(b, dev) for b in bodies], device=dev).T.contiguous()
    source_host = []
    for j in range(nb):
        source_host += [j, -j - 1]
    source_host.append(nb)
    source = torch.tensor(source_host, device=dev)
    return SimpleNamespace(t=t, hv=hv, kd=kd, vd=vd, cu=cu, cu_cpu=cu_cpu, q=q, k=k, v=v, g=g, beta=beta,
                           bodies=bodies, table=SummaryTable(tuple(bodies), addresses), source=source,
                           cu_chains=torch.tensor([0, len(source_host)], device=dev),
                           record=torch.where(source >= 0, source, torch.full_like(source, -1)))


def run(nb: int, repeats: int) -> dict:
    from hypic.ops.linear import fla_paths
    from hypic.ops.linear.gated_delta import gated_delta_chain_forward
    from hypic.ops.linear.short_span import short_span_rows, short_span_state_pass_triton
    from hypic.ops.linear.summary import DenseSummary, scan_chain_from
    from hypic.ops.linear.triton_scan import scan_chain_wy_triton

    x = allhit_layer_inputs(nb)
    t, hv, kd, vd, cu, cu_cpu = x.t, x.hv, x.kd, x.vd, x.cu, x.cu_cpu
    q, k, v, g, beta = x.q, x.k, x.v, x.g, x.beta
    bodies, table, source, cu_chains, record = x.bodies, x.table, x.source, x.cu_chains, x.record

    def separate():
        out = {}

        def incoming_from(live):
            out["inc"], out["final"] = scan_chain_from(live, table, source, cu_chains, record_rows=record,
                                                       num_records=nb + 1)
            return out["inc"]

        o, _, _ = fla_paths.gated_delta_summarize_then_forward(
            q, k, v, g, beta, cu_seqlens=cu, initial_states_from=incoming_from, cu_seqlens_cpu=cu_cpu,
            output_final_state=False)
        return o, out["final"]

    def fused():
        return gated_delta_chain_forward(q, k, v, g, beta, cu_seqlens=cu, cu_chains=cu_chains, source=source,
                                         bodies=table, cu_seqlens_cpu=cu_cpu)

    # the scans alone, on the same WY factors
    _, _, k4, gc, w, u = fla_paths._wy_prepare(k, v, g, beta, cu, cu_cpu)
    spans = short_span_rows(cu, cu_cpu, 64, classes=False)
    live = fla_paths._zero_start_summary(k4, w, u, gc, cu, cu_cpu)

    def old_scan():
        inc, final = scan_chain_from(live, table, source, cu_chains, record_rows=record, num_records=nb + 1)
        return short_span_state_pass_triton(w[0], u[0], inc, cu, spans, 64), final

    def wy_scan(precision):
        return lambda: scan_chain_wy_triton(k4[0], w[0], u[0], gc[0], cu, spans.span_chunk, spans.chunk_spans.shape[0],
                                            cu_chains, second=table, source=source, precision=precision)

    o_a, f_a = separate()
    o_b, f_b = fused()
    # float64 reference of the final state: the same live summaries and bodies, scanned in fp64
    _, f_ref = scan_chain_from(DenseSummary(live.transition.double().cpu(), live.state.double().cpu()),
                               DenseSummary(torch.cat([b.transition for b in bodies]).double().cpu(),
                                            torch.cat([b.state for b in bodies]).double().cpu()),
                               source.cpu(), cu_chains.cpu())
    rel = lambda a, b: float((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm())  # noqa: E731
    f_tf32 = wy_scan("tf32")()[2]
    f_bf16x3 = wy_scan("bf16x3")()[2]

    def with_env(fn, **env):
        def run():
            with env_vars(**env):
                return fn()
        return run

    fused_bf16x3 = with_env(fused, HYPIC_SCAN_PRECISION="bf16x3")
    fuse_modes = ("0", "1")
    fuse_scans = {m: with_env(wy_scan("bf16x3"), HYPIC_CHAIN_FUSE_SEAMS=m) for m in fuse_modes}
    fuse_layers = {m: with_env(fused, HYPIC_SCAN_PRECISION="bf16x3", HYPIC_CHAIN_FUSE_SEAMS=m) for m in fuse_modes}
    fuse_outs = {m: fuse_scans[m]() for m in fuse_modes}

    o_c, f_c = fused_bf16x3()
    med = lambda fn: statistics.median(event_times_ms(fn, repeats=repeats))  # noqa: E731
    row = {"bodies": nb, "live_tokens": t, "heads": hv, "key_dim": kd, "value_dim": vd,
           "separate_ms": med(separate), "fused_ms": med(fused), "old_scan_ms": med(old_scan),
           "wy_scan_ms": med(wy_scan("tf32x3")), "wy_scan_tf32_ms": med(wy_scan("tf32")),
           "wy_scan_bf16x3_ms": med(wy_scan("bf16x3")), "fused_bf16x3_ms": med(fused_bf16x3),
           "o_rel_diff_bf16x3": rel(o_c, o_a), "final_rel_err_fused_bf16x3_layer": rel(f_c, f_ref),
           "final_rel_err_fused_bf16x3": rel(f_bf16x3, f_ref),
           "o_rel_diff": rel(o_b, o_a), "final_rel_diff": rel(f_b, f_a),
           "final_rel_err_separate": rel(f_a, f_ref), "final_rel_err_fused": rel(f_b, f_ref),
           "final_rel_err_fused_tf32": rel(f_tf32, f_ref),
           "fuse_seams": {m: {"scan_ms": med(fuse_scans[m]), "layer_ms": med(fuse_layers[m]),
                              "final_rel_err": rel(fuse_outs[m][2], f_ref),
                              "vs_two_steps_rel_diff": {name: rel(a, b) for name, a, b in
                                                        zip(("v_new", "h", "final"), fuse_outs[m], fuse_outs["0"])}}
                          for m in fuse_modes}}
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    main()
