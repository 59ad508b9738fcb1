"""Tests of hypic/runner/layout_template.py: a layout built from a geometry's template is the fresh
build's, field for field and tensor for tensor, and a template is never used for a batch of
another geometry."""

import dataclasses
import random

import pytest
import torch

from hypic.runner.layout_template import LayoutTemplates, request_geometry
from hypic.runner.layout import (
    WRITE_CHECKPOINT,
    WRITE_SEGMENT,
    BodyElement,
    LiveElement,
    PackedLayout,
    RequestLayout,
    Write,
    build_layout,
)
from hypic.ops.linear.summary import DenseSummary
from hypic.pic.keys import Keyer, KeyNamespace
from hypic.pic.modes import PICConfig
from hypic.pic.payload import AttentionLayerCache, LinearLayerCache, LinearStateCheckpoint, SegmentEntry
from tests.runner.pic_helpers import PicHarness, random_segment, tiny_model

KEYER = Keyer(KeyNamespace("template-test", "float32"))
CPU = torch.device("cpu")
HV, K, V = 2, 4, 4


def body_entry(tokens, body_start=1, origin=0, dtype=torch.float32):
    """A segment entry with linear layers 0, 2 and attention layers 1, 3."""
    key = KEYER.segment_key(tuple(tokens), body_start)
    n = len(tokens) - body_start
    linear = {layer: LinearLayerCache(DenseSummary(torch.randn(1, HV, K, K, dtype=dtype),
                                                   torch.randn(1, HV, K, V, dtype=dtype)),
                                      torch.zeros(8, 3, dtype=dtype)) for layer in (0, 2)}
    attention = {layer: AttentionLayerCache(torch.randn(n, 2, 8), torch.randn(n, 2, 8)) for layer in (1, 3)}
    return SegmentEntry(key=key, linear=linear, attention=attention, origin_position=origin)


def checkpoint_entry(tokens):
    key = KEYER.prefix_key(None, tuple(tokens))
    n = len(tokens)
    linear = {layer: LinearStateCheckpoint(torch.randn(HV, K, V), torch.zeros(8, 3)) for layer in (0, 2)}
    attention = {layer: AttentionLayerCache(torch.randn(n, 2, 8), torch.randn(n, 2, 8)) for layer in (1, 3)}
    return SegmentEntry(key=key, linear=linear, attention=attention)


SEGMENT_TOKENS, SEAM = 6, 2
POOL = [body_entry(range(100 * i, 100 * i + SEGMENT_TOKENS), SEAM, origin=SEGMENT_TOKENS * i) for i in range(6)]


def hit_request(order, query, *, prefix=(), seam=SEAM, use_transition=True, rerotate_keys=True,
                need_logits=True, miss_at=None, write_kind=WRITE_SEGMENT, write_from=None):
    """The request a runner lays out for segments of POOL in ``order`` (each a seam window then
    its body) and ``query``; ``miss_at``: the index in ``order`` of a segment run live and written."""
    elems = []
    pos = sum(p.num_tokens for p in prefix)
    for i, idx in enumerate(order):
        entry = POOL[idx]
        tokens = entry.key.token_ids
        if i == miss_at:
            key = KEYER.segment_key(tokens, seam) if write_kind == WRITE_SEGMENT else KEYER.prefix_key(None, tokens)
            elems.append(LiveElement(tokens[:seam], pos))
            elems.append(LiveElement(tokens[seam:], pos + seam, (Write(write_kind, key, pos, write_from),)))
        else:
            elems.append(LiveElement(tokens[:seam], pos))
            elems.append(BodyElement(entry, pos + seam, len(tokens) - seam, pos))
        pos += len(tokens)
    elems.append(LiveElement(tuple(query), pos))
    return RequestLayout(tuple(elems), tuple(prefix), use_transition=use_transition,
                         rerotate_keys=rerotate_keys, need_logits=need_logits)


def assert_same_layout(got: PackedLayout, want: PackedLayout) -> None:
    for f in dataclasses.fields(PackedLayout):
        if f.name == "geometry_cache":  # a template's, None for a fresh build
            continue
        a, b = getattr(got, f.name), getattr(want, f.name)
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor), f.name
            assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), f.name
            assert torch.equal(a, b), f.name
            if f.name != "index_device":
                assert a.data_ptr() % 16 == 0, f.name
        elif f.name in ("requests", "cached_pieces"):
            assert len(a) == len(b) and all(x is y for x, y in zip(a, b)), f.name
        elif f.name == "bodies":
            assert len(a) == len(b) and all(x[0] == y[0] and x[1] is y[1] for x, y in zip(a, b)), f.name
        elif f.name == "writes":
            assert len(a) == len(b) and all(x[:2] == y[:2] and x[2] is y[2] for x, y in zip(a, b)), f.name
        else:
            assert a == b and type(a) is type(b), f.name
    if got.index_device is not None:  # every table a view of the one buffer
        assert got.input_ids.untyped_storage().data_ptr() == got.index_device.untyped_storage().data_ptr()


def differs(a: PackedLayout, b: PackedLayout) -> bool:
    try:
        assert_same_layout(a, b)
    except AssertionError:
        return True
    return False


def build_twice_then(templates, batch, conv_width=4, device=CPU):
    """Two fresh builds through ``templates`` (the second makes the template), then a third."""
    for _ in range(2):
        build_layout(batch, conv_width, device, templates=templates)
    return build_layout(batch, conv_width, device, templates=templates)


def test_template_builds_equal_fresh_builds_for_new_orders_and_queries():
    rng = random.Random(0)
    templates = LayoutTemplates()
    for i in range(8):
        order = rng.sample(range(len(POOL)), len(POOL))
        batch = [hit_request(order, [rng.randrange(500) for _ in range(5)])]
        got = build_layout(batch, 4, CPU, templates=templates)
        assert_same_layout(got, build_layout(batch, 4, CPU))
    assert len(templates) == 1 and templates.num_reused == 6  # made at the second build


def test_template_of_a_batch_with_misses_prefixes_and_writes():
    rng = random.Random(1)
    prefix = (checkpoint_entry((1, 2, 3)), checkpoint_entry((4, 5)))
    templates = LayoutTemplates()
    for i in range(6):
        order = rng.sample(range(len(POOL)), 4)
        batch = [hit_request(order, [rng.randrange(500) for _ in range(3)], miss_at=1),
                 hit_request(order[::-1], [7, 8], prefix=prefix, miss_at=2, write_kind=WRITE_CHECKPOINT),
                 hit_request(order[:2], [9], need_logits=False)]
        got = build_layout(batch, 4, CPU, templates=templates)
        want = build_layout(batch, 4, CPU)
        assert_same_layout(got, want)
        assert [w.key for _, _, w in got.writes] == [w.key for _, _, w in want.writes]
    assert templates.num_reused == 4


# each changes one part of a batch's geometry (and so its fresh layout): a template key without
# that part would give the changed batch the first one's layout
def _variants():
    order, query = [0, 1, 2], [1, 2, 3]
    base = [hit_request(order, query)]
    yield "query length", base, [hit_request(order, query + [4])]
    yield "segment count", base, [hit_request(order + [3], query)]
    split = hit_request(order, query)
    split = RequestLayout(split.elements[:-1] + (LiveElement((1,), split.elements[-1].start),
                                                 LiveElement((2, 3), split.elements[-1].start + 1)))
    yield "live split", base, [split]
    yield "need_logits", base, [hit_request(order, query, need_logits=False)]
    yield "use_transition", base, [hit_request(order, query, use_transition=False)]
    yield "rerotate_keys", base, [hit_request(order, query, rerotate_keys=False)]
    yield "a miss", base, [hit_request(order, query, miss_at=1)]
    yield "write kind", [hit_request(order, query, miss_at=1)], \
        [hit_request(order, query, miss_at=1, write_kind=WRITE_CHECKPOINT)]
    yield "write place", [hit_request(order, query, miss_at=1)], [hit_request(order, query, miss_at=2)]
    yield "checkpoint K/V start", [hit_request(order, query, miss_at=1, write_kind=WRITE_CHECKPOINT)], \
        [hit_request(order, query, miss_at=1, write_kind=WRITE_CHECKPOINT, write_from=SEGMENT_TOKENS)]
    yield "prefix", base, [hit_request(order, query, prefix=(checkpoint_entry((1, 2, 3)),))]
    yield "prefix length", [hit_request(order, query, prefix=(checkpoint_entry((1, 2, 3)),))], \
        [hit_request(order, query, prefix=(checkpoint_entry((1, 2, 3, 4)),))]
    yield "batch size", base, base + [hit_request(order, query)]
    yield "request order", base + [hit_request(order[:1], query)], [hit_request(order[:1], query)] + base
    # the same kinds and lengths, shifted: a live element and a body swap places
    e = POOL[0]
    a = RequestLayout((LiveElement((1, 2), 0), BodyElement(e, 2, 4, 0), LiveElement((1, 2), 6), LiveElement((3,), 8)))
    b = RequestLayout((LiveElement((1, 2), 0), LiveElement((1, 2), 2), BodyElement(e, 4, 4, 2), LiveElement((3,), 8)))
    yield "element kinds", [a], [b]


@pytest.mark.parametrize("name,first,second", list(_variants()), ids=[v[0] for v in _variants()])
def test_a_template_serves_only_its_geometry(name, first, second):
    templates = LayoutTemplates()
    build_twice_then(templates, first)
    assert len(templates) == 1
    assert differs(build_layout(second, 4, CPU), build_layout(first, 4, CPU)), name
    for _ in range(3):
        assert_same_layout(build_layout(second, 4, CPU, templates=templates), build_layout(second, 4, CPU))
    assert len(templates) == 2  # the second geometry has its own


def test_conv_width_and_device_are_in_the_key():
    batch = [hit_request([0, 1], [5])]
    templates = LayoutTemplates()
    build_twice_then(templates, batch, conv_width=4)
    assert differs(build_layout(batch, 3, CPU), build_layout(batch, 4, CPU))  # the conv tails' rows
    assert_same_layout(build_layout(batch, 3, CPU, templates=templates), build_layout(batch, 3, CPU))
    assert templates.num_reused == 1
    build_layout(batch, 4, "cpu", templates=templates)
    assert templates.num_reused == 2  # "cpu" is torch.device("cpu")
    a = request_geometry(batch[0])[0]
    assert a == request_geometry(hit_request([1, 0], [6]))[0]  # order and tokens are not geometry
    assert a != request_geometry(hit_request([1, 0], [6, 6]))[0]


def test_entries_that_read_otherwise_build_fresh():
    templates = LayoutTemplates()
    build_twice_then(templates, [hit_request([0, 1, 2], [4])])
    # a body whose summaries cannot be read in place (fp64): no address table, another buffer
    odd = body_entry(range(900, 900 + SEGMENT_TOKENS), SEAM, dtype=torch.float64)
    POOL.append(odd)
    try:
        batch = [hit_request([0, len(POOL) - 1, 2], [4])]
        got = build_layout(batch, 4, CPU, templates=templates)
        assert got.body_addresses is None
        assert_same_layout(got, build_layout(batch, 4, CPU))
    finally:
        POOL.pop()
    assert templates.num_reused == 1  # build_twice_then's third only
    # a body of another length than its entry's: the fresh build's error
    e = POOL[0]
    good = RequestLayout((LiveElement((1, 2), 0), BodyElement(e, 2, 4, 0), LiveElement((3,), 6)))
    build_twice_then(templates, [good])
    other = body_entry(range(700, 700 + SEGMENT_TOKENS + 1), SEAM)
    bad = RequestLayout((LiveElement((1, 2), 0), BodyElement(other, 2, 4, 0), LiveElement((3,), 6)))
    with pytest.raises(ValueError, match="its entry"):
        build_layout([bad], 4, CPU, templates=templates)


def test_invalid_requests_raise_as_fresh_builds_do():
    templates = LayoutTemplates()
    with pytest.raises(ValueError, match="last element must be live"):
        build_layout([RequestLayout((BodyElement(POOL[0], 0, 4, 0),))], 4, CPU, templates=templates)
    with pytest.raises(ValueError, match="expected 1"):
        build_layout([RequestLayout((LiveElement((1,), 0), LiveElement((2,), 3)))], 4, CPU, templates=templates)
    class Odd:
        start, num_tokens = 0, 1

    with pytest.raises(ValueError, match="unknown element type"):
        build_layout([RequestLayout((Odd(), LiveElement((2,), 1)))], 4, CPU, templates=templates)
    with pytest.raises(ValueError, match="at least one request"):
        build_layout([], 4, CPU, templates=templates)


def test_builds_share_no_mutable_host_list():
    batch = [hit_request([0, 1], [5])]
    templates = LayoutTemplates()
    first = build_twice_then(templates, batch)
    first.cu_live_host.append(99)
    first.run_init.clear()
    first.input_ids.fill_(0)  # a layout's tables are its own buffer's
    assert_same_layout(build_layout(batch, 4, CPU, templates=templates), build_layout(batch, 4, CPU))


def test_templates_are_bounded():
    templates = LayoutTemplates(max_templates=2, seen_geometries=3)
    for n in range(1, 6):
        build_twice_then(templates, [hit_request([0], [1] * n)])
    assert len(templates) == 2
    assert len(templates._seen) <= 3
    for n in range(1, 5):  # seen once each: remembered, no template
        build_layout([hit_request([1], [1] * n)], 4, CPU, templates=templates)
    assert len(templates._seen) == 3 and len(templates) == 2
    off = LayoutTemplates(max_templates=0)
    build_twice_then(off, [hit_request([0], [1])])
    assert len(off) == 0 and off.num_reused == 0


def test_buffer_for_gets_the_signature_and_is_copied_into():
    batch = [hit_request([0, 1, 2], [5, 6])]
    asked = []
    kept = {}

    def buffer_for(signature):
        asked.append(signature)
        return kept.get(signature)

    templates = LayoutTemplates()
    first = build_twice_then(templates, batch)
    kept[build_layout(batch, 4, CPU, buffer_for=lambda s: None).index_signature] = first.index_device
    other = [hit_request([2, 0, 1], [7, 8])]
    got = build_layout(other, 4, CPU, buffer_for=buffer_for, templates=templates)
    want = build_layout(other, 4, CPU, buffer_for=lambda s: None)
    assert asked[-1] == want.index_signature == got.index_signature
    assert got.index_device is first.index_device  # copied into the kept buffer
    assert torch.equal(first.input_ids, want.input_ids)  # whose views now hold this batch's tables
    got.index_device = want.index_device = None
    assert_same_layout(got, want)


def test_rope_tables_are_kept_per_template():
    from hypic.runner.pic_context import PicContext
    from hypic.models.config import spec_from_config
    from hypic.ops.rope import RotaryEmbedding
    from tests.runner.pic_helpers import TINY_CONFIG

    spec = spec_from_config(TINY_CONFIG)
    rotary = RotaryEmbedding(16, 8, 10000.0)
    templates = LayoutTemplates()
    first = build_twice_then(templates, [hit_request([0, 1, 2], [5, 6])])
    second = build_layout([hit_request([2, 0, 1], [7, 8])], 4, CPU, templates=templates)
    fresh = build_layout([hit_request([2, 0, 1], [7, 8])], 4, CPU)
    assert fresh.geometry_cache is None and first.geometry_cache is second.geometry_cache
    cos, sin = PicContext(spec, first).rope_cos_sin(rotary, first.positions, torch.float16)
    again = PicContext(spec, second).rope_cos_sin(rotary, second.positions, torch.float16)
    assert again[0] is cos and again[1] is sin  # kept, not recomputed
    want = rotary.cos_sin(fresh.positions)
    assert cos.dtype == torch.float16 and torch.equal(cos, want[0].half()) and torch.equal(sin, want[1].half())
    # another dtype, another rotary, positions that are not the layout's: computed
    assert PicContext(spec, second).rope_cos_sin(rotary, second.positions, torch.float32)[0] is not cos
    assert PicContext(spec, second).rope_cos_sin(RotaryEmbedding(16, 8, 500.0), second.positions,
                                                 torch.float16)[0] is not cos
    assert PicContext(spec, second).rope_cos_sin(rotary, second.positions.clone(), torch.float16)[0] is not cos
    # a fresh layout keeps nothing
    ctx = PicContext(spec, fresh)
    assert ctx.rope_cos_sin(rotary, fresh.positions, torch.float16)[0] is not ctx.rope_cos_sin(
        rotary, fresh.positions, torch.float16)[0]


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(seed=0)


@pytest.mark.parametrize("mode", ["hypic", "addition", "prefix_cache"])
def test_runner_results_are_those_of_fresh_builds(tiny, mode):
    # all-hit requests of one pool in new orders share a geometry: from the second one on, the
    # runner builds their layouts from its template; their logits and decode caches must be those
    # of a runner that builds every layout fresh (bit for bit)
    spec, model = tiny
    rng = random.Random(5)
    pool = [random_segment(20, 300 + i) for i in range(5)]
    kept, fresh = (PicHarness(spec, model, config=PICConfig(mode=mode, cold_policy="inline", segment_min_tokens=0)) for _ in range(2))
    fresh.runner.layout_templates = LayoutTemplates(max_templates=0)
    for h in (kept, fresh):
        h.run(pool, random_segment(4, 1))  # cold: caches the pool
    for r in range(5):
        order = rng.sample(range(len(pool)), len(pool)) if mode != "prefix_cache" else range(len(pool))
        segs, query = [pool[j] for j in order], random_segment(4, 50 + r)
        if r == 4:  # a miss among the hits: another geometry, with a write
            segs = segs[:2] + [random_segment(20, 999)] + segs[2:]
        (_, a), (_, b) = kept.run(segs, query), fresh.run(segs, query)
        assert torch.equal(a.logits, b.logits)
        for la, lb in zip(a.cache.layers, b.cache.layers):
            for name in ("recurrent_state", "conv_state", "keys", "values", "positions"):
                if hasattr(la, name):
                    assert torch.equal(getattr(la, name), getattr(lb, name)), name
    assert kept.runner.layout_templates.num_reused >= 2


def test_bodies_with_packed_t_are_another_signature():
    """Bodies whose T are stored as bf16 planes: the layout says so (the walk reads them that
    way), a kept graph of plain bodies is not theirs (another signature), a template of plain
    bodies builds them fresh, and a batch mixing the forms reads its bodies as values."""
    from hypic.ops.linear.t_planes import pack_planes

    def packed(e):
        linear = {layer: LinearLayerCache(DenseSummary(pack_planes(c.summary.transition), c.summary.state, True),
                                          c.conv_tail) for layer, c in e.linear.items()}
        return SegmentEntry(key=e.key, linear=linear, attention=e.attention, origin_position=e.origin_position)

    batch = [hit_request([0, 1, 2], [5, 6])]
    templates = LayoutTemplates()
    plain = build_twice_then(templates, batch)
    assert not plain.body_t_packed and plain.body_addresses is not None
    saved = POOL[:3]
    POOL[:3] = [packed(e) for e in saved]
    try:
        batch = [hit_request([0, 1, 2], [5, 6])]  # the same geometry, its bodies packed
        got = build_layout(batch, 4, CPU, templates=templates, buffer_for=lambda s: None)
        want = build_layout(batch, 4, CPU, buffer_for=lambda s: None)
        assert got.body_t_packed and got.body_addresses is not None
        assert templates.num_reused == 1  # build_twice_then's third only: this one built fresh
        assert got.index_signature == want.index_signature
        assert got.index_signature != build_layout([hit_request([3, 4, 5], [5, 6])], 4, CPU,
                                                   buffer_for=lambda s: None).index_signature
        got.index_device = want.index_device = None
        assert_same_layout(got, want)
        mixed = build_layout([hit_request([0, 4, 2], [5, 6])], 4, CPU)
        assert mixed.body_addresses is None and not mixed.body_t_packed
    finally:
        POOL[:3] = saved
