"""PIC exact modes against the plain path in bf16 on CPU (tiny test model, 8 x 64-token segments).

    PYTHONPATH=. python3 benchmarks/pic_bf16_cpu.py

Prints max / mean |log-prob difference| at the last token for full_recompute and prefix_cache
(second, all-reused run) against a plain prefill, and for a plain prefill split in two spans
(the rounding floor of carrying state between spans), in fp32 and bf16.
"""

import torch

from hypic.engine.context import PlainContext, SequenceCache
from hypic.pic.modes import PICConfig
from tests.runner.pic_helpers import PicHarness, full_logits, random_segment, tiny_model


def diff(a, b):
    d = (torch.log_softmax(a.float(), -1) - torch.log_softmax(b.float(), -1)).abs()
    return f"max {float(d.max()):.3g} mean {float(d.mean()):.3g}"


def main():
    for dtype in (torch.float32, torch.bfloat16):
        spec, model = tiny_model(seed=0, dtype=dtype)
        segs = [random_segment(64, i) for i in range(8)]
        query = random_segment(16, 99)
        ids = sum(segs, []) + query
        ref = full_logits(spec, model, ids)
        for mode in ("full_recompute", "prefix_cache"):
            h = PicHarness(spec, model, config=PICConfig(mode=mode))
            h.run(segs, query)
            _, res = h.run(segs, query)
            print(f"{str(dtype):15s} {mode:15s} vs plain: {diff(res.logits, ref)}")
        cache = SequenceCache.allocate(spec, "cpu", dtype)
        with torch.no_grad():
            for a, b in ((0, 200), (200, len(ids))):
                ctx = PlainContext(spec, [cache], [b - a])
                out = model(torch.tensor(ids[a:b]), ctx.positions, ctx)[-1]
        print(f"{str(dtype):15s} {'plain split':15s} vs plain: {diff(out, ref)}")


if __name__ == "__main__":
    main()
