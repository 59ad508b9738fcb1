"""Causal prefill attention kernels on one GPU at Qwen3.5-35B-A3B's full-attention shape.

16 query heads, 2 KV heads, head dim 256, bf16; one sequence of T tokens (cold prefill) and two
sequences of T/2 packed (varlen). Variants, each checked against FlashAttention's output:

* ``flash``        - ``aten._flash_attention_forward`` varlen (hypic's cold path today);
* ``cudnn_varlen`` - ``aten._cudnn_attention_forward`` with cumulative lengths, packed [T, H, D];
* ``cudnn_sdpa``   - SDPA restricted to the cuDNN backend, [1, H, T, D] (single sequence);
* ``efficient``    - SDPA restricted to the memory-efficient backend (single sequence).

FLOP rate: 4 * Hq * D per visible (query, key) pair, the count in hypic/bench/flops.py.
Writes OUT/attention_h200.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from _timing import event_median_ms

HQ, HKV, D = 16, 2, 256


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tokens", default="8192,32768")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(),
           "attention_api": sorted(n for n in dir(torch.nn.attention) if not n.startswith("__")), "rows": []}
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}), flush=True)
    scale = D**-0.5
    for total in [int(x) for x in args.tokens.split(",")]:
        g = torch.Generator(device=dev).manual_seed(total)
        q = torch.randn(total, HQ, D, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(total, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(total, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
        for nseq in (1, 2):
            lens = [total // nseq] * nseq
            cu = torch.tensor([0] + [sum(lens[: i + 1]) for i in range(nseq)], device=dev, dtype=torch.int32)
            pairs = sum(n * (n + 1) // 2 for n in lens)
            flop = 4 * HQ * D * pairs
            variants = {}

            def flash():
                return torch.ops.aten._flash_attention_forward(
                    q, k, v, cu, cu, max(lens), max(lens), 0.0, True, False, scale=scale)[0]

            variants["flash"] = flash
            k_exp = k.repeat_interleave(HQ // HKV, dim=1)
            v_exp = v.repeat_interleave(HQ // HKV, dim=1)
            cu64 = cu.long()

            def cudnn_varlen_gqa():
                return torch.ops.aten._cudnn_attention_forward(
                    q, k, v, None, cu64, cu64, max(lens), max(lens), False, 0.0, True, False, scale=scale)[0]

            def cudnn_varlen_exp():
                return torch.ops.aten._cudnn_attention_forward(
                    q, k_exp, v_exp, None, cu64, cu64, max(lens), max(lens), False, 0.0, True, False, scale=scale)[0]

            variants["cudnn_varlen_gqa"] = cudnn_varlen_gqa
            variants["cudnn_varlen_expanded"] = cudnn_varlen_exp
            if nseq == 1:
                qd = q.transpose(0, 1)[None]
                kd = k_exp.transpose(0, 1)[None]
                vd = v_exp.transpose(0, 1)[None]

                def sdpa(backend):
                    def run():
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scale)[0].transpose(0, 1)
                    return run

                variants["cudnn_sdpa"] = sdpa(SDPBackend.CUDNN_ATTENTION)
                variants["efficient_sdpa"] = sdpa(SDPBackend.EFFICIENT_ATTENTION)
                variants["flash_sdpa"] = sdpa(SDPBackend.FLASH_ATTENTION)
            ref = flash()
            for name, fn in variants.items():
                row = {"tokens": total, "sequences": nseq, "variant": name, "tflop": flop / 1e12}
                try:
                    out = fn()
                    out = out.reshape(ref.shape) if out.numel() == ref.numel() else out
                    row["shape"] = list(out.shape)
                    row["rel_err_vs_flash"] = rel_err(out, ref) if out.shape == ref.shape else None
                    ms = event_median_ms(fn, args.repeats)
                    row["ms"] = ms
                    row["tflops"] = flop / ms / 1e9
                except Exception as exc:  # a backend that refuses this shape is a result, not a failure
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                res["rows"].append(row)
                print(json.dumps(row), flush=True)
            del ref
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "attention_h200.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"{'tokens':>7} {'seqs':>4} {'variant':>24} {'ms':>9} {'TFLOP/s':>8} {'rel err':>9}")
    for r in res["rows"]:
        if "ms" in r:
            print(f"{r['tokens']:>7} {r['sequences']:>4} {r['variant']:>24} {r['ms']:>9.2f} {r['tflops']:>8.1f} "
                  f"{r['rel_err_vs_flash'] if r['rel_err_vs_flash'] is not None else float('nan'):>9.2e}")
        else:
            print(f"{r['tokens']:>7} {r['sequences']:>4} {r['variant']:>24}  {r['error'][:80]}")


if __name__ == "__main__":
    main()
