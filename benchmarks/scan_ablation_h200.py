"""Where the fused chain walk's step time goes, at the all-hit 32k shape of one linear layer
(Qwen3.5-35B-A3B: 32 value heads, 16 key heads, K = V = 128; N cached bodies, each after its
8-token seam, then a 64-token question): the kernel module is copied with one stage edited out
(or added) per variant, and each variant's launch timed at the configuration the default's
autotuning picked. Differences against ``base`` place the time inside the step (H200.md: no
hardware counters on every machine, so variants that leave one stage out).

Variants (text edits of ``hypic/ops/linear/_triton_scan_kernel.py``, checked to apply):

* ``hot_ts``: every step reads one fixed T and S tile per head (L2-resident) instead of the
  body's own: the cost of fetching the bodies' tiles from HBM;
* ``no_stores``: no ``h_chunks`` / ``v_new`` stores;
* ``no_th``: ``T h`` replaced by ``h`` (its three MMAs leave the state's path);
* ``no_t``: neither product with T (``P = Kd^T``, ``T h = h``): T is not loaded or split;
* ``no_seam``: the seam's ``W h -> P v`` path dropped from the state;
* ``prefetch``: the next pair's body T and S tiles prefetched into L2 while a step runs
  (``prefetch.global.L2``), no registers held;
* ``presplit``: the body's T read as bf16 high and low planes (a copy of each body written so)
  instead of fp32 split in the step: the walk's side of storing T pre-split;
* ``reorder``: the body's T tile loaded after the seam's tiles and S (its layout change into shared
  memory waits for it, and everything loaded before it is then in flight at once);
  ``reorder_prefetch`` both.

Variants are timed round-robin (``--rounds``), medians over every round's samples.

Outputs of variants are garbage by design (timing only), except ``prefetch``, whose outputs are
checked equal to ``base``'s.

    python3 benchmarks/scan_ablation_h200.py --out OUT   # -> OUT/scan_ablation.json
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import statistics
import sys
import tempfile

import torch

from _timing import event_times_ms

PREFETCH_HELPER = '''

@triton.jit
def prefetch_l2(base, NUM: tl.constexpr):
    """Ask L2 for the NUM fp32 values from ``base`` (one request per 128-byte line)."""
    offs = tl.arange(0, NUM // 32) * 32
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\\n mov.u32 $0, 0;", "=r,l", [base + offs],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_rows_l2(base, o_k, NUM_ROWS_STRIDE: tl.constexpr):
    """Ask L2 for the line holding each row's first value (``base + o_k * stride``)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\\n mov.u32 $0, 0;", "=r,l", [base + o_k * NUM_ROWS_STRIDE],
                              dtype=tl.int32, is_pure=False, pack=1)
'''

PREFETCH = [
    ("            fuse = (src0 >= 0) & (i + 1 < end) & (src1 < 0) & (len0 <= BS)\n",
     "            fuse = (src0 >= 0) & (i + 1 < end) & (src1 < 0) & (len0 <= BS)\n"
     "            if (src3 < 0) & (j3 > i + 1):\n"
     "                prefetch_l2(trans + t3, K * K)\n"
     "                prefetch_rows_l2(state + s3 + i_v * BV, o_k, V)\n"),
]
# The body's T block of seam_body_step (fp32 load, or its planes with T_PACKED) as the kernel has it
T_LOAD = ("    if T_PACKED:\n"
          "        t_hi, t_lo = load_t_planes(trans, t_off, o_k, m_k, K)\n"
          "        b_t = t_hi  # read by split_dot only without SPLIT, which T_PACKED excludes\n"
          "    else:\n"
          "        b_t = tl.load(trans + t_off + o_k[:, None] * K + o_k[None, :], mask=m_k[:, None] & m_k[None, :], "
          "other=0.0)\n")
T_SPLIT = "    if T_PACKED:\n        pass  # split already, by the store's writer\n"
REORDER = [
    (T_LOAD + "    b_s = tl.load(state + s_off + kv_off, mask=m_kv, other=0.0)\n    b_w",
     "    b_s = tl.load(state + s_off + kv_off, mask=m_kv, other=0.0)\n    b_w"),
    (T_SPLIT, T_LOAD + T_SPLIT),
]
# ``presplit`` is now the kernel's own T_PACKED path: the bodies' T read as two
# bf16 planes (``hi`` then ``lo`` in its 64 KB per head, :func:`presplit_table`, packed as the
# store's writer packs them) instead of fp32 split in the step. Its outputs must equal the
# default's (the split is the same rounding).
PRESPLIT: list = []
VARIANTS = {
    "base": [],
    "presplit": PRESPLIT,
    "hot_ts": [
        ("b_t = tl.load(trans + t_off + o_k[:, None] * K + o_k[None, :], mask=m_k[:, None] & m_k[None, :], other=0.0)\n"
         "    b_s = tl.load(state + s_off + kv_off, mask=m_kv, other=0.0)\n    b_w",
         "b_t = tl.load(trans + i_h * K * K + o_k[:, None] * K + o_k[None, :], mask=m_k[:, None] & m_k[None, :], other=0.0)\n"
         "    b_s = tl.load(state + i_h * K * V + kv_off, mask=m_kv, other=0.0)\n    b_w"),
    ],
    "no_stores": [
        ("    if chunk >= 0:\n        tl.store(h_chunks + (chunk * HV + i_h) * K * V + kv_off, b_h.to(h_chunks.dtype.element_ty), mask=m_kv)\n    o_s = tl.arange(0, BS)",
         "    o_s = tl.arange(0, BS)"),
        ("    tl.store(v_new + p_uv, b_v.to(v_new.dtype.element_ty), mask=m_tv)\n    b_th", "    b_th"),
    ],
    "no_th": [
        ("    b_th = split_dot(t_hi, t_lo, b_t, b_h, PRECISION, SPLIT)\n", "    b_th = b_h\n"),
    ],
    "no_t": [
        ("    b_p = split_dot(t_hi, t_lo, b_t, tl.trans(b_k * decay[:, None]), PRECISION, SPLIT)  # [K, BS]\n",
         "    b_p = tl.trans(b_k * decay[:, None])  # [K, BS]\n"),
        ("    b_th = split_dot(t_hi, t_lo, b_t, b_h, PRECISION, SPLIT)\n", "    b_th = b_h\n"),
    ],
    "no_seam": [
        ("    return gamma * b_th + fp32_dot(b_p, b_v, PRECISION, SPLIT) + b_s", "    return gamma * b_th + b_s"),
    ],
    "reorder": REORDER,
    "reorder_prefetch": REORDER + PREFETCH,
    "prefetch": PREFETCH,
}


def variant_module(name: str, edits, tmp: str):
    from hypic.ops.linear import _triton_scan_kernel as mod

    src = inspect.getsource(mod)
    for old, new in edits:
        if src.count(old) != 1:
            raise SystemExit(f"variant {name}: edit does not apply once ({src.count(old)}): {old[:80]!r}")
        src = src.replace(old, new)
    if "prefetch" in name:
        src = src.replace("@triton.jit\ndef span_offsets", PREFETCH_HELPER.lstrip("\n") + "\n\n@triton.jit\ndef span_offsets", 1)
    path = os.path.join(tmp, f"scan_variant_{name}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(f"scan_variant_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


EXACT = ("base", "prefetch", "reorder", "reorder_prefetch", "presplit")  # variants that must equal the default
PRESPLIT_VARIANTS = ("presplit",)  # variants that read the bodies' T from presplit_table's copies


def presplit_table(bodies, device):
    """Copies of the bodies with each head's T as its bf16 high plane then its low plane, in the
    same 64 KB (``hi = T`` rounded to bf16, ``lo = T - hi`` rounded: the split the step does),
    marked packed (the walk then reads them with T_PACKED), and their address table."""
    from hypic.ops.linear.summary import DenseSummary, SummaryTable, summary_addresses
    from hypic.ops.linear.t_planes import pack_planes

    copies = [DenseSummary(pack_planes(b.transition), b.state, True) for b in bodies]
    addresses = torch.tensor([summary_addresses(b, device) for b in copies], device=device).T.contiguous()
    return SummaryTable(tuple(copies), addresses)


class FixedConfig:
    """A plain JIT kernel launched at one (BV, warps, stages), in the shape ``_launch`` calls."""

    def __init__(self, fn, warps: int, stages: int):
        self.fn, self.warps, self.stages = fn, warps, stages

    def __getitem__(self, grid):
        launch = self.fn[grid]
        return lambda *a, **k: launch(*a, num_warps=self.warps, num_stages=self.stages, **k)


def inputs(nb: int, presplit: bool = False):
    """chain_forward_h200's all-hit layer, with the WY factors the walk reads and a buffer whose
    zeroing pushes the bodies' tiles out of L2 before each timed launch (as the layers between two
    walks of a request do); with ``presplit``, also the bodies' pre-split copies."""
    from chain_forward_h200 import allhit_layer_inputs

    from hypic.ops.linear import fla_paths
    from hypic.ops.linear.short_span import short_span_rows

    x = allhit_layer_inputs(nb)
    _, _, k4, gc, w, u = fla_paths._wy_prepare(x.k, x.v, x.g, x.beta, x.cu, x.cu_cpu)
    spans = short_span_rows(x.cu, x.cu_cpu, 64, classes=False)
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=x.cu.device)
    return dict(k4=k4, gc=gc, w=w, u=u, cu=x.cu, spans=spans, cu_chains=x.cu_chains, table=x.table,
                source=x.source, flush=flush,
                presplit_table=presplit_table(x.bodies, x.cu.device) if presplit else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--bodies", default="64,16")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--configs", default="16,4,1;16,4,2;32,4,2;32,8,2;64,8,1",
                    help="BV,warps,stages;...: fixed configurations timed for each --config-variants")
    ap.add_argument("--config-variants", default="base", help="variants timed at every --configs entry")
    ap.add_argument("--ncu-once", action="store_true", help="run the default once (for ncu) and exit")
    ap.add_argument("--ncu-config", default=None, help="BV,warps,stages: --ncu-once launches this config alone")
    args = ap.parse_args()
    from hypic.ops.linear import triton_scan
    from hypic.ops.linear.triton_scan import scan_chain_wy_triton

    def scan(x, name="base"):
        table = x["presplit_table"] if name in PRESPLIT_VARIANTS else x["table"]
        return scan_chain_wy_triton(x["k4"][0], x["w"][0], x["u"][0], x["gc"][0], x["cu"], x["spans"].span_chunk,
                                    x["spans"].chunk_spans.shape[0], x["cu_chains"], second=table,
                                    source=x["source"], precision="bf16x3")

    if args.ncu_once:
        x = inputs(64)
        if args.ncu_config:
            bv, warps, stages = (int(v) for v in args.ncu_config.split(","))
            mod = variant_module("base", [], tempfile.mkdtemp())
            triton_scan._KERNEL = (FixedConfig(mod.scan_chain_kernel, warps, stages), bv)
        scan(x)
        torch.cuda.synchronize()
        return
    rows = []
    tmp = tempfile.mkdtemp()
    wanted = set(args.variants.split(",")) | set(args.config_variants.split(","))
    for nb in [int(n) for n in args.bodies.split(",")]:
        x = inputs(nb, presplit=bool(wanted & set(PRESPLIT_VARIANTS)))

        # the flush is timed with each launch: timed alone once, and subtracted
        flush_ms = statistics.median(event_times_ms(lambda: x["flush"].zero_(), repeats=args.repeats))

        def timed(fn):
            def call():
                x["flush"].zero_()  # the bodies' tiles leave L2, as between layers
                return fn()
            return statistics.median(event_times_ms(call, repeats=args.repeats)) - flush_ms

        triton_scan._KERNEL = None  # the default, autotuned
        ref = scan(x)
        tuned = triton_scan._KERNEL[0]
        best = getattr(tuned, "best_config", None)
        base_ms = timed(lambda: scan(x))
        bv = best.kwargs["BV"] if best is not None else 16
        warps = best.num_warps if best is not None else 4
        stages = best.num_stages if best is not None else 2
        row = {"bodies": nb, "default_ms": base_ms, "best_config": str(best), "variants": {}, "configs": {}}
        configs = [tuple(int(v) for v in c.split(",")) for c in args.configs.split(";")]
        for name in args.config_variants.split(","):
            mod = variant_module(name, VARIANTS[name], tmp)
            for cfg in configs:
                triton_scan._KERNEL = (FixedConfig(mod.scan_chain_kernel, cfg[1], cfg[2]), cfg[0])
                scan(x, name)
                key = f"BV{cfg[0]}_w{cfg[1]}_s{cfg[2]}" + ("" if name == "base" else f"_{name}")
                row["configs"][key] = timed(lambda: scan(x, name))
        kernels = {}
        for name in args.variants.split(","):
            mod = variant_module(name, VARIANTS[name], tmp)
            kernels[name] = (FixedConfig(mod.scan_chain_kernel, warps, stages), bv)
            triton_scan._KERNEL = kernels[name]
            out = scan(x, name)  # compiles
            item = {"samples_ms": []}
            if name in EXACT:
                item["max_abs_diff_vs_default"] = [float((a.float() - b.float()).abs().max()) for a, b in zip(out, ref)]
            row["variants"][name] = item
        for _ in range(args.rounds):  # round-robin: machine drift falls on every variant alike
            for name, kernel in kernels.items():
                triton_scan._KERNEL = kernel
                row["variants"][name]["samples_ms"].append(timed(lambda: scan(x, name)))
        for item in row["variants"].values():
            item["ms"] = statistics.median(item["samples_ms"])
        # the same number of plain dense steps (T h + S, no seam, no WY outputs), autotuned
        from hypic.ops.linear.summary import DenseSummary
        from hypic.ops.linear.triton_scan import scan_chain_triton
        triton_scan._KERNEL = None
        gen = torch.Generator(device="cuda").manual_seed(1)
        dense = DenseSummary(0.9 * torch.eye(128, device="cuda") + 0.01 * torch.randn(nb + 1, 32, 128, 128, device="cuda", generator=gen),
                             torch.randn(nb + 1, 32, 128, 128, device="cuda", generator=gen))
        one_chain = torch.tensor([0, nb + 1], device="cuda")
        scan_chain_triton(dense, one_chain, precision="bf16x3")
        row["dense_walk_ms"] = timed(lambda: scan_chain_triton(dense, one_chain, precision="bf16x3"))
        row["dense_walk_config"] = str(getattr(triton_scan._KERNEL[0], "best_config", None))
        triton_scan._KERNEL = None
        steps = nb + 1
        row["per_step_us"] = {k: v["ms"] * 1e3 / steps for k, v in row["variants"].items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "scan_ablation.json"), "w") as f:
        json.dump(rows, f, indent=1)
    names = list(rows[0]["variants"])
    print(f"{'bodies':>6} {'default':>8} " + " ".join(f"{n:>10}" for n in names) + "  (ms per launch)")
    for r in rows:
        print(f"{r['bodies']:>6} {r['default_ms']:>8.3f} " + " ".join(f"{r['variants'][n]['ms']:>10.3f}" for n in names))
    for r in rows:
        print(r["bodies"], "dense walk", round(r["dense_walk_ms"], 3), r["dense_walk_config"], "configs:", {k: round(v, 3) for k, v in r["configs"].items()}, "best:", r["best_config"])


if __name__ == "__main__":
    main()
