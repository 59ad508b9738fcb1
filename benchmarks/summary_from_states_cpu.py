"""How accurate is a segment's zero-start state S(C|0) when derived from the states around it in a
prefill, ``S(C|0) = h_end - T_C h_start``, instead of computed by a second (zero-start) state pass?

Why: a cold PIC prefill computes, per GDN layer, the forward over the whole request *and* every
segment's (T_C, S(C|0)). On the H200 (benchmarks/results/session9/call2) the S half of fla's
summary kernel, the chain scan and the per-segment state pass are most of the +10-13% summary
cost. fla's state pass already has the state entering every 64-token chunk (``h``), so only T_C
(a T-only summary kernel) and one batched matmul per layer would be left, but fla stores ``h`` in
the activations' dtype (bf16), and the subtraction can cancel. This script measures that error in
float64 on the CPU (Gated DeltaNet reference, K = V = 128) for boundary states rounded to bf16 and
to fp32, against two yardsticks: S(C|0) itself rounded to bf16, and what the error does to the
state a cached segment hands on after a new prefix, ``T_C p + S(C|0)``.

A cold PIC layout writes each segment's *body*, which starts after its 8-token seam, mid-chunk.
The last two columns compose a body from its partial first chunk ``[8, 64)`` (its own zero-start
summary) and its chunk-aligned rest ``[64, end)``, whose S is derived from the bf16 boundary
states: ``T_body = T_rest T_part`` and ``S_body = T_rest S_part + (h_end - T_rest h_64)``.

    PYTHONPATH=. python3 benchmarks/summary_from_states_cpu.py --json OUT.json

Gates follow the Qwen3.5 recipe (``-exp(A_log) softplus(a - 6)``) with ``A_log`` fixed per row of
the table, from slow (decay ~0.996 a token) to fast; keys unit-norm, beta = sigmoid(N(shift, 1)).
Random keys span all K directions, so the delta rule erases most of an old state within a
segment and T_C is small; ``--key-rank`` draws keys from a subspace (the directions outside it
keep the old state, decayed by the gates only) and ``--beta-shift`` weakens the writes: both make
T_C large and the subtraction cancel, the hard case for the derivation.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import torch
import torch.nn.functional as F

from hypic.ops.linear.gated_delta import gated_delta_forward, gated_delta_summarize

H, HV, K, V = 2, 4, 128, 128


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative Frobenius error per (span, head), as a flat list."""
    diff = (got.double() - want.double()).flatten(2).norm(dim=-1)
    return (diff / want.double().flatten(2).norm(dim=-1)).flatten().tolist()


def case(a_log: float, num_segments: int, segment_tokens: int, prefix_tokens: int, seed: int,
         key_rank: int = K, beta_shift: float = 0.0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    total = prefix_tokens + num_segments * segment_tokens
    f64 = torch.float64
    q = F.normalize(torch.randn(total, H, K, generator=gen, dtype=f64), dim=-1)
    basis = torch.linalg.qr(torch.randn(K, K, generator=gen, dtype=f64))[0][:, :key_rank]  # [K, r]
    k = F.normalize(torch.randn(total, H, key_rank, generator=gen, dtype=f64) @ basis.T, dim=-1)
    v = torch.randn(total, HV, V, generator=gen, dtype=f64)
    g = -math.exp(a_log) * F.softplus(torch.randn(total, HV, generator=gen, dtype=f64) - 6.0)
    beta = torch.sigmoid(torch.randn(total, HV, generator=gen, dtype=f64) + beta_shift)
    p = prefix_tokens
    # the state the first segment starts from: a real prefix's
    _, h0 = gated_delta_forward(q[:p], k[:p], v[:p], g[:p], beta[:p], cu_seqlens=torch.tensor([0, p]))
    cu = torch.arange(num_segments + 1) * segment_tokens
    args = (k[p:], v[p:], g[p:], beta[p:])
    summ = gated_delta_summarize(*args, cu_seqlens=cu)
    t, s = summ.transition, summ.state  # [N, HV, K, K], [N, HV, K, V], exact
    states = [h0[0]]
    for i in range(num_segments):  # the prefill's states at the segment boundaries, exact
        states.append(t[i] @ states[-1] + s[i])
    start, end = torch.stack(states[:-1]), torch.stack(states[1:])
    # another prefix for the composed-state check: the state after a different random run
    other = torch.randn(1, HV, K, V, generator=gen, dtype=f64) * start.flatten(2).norm(dim=-1).mean() / math.sqrt(K * V)
    out = {"a_log": a_log, "key_rank": key_rank, "beta_shift": beta_shift, "segments": num_segments,
           "segment_tokens": segment_tokens,
           "decay_per_token_mean": float(torch.exp(g[p:]).mean()),
           "transition_norm_mean": float(t.flatten(2).norm(dim=-1).mean() / math.sqrt(K)),
           "state_ratio_mean": float((end.flatten(2).norm(dim=-1) / s.flatten(2).norm(dim=-1)).mean())}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        t32 = t.float()
        derived = end.to(dtype).float() - t32 @ start.to(dtype).float()
        errs = rel(derived, s)
        composed = rel(t32 @ other.float() + derived, t @ other + s)
        out[f"derived_{name}_rel_median"] = statistics.median(errs)
        out[f"derived_{name}_rel_max"] = max(errs)
        out[f"composed_{name}_rel_max"] = max(composed)
    out["s_rounded_bf16_rel_max"] = max(rel(s.to(torch.bfloat16), s))
    # A cold PIC layout writes each segment's body, which starts after the seam (w tokens, here
    # 8), mid-chunk: compose it from its partial first chunk [w, 64) (its own zero-start summary)
    # and its chunk-aligned rest [64, end), whose S comes from the boundary states.
    seam, chunk = 8, 64
    starts = [i * segment_tokens for i in range(num_segments)]
    total_seg = num_segments * segment_tokens

    def spans(offsets):  # cu over all segment tokens, cut at each segment's start + offsets
        return torch.tensor(sorted({0, total_seg, *starts, *(a + o for a in starts for o in offsets)}))

    body = gated_delta_summarize(*args, cu_seqlens=spans([seam]))  # seam, body, seam, body, ...
    t_body, s_body = body.transition[1::2], body.state[1::2]
    pieces = gated_delta_summarize(*args, cu_seqlens=spans([seam, chunk]))  # seam, partial, rest, ...
    t_part, s_part, t_rest = pieces.transition[1::3], pieces.state[1::3], pieces.transition[2::3].float()
    # the state entering the chunk at start + 64: the exact state advanced through [0, 64)
    first = gated_delta_summarize(*args, cu_seqlens=spans([chunk]))  # first chunk, rest, ...
    h64 = first.transition[0::2] @ start + first.state[0::2]
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        s_rest = end.to(dtype).float() - t_rest @ h64.to(dtype).float()
        derived_s = t_rest @ s_part.float() + s_rest
        derived_t = t_rest @ t_part.float()
        out[f"body_{name}_s_rel_max"] = max(rel(derived_s, s_body))
        out[f"body_{name}_t_rel_max"] = max(rel(derived_t, t_body))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--a-logs", default="0,1,2,2.77", help="log of the gate scale (Qwen3.5: U(0, log 16))")
    ap.add_argument("--segments", type=int, default=6)
    ap.add_argument("--segment-tokens", type=int, default=512)
    ap.add_argument("--prefix-tokens", type=int, default=1024)
    ap.add_argument("--key-ranks", default="128,16", help="dimension of the subspace keys are drawn from")
    ap.add_argument("--beta-shifts", default="0,-3", help="beta = sigmoid(N(shift, 1))")
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = []
    for rank in [int(x) for x in args.key_ranks.split(",")]:
        for shift in [float(x) for x in args.beta_shifts.split(",")]:
            for i, a in enumerate(args.a_logs.split(",")):
                rows.append(case(float(a), args.segments, args.segment_tokens, args.prefix_tokens, seed=i,
                                 key_rank=rank, beta_shift=shift))
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'rank':>4} {'beta':>5} {'A_log':>6} {'decay':>7} {'|T|':>7} {'|h|/|S|':>8} {'bf16 med':>9} {'bf16 max':>9} {'comp bf16':>10} "
          f"{'fp32 max':>9} {'comp fp32':>10} {'S->bf16':>8} {'body S':>8} {'body T':>8}")
    for r in rows:
        print(f"{r['key_rank']:>4} {r['beta_shift']:>5.1f} {r['a_log']:>6.2f} {r['decay_per_token_mean']:>7.4f} {r['transition_norm_mean']:>7.3f} "
              f"{r['state_ratio_mean']:>8.2f} {r['derived_bf16_rel_median']:>9.1e} {r['derived_bf16_rel_max']:>9.1e} "
              f"{r['composed_bf16_rel_max']:>10.1e} {r['derived_fp32_rel_max']:>9.1e} {r['composed_fp32_rel_max']:>10.1e} "
              f"{r['s_rounded_bf16_rel_max']:>8.1e} {r['body_bf16_s_rel_max']:>8.1e} {r['body_bf16_t_rel_max']:>8.1e}")


if __name__ == "__main__":
    main()
