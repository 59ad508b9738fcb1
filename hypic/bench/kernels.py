"""``hypic bench kernels --op NAME``: time one product op on the device its inputs live on, and its
error against the pure-PyTorch reference beside it.

    hypic bench kernels --op moe --device cuda --size model --json moe.json
    hypic bench kernels --op all --device cpu --size tiny            # every op, CPU smoke run

Each op is called through its public function, which picks the kernel for the input tensors
(device, dtype, shape), exactly as a forward does; the reference is the same computation through
the pure-PyTorch path in float64 on the CPU, except ``moe`` and ``attention`` on CUDA, whose
``impl="reference"`` path runs there in float32 (a float64 CPU pass over 32k tokens at model
widths takes minutes). Shapes at
``--size model`` are Qwen3.5-35B-A3B's (hidden 2048, 256 experts top-8 of intermediate 512; 16
query / 2 kv heads of 256; GDN 16 key / 32 value heads of 128, conv width 4), at the all-hit 32k
request's sizes (576 live tokens) and the cold 32k prefill's (32,768 tokens). ``--size tiny`` is a
few tokens of narrow widths (the CPU smoke test).

Rows: ``op, case, impl`` (what the public function ran: ``auto`` on the device), ``tokens``,
``first_call_ms`` (compiles and autotuning included), ``ms`` (median of ``--repeats``; CUDA events
behind a sleep kernel, so the kernels rather than the launch latency), ``ms_samples``,
``tflops`` where a FLOP count is given, ``max_abs_err`` / ``rel_err`` (Frobenius) of the output
against the reference (``state_rel_err``: of the final state, where the op returns one),
``reference`` (where and in which dtype it ran).
"""

from __future__ import annotations

import argparse
import math
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F

from hypic.bench.common import device_name, median, provenance, time_calls_ms, write_report
from hypic.engine.engine import resolve_device, resolve_dtype
from hypic.ops.attention import varlen_attention
from hypic.ops.conv import causal_conv1d
from hypic.ops.linear.gated_delta import gated_delta_forward_and_summarize
from hypic.ops.linear.scan import scan_chain
from hypic.ops.linear.summary import DenseSummary
from hypic.ops.moe import moe_experts, route_topk_softmax

SIZES = ("tiny", "model")


def _errors(out: torch.Tensor, ref: torch.Tensor) -> Dict[str, float]:
    a, b = out.detach().double().cpu(), ref.detach().double().cpu()
    return {"max_abs_err": float((a - b).abs().max()) if a.numel() else 0.0,
            "rel_err": float((a - b).norm() / b.norm().clamp_min(1e-300))}


def _reference_dtype(device: torch.device) -> torch.dtype:
    """The dtype of the ``impl="reference"`` oracle on the inputs' device (see the module docstring)."""
    return torch.float64 if device.type == "cpu" else torch.float32


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def _moe_cases(size: str, device: torch.device, dtype: torch.dtype):
    hidden, inter, experts, top_k = (2048, 512, 256, 8) if size == "model" else (32, 16, 8, 2)
    tokens_list = (576, 32768) if size == "model" else (8, 40)
    gen = torch.Generator().manual_seed(0)
    gate_up = (_randn(gen, experts, 2 * inter, hidden) / hidden ** 0.5).to(dtype)
    down = (_randn(gen, experts, hidden, inter) / inter ** 0.5).to(dtype)
    for tokens in tokens_list:
        x = _randn(gen, tokens, hidden).to(dtype)
        weights, ids = route_topk_softmax(_randn(gen, tokens, experts), top_k, True)
        weights = weights.to(dtype)
        dev = [t.to(device) for t in (x, gate_up, down, weights, ids)]

        def run(dev=dev):
            return moe_experts(*dev)

        def reference(dev=dev):
            ref = _reference_dtype(device)
            return moe_experts(*(t.to(ref) for t in dev[:4]), dev[4], impl="reference")

        yield f"T={tokens}", tokens, 6.0 * tokens * top_k * hidden * inter, run, reference


def _attention_cases(size: str, device: torch.device, dtype: torch.dtype):
    heads, kv_heads, head_dim = (16, 2, 256) if size == "model" else (4, 2, 16)
    # (case, queries, keys): a cold prefill (square, causal) and a cached request's live tokens
    # (seams + question spread over the keys: the split-KV path on CUDA)
    cases = (("cold", 32768, 32768), ("all_hit_live", 576, 32832)) if size == "model" else \
        (("cold", 40, 40), ("all_hit_live", 12, 300))
    gen = torch.Generator().manual_seed(1)
    for case, num_q, num_k in cases:
        if num_q == num_k:
            pos_q = torch.arange(num_k)
        else:
            pos_q = torch.linspace(0, num_k - 1, num_q).round().long().unique()
            num_q = pos_q.numel()
        q = _randn(gen, num_q, heads, head_dim).to(dtype)
        k = _randn(gen, num_k, kv_heads, head_dim).to(dtype)
        v = _randn(gen, num_k, kv_heads, head_dim).to(dtype)
        pos_k = torch.arange(num_k)
        cu_q, cu_k = torch.tensor([0, num_q]), torch.tensor([0, num_k])
        layout = dict(cu_seqlens_q_host=[0, num_q], cu_seqlens_k_host=[0, num_k], keys_by_position=True,
                      index_causal=num_q == num_k, max_seqlen_q=num_q, max_seqlen_k=num_k)
        dq, dk, dv = q.to(device), k.to(device), v.to(device)
        dev_layout = dict(cu_seqlens_q=cu_q.to(device), cu_seqlens_k=cu_k.to(device),
                          positions_q=pos_q.to(device), positions_k=pos_k.to(device))

        def run(dq=dq, dk=dk, dv=dv, dev_layout=dev_layout, layout=layout):
            return varlen_attention(dq, dk, dv, **dev_layout, **layout)

        def reference(dq=dq, dk=dk, dv=dv, dev_layout=dev_layout):
            ref = _reference_dtype(device)
            return varlen_attention(dq.to(ref), dk.to(ref), dv.to(ref), **dev_layout, impl="reference")

        pairs = float((pos_q + 1).sum())
        yield f"{case} Tq={num_q} Tk={num_k}", num_q, 4.0 * heads * head_dim * pairs, run, reference


def _gdn_inputs(gen: torch.Generator, tokens: int, heads: int, value_heads: int, dim: int, dtype: torch.dtype):
    q = F.normalize(_randn(gen, tokens, heads, dim), dim=-1).to(dtype)
    k = F.normalize(_randn(gen, tokens, heads, dim), dim=-1).to(dtype)
    v = _randn(gen, tokens, value_heads, dim).to(dtype)
    g = F.logsigmoid(_randn(gen, tokens, value_heads) + torch.linspace(2.0, 6.0, value_heads)).float()
    beta = torch.sigmoid(_randn(gen, tokens, value_heads)).to(dtype)
    return q, k, v, g, beta


def _gdn_cases(size: str, device: torch.device, dtype: torch.dtype):
    """The cold write path of a GDN layer: the forward and every segment's (T, S) summary."""
    heads, value_heads, dim = (16, 32, 128) if size == "model" else (2, 4, 8)
    segments, segment_tokens = (64, 512) if size == "model" else (3, 16)
    gen = torch.Generator().manual_seed(2)
    tokens = segments * segment_tokens
    inputs = _gdn_inputs(gen, tokens, heads, value_heads, dim, dtype)
    cu = torch.arange(0, tokens + 1, segment_tokens)
    dev = [t.to(device) for t in inputs]
    dev_cu = cu.to(device)

    def run():
        return gated_delta_forward_and_summarize(*dev, cu_seqlens=dev_cu, cu_seqlens_cpu=cu)

    def reference():
        return gated_delta_forward_and_summarize(*(t.double() for t in inputs), cu_seqlens=cu)

    flops = 4.0 * tokens * value_heads * dim * dim  # the state products of the recurrence
    yield f"{segments}x{segment_tokens} forward+summaries", tokens, flops, run, reference


def _scan_cases(size: str, device: torch.device, dtype: torch.dtype):
    """The chain walk of an all-hit request: each cached segment's state through the dense
    transitions of the segments before it (64 segments in one chain)."""
    value_heads, dim = (32, 128) if size == "model" else (2, 8)
    segments = 64 if size == "model" else 5
    gen = torch.Generator().manual_seed(5)
    base = _randn(gen, segments, value_heads, dim, dim) / dim ** 0.5
    # contractive dense T like real GDN segments (spectral radius < 1), S of unit scale
    trans = 0.9 * torch.linalg.matrix_exp(0.5 * (base - base.transpose(-1, -2)))
    state = _randn(gen, segments, value_heads, dim, dim)
    cu = torch.tensor([0, segments])
    dense = DenseSummary(trans.to(device), state.to(device))
    dev_cu = cu.to(device)

    def run():
        return scan_chain(dense, dev_cu)

    def reference():
        return scan_chain(DenseSummary(trans.double(), state.double()), cu)

    yield f"{segments} segments", segments, 2.0 * segments * value_heads * dim ** 3, run, reference


def _conv_cases(size: str, device: torch.device, dtype: torch.dtype):
    """The GDN layer's short causal conv over packed segments (width 4, silu)."""
    dim = 2 * 16 * 128 + 32 * 128 if size == "model" else 24
    segments, segment_tokens = (64, 512) if size == "model" else (3, 16)
    gen = torch.Generator().manual_seed(3)
    tokens = segments * segment_tokens
    x = _randn(gen, tokens, dim).to(dtype)
    weight = (_randn(gen, dim, 4) / 2).to(dtype)
    cu = torch.arange(0, tokens + 1, segment_tokens)
    dx, dw, dcu = x.to(device), weight.to(device), cu.to(device)

    def run():
        return causal_conv1d(dx, dw, cu_seqlens=dcu, cu_seqlens_cpu=cu)

    def reference():
        return causal_conv1d(x.double(), weight.double(), cu_seqlens=cu)

    yield f"{segments}x{segment_tokens}", tokens, 2.0 * tokens * dim * 4, run, reference


# op name -> cases(size, device, dtype): (case, tokens, flops, product call, float64 reference)
OPS: Dict[str, Callable] = {
    "moe": _moe_cases,
    "attention": _attention_cases,
    "gdn": _gdn_cases,
    "scan": _scan_cases,
    "conv": _conv_cases,
}


def _first(out):
    """The tensor compared: the output of an op returning (output, state, ...)."""
    return out[0] if isinstance(out, tuple) else out


def bench_op(name: str, size: str, device: torch.device, dtype: torch.dtype, repeats: int) -> List[Dict]:
    rows = []
    for case, tokens, flops, run, reference in OPS[name](size, device, dtype):
        first_ms, samples = time_calls_ms(run, device, repeats)
        out, ref = run(), reference()
        on_device = name in ("moe", "attention")
        row = {"op": name, "case": case, "impl": "auto", "tokens": tokens, "first_call_ms": first_ms,
               "reference": f"{device.type if on_device else 'cpu'} "
                            f"{str(_reference_dtype(device) if on_device else torch.float64).replace('torch.', '')}",
               "ms": median(samples), "ms_samples": samples,
               "tflops": flops / (median(samples) * 1e-3) / 1e12 if flops and median(samples) else None,
               **_errors(_first(out), _first(ref))}
        if isinstance(out, tuple) and len(out) > 1 and isinstance(out[1], torch.Tensor):
            state_err = _errors(out[1], ref[1])
            row["state_rel_err"] = state_err["rel_err"]
        if not math.isfinite(row["rel_err"]):
            row["error"] = "non-finite difference against the reference"
        rows.append(row)
        print(f"{name:9s} {case:34s} {row['ms']:9.3f} ms  rel err {row['rel_err']:.2e}", flush=True)
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--op", default="all", help=f"one of {', '.join(OPS)}, a comma-separated list, or 'all'")
    p.add_argument("--size", default=None, choices=SIZES,
                   help="shapes: model (Qwen3.5-35B-A3B; the default on CUDA) or tiny (the default on CPU)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json", default=None, help="write the rows here")


def _ops(text: str) -> Tuple[str, ...]:
    names = tuple(OPS) if text == "all" else tuple(n.strip() for n in text.split(",") if n.strip())
    for n in names:
        if n not in OPS:
            raise ValueError(f"--op: unknown op {n!r}; valid: {', '.join(OPS)}, all")
    return names


def run(args: argparse.Namespace) -> int:
    names = _ops(args.op)
    if args.repeats < 1:
        raise ValueError(f"--repeats: expected >= 1, got {args.repeats}")
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    size = args.size or ("model" if device.type == "cuda" else "tiny")
    rows: List[Dict] = []
    report = {"device": device_name(device), "dtype": str(dtype).replace("torch.", ""), "size": size,
              **provenance(args), "rows": rows}
    with torch.no_grad():
        for name in names:
            rows.extend(bench_op(name, size, device, dtype, args.repeats))
            if args.json:
                write_report(args.json, report)
    if args.json:
        print(f"wrote {args.json}")
    return 1 if any("error" in r for r in rows) else 0


HELP = "time each kept op kernel at model shapes and its error against the float64 reference"
