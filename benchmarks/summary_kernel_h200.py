"""Cost and accuracy of fla's affine-summary kernel (``chunk_cp_fwd_h``) per dot precision.

In session 5's cold 32k profile the kernel that builds the GDN summaries (T dense K x K and S per
span) took 76.2 ms of a 797 ms request (64 spans x 512 tokens, 30 layers): it alone exceeds the
6% summary budget. fla composes T in fp32 with ``tf32x3`` dots (``CP_DOT_PRECISION``). This
probe times one layer's launch at the 35B-A3B shape (32 value heads, K = V = 128, 32,768 tokens
in 512-token spans) under the precision given by ``--precision`` (patched into fla's module
before the kernel's first compile; one process per precision), and compares T and S of the first
``--check-spans`` spans with the float64 CPU reference.

    python3 benchmarks/summary_kernel_h200.py --precision tf32x3 --out OUT   # fla's choice
    python3 benchmarks/summary_kernel_h200.py --precision tf32 --out OUT
    python3 benchmarks/summary_kernel_h200.py --precision ieee --out OUT

``--gate-bias`` sets how fast the gates decay (a slow decay keeps T far from zero, where its
relative error matters). Writes OUT/summary_kernel_<precision>_bias<bias>.json. The engine's
precision is ``HYPIC_SUMMARY_DOT_PRECISION`` (hypic.ops.linear._fla_summaries).
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
    ap.add_argument("--precision", choices=["tf32x3", "tf32", "ieee"], required=True)
    ap.add_argument("--check-spans", type=int, default=2)
    ap.add_argument("--gate-bias", type=float, default=4.0,
                    help="g = logsigmoid(randn + bias): 4 decays a 512-token span to ~1e-4, 8 to ~0.8")
    args = ap.parse_args()
    import fla.ops.cp.chunk_fwd as cp_fwd

    os.environ["HYPIC_SUMMARY_DOT_PRECISION"] = args.precision
    from hypic.ops.linear._fla_summaries import _configure_summary_precision

    _configure_summary_precision()  # hypic's knob, before the kernel's first compile
    from hypic.ops.linear import gated_delta
    from hypic.ops.linear._fla_common import CHUNK_SIZE, _b1, _chunk_indices, _cu, _local_cumsum
    from hypic.ops.linear.fla_paths import _wy_intra

    dev = torch.device("cuda")
    h, hv, kd, vd, spans, span_tokens = 16, 32, 128, 128, 64, 512
    t = spans * span_tokens
    g_ = torch.Generator(device=dev).manual_seed(0)
    k = F.normalize(torch.randn(t, h, kd, device=dev, generator=g_), dim=-1).bfloat16()
    v = torch.randn(t, hv, vd, device=dev, generator=g_).bfloat16()
    g = F.logsigmoid(torch.randn(t, hv, device=dev, generator=g_) + args.gate_bias)
    beta = torch.sigmoid(torch.randn(t, hv, device=dev, generator=g_)).bfloat16()
    cu = torch.arange(0, t + 1, span_tokens, device=dev)
    cu_cpu = cu.cpu()
    k4 = _b1(k)
    v4, beta3 = _b1(v), _b1(beta)
    cu_d = _cu(cu, dev)
    ci = _chunk_indices(cu_d, cu_cpu)
    gc = _local_cumsum(_b1(g), cu_d, ci)
    w, u = _wy_intra(k4, v4, gc, beta3, cu_d, ci)
    hm = torch.empty(spans, hv, kd, vd + kd, device=dev, dtype=torch.float32)

    def launch():
        cp_fwd.chunk_cp_fwd_h(k=k4, w=w, u=u, hm=hm, g=gc, gk=None, cu_seqlens=cu_d, chunk_size=CHUNK_SIZE,
                              multi_seqs=True)

    times = event_times_ms(launch)
    n = args.check_spans
    ref = gated_delta.gated_delta_summarize(
        k[: n * span_tokens].cpu().double(),
        v[: n * span_tokens].cpu().double(), g[: n * span_tokens].cpu().double(),
        beta[: n * span_tokens].cpu().double(), cu_seqlens=cu_cpu[: n + 1])
    state, trans = hm[:n, ..., :vd].double().cpu(), hm[:n, ..., vd:].double().cpu()
    row = {"precision": args.precision, "gate_bias": args.gate_bias, "ms_per_layer": statistics.median(times), "ms_all": times,
           "tokens": t, "spans": spans, "value_heads": hv, "key_dim": kd,
           "rel_err_T": float((trans - ref.transition).norm() / ref.transition.norm()),
           "rel_err_S": float((state - ref.state).norm() / ref.state.norm()),
           "max_abs_err_T": float((trans - ref.transition).abs().max())}
    print(json.dumps({k_: v_ for k_, v_ in row.items() if k_ != "ms_all"}), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"summary_kernel_{args.precision}_bias{args.gate_bias:g}.json"), "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
