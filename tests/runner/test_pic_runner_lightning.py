"""PIC execution of the lightning-attention families (Ring-linear-2.0, MiniMax) on tiny models: every
mode and cold policy, exactness where the architecture promises it (architecture.md section 3),
the composed state of the first linear layer after reordering (with and without the re-rotation of
RoPE'd keys), the compact scalar-T entries and their byte accounting."""

from __future__ import annotations

import pytest
import torch

from hypic.engine.context import PlainContext, SequenceCache
from hypic.models.loader import load_model
from hypic.ops.linear.summary import ScalarSummary
from hypic.pic.modes import COLD_POLICIES, MODES, PICConfig
from tests.models._lightning import build_minimax, save_ring_checkpoint
from tests.runner.pic_helpers import PicHarness, full_logits, random_segment
from tests.runner.test_pic_runner_work import _EngineOpCounter
from tests.runner.test_pic_runner_interpreted import SYNC_OPS

pytestmark = pytest.mark.usefixtures("single_thread_torch")

FAMILIES = ("ring", "minimax")
ATOL = 1e-4


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    if request.param == "ring":
        save_ring_checkpoint(path)
    else:
        build_minimax(seed=2).save_pretrained(str(path))
    spec, model = load_model(str(path), dtype=torch.float32)
    return request.param, spec, model


def _concat(segments, query):
    return [t for s in segments for t in s] + list(query)


@torch.no_grad()
def _full_states(spec, model, ids):
    """The plain forward's cache after ``ids`` (every layer's final state)."""
    cache = SequenceCache.allocate(spec, "cpu", torch.float32)
    ctx = PlainContext(spec, [cache], [len(ids)])
    model(torch.tensor(ids), ctx.positions, ctx)
    return cache


@torch.no_grad()
def _greedy_after(spec, model, cache, logits, num_new):
    out = []
    for _ in range(num_new):
        out.append(int(logits.argmax()))
        ctx = PlainContext(spec, [cache], [1])
        logits = model(torch.tensor([out[-1]]), ctx.positions, ctx)[-1]
    return out


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("cold_policy", COLD_POLICIES)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_mode_and_cold_policy_runs_and_a_cold_inline_request_is_exact(family, mode, cold_policy):
    _, spec, model = family
    h = PicHarness(spec, model)
    segs = [random_segment(n, 10 + n) for n in (30, 70, 2, 13)]
    query = random_segment(5, 99)
    ref = full_logits(spec, model, _concat(segs, query))
    plan, res = h.run(segs, query, mode=mode, cold_policy=cold_policy)
    assert torch.isfinite(res.logits).all()
    if cold_policy != "standalone" or mode in ("full_recompute", "prefix_cache"):
        assert float((res.logits - ref).abs().max()) < ATOL  # all cold, with its true prefix
    # a second request reorders the segments: cached bodies where the mode keeps any
    plan, res = h.run(segs[::-1], query, mode=mode, cold_policy=cold_policy)
    assert torch.isfinite(res.logits).all()
    if MODES[mode].uses_segment_store:
        assert plan.cached_tokens > 0


@pytest.mark.parametrize("mode", ["transition", "transition_rope", "hypic", "prefix_cache"])
def test_same_order_reuse_gives_the_full_recompute_tokens(family, mode):
    _, spec, model = family
    h = PicHarness(spec, model)
    segs = [random_segment(n, 30 + n) for n in (40, 9, 65)]
    query = random_segment(6, 5)
    ids = _concat(segs, query)
    h.run(segs, query, mode=mode)  # cold, inline: entries made in this very context
    plan, res = h.run(segs, query, mode=mode)
    assert plan.cached_tokens > 0 or plan.prefix_hit_tokens > 0
    want_cache = _full_states(spec, model, ids)
    want = _greedy_after(spec, model, want_cache, full_logits(spec, model, ids), 8)
    assert _greedy_after(spec, model, res.cache, res.logits, 8) == want
    assert float((res.logits - full_logits(spec, model, ids)).abs().max()) < ATOL


def test_reordered_first_linear_layer_state_is_exact_with_rerotation(family):
    """After reordering, the first linear layer's composed state (cached bodies' summaries applied
    as T S + S_body) equals a full recompute's: its inputs are embeddings, the same wherever a
    segment sits. Ring-linear's keys carry RoPE inside the linear layers, so a body's S must move
    to the segment's new position (``transition_rope``); plain ``transition`` keeps it where it
    was cached and is measurably off. MiniMax's keys carry none: both modes are exact."""
    name, spec, model = family
    pool = [random_segment(n, 50 + n) for n in (60, 45, 80)]
    segs = [pool[2], pool[1], pool[0]]
    query = random_segment(5, 6)
    want = _full_states(spec, model, _concat(segs, query))
    first = spec.linear_layer_ids[0]
    errors = {}
    for mode in ("transition_rope", "transition"):
        h = PicHarness(spec, model)
        h.run([pool[0], pool[1]], random_segment(3, 3), mode=mode)
        h.run([pool[2]], random_segment(3, 4), mode=mode)
        plan, res = h.run(segs, query, mode=mode)
        assert plan.cached_tokens == sum(len(s) for s in segs)  # every segment a body cached elsewhere
        errors[mode] = _rel(res.cache.layers[first].recurrent_state, want.layers[first].recurrent_state)
    assert errors["transition_rope"] < 1e-5
    if name == "ring":
        assert errors["transition"] > 1e-2, errors
    else:
        assert errors["transition"] < 1e-5


def test_entries_hold_scalar_summaries_and_are_accounted_exactly(family):
    _, spec, model = family
    h = PicHarness(spec, model)
    segs = [random_segment(n, 70 + n) for n in (33, 50)]
    h.run(segs, random_segment(4, 1))
    entries = h.store.snapshot()
    assert len(entries) == 2
    for entry in entries:
        for layer in spec.linear_layer_ids:
            payload = entry.linear[layer]
            assert isinstance(payload.summary, ScalarSummary) and payload.conv_tail is None
            assert payload.summary.log_decay.shape == (1, spec.linear_num_value_heads)
        n = entry.num_body_tokens
        assert entry.nbytes == h.runner.entry_nbytes(n, checkpoint=False)
        # per linear layer: S [H, D, D] and one number per head, fp32
        linear = sum(p.nbytes for p in entry.linear.values())
        heads, d = spec.linear_num_value_heads, spec.linear_key_head_dim
        assert linear == len(spec.linear_layer_ids) * 4 * (heads * d * d + heads)
    stats = h.store.stats()
    assert stats.bytes_per_cached_token == pytest.approx(sum(e.nbytes for e in entries) / sum(e.num_body_tokens for e in entries))


def test_decode_continues_from_a_pic_prefill(family):
    _, spec, model = family
    h = PicHarness(spec, model)
    segs = [random_segment(n, 20 + n) for n in (25, 40)]
    query = random_segment(4, 7)
    h.run(segs, query)
    _, res = h.run(segs, query)  # all hit, same context
    ids = _concat(segs, query)
    cache = res.cache
    token = int(res.logits.argmax())
    for _ in range(3):
        ctx = PlainContext(spec, [cache], [1])
        with torch.no_grad():
            logits = model(torch.tensor([token]), ctx.positions, ctx)[-1]
        ids = ids + [token]
        assert float((logits - full_logits(spec, model, ids)).abs().max()) < ATOL
        token = int(logits.argmax())


def test_a_batch_mixing_hits_misses_and_prefix_checkpoints(family):
    """Two requests in one forward, one reusing bodies, one cold: each equals its own run."""
    _, spec, model = family
    h = PicHarness(spec, model)
    a = [random_segment(n, 90 + n) for n in (20, 30)]
    b = [random_segment(n, 95 + n) for n in (17, 12)]
    qa, qb = random_segment(4, 11), random_segment(6, 12)
    h.run(a, qa)
    plans, results = h.run_batch([(a, qa), (b, qb)])
    assert plans[0].cached_tokens > 0 and plans[1].cached_tokens == 0
    assert float((results[0].logits - full_logits(spec, model, _concat(a, qa))).abs().max()) < ATOL
    assert float((results[1].logits - full_logits(spec, model, _concat(b, qb))).abs().max()) < ATOL


def test_engine_issues_no_tensor_op_and_no_host_read_per_cached_segment(family):
    """The engine, runner and model code of an all-hit lightning request (reordered: every
    body's keys re-rotated) issue as many tensor ops over 12 cached segments as over 4, and none
    that would read a device tensor back on the host (the CUDA path of the layers' core is held
    to the same by tests/runner/test_pic_runner_interpreted.py)."""
    _, spec, model = family
    counts = {}
    for n in (4, 12):
        h = PicHarness(spec, model, config=PICConfig(mode="hypic", cold_policy="inline", segment_min_tokens=0))
        segs = [random_segment(40, 300 + i) for i in range(n)]
        query = random_segment(5, 9)
        h.run(list(reversed(segs)), query)  # caches every segment, in another order
        plan = h.plan(segs, query)
        assert plan.cached_tokens > 0
        ops, syncs = _EngineOpCounter(), _EngineOpCounter(only=SYNC_OPS)
        with plan:
            with ops.mode, syncs.mode:
                h.runner.prefill([plan])
        counts[n] = ops.count
        assert syncs.count == 0
    assert counts[4] > 0 and counts[12] == counts[4], counts
