"""Attention of an all-hit PIC prompt on one GPU: live seam/query tokens over every key.

The all-hit 32k case (64 x 512 + a 64-token question, seam w = 8) attends 576 live queries at
their absolute positions to 32,832 keys in position order (every position present once), at
Qwen3.5-35B-A3B's attention shape (16 q heads, 2 kv heads, head dim 256, bf16). hypic runs it
through FlexAttention with a 128-token block mask; the session-5 profile measured 1.96 ms per
layer, ~7x above the FLOP floor, with only 5 query tiles x 16 heads of parallel work.

Variants (outputs compared with the default flex call):

* ``flex_default`` - hypic's call (``BACKEND=TRITON``);
* ``flex_M{m}_N{n}`` - the same block mask with smaller kernel tiles (more programs);
* ``flash_paged_spans`` - FlashAttention's varlen kernel with a paged K/V: each live span is one
  "sequence" whose keys are pages 0.. of the shared key buffer and ``seqused_k`` its end
  position (keys are positions, so bottom-right causal by index is causal by position).

Writes OUT/allhit_attention_h200.json and prints a table. Exploratory: the engine uses none of
the alternatives yet.
"""

from __future__ import annotations

import argparse
import json
import os
import traceback

import torch

from _timing import event_median_ms
from hypic.ops.attention_flex import build_varlen_block_mask, flex_varlen_attention

HQ, HKV, D = 16, 2, 256


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--segments", type=int, default=64)
    ap.add_argument("--segment-tokens", type=int, default=512)
    ap.add_argument("--seam", type=int, default=8)
    ap.add_argument("--query-tokens", type=int, default=64)
    args = ap.parse_args()
    dev = torch.device("cuda")
    seg, n, w = args.segment_tokens, args.segments, args.seam
    spans = [(i * seg, w) for i in range(n)] + [(n * seg, args.query_tokens)]  # (start, length)
    num_keys = n * seg + args.query_tokens
    pos_q = torch.cat([torch.arange(s, s + m) for s, m in spans]).to(dev)
    pos_k = torch.arange(num_keys, device=dev)
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(pos_q.numel(), HQ, D, device=dev, dtype=torch.bfloat16, generator=g)
    k = torch.randn(num_keys, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn(num_keys, HKV, D, device=dev, dtype=torch.bfloat16, generator=g)
    cu_q = torch.tensor([0, pos_q.numel()], device=dev)
    cu_k = torch.tensor([0, num_keys], device=dev)
    scale = D**-0.5
    mask = build_varlen_block_mask(cu_q, cu_k, pos_q, pos_k)
    pairs = int(sum((s + j + 1) for s, m in spans for j in range(m)))
    flop = 4 * HQ * D * pairs
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "live_queries": pos_q.numel(),
           "keys": num_keys, "tflop": flop / 1e12, "rows": []}
    ref = flex_varlen_attention(q, k, v, block_mask=mask, scale=scale)

    def flex_with(options):
        from hypic.ops.attention_flex import _flex_fn

        fn = _flex_fn(dev, True)

        def run():
            return fn(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], block_mask=mask,
                      scale=scale, enable_gqa=True, kernel_options=options)[0].transpose(0, 1)
        return run

    variants = {"flex_default": lambda: flex_varlen_attention(q, k, v, block_mask=mask, scale=scale)}
    for m_, n_ in ((64, 64), (32, 64), (32, 32), (16, 64)):
        variants[f"flex_M{m_}_N{n_}"] = flex_with({"BACKEND": "TRITON", "BLOCK_M": m_, "BLOCK_N": n_})

    page = 256
    num_pages = -(-num_keys // page)
    pad = num_pages * page - num_keys
    k_pages = torch.cat([k, k.new_zeros(pad, HKV, D)]).view(num_pages, page, HKV, D)
    v_pages = torch.cat([v, v.new_zeros(pad, HKV, D)]).view(num_pages, page, HKV, D)
    ends = [s + m for s, m in spans]
    cu_q_spans = torch.tensor([0] + [sum(m for _, m in spans[: i + 1]) for i in range(len(spans))],
                              device=dev, dtype=torch.int32)
    seqused = torch.tensor(ends, device=dev, dtype=torch.int32)
    cu_k_spans = torch.tensor([0] + [sum(ends[: i + 1]) for i in range(len(ends))], device=dev, dtype=torch.int32)
    table = torch.arange(num_pages, device=dev, dtype=torch.int32)[None].expand(len(spans), num_pages).contiguous()

    def flash_paged(num_splits=None):
        def run():
            return torch.ops.aten._flash_attention_forward(
                q, k_pages, v_pages, cu_q_spans, cu_k_spans, max(m for _, m in spans), max(ends), 0.0, True, False,
                scale=scale, seqused_k=seqused, block_table=table, num_splits=num_splits)[0]
        return run

    variants["flash_paged_spans"] = flash_paged()
    variants["flash_paged_spans_split8"] = flash_paged(8)
    for name, fn in variants.items():
        row = {"variant": name}
        try:
            out = fn()
            row["rel_err_vs_default"] = float((out.float() - ref.float()).norm() / ref.float().norm())
            row["ms"] = event_median_ms(fn)
            row["tflops"] = flop / row["ms"] / 1e9
        except Exception as exc:  # a kernel that rejects this layout is a result
            row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
            row["trace"] = traceback.format_exc()[-1500:]
        res["rows"].append(row)
        print(json.dumps({k_: v_ for k_, v_ in row.items() if k_ != "trace"}), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "allhit_attention_h200.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
