"""Is the compiled glue (``HYPIC_COMPILE_GLUE=1``) right on the GPU, and what does each piece buy?

1. every function the fused path compiles, eager against compiled on CUDA at Qwen3.5-35B-A3B
   shapes for a 32k-token prefill (bf16): relative error and time of each (median of 5);
2. how far the dummy model's logits move under a perturbation the size of bf16 rounding (each
   embedding row times ``1 + 2^-8 * noise``): the scale against which the logits difference of
   the whole model with and without the compiled glue is read (random weights and top-k routing
   amplify any rounding difference, so that difference alone proves nothing).

    python3 benchmarks/glue_check_h200.py --out OUT_DIR      # -> OUT_DIR/glue_check_h200.json

``--smoke`` runs the same on the CPU with small shapes and the embedded tiny config.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from hypic.engine.context import PlainContext, SequenceCache  # noqa: E402
from hypic.models.loader import build_dummy_model  # noqa: E402
from hypic.ops import fused, moe_grouped, norms  # noqa: E402

CONFIG = os.path.join(os.path.dirname(__file__), "..", "hypic", "models", "configs", "qwen3_5_35b_a3b.json")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def median_ms(fn, device, repeats=5) -> float:
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def op_cases(num_tokens: int, spec, device, dtype, gen):
    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    hidden, top_k = spec.hidden_size, max(1, spec.num_experts_per_tok)  # the tiny smoke model is dense
    heads, head_dim = spec.num_attention_heads, spec.head_dim
    hv, dv, hk, dk = (spec.linear_num_value_heads, spec.linear_value_head_dim,
                      spec.linear_num_key_heads, spec.linear_key_head_dim)
    inter = spec.moe_intermediate_size or spec.intermediate_size
    x, h = r(num_tokens, hidden, scale=3), r(num_tokens, hidden)
    w = r(hidden, scale=0.1)
    rows = r(num_tokens * top_k, hidden)
    inverse = torch.randperm(num_tokens * top_k, generator=gen).to(device)
    mix = torch.rand(num_tokens, top_k, generator=gen).to(device=device, dtype=dtype)
    return {
        "rms_norm_zero_centered": (norms.rms_norm_zero_centered_math, (x, w, 1e-6)),
        "add_rms_norm_zero_centered": (norms._ADD_RMS_NORM_ZERO_CENTERED, (x, h, w, 1e-6)),
        "q_norm (rms_norm_zero_centered)": (norms.rms_norm_zero_centered_math,
                                            (r(num_tokens, heads, head_dim), r(head_dim, scale=0.1), 1e-6)),
        "gated_rms_norm": (norms.gated_rms_norm_math, (r(num_tokens, hv, dv), r(num_tokens, hv, dv), r(dv) + 1, 1e-6)),
        "l2_normalize": (norms.l2_normalize_math, (r(num_tokens, hk, dk), 1e-6)),
        "swiglu (routed)": (fused.swiglu_math, (r(num_tokens * top_k, inter), r(num_tokens * top_k, inter))),
        "sigmoid_gate": (fused.sigmoid_gate_math, (r(num_tokens, heads * head_dim), r(num_tokens, heads * head_dim))),
        "add_sigmoid_gated": (fused.add_sigmoid_gated_math, (x, h, r(num_tokens, 1))),
        "moe combine": (moe_grouped.combine_slots_math, (rows, inverse, mix)),
        "moe combine (eager gather + bmm)": (moe_grouped.combine_slots, (rows, inverse, mix)),
    }


def logits(spec, model, ids, device, dtype, noise=None):
    cache = SequenceCache.allocate(spec, device, dtype)
    handle = None
    if noise is not None:
        handle = model.model.embed_tokens.register_forward_hook(lambda m, i, out: out * (1 + noise))
    try:
        with torch.inference_mode():
            ctx = PlainContext(spec, [cache], [len(ids)])
            return model(torch.tensor(ids, device=device), ctx.positions, ctx).float()
    finally:
        if handle is not None:
            handle.remove()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    device, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)
    config_path = CONFIG if not args.smoke else os.path.join(os.path.dirname(CONFIG), "..", "..", "assets", "tiny", "config.json")
    with open(config_path) as f:
        config = json.load(f)
    spec, model = build_dummy_model(config, dtype=dtype, device=device, seed=0)
    gen = torch.Generator().manual_seed(0)
    num_tokens = 256 if args.smoke else 32768
    res = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "num_tokens": num_tokens, "ops": {}}
    for name, (fn, fargs) in op_cases(num_tokens, spec, device, dtype, gen).items():
        ref = fn(*fargs)
        comp = fused.compile_graph(fn)
        out = comp(*fargs)  # compiles
        refs, outs = (ref if isinstance(ref, tuple) else (ref,)), (out if isinstance(out, tuple) else (out,))
        row = {"rel_err": max(rel(o, r) for o, r in zip(outs, refs)),
               "eager_ms": median_ms(lambda: fn(*fargs), device), "compiled_ms": median_ms(lambda: comp(*fargs), device)}
        res["ops"][name] = row
        print(f"{name:36s} rel {row['rel_err']:.2e}  eager {row['eager_ms']:8.3f} ms  compiled {row['compiled_ms']:8.3f} ms", flush=True)
    del fargs
    # the eager combine is the reference of the compiled one: compare them directly too
    top_k = max(1, spec.num_experts_per_tok)
    rows_t = torch.randn(num_tokens * top_k, spec.hidden_size, generator=gen).to(device=device, dtype=dtype)
    inv = torch.randperm(rows_t.shape[0], generator=gen).to(device)
    mix = torch.rand(num_tokens, top_k, generator=gen).to(device=device, dtype=dtype)
    res["combine_compiled_vs_eager_rel"] = rel(fused.compile_graph(moe_grouped.combine_slots_math)(rows_t, inv, mix),
                                               moe_grouped.combine_slots(rows_t, inv, mix))
    del rows_t
    ids = torch.randint(spec.vocab_size, (64 if args.smoke else 2048,), generator=gen).tolist()
    os.environ[fused.COMPILE_ENV] = "0"
    base = logits(spec, model, ids, device, dtype)
    noise = torch.randn(len(ids), spec.hidden_size, generator=gen).to(device=device, dtype=dtype) * 2**-8
    res["logits_rel_under_bf16_sized_noise"] = rel(logits(spec, model, ids, device, dtype, noise=noise), base)
    os.environ[fused.COMPILE_ENV] = "1"
    res["logits_rel_glue_vs_eager"] = rel(logits(spec, model, ids, device, dtype), base)
    os.environ[fused.COMPILE_ENV] = "0"
    res["note"] = ("logits_rel_glue_vs_eager is read against logits_rel_under_bf16_sized_noise: "
                   "a difference of the same size is rounding amplified by the random model")
    print(json.dumps({k: v for k, v in res.items() if k != "ops"}, indent=1), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "glue_check_h200.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
