import pytest

from hypic.pic.modes import PICConfig
from hypic.pic.plan import ENTRY_FROM_STANDALONE, ENTRY_FROM_STORE, SpanKind, plan_request
from hypic.pic.segments import SegmentedPrompt
from hypic.pic.store import SegmentStore
from tests.pic.helpers import keyer, make_entry

A = tuple(range(10, 15))  # 5 tokens
B = tuple(range(20, 27))  # 7 tokens
C = tuple(range(30, 33))  # 3 tokens
Q = tuple(range(40, 44))  # 4 tokens
KR = keyer()


def prompt(*segs, query=Q):
    return SegmentedPrompt(segments=segs, query=query)


def new_store():
    return SegmentStore(device_budget_bytes=None, host_budget_bytes=0)


def put(store, tokens, body_start):
    store.insert(make_entry(KR.segment_key(tokens, body_start)))


def plan(p, store=None, *, mode="hypic", seam=2, cold_policy="inline", **kw):
    # every segment a seam leaves a body in is cached (test_short_segments_are_never_cached has the threshold)
    policy = PICConfig(segment_min_tokens=0).resolve(mode=mode, seam=seam if mode == "hypic" else None,
                                                     cold_policy=cold_policy)
    return plan_request(p, policy, store=store, keyer=KR, **kw)


def kinds(rp):
    return [s.kind for s in rp.spans]


def test_positions_and_live_ranges_int_seam():
    store = new_store()
    put(store, B, 2)
    rp = plan(prompt(A, B, C), store)
    assert kinds(rp) == [SpanKind.MISS, SpanKind.HIT, SpanKind.MISS, SpanKind.QUERY]
    assert [s.start for s in rp.spans] == [0, 5, 12, 15]
    assert [s.num_tokens for s in rp.spans] == [5, 7, 3, 4]
    assert [s.live_end for s in rp.spans] == [5, 2, 3, 4]
    assert [s.body_start for s in rp.spans] == [2, 2, 2, 4]
    assert [s.writes_entry for s in rp.spans] == [True, False, True, False]
    hit = rp.spans[1]
    assert hit.entry_source == ENTRY_FROM_STORE and rp.handles[hit.entry_index].key == hit.key
    assert (rp.prompt_tokens, rp.cached_tokens, rp.live_tokens, rp.prefix_hit_tokens) == (19, 5, 14, 0)
    rp.release()


def test_float_seam_is_a_fraction_of_each_segment():
    store = new_store()
    for seg in (A, B, C):
        put(store, seg, {5: 2, 7: 2, 3: 1}[len(seg)])  # ceil(0.25 * L)
    rp = plan(prompt(A, B, C), store, seam=0.25)
    assert kinds(rp)[:3] == [SpanKind.HIT] * 3
    assert [s.live_end for s in rp.spans] == [2, 2, 1, 4]
    assert rp.cached_tokens == 3 + 5 + 2
    rp.release()


def test_first_segment_window_is_recomputed():
    store = new_store()
    put(store, A, 2)
    with plan(prompt(A), store) as rp:
        first = rp.spans[0]
        assert first.kind is SpanKind.HIT and first.start == 0
        assert (first.live_end, first.body_start) == (2, 2)


def test_seam_covering_the_segment_makes_it_live_without_store_access():
    store = new_store()
    put(store, C, 3)  # would only match a body-less key; must not be looked up
    rp = plan(prompt(A, C), store, seam=10)
    assert kinds(rp) == [SpanKind.MISS, SpanKind.MISS, SpanKind.QUERY]
    assert all(not s.writes_entry and s.key is None for s in rp.spans)
    assert rp.live_tokens == rp.prompt_tokens
    assert store.stats().hits + store.stats().misses == 0
    rp = plan(prompt(A, C), store, seam=1.0)
    assert rp.live_tokens == rp.prompt_tokens


def test_entries_are_keyed_by_seam():
    store = new_store()
    put(store, A, 2)
    with plan(prompt(A), store, seam=3) as rp:
        assert rp.spans[0].kind is SpanKind.MISS
    with plan(prompt(A), store, mode="transition") as rp:  # seam 0 -> different key
        assert rp.spans[0].kind is SpanKind.MISS and rp.spans[0].body_start == 0
    put(store, A, 0)
    with plan(prompt(A), store, mode="addition") as rp:
        assert rp.spans[0].kind is SpanKind.HIT and rp.spans[0].live_end == 0
        assert rp.live_tokens == len(Q) and rp.cached_tokens == 5


def test_repeated_cold_segment_inline_is_miss_each_time_and_written_once():
    store = new_store()
    rp = plan(prompt(A, B, A), store)
    assert kinds(rp)[:3] == [SpanKind.MISS] * 3
    assert [s.writes_entry for s in rp.spans[:3]] == [True, True, False]
    assert rp.spans[0].key == rp.spans[2].key
    assert rp.spans[2].start == 12 and rp.spans[2].live_end == 5
    assert store.stats().misses == 2  # one lookup per distinct segment
    rp.release()


def test_repeated_stored_segment_hits_one_handle():
    store = new_store()
    put(store, A, 2)
    rp = plan(prompt(A, B, A), store)
    assert kinds(rp)[:3] == [SpanKind.HIT, SpanKind.MISS, SpanKind.HIT]
    assert rp.spans[0].entry_index == rp.spans[2].entry_index == 0 and len(rp.handles) == 1
    assert rp.cached_tokens == 2 * 3
    assert store.stats().held_entries == 1
    rp.release()
    assert store.stats().held_entries == 0


def test_standalone_policy_turns_cold_segments_into_pending_hits():
    store = new_store()
    put(store, B, 2)
    rp = plan(prompt(A, B, A, C), store, cold_policy="standalone")
    assert kinds(rp)[:4] == [SpanKind.HIT] * 4
    assert [s.entry_source for s in rp.spans[:4]] == [
        ENTRY_FROM_STANDALONE, ENTRY_FROM_STORE, ENTRY_FROM_STANDALONE, ENTRY_FROM_STANDALONE]
    assert rp.standalone_segments == (0, 3) and rp.standalone_tokens == 8
    assert rp.cached_tokens == 5  # only the stored body counts as a cache hit
    rp.release()


def test_evicted_segment_is_planned_again_as_a_writing_miss():
    store = SegmentStore(device_budget_bytes=0, host_budget_bytes=0)
    put(store, A, 2)  # evicted at once (nothing holds it)
    with plan(prompt(A), store) as rp:
        assert rp.spans[0].kind is SpanKind.MISS and rp.spans[0].writes_entry


def test_full_recompute_touches_no_store():
    rp = plan(prompt(A, B, A), None, mode="full_recompute")
    assert kinds(rp) == [SpanKind.MISS] * 3 + [SpanKind.QUERY]
    assert rp.live_tokens == rp.prompt_tokens and rp.handles == ()


def put_chain(store, tokens, block=4):
    keys = KR.prefix_chain(tokens, block)
    for k in keys:
        store.insert(make_entry(k))
    return keys


def test_prefix_cache_uses_the_longest_stored_chain_and_writes_past_it():
    store = new_store()
    keys = put_chain(store, A + B)  # 12 tokens: blocks of 4 to 12
    rp = plan(prompt(A, B, C), store, mode="prefix_cache", prefix_block_tokens=4)
    assert rp.prefix_tokens == rp.prefix_hit_tokens == 12
    assert [h.key for h in rp.prefix_handles] == list(keys) and rp.resume_handle.key == keys[-1]
    assert kinds(rp) == [SpanKind.MISS, SpanKind.QUERY] and [s.start for s in rp.spans] == [12, 15]
    assert rp.live_tokens == 7 and rp.cached_tokens == 0 and rp.handles == ()
    # writes: the spine at 16, the end of C (a segment end, 15) and the prompt's last position but one (18)
    assert [(c.position, c.kv_start) for c in rp.checkpoints] == [(15, 12), (16, 12), (18, 16)]
    assert rp.checkpoints[1].key == KR.prefix_chain(A + B + C + Q, 4)[3]
    assert rp.checkpoints[0].key.parent is keys[-1]  # built on the stored key objects
    rp.release()
    assert store.stats().held_entries == 0
    with plan(prompt(A, C, B), store, mode="prefix_cache", prefix_block_tokens=4) as rp:
        assert rp.prefix_tokens == 4  # A's first block only: no checkpoint at 5 was stored
        assert kinds(rp)[0] is SpanKind.MISS and rp.spans[0].offset == 4 and rp.spans[0].num_tokens == 1
    with plan(prompt(B, A), store, mode="prefix_cache", prefix_block_tokens=4) as rp:
        assert rp.prefix_tokens == 0 and rp.resume_handle is None


def test_prefix_stops_at_a_missing_checkpoint_and_needs_a_live_token():
    store = new_store()
    keys = KR.prefix_chain(A + B, 4)
    store.insert(make_entry(keys[0]))
    store.insert(make_entry(keys[2]))  # the middle one is gone: only the first block is usable
    with plan(prompt(A, B, C), store, mode="prefix_cache", prefix_block_tokens=4) as rp:
        assert rp.prefix_tokens == 4 and store.stats().held_entries == 1
    put_chain(store, A + B + C + Q)  # the whole prompt: one token stays live
    with plan(prompt(A, B, C), store, mode="prefix_cache", prefix_block_tokens=4) as rp:
        assert rp.prefix_tokens == 16 and rp.live_tokens == 3


def test_a_leaf_continues_a_longer_prompt():
    # the end of an earlier prompt (a leaf under its last spine checkpoint) is found by a longer one
    store = new_store()
    earlier = KR.prefix_chain(A + B + C[:1], 4)  # 13 tokens: spine at 4, 8, 12, a leaf to 13
    for k in earlier:
        store.insert(make_entry(k))
    with plan(prompt(A, B, C), store, mode="hypic", prefix_block_tokens=4) as rp:
        assert rp.prefix_tokens == 13 and [h.key for h in rp.prefix_handles] == list(earlier)
        assert rp.spans[0].kind is SpanKind.MISS and rp.spans[0].offset == 1 and not rp.spans[0].writes_entry
    with plan(prompt(A, B, query=(7, 7)), store, mode="hypic", prefix_block_tokens=4) as rp:
        assert rp.prefix_tokens == 12  # the leaf's token (30) is not this prompt's


def test_pic_composes_after_the_prefix_and_checkpoints_stop_at_the_first_body():
    store = new_store()
    put_chain(store, A + B)
    put(store, C + Q, 2)  # a long segment to reuse after the prefix
    rp = plan(prompt(A, B, C + Q), store, prefix_block_tokens=4)
    assert rp.prefix_tokens == 12
    assert kinds(rp) == [SpanKind.HIT, SpanKind.QUERY] and rp.cached_tokens == 5
    assert rp.checkpoints == ()  # the exact region ends at the body (position 14)
    rp.release()
    fresh = new_store()
    with plan(prompt(A, B), fresh, prefix_block_tokens=4) as rp:  # all cold: writes everywhere
        assert [c.position for c in rp.checkpoints] == [4, 8, 12, 15]
        assert [s.writes_entry for s in rp.spans[:2]] == [True, True]


def test_short_segments_are_never_cached():
    store = new_store()
    policy = PICConfig(seam=2, segment_min_tokens=6, cold_policy="inline").resolve()
    rp = plan_request(prompt(A, B, C), policy, store=store, keyer=KR)
    assert [s.key is None for s in rp.spans[:3]] == [True, False, True]
    assert [s.writes_entry for s in rp.spans[:3]] == [False, True, False]
    assert rp.live_tokens == rp.prompt_tokens
    rp.release()
    assert store.stats().misses == 1  # only B was looked up


def test_bad_input_errors_acquire_nothing():
    store = new_store()
    put(store, A, 2)
    with pytest.raises(ValueError, match="context length 10"):
        plan(prompt(A, B), store, max_model_len=10)
    assert store.stats().held_entries == 0 and store.stats().hits == 0
    with pytest.raises(ValueError, match="needs a store"):
        plan(prompt(A), None)
    with pytest.raises(ValueError, match="SegmentedPrompt"):
        plan([A, Q], store)
    with pytest.raises(ValueError, match="policy"):
        plan_request(prompt(A), "hypic", store=store, keyer=KR)
    with pytest.raises(ValueError, match="unknown mode"):
        plan(prompt(A), store, mode="fastest")
    # The store keeps serving after rejected requests.
    with plan(prompt(A), store) as rp:
        assert rp.spans[0].kind is SpanKind.HIT


def test_tenant_salt_separates_entries():
    store = new_store()
    put(store, A, 2)
    with plan(prompt(A), store, tenant_salt="other") as rp:
        assert rp.spans[0].kind is SpanKind.MISS


def test_precomputed_segment_keys_are_used_and_checked(monkeypatch):
    from hypic.pic.plan import segment_keys

    store = new_store()
    put(store, B, 2)
    policy = PICConfig(segment_min_tokens=0).resolve(mode="hypic", seam=2, cold_policy="inline")
    p = prompt(A, B, (7, 8))  # the 2-token segment is all seam: no key
    keys = segment_keys(p, policy, KR)
    assert keys[2] is None and keys[1] == KR.segment_key(B, 2)
    calls = []
    monkeypatch.setattr(type(KR), "segment_key", lambda self, *a, **k: calls.append(a) or None)
    rp = plan_request(p, policy, store=store, keyer=KR, segment_keys=keys)  # no keying at all
    assert calls == [] and kinds(rp) == [SpanKind.MISS, SpanKind.HIT, SpanKind.MISS, SpanKind.QUERY]
    rp.release()
    with pytest.raises(ValueError, match="segment_keys: 2 keys for 3 segments"):
        plan_request(p, policy, store=store, keyer=KR, segment_keys=keys[:2])
