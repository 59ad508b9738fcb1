"""GPU time of one linear layer's chain scan at the all-hit 32k shape (Qwen3.5-35B-A3B: 64
cached bodies, each preceded by its 8-token seam, then the 64-token question: a chain of 129
elements; 32 value heads, K = V = 128, fp32 summaries).

    python3 benchmarks/scan_h200.py --out OUT   # -> OUT/scan_kernel.json

Two ways the PIC forward has fed the scan:

* ``cat``: the bodies' (T, S) concatenated from their store entries, a two-source scan that
  writes every element's incoming state, then the live elements' rows gathered (session 6);
* ``table``: the bodies read in place through an address table, only the live elements'
  incoming states written, in live order (session 7).

Both results are compared (they must agree to fp32 rounding).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from _timing import event_times_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--bodies", type=int, default=64)
    args = ap.parse_args()
    from hypic.ops.linear.summary import DenseSummary, SummaryTable, scan_chain_from, summary_addresses

    dev = torch.device("cuda")
    nb, hv, kd, vd = args.bodies, 32, 128, 128
    gen = torch.Generator(device=dev).manual_seed(0)

    def summaries(n):
        eye = torch.eye(kd, device=dev)
        t = eye + 0.01 * torch.randn(n, hv, kd, kd, device=dev, generator=gen)
        return DenseSummary(t, torch.randn(n, hv, kd, vd, device=dev, generator=gen))

    live = summaries(nb + 1)  # the seams, then the question
    bodies = [summaries(1) for _ in range(nb)]  # separate tensors, like store entries
    source_host = []
    for j in range(nb):
        source_host += [j, -j - 1]
    source_host.append(nb)
    source = torch.tensor(source_host, device=dev)
    cu = torch.tensor([0, len(source_host)], device=dev)
    live_pos = torch.tensor([i for i, s in enumerate(source_host) if s >= 0], device=dev)
    record = torch.tensor([s if s >= 0 else -1 for s in source_host], device=dev)
    addresses = torch.tensor([summary_addresses(b, dev) for b in bodies], device=dev).T.contiguous()

    def by_cat():
        stacked = DenseSummary(torch.cat([b.transition for b in bodies]), torch.cat([b.state for b in bodies]))
        incoming, final = scan_chain_from(live, stacked, source, cu)
        return incoming.index_select(0, live_pos), final

    def by_table():
        table = SummaryTable(tuple(bodies), addresses)
        return scan_chain_from(live, table, source, cu, record_rows=record, num_records=nb + 1)

    a, fa = by_cat()
    b, fb = by_table()
    rel = max(((a - b).norm() / a.norm()).item(), ((fa - fb).norm() / fa.norm()).item())
    row = {"bodies": nb, "chain": len(source_host), "max_rel_diff": rel,
           "cat_ms": statistics.median(event_times_ms(by_cat, repeats=20)),
           "table_ms": statistics.median(event_times_ms(by_table, repeats=20))}
    print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "scan_kernel.json"), "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
