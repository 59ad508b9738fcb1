"""Tests of hypic/pic/prefix.py: spacing, chain look-ups (spine, then leaves) and the checkpoints
a request writes."""

import pytest

from hypic.pic.prefix import BLOCK_MULTIPLE_TOKENS, default_block_tokens, match_prefix, plan_checkpoints
from hypic.pic.store import SegmentStore
from tests.pic.helpers import keyer, make_entry

KR = keyer()
TOKENS = tuple(range(100, 140))  # 40 tokens


def store_with(*keys):
    store = SegmentStore(device_budget_bytes=None)
    for k in keys:
        store.insert(make_entry(k))
    return store


def test_default_spacing_makes_a_checkpoint_cost_at_most_its_block():
    # the embedded model: 448,512 state bytes per checkpoint, 2,048 K/V bytes per token -> 219 -> 256
    assert default_block_tokens(448_512, 2_048) == 256
    # Qwen3.5-35B-A3B in bf16: 65.9 MB of states, 20 KiB of K/V per token -> 3,218 -> 3,264
    assert default_block_tokens(30 * (32 * 128 * 128 * 4 + 8192 * 3 * 4), 10 * 2 * 2 * 256 * 2) == 3264
    assert default_block_tokens(10, 1 << 20) == BLOCK_MULTIPLE_TOKENS  # never below the multiple
    assert default_block_tokens(10, 0) == BLOCK_MULTIPLE_TOKENS  # no K/V at all
    for n in (1, 63, 64, 65, 1000):
        block = default_block_tokens(n * 100, 100)
        assert block % BLOCK_MULTIPLE_TOKENS == 0 and block * 100 >= n * 100
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        default_block_tokens(1, -1)


def test_match_walks_the_spine_then_takes_the_longest_leaf():
    spine = KR.prefix_chain(TOKENS[:24], 8)  # checkpoints at 8, 16, 24
    short_leaf = KR.prefix_key(spine[1], TOKENS[16:19])
    long_leaf = KR.prefix_key(spine[1], TOKENS[16:22])
    other_leaf = KR.prefix_key(spine[1], (1, 2, 3))
    store = store_with(spine[0], spine[1], short_leaf, long_leaf, other_leaf)
    handles, n = match_prefix(store, KR, TOKENS, block_tokens=8, limit=39)
    assert n == 22 and [h.key for h in handles] == [spine[0], spine[1], long_leaf]
    # the store's LRU order: the chain touched leaf first, so its root is the most recent
    assert store.device_lru_order()[-3:] == [long_leaf, spine[1], spine[0]]
    for h in handles:
        h.release()
    # a limit below a leaf's end: the leaf is not taken (one token must stay live)
    handles, n = match_prefix(store, KR, TOKENS, block_tokens=8, limit=20)
    assert n == 19 and handles[-1].key == short_leaf
    for h in handles:
        h.release()
    stats = store.stats()
    assert stats.prefix_hits == 6 and stats.hits == stats.misses == 0
    assert stats.held_entries == 0


def test_match_respects_the_tenant():
    store = store_with(*KR.prefix_chain(TOKENS[:16], 8))
    handles, n = match_prefix(store, KR, TOKENS, block_tokens=8, limit=39, tenant_salt="b")
    assert handles == [] and n == 0
    salted = store_with(*KR.prefix_chain(TOKENS[:19], 8, tenant_salt="b"))
    handles, n = match_prefix(salted, KR, TOKENS, block_tokens=8, limit=39, tenant_salt="b")
    assert n == 19
    for h in handles:
        h.release()
    assert match_prefix(salted, KR, TOKENS, block_tokens=8, limit=39) == ([], 0)


def test_plan_checkpoints_spine_and_leaves():
    found = KR.prefix_chain(TOKENS[:16], 8)
    writes = plan_checkpoints(KR, TOKENS, block_tokens=8, found=found, start=16, end=39, leaves=[20, 24, 39])
    assert [(w.position, w.kv_start) for w in writes] == [(20, 16), (24, 16), (32, 24), (39, 32)]
    full = KR.prefix_chain(TOKENS[:39], 8)
    assert writes[1].key == full[2] and writes[3].key == full[4] and writes[2].key == full[3]
    assert writes[0].key.parent is found[1]  # built on the found key objects
    assert writes[0].key == KR.prefix_key(found[1], TOKENS[16:20])
    # after a leaf (a prefix that ends between block boundaries) the next block starts below it
    leaf = KR.prefix_key(found[1], TOKENS[16:19])
    writes = plan_checkpoints(KR, TOKENS, block_tokens=8, found=list(found) + [leaf], start=19, end=30)
    assert [(w.position, w.kv_start) for w in writes] == [(24, 16)]
    assert plan_checkpoints(KR, TOKENS, block_tokens=8, found=(), start=0, end=0) == ()
    with pytest.raises(ValueError, match="no spine checkpoint"):
        plan_checkpoints(KR, TOKENS, block_tokens=8, found=(), start=12, end=20)
