"""The PIC runner with hypic's Triton kernels in every layer, on the CPU through
``TRITON_INTERPRET=1`` (a subprocess; skipped without Triton): the one-launch short conv
(hypic.ops.conv_short) in every linear layer and the one-pass K/V gather (hypic.ops.kv_gather)
in every attention layer of a cached request, against the runner on the reference ops. The CUDA
runner test covers the same paths on the GPU; this one runs wherever Triton is installed."""

from __future__ import annotations

import textwrap

import pytest

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


# Ops that read a device tensor back on the host when they run on CUDA (a host sync).
SYNC_OPS = ("_local_scalar_dense", "item", "is_nonzero", "nonzero", "nonzero_static", "masked_select", "equal",
            "_unique", "_unique2", "unique_dim", "unique_consecutive", "allclose")

LIGHTNING_SCRIPT = textwrap.dedent("""
    import sys, tempfile, traceback
    from pathlib import Path
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from hypic.models.loader import load_model
    from hypic.ops.linear import _fla_scalar_chain, fla_paths
    from hypic.pic.modes import PICConfig
    from hypic.runner import pic_context
    from tests.graphs.test_layer_graphs import RecordingBackend
    from tests.models._lightning import RING_CONFIG, build_minimax, save_ring_checkpoint
    from tests.runner.pic_helpers import PicHarness, random_segment

    torch.set_num_threads(1)
    FAMILY, SYNC_OPS = sys.argv[1], set(sys.argv[2].split(","))
    path = Path(tempfile.mkdtemp())
    # 16 heads: an entry's per-layer log decays (fp32) then lie 64 bytes apart, so the bodies are
    # read through the layout's address table, as at the full models' head counts
    if FAMILY == "ring":
        save_ring_checkpoint(path, dict(RING_CONFIG, num_attention_heads=16))
    else:
        build_minimax(seed=2, num_attention_heads=16).save_pretrained(str(path))
    spec, model = load_model(str(path), dtype=torch.float32)
    num_linear = sum(t == "linear_attention" for t in spec.layer_types)

    class Counter(TorchDispatchMode):
        # aten ops issued inside a layer's lightning_attention, outside Triton's interpreter (which
        # runs the kernels' bodies on the host)
        def __init__(self):
            super().__init__()
            self.ops, self.syncs = 0, []
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names = [(f.filename.replace("\\\\", "/"), f.name) for f in traceback.extract_stack()]
            if (any(n == "lightning_attention" and f.endswith("runner/pic_context.py") for f, n in names)
                    and not any("/triton/" in f for f, _ in names)):
                self.ops += 1
                if func.__name__.split(".")[0] in SYNC_OPS:
                    self.syncs.append(func.__name__)
            return func(*args, **(kwargs or {}))

    item_reads = []
    lazy_get = pic_context._LazyItems.__getitem__
    def counted_get(self, i):
        item_reads.append(i)
        return lazy_get(self, i)
    pic_context._LazyItems.__getitem__ = counted_get
    walks = []
    walk = fla_paths.simple_gla_chain_walk
    fla_paths.simple_gla_chain_walk = lambda *a, **kw: walks.append(1) or walk(*a, **kw)
    cpu_takes = lambda *tensors, key_dim=0: all(t is None or t.dtype != torch.float64 for t in tensors)  # noqa: E731

    def all_hit(num_segments, on_kernels):
        # the walk taken by the CPU tensors (interpreted) and the cores replayed from graphs, or
        # the reference run
        _fla_scalar_chain.fla_takes = cpu_takes if on_kernels else fla_paths.fla_takes
        h = PicHarness(spec, model, config=PICConfig(mode="hypic", cold_policy="inline", segment_min_tokens=0))
        segs = [random_segment(40, 300 + i) for i in range(num_segments)]
        query = random_segment(5, 9)
        h.run(list(reversed(segs)), query)  # caches every segment (writes: never the walk)
        plan = h.plan(segs, query)
        assert plan.cached_tokens > 0
        if on_kernels:
            h.runner._core_graphs_on = lambda: True
            h.runner._replays_backend = RecordingBackend
            h.runner._max_core_graph_tokens = lambda: 1 << 20
        counter = Counter()
        walks.clear()
        item_reads.clear()
        with plan:
            with counter:
                out = h.runner.prefill([plan])[0]
        if on_kernels:
            replays = h.runner._replays
            assert len(walks) == num_linear and replays.num_replays == num_linear - 2, (walks, replays.failures())
        return out, counter, len(item_reads)

    counts, err = {}, 0.0
    for n in (4, 12):
        got, counter, reads = all_hit(n, True)
        want, _, _ = all_hit(n, False)
        assert counter.syncs == [], counter.syncs
        counts[n] = (counter.ops, reads)
        rel = lambda a, b: float((a - b).abs().max() / b.abs().max())  # noqa: E731
        err = max(err, rel(got.logits, want.logits))
        for a, b in zip(got.cache.layers, want.cache.layers):
            if hasattr(a, "recurrent_state"):
                err = max(err, rel(a.recurrent_state, b.recurrent_state))
    assert counts[4] == counts[12] and counts[4][0] > 0, counts
    print(err)
""")


@pytest.mark.parametrize("family", ["ring", "minimax"])
def test_lightning_all_hit_walk_issues_no_op_and_no_sync_per_cached_segment(family):
    """A cached lightning request's linear layers on their CUDA path (the chain walk, interpreted;
    each core captured and replayed from graphs): the same tensor ops in ``lightning_attention``
    for 12 cached segments as for 4, none of them a host read of a device tensor (``.item()``,
    ``bool()``, ``nonzero``, ...), the same number of look-ups of cached entries' items in the
    forward, and logits and final states within 1e-5 (relative to their largest value) of the
    reference run. Before the walk, each lightning layer's core ran fla's ``chunk_simple_gla``
    twice, each call reading a chunk count back to the host (32 syncs per all-hit request on
    Ring-mini-linear-2.0), and looked up and rotated every body per layer."""
    assert interpreted_error(LIGHTNING_SCRIPT, family, ",".join(SYNC_OPS)) < 1e-5
