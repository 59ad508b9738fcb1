"""How far each fp32 forward of the parity test (tests/models/test_qwen3_next.py) is from an fp64
one, per model kind, on this CPU: hypic fp32 against transformers fp32 (what the test compares),
and each against hypic's fp64 forward of the same weights (transformers' MoE cannot run in fp64:
its grouped GEMM takes no float64). The 70-token prompt of ``test_full_prompt_logits_match``.

    PYTHONPATH=. python3 benchmarks/hf_parity_precision_cpu.py --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tests.models.test_qwen3_next as parity  # noqa: E402
from hypic.models.loader import load_model  # noqa: E402
from tests.models._hf import KINDS, hf_logits, save_hf_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    ids = parity._prompt(70, 0)
    rows = []
    for kind in KINDS:
        path = tempfile.mkdtemp()
        hf = save_hf_model(kind, path)
        spec, m32 = load_model(path, dtype=torch.float32)
        m64 = load_model(path, dtype=torch.float64)[1]
        got32 = parity._forward_all(spec, m32, ids)[0].double()
        truth = parity._forward_all(spec, m64, ids)[0].double()
        ref32 = hf_logits(hf, ids).double()
        rows.append({"kind": kind, "hypic32_vs_hf32": float((got32 - ref32).abs().max()),
                     "hypic32_vs_fp64": float((got32 - truth).abs().max()),
                     "hf32_vs_fp64": float((ref32 - truth).abs().max()), "logit_scale": float(ref32.abs().max())})
        print(" ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in rows[-1].items()), flush=True)
    with open(args.json, "w") as f:
        json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
