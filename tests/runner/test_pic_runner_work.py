"""The work a PIC forward issues: tensor ops that must not grow with the number of cached or
written segments, what it records, and the write budgets that keep entry writes within the
device's memory (the tiny model on the CPU)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

import pytest
import torch

import hypic
from hypic.pic.modes import PICConfig
from tests.runner.pic_helpers import ATOL, PicHarness, concat, full_logits, max_err, random_segment, tiny_model


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(seed=0)


# Package areas whose tensor ops _EngineOpCounter counts: the loop, the PIC runner and its
# forward context, the graphs and the layers.
_COUNTED_AREAS = ("engine", "runner", "graphs", "models")
_PACKAGE_DIR = Path(hypic.__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def _package_area(filename: str) -> Optional[str]:
    """The first folder of ``filename`` inside the hypic package (``engine``, ``ops``, ...), None
    outside it: by the package's own path, so a checkout inside a folder named ``hypic`` counts
    the same."""
    try:
        return Path(filename).resolve().relative_to(_PACKAGE_DIR).parts[0]
    except ValueError:
        return None


class _EngineOpCounter:
    """Counts the aten ops whose innermost hypic frame is in one of :data:`_COUNTED_AREAS`,
    leaving out the ops/ kernels, whose CPU references loop over chain steps by design (the GPU
    paths batch them); ops named in ``skip`` are not counted, and with ``only`` only those named
    there are."""

    def __init__(self, skip=(), only=None):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                import traceback

                name = func.__name__.split(".")[0]
                if name in skip or (only is not None and name not in only):
                    return func(*args, **(kwargs or {}))
                areas = [a for a in map(_package_area, (f.filename for f in traceback.extract_stack())) if a]
                if areas and areas[-1] in _COUNTED_AREAS:
                    counter.count += 1
                return func(*args, **(kwargs or {}))

        self.count = 0
        self.mode = Mode()


@pytest.mark.parametrize("mode", ["hypic", "addition"])
def test_engine_issues_no_tensor_op_per_cached_segment(tiny, mode):
    """Per-segment work is batched, never a Python loop of tensor ops per segment per layer. An
    all-hit request over 12 cached segments must cost the engine, runner and model code the same
    number of tensor ops as one over 4 (a chain gather per segment once cost 12 more per segment
    here)."""
    spec, model = tiny
    counts = {}
    for n in (4, 12):
        h = PicHarness(spec, model, config=PICConfig(mode=mode, cold_policy="inline", segment_min_tokens=0))
        segs = [random_segment(40, 300 + i) for i in range(n)]
        query = random_segment(5, 9)
        h.run(list(reversed(segs)), query)  # cache every segment, in another order
        plan = h.plan(segs, query)
        assert plan.cached_tokens > 0
        counter = _EngineOpCounter()
        with plan:
            with counter.mode:
                h.runner.prefill([plan])
        counts[n] = counter.count
    assert counts[4] > 0
    assert counts[12] == counts[4], counts


# Views and allocations: ops that launch no kernel.
_NO_KERNEL_OPS = {"slice", "select", "view", "alias", "transpose", "t", "unsqueeze", "squeeze", "expand",
                  "split", "split_with_sizes", "unbind", "as_strided", "detach", "_unsafe_view", "permute",
                  "reshape", "narrow", "empty"}


def test_cold_writes_cost_no_kernel_per_written_segment(tiny):
    """Recording the entries of cold segments copies views of the forward's records with one
    multi-tensor copy per dtype: the engine, runner and model code launch the same number of
    kernels for 12 written segments as for 4. A write path that built an index tensor per segment
    per linear layer made a host-to-device copy that synchronised each time on CUDA (1,920 syncs
    for 64 segments on the H200), and cloned every tensor twice."""
    spec, model = tiny
    counts = {}
    for n in (4, 12):
        h = PicHarness(spec, model, config=PICConfig(mode="hypic", cold_policy="inline", segment_min_tokens=0))
        segs = [random_segment(40, 500 + i) for i in range(n)]
        plan = h.plan(segs, random_segment(5, 9))
        assert plan.cached_tokens == 0
        counter = _EngineOpCounter(skip=_NO_KERNEL_OPS)
        with plan:
            with counter.mode:
                h.runner.prefill([plan])
        assert len(h.store) == n
        counts[n] = counter.count
    assert counts[4] > 0
    assert counts[12] == counts[4], counts


def test_nothing_cached_nothing_recorded_runs_without_summaries(tiny, monkeypatch):
    """A forward with no cached body and no write (cold full_recompute; prefix_cache whose every
    checkpoint exists) runs each request's live tokens as one linear-attention run from its prefix
    state: no summaries, no scan, and still exact."""
    from hypic.runner import pic_context

    spec, model = tiny
    segs = [random_segment(n, 700 + n) for n in (23, 9, 30)]
    query = random_segment(5, 3)
    calls = []
    real = pic_context.gated_delta_chain_forward_and_summarize
    monkeypatch.setattr(pic_context, "gated_delta_chain_forward_and_summarize",
                        lambda *a, **k: calls.append(1) or real(*a, **k))

    full = PicHarness(spec, model, config=PICConfig(mode="full_recompute", cold_policy="inline", segment_min_tokens=0))
    _, res = full.run(segs, query)
    assert calls == [] and max_err(res.logits, full_logits(spec, model, concat(segs, query))) < ATOL

    prefix = PicHarness(spec, model, config=PICConfig(mode="prefix_cache", cold_policy="inline", segment_min_tokens=0))
    prefix.run(segs, query)  # records the checkpoints (the write path runs here)
    assert calls  # the spy sees the write path when it runs
    calls.clear()
    plan, res = prefix.run(segs, query)  # everything but the last token found: nothing to write
    assert plan.prefix_hit_tokens == sum(len(s) for s in segs) + len(query) - 1 and plan.checkpoints == ()
    assert calls == [] and max_err(res.logits, full_logits(spec, model, concat(segs, query))) < ATOL


@pytest.mark.parametrize("mode", ["hypic", "prefix_cache"])
def test_run_initial_conv_states_are_stacked_once_per_forward(tiny, mode):
    """The runs' initial conv states of every linear layer come from one stack per forward when
    the entries' tails were written as one buffer's rows, equal to each layer's own stack."""
    from hypic.runner import pic_context

    spec, model = tiny
    h = PicHarness(spec, model, config=PICConfig(mode=mode, cold_policy="inline", segment_min_tokens=0))
    segs = [random_segment(20, 700 + i) for i in range(3)]
    query = random_segment(4, 5)
    h.run(segs if mode == "prefix_cache" else list(reversed(segs)), query)
    plan = h.plan(segs, query)
    captured = {}
    decode_caches = h.runner._decode_caches

    def keep(ctx):
        captured["ctx"] = ctx
        return decode_caches(ctx)

    with plan:
        h.runner._decode_caches = keep
        h.runner.prefill([plan])
    ctx = captured["ctx"]
    assert ctx._batched_tails and set(ctx._batched_tails) == set(spec.linear_layer_ids)
    x = torch.zeros(1, spec.conv_dim, dtype=next(model.parameters()).dtype)
    width = spec.conv_kernel_size
    per_layer = pic_context.PicContext(spec, ctx.layout)
    per_layer._batched_tails = {}  # the per-layer path
    for layer in spec.linear_layer_ids:
        got = ctx._run_initial_conv_states(layer, x, width)
        want = per_layer._run_initial_conv_states(layer, x, width)
        assert got.dtype == want.dtype and got.is_contiguous() and torch.equal(got, want)


@pytest.mark.parametrize("mode", ["prefix_cache", "hypic"])
def test_cold_records_keep_no_summaries(tiny, monkeypatch, mode):
    """A prefix-cache checkpoint needs the state after its segment, not the segment's summary:
    its forward must not keep every span's (T, S) alive until the writes (at 128k tokens in
    512-token segments that held 30 GiB and ran the H200 out of memory). A cold hypic forward's
    segment summaries are written into the entries by the op, so its records keep none either."""
    from hypic.runner.entry_writer import EntryWriter

    spec, model = tiny
    seen = []
    placed = []
    real = EntryWriter.linear_done

    def spy(self, layer_idx, rec):
        seen.append(rec.write_summaries)
        placed.append(layer_idx in self._in_place)
        return real(self, layer_idx, rec)

    monkeypatch.setattr(EntryWriter, "linear_done", spy)
    h = PicHarness(spec, model, config=PICConfig(mode=mode, cold_policy="inline", segment_min_tokens=0))
    segs = [random_segment(n, 900 + n) for n in (23, 30, 17)]
    query = random_segment(5, 4)
    plan, res = h.run(segs, query)
    assert seen and all(s is None for s in seen)
    assert all(placed) == (mode == "hypic") and (any(placed) == all(placed))
    assert max_err(res.logits, full_logits(spec, model, concat(segs, query))) < ATOL
    _, again = h.run(segs, query)  # the written entries serve the next request
    assert max_err(again.logits, full_logits(spec, model, concat(segs, query))) < ATOL


def test_writes_beyond_the_device_headroom_are_skipped(tiny, monkeypatch):
    """On CUDA the bytes a forward records are also bounded by the device memory left for them
    (record_headroom_bytes); the segments beyond it run live and unrecorded, and the result is
    still exact."""
    from hypic.runner import pic_runner

    spec, model = tiny
    a, b, c = (random_segment(n, 800 + n) for n in (40, 30, 50))
    probe = PicHarness(spec, model)
    one = probe.runner.entry_nbytes(len(a) - 8, checkpoint=False)
    two = one + probe.runner.entry_nbytes(len(b) - 8, checkpoint=False)
    asked = []
    monkeypatch.setattr(pic_runner, "record_headroom_bytes",
                        lambda device, n, factor=pic_runner.RECORD_PEAK_FACTOR: asked.append((n, factor)) or two)
    h = PicHarness(spec, model)  # an unbounded store: the headroom alone limits the writes
    query = random_segment(4, 3)
    plan, res = h.run([a, b, c], query)
    # a cold forward writes its entries in place: each charged once against the raw headroom
    assert asked == [(plan.live_tokens, 1)]
    assert len(h.store) == 2 and h.runner.skipped_writes == 1
    assert max_err(res.logits, full_logits(spec, model, concat([a, b, c], query))) < ATOL


def test_write_headroom_counts_an_entry_once_only_when_written_in_place(tiny, monkeypatch):
    """The device headroom of a forward's writes takes a segment entry's bytes once when its
    linear layers write the summaries straight into the entries (a cold forward), else
    RECORD_PEAK_FACTOR times (the rows copied from the forward's records: a cached request with a
    missed segment), and a prefix-cache checkpoint's RECORD_PEAK_FACTOR times always."""
    from hypic.runner import pic_runner

    spec, model = tiny
    a, b, c = (random_segment(n, 900 + n) for n in (40, 30, 50))
    charged = []
    real = pic_runner.PicRunner._take_budget

    def spy(self, budget, num_tokens, checkpoint):
        before = budget.remaining()[1]
        taken = real(self, budget, num_tokens, checkpoint)
        charged.append((checkpoint, (before - budget.remaining()[1]) // self.entry_nbytes(num_tokens, checkpoint)))
        return taken

    monkeypatch.setattr(pic_runner, "record_headroom_bytes", lambda device, n, factor=1: 1 << 40)
    monkeypatch.setattr(pic_runner.PicRunner, "_take_budget", spy)
    copied, cold = pic_runner.RECORD_PEAK_FACTOR, pic_runner.IN_PLACE_PEAK_FACTOR
    h = PicHarness(spec, model)
    query = random_segment(4, 3)
    h.run([a, b], query)  # cold
    assert charged == [(False, cold)] * 2
    charged.clear()
    h.run([a, c, b], query)  # two hits and a miss: the miss's rows are copied after the forward
    assert charged == [(False, copied)]
    p = PicHarness(spec, model, config=PICConfig(mode="prefix_cache", cold_policy="inline", segment_min_tokens=0))
    charged.clear()
    p.run([a, b], query)  # checkpoints are copied from the records
    assert charged and all(c == (True, copied) for c in charged)


def test_writes_in_place_follows_the_entry_writer_conditions():
    from types import SimpleNamespace

    from hypic.runner import pic_runner
    from hypic.pic.plan import SpanKind

    def plan(*kinds):
        return SimpleNamespace(spans=[SimpleNamespace(kind=k) for k in kinds])

    cold = plan(SpanKind.MISS, SpanKind.MISS, SpanKind.QUERY)
    assert pic_runner._writes_in_place([cold, cold])
    assert not pic_runner._writes_in_place([cold, plan(SpanKind.HIT, SpanKind.MISS, SpanKind.QUERY)])


def test_record_headroom_is_none_off_cuda_and_leaves_room_for_activations(monkeypatch):
    from hypic.runner import pic_runner

    assert pic_runner.record_headroom_bytes(torch.device("cpu"), 1000) is None
    monkeypatch.setattr(pic_runner, "device_free_bytes", lambda device: 10 << 30)
    per_token = pic_runner.ACTIVATION_BYTES_PER_LIVE_TOKEN
    got = pic_runner.record_headroom_bytes(torch.device("cuda"), 4096)
    assert got == ((10 << 30) - 4096 * per_token) // pic_runner.RECORD_PEAK_FACTOR
    assert pic_runner.record_headroom_bytes(torch.device("cuda"), 4096, 1) == (10 << 30) - 4096 * per_token
    assert pic_runner.record_headroom_bytes(torch.device("cuda"), 10 ** 9) == 0
    with pytest.raises(ValueError, match="peak_factor"):
        pic_runner.record_headroom_bytes(torch.device("cuda"), 4096, 0)


def test_standalone_pass_runs_in_groups_that_fit_the_device(tiny, monkeypatch):
    from hypic.runner import pic_runner

    spec, model = tiny
    segs = [random_segment(n, 600 + n) for n in (30, 22, 41, 27)]
    query = random_segment(5, 6)
    ref = PicHarness(spec, model, config=PICConfig(mode="hypic", cold_policy="standalone", segment_min_tokens=0))
    _, want = ref.run(segs, query)
    one = ref.runner.entry_nbytes(41 - 8, checkpoint=False)  # the largest entry
    monkeypatch.setattr(pic_runner, "record_headroom_bytes", lambda device, n, factor=3: one)
    forwards = []
    real = pic_runner.PicRunner._standalone_entries
    monkeypatch.setattr(pic_runner.PicRunner, "_standalone_entries",
                        lambda self, todo: forwards.append(len(todo)) or real(self, todo))
    h = PicHarness(spec, model, config=PICConfig(mode="hypic", cold_policy="standalone", segment_min_tokens=0))
    plan, got = h.run(segs, query)
    assert forwards == [1, 1, 1, 1] and len(h.store) == 4  # one segment per forward: the room of one
    torch.testing.assert_close(got.logits, want.logits)


def test_writes_of_a_batch_record_their_own_conv_tails(tiny):
    """Each written entry's conv tail is its own segment's, whatever request of the batch wrote
    it: a batched layout once read request 0's final tail for request 1's write (the standalone
    pass, one request per segment, wrote wrong tails for every segment but the first)."""
    spec, model = tiny
    requests = [([random_segment(n, 1000 + n)], random_segment(4, n)) for n in (26, 31, 19)]
    batch = PicHarness(spec, model)
    batch.run_batch(requests)
    got = {e.key: e for e in batch.store.snapshot()}
    assert len(got) == 3
    for segs, query in requests:
        alone = PicHarness(spec, model)
        alone.run(segs, query)
        (want,) = alone.store.snapshot()
        for layer, cache in want.linear.items():
            # batched and alone run different fp32 GEMM shapes: their roundings differ (1.07e-6
            # seen on one CPU); another request's tail would be off by O(1)
            torch.testing.assert_close(got[want.key].linear[layer].conv_tail, cache.conv_tail, rtol=0, atol=1e-5)
