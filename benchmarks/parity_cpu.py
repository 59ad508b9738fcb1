"""Parity of hypic against transformers on tiny random models (CPU, fp32 and fp64), as numbers.

    PYTHONPATH=. python3 benchmarks/parity_cpu.py

For each of Qwen3-Next, Qwen3.5 and Qwen3.5-MoE (tests/models/_hf.py): max |logit difference| over a
40-token prompt (full forward), prefill of 24 tokens + 16 decode steps, greedy 32 tokens, and
hypic fp32 against hypic fp64 (the fp32 noise floor of the model).
"""

import tempfile

import torch

from hypic.engine.context import PlainContext, SequenceCache
from hypic.models.loader import load_model
from tests.models._hf import KINDS, hf_greedy, hf_logits, hypic_greedy, save_hf_model


@torch.no_grad()
def all_logits(spec, model, ids, dtype):
    cache = SequenceCache.allocate(spec, "cpu", dtype)
    ctx = PlainContext(spec, [cache], [len(ids)], logits_rows="all")
    return model(torch.tensor(ids), ctx.positions, ctx).double()


@torch.no_grad()
def decode_errors(spec, model, ids, ref, prefill):
    cache = SequenceCache.allocate(spec, "cpu")
    ctx = PlainContext(spec, [cache], [prefill])
    model(torch.tensor(ids[:prefill]), ctx.positions, ctx)
    errs = []
    for t in range(prefill, len(ids)):
        ctx = PlainContext(spec, [cache], [1])
        errs.append(float((model(torch.tensor([ids[t]]), ctx.positions, ctx)[-1].double() - ref[t]).abs().max()))
    return max(errs)


def main():
    for kind in KINDS:
        path = tempfile.mkdtemp()
        hf = save_hf_model(kind, path)
        ids = torch.randint(1, 128, (40,), generator=torch.Generator().manual_seed(1)).tolist()
        ref = hf_logits(hf, ids).double()
        spec, m32 = load_model(path, dtype=torch.float32)
        _, m64 = load_model(path, dtype=torch.float64)
        l32 = all_logits(spec, m32, ids, torch.float32)
        l64 = all_logits(spec, m64, ids, torch.float64)
        dec = decode_errors(spec, m32, ids, ref, 24)
        same = hf_greedy(hf, ids[:10], 32) == hypic_greedy(spec, m32, ids[:10], 32)
        print(f"{kind:12s} full-prompt max|dlogit| fp32 {float((l32 - ref).abs().max()):.2e}  "
              f"prefill24+16 decode {dec:.2e}  greedy-32 identical {same}  "
              f"hypic fp64 vs transformers fp32 {float((l64 - ref).abs().max()):.2e}  "
              f"hypic fp32 vs fp64 {float((l32 - l64).abs().max()):.2e}", flush=True)


if __name__ == "__main__":
    main()
