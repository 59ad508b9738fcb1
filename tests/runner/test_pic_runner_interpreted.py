"""The PIC runner with hypic's Triton kernels in every layer, on the CPU through
``TRITON_INTERPRET=1`` (a subprocess; skipped without Triton): the one-launch short conv
(hypic.ops.conv_short) in every linear layer and the one-pass K/V gather (hypic.ops.kv_gather)
in every attention layer of a cached request, against the runner on the reference ops. The CUDA
runner test covers the same paths on the GPU; this one runs wherever Triton is installed."""

from __future__ import annotations

import textwrap

from tests.interpreter import interpreted_error

SCRIPT = textwrap.dedent("""
    import torch
    import hypic.ops.conv as conv
    from tests.runner.pic_helpers import DEEP_LAYER_TYPES, PicHarness, random_segment, tiny_model

    spec, model = tiny_model(seed=5, layer_types=DEEP_LAYER_TYPES)
    segs = [random_segment(20 + 6 * i, seed=30 + i) for i in range(4)]
    query = random_segment(9, seed=77)

    def requests():
        h = PicHarness(spec, model)
        _, cold = h.run(list(reversed(segs)), query)  # caches every segment
        plan, cached = h.run(segs, query)
        assert plan.cached_tokens > 0
        return cold.logits, cached.logits

    want = requests()
    calls = []
    def short_kernel(x, num_seqs):
        calls.append(1)
        return "short"
    conv.conv_kernel = short_kernel  # the CPU tensors take the GPU kernel: short_conv, interpreted
    got = requests()
    assert len(calls) >= 2 * 5, len(calls)  # every linear layer of both requests
    print(max(float((g - w).norm() / w.norm()) for g, w in zip(got, want)))
""")


def test_runner_with_short_conv_interpreted():
    assert interpreted_error(SCRIPT) < 1e-5


KV_SCRIPT = textwrap.dedent("""
    import torch
    from hypic.ops import kv_gather
    from tests.runner.pic_helpers import DEEP_LAYER_TYPES, PicHarness, random_segment, tiny_model

    spec, model = tiny_model(seed=6, layer_types=DEEP_LAYER_TYPES)
    segs = [random_segment(18 + 5 * i, seed=40 + i) for i in range(4)]
    query = random_segment(7, seed=78)

    def requests():
        h = PicHarness(spec, model)
        _, cold = h.run(list(reversed(segs)), query)  # caches every segment
        plan, moved = h.run(segs, query)  # every body re-rotated to its new place
        assert plan.cached_tokens > 0
        _, kept = h.run(list(reversed(segs)), query)  # every body where it was cached: no shift
        return cold.logits, moved.logits, kept.logits

    refusal = kv_gather.kernel_refusal
    kv_gather.kernel_refusal = lambda *args: "the reference run"
    want = requests()
    kv_gather.kernel_refusal = refusal
    calls = []
    kernel_path = kv_gather.gather_kv_triton
    def counted(*args, **kw):
        # (cached pieces read in place through a table, keys rotated)
        calls.append((args[2] is not None, kw["shift_cos"] is not None))
        return kernel_path(*args, **kw)
    kv_gather.gather_kv_triton = counted
    got = requests()
    # both attention layers of both cached requests; only the moved bodies' keys rotated
    assert calls == [(True, True)] * 2 + [(True, False)] * 2, calls
    print(max(float((g - w).abs().max()) for g, w in zip(got, want)))
""")


def test_runner_with_kv_gather_interpreted():
    """Every cached request's attention layers take the one-pass K/V gather (fp32: bit-identical
    to the reference, so the logits are too)."""
    assert interpreted_error(KV_SCRIPT) == 0.0
