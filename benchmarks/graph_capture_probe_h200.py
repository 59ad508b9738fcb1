"""Does a failed CUDA graph capture leave the graph pool usable? (torch on the H200)

The engine captures a linear layer's cores at their second call in a forward, because a capture
at the first call failed on new shapes in session 13 (a compile or a host sync inside the capture)
and every later capture into the same pool then raised ``beginAllocateToPool: already recording
to mempool_id``. This probe repeats that sequence with the engine's own backend
(:class:`hypic.graphs.layer_graphs.CudaGraphBackend`): a capture in a shared pool, a capture whose
function synchronises (it must fail), then another capture, and says whether it works, and
whether ending the pool's allocation by hand (``torch._C._cuda_endAllocateToPool``) mends it.

    python3 benchmarks/graph_capture_probe_h200.py --out OUT

Writes OUT/graph_capture_probe.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from hypic.graphs.layer_graphs import CudaGraphBackend  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.device("cuda")
    pool = torch.cuda.graph_pool_handle()
    backend = CudaGraphBackend(dev, pool)
    x = torch.randn(1024, device=dev)
    res = {"torch": torch.__version__}

    def good(t):
        return t * 2 + 1

    def syncing(t):
        y = t * 3
        float(y.sum())  # a host read: not permitted while the stream captures
        return y

    def attempt(name, fn):
        try:
            graph, out = backend.capture(fn, (x,))
            torch.cuda.synchronize()
            res[name] = {"ok": True, "max_err": float((out - fn(x)).abs().max()) if fn is good else None}
        except Exception as err:  # noqa: BLE001 - the probe records any failure
            res[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:400],
                         "trace": traceback.format_exc()[-1500:]}

    attempt("first_capture", good)
    attempt("failing_capture", syncing)
    try:
        torch.cuda.synchronize()
        res["sync_after_failure"] = "ok"
    except Exception as err:  # noqa: BLE001
        res["sync_after_failure"] = f"{type(err).__name__}: {err}"[:400]
    attempt("capture_after_failure", good)
    if not res["capture_after_failure"]["ok"]:
        try:
            torch._C._cuda_endAllocateToPool(dev.index or 0, pool)
            res["end_allocate_to_pool"] = "called"
        except Exception as err:  # noqa: BLE001
            res["end_allocate_to_pool"] = f"{type(err).__name__}: {err}"[:400]
        attempt("capture_after_mend", good)
    # an eager op on the capture's side stream and the current one still run
    res["eager_after"] = float((x * 5).sum()) == float((x * 5).sum())
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "graph_capture_probe.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: (v if not isinstance(v, dict) else {a: b for a, b in v.items() if a != "trace"})
                      for k, v in res.items()}, indent=1))


if __name__ == "__main__":
    main()
