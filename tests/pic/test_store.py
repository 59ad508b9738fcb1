import random
import threading

import pytest
import torch

from hypic.pic.payload import AttentionLayerCache, SegmentEntry, payload_equal
from hypic.pic.store import TIER_DEVICE, TIER_HOST, SegmentStore
from tests.pic.helpers import entry_nbytes, keyer, make_entry

KR = keyer()


def key(i, length=3, body_start=1):
    return KR.segment_key([i] * length, body_start)


E = entry_nbytes(body=2)  # bytes of make_entry(key(i)) (3 tokens, body 2)


def test_entry_bytes_are_exact():
    e = make_entry(key(0))
    assert e.nbytes == E
    store = SegmentStore(device_budget_bytes=None)
    store.insert(e)
    s = store.stats()
    assert s.device_bytes == E and s.device_entries == 1 and s.insertions == 1
    assert s.device_body_tokens == 2 and s.bytes_per_cached_token == E / 2
    store.check_consistency()


def test_views_are_compacted_on_insert():
    big = torch.randn(10, 1, 4)
    k = key(0, length=5, body_start=2)  # body of 3 tokens
    e = SegmentEntry(k, attention={0: AttentionLayerCache(big[2:5], big[5:8])})
    store = SegmentStore(device_budget_bytes=None)
    with store.insert(e, acquire=True) as h:
        stored = h.entry.attention[0]
        assert stored.key.untyped_storage().nbytes() == 3 * 4 * 4
        assert torch.equal(stored.key, big[2:5])
    assert store.stats().device_bytes == 2 * 3 * 4 * 4


def test_insert_without_compaction_keeps_the_callers_tensors():
    """compact=False (the runner's fresh exact-size copies): the entry is stored as given, no walk
    and no copy; its byte count is the one taken when the entry was built."""
    k = key(0, length=5, body_start=2)
    kv = AttentionLayerCache(torch.randn(3, 1, 4), torch.randn(3, 1, 4))
    e = SegmentEntry(k, attention={0: kv})
    assert e.nbytes == 2 * 3 * 4 * 4
    store = SegmentStore(device_budget_bytes=None)
    with store.insert(e, acquire=True, compact=False) as h:
        assert h.entry is e and h.entry.attention[0].key is kv.key
    assert store.stats().device_bytes == e.nbytes
    store.check_consistency()


def test_miss_hit_and_handle_lifecycle():
    store = SegmentStore(device_budget_bytes=None)
    assert store.acquire(key(0)) is None
    store.insert(make_entry(key(0), seed=3))
    h = store.acquire(key(0))
    assert h is not None and h.entry.metadata["seed"] == 3 and h.key == key(0)
    assert store.stats().held_entries == 1
    h.release()
    h.release()  # idempotent
    assert store.stats().held_entries == 0
    with pytest.raises(RuntimeError, match="after release"):
        h.entry
    s = store.stats()
    assert (s.hits, s.misses) == (1, 1) and s.hit_rate == 0.5


def test_lru_order_and_eviction_without_host_tier():
    store = SegmentStore(device_budget_bytes=3 * E)
    for i in range(3):
        store.insert(make_entry(key(i)))
    store.acquire(key(0)).release()  # 0 becomes most recently used
    assert store.device_lru_order() == [key(1), key(2), key(0)]
    store.insert(make_entry(key(3)))
    assert store.device_lru_order() == [key(2), key(0), key(3)]
    assert key(1) not in store
    s = store.stats()
    assert (s.evictions, s.spills, s.drops) == (1, 0, 1) and s.device_bytes == 3 * E
    store.check_consistency()


def test_eviction_never_drops_a_held_entry():
    store = SegmentStore(device_budget_bytes=E, host_budget_bytes=0)
    held = store.insert(make_entry(key(0), seed=7), acquire=True)
    for i in range(1, 5):
        store.insert(make_entry(key(i)))
        # The newcomer is evicted, not the held entry; the device stays at the held bytes.
        assert store.tier_of(key(0)) == TIER_DEVICE
        assert store.tier_of(key(i)) is None
        store.check_consistency()
    h2 = store.acquire(key(0))  # a second request shares the entry
    held.release()
    assert store.tier_of(key(0)) == TIER_DEVICE  # still held by h2
    assert h2.entry.metadata["seed"] == 7
    h2.release()
    assert store.stats().device_bytes == E  # fits the budget: kept


def test_held_entries_may_exceed_the_budget_until_released():
    store = SegmentStore(device_budget_bytes=E, host_budget_bytes=10 * E)
    h0 = store.insert(make_entry(key(0)), acquire=True)
    h1 = store.insert(make_entry(key(1)), acquire=True)
    assert store.stats().device_bytes == 2 * E  # over budget, both held
    store.check_consistency()
    h0.release()  # now 0 is evictable and the least recently used
    assert store.tier_of(key(0)) == TIER_HOST and store.tier_of(key(1)) == TIER_DEVICE
    h1.release()
    assert store.stats().device_bytes == E
    store.check_consistency()


def test_spill_and_promote_round_trip_is_bit_identical():
    store = SegmentStore(device_budget_bytes=E, host_budget_bytes=4 * E)
    original = make_entry(key(0), seed=11)
    # Special values must survive bit for bit.
    original.attention[1].key[0, 0, 0] = float("nan")
    original.attention[1].key[0, 0, 1] = -0.0
    reference = original.map_payload(lambda o: o)  # same tensors, for comparison below
    store.insert(original)
    store.insert(make_entry(key(1)))  # pushes 0 to the host tier
    assert store.tier_of(key(0)) == TIER_HOST
    s = store.stats()
    assert (s.spills, s.host_bytes, s.host_entries) == (1, E, 1)
    with store.acquire(key(0)) as h:  # promotion; 1 spills in turn
        assert store.tier_of(key(0)) == TIER_DEVICE and store.tier_of(key(1)) == TIER_HOST
        for layer in (0, 1):
            a = h.entry.linear.get(layer) or h.entry.attention[layer]
            b = reference.linear.get(layer) or reference.attention[layer]
            assert payload_equal(a, b)
        # The promoted payload is a copy, not the object inserted.
        assert h.entry.attention[1].key.data_ptr() != reference.attention[1].key.data_ptr()
        assert isinstance(h.entry.linear[0].summary, type(reference.linear[0].summary))
    s = store.stats()
    assert (s.promotions, s.spills, s.hits) == (1, 2, 1)
    store.check_consistency()


def test_host_tier_lru_drops_when_full():
    store = SegmentStore(device_budget_bytes=E, host_budget_bytes=2 * E)
    for i in range(5):
        store.insert(make_entry(key(i)))
    # device: 4; host keeps the two most recent spills (2, 3); 0 and 1 were dropped.
    assert store.device_lru_order() == [key(4)]
    assert store.host_lru_order() == [key(2), key(3)]
    s = store.stats()
    assert (s.evictions, s.spills, s.drops) == (4, 4, 2)
    assert s.host_bytes == 2 * E
    store.check_consistency()


def test_entry_larger_than_host_budget_is_dropped():
    store = SegmentStore(device_budget_bytes=0, host_budget_bytes=E - 1)
    store.insert(make_entry(key(0)))
    assert len(store) == 0 and store.stats().drops == 1


def test_duplicate_insert_keeps_one():
    store = SegmentStore(device_budget_bytes=None)
    store.insert(make_entry(key(0), seed=1))
    assert store.insert(make_entry(key(0), seed=2)) is None
    with store.insert(make_entry(key(0), seed=3), acquire=True) as h:
        assert h.entry.metadata["seed"] == 1
    s = store.stats()
    assert (s.insertions, s.duplicate_inserts, s.device_entries, s.device_bytes) == (1, 2, 1, E)


def test_forced_collision_is_a_miss_and_both_can_be_stored():
    kr = keyer(hash_fn=lambda data: b"\x00" * 8)
    a, b = kr.segment_key([1, 2, 3], 1), kr.segment_key([4, 5, 6], 1)
    store = SegmentStore(device_budget_bytes=None)
    store.insert(make_entry(a, seed=1))
    assert store.acquire(b) is None
    assert store.stats().collisions == 1 and store.stats().misses == 1
    store.insert(make_entry(b, seed=2))
    assert store.stats().collisions == 2  # inserting b next to a's digest
    with store.acquire(a) as ha, store.acquire(b) as hb:
        assert ha.entry.token_ids == (1, 2, 3) and hb.entry.token_ids == (4, 5, 6)
        assert ha.entry.metadata["seed"] == 1 and hb.entry.metadata["seed"] == 2


def test_clear_keeps_held_entries():
    store = SegmentStore(device_budget_bytes=None)
    h = store.insert(make_entry(key(0)), acquire=True)
    store.insert(make_entry(key(1)))
    assert store.clear() == 1
    assert store.tier_of(key(0)) == TIER_DEVICE and key(1) not in store
    h.release()
    store.check_consistency()


def test_discard_drops_one_entry_of_either_tier_unless_held():
    entry = make_entry(key(0))
    one = entry.nbytes
    store = SegmentStore(device_budget_bytes=one, host_budget_bytes=10 * one)
    h = store.insert(make_entry(key(0)), acquire=True)
    store.insert(make_entry(key(1)))  # pushes nothing held out: key 1 spills to the host tier
    assert store.tier_of(key(1)) == TIER_HOST
    with pytest.raises(ValueError, match="hold it"):
        store.discard(key(0))
    assert store.discard(key(1)) and key(1) not in store
    assert not store.discard(key(1))
    h.release()
    assert store.discard(key(0)) and len(store) == 0
    assert store.stats().device_bytes == 0 and store.stats().host_bytes == 0
    store.check_consistency()
    with pytest.raises(ValueError, match="StoreKey"):
        store.discard("k")


def test_opaque_payload_objects_are_moved_with_to():
    class Opaque:
        def __init__(self, t):
            self.t = t

        @property
        def nbytes(self):
            return self.t.numel() * self.t.element_size()

        def to(self, device):
            return Opaque(self.t.to(device, copy=True))

    k = key(0)
    store = SegmentStore(device_budget_bytes=0, host_budget_bytes=10_000)
    store.insert(SegmentEntry(k, linear={2: Opaque(torch.arange(6.0))}))
    assert store.stats().host_bytes == 24
    with store.acquire(k) as h:
        assert torch.equal(h.entry.linear[2].t, torch.arange(6.0))


def test_bad_arguments():
    with pytest.raises(ValueError, match="device_budget_bytes"):
        SegmentStore(device_budget_bytes=-1)
    with pytest.raises(ValueError, match="host_budget_bytes"):
        SegmentStore(device_budget_bytes=None, host_budget_bytes=1.5)
    store = SegmentStore(device_budget_bytes=None)
    with pytest.raises(ValueError, match="key"):
        store.acquire("abc")
    with pytest.raises(ValueError, match="entry"):
        store.insert({"not": "an entry"})
    with pytest.raises(ValueError, match="both linear and attention"):
        make = make_entry(key(0))
        SegmentEntry(key(0), linear=dict(make.linear), attention={0: make.attention[1]})
    with pytest.raises(ValueError, match="layer indices"):
        SegmentEntry(key(0), linear={"0": torch.zeros(1)})
    with pytest.raises(ValueError, match="cannot measure"):
        SegmentEntry(key(0), linear={0: object()})


def test_concurrent_requests_smoke():
    """Threads acquire, verify and release while others insert; tiny budgets force churn."""
    keys = [key(i) for i in range(12)]
    store = SegmentStore(device_budget_bytes=3 * E, host_budget_bytes=4 * E)
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        try:
            for _ in range(150):
                i = rng.randrange(len(keys))
                h = store.acquire(keys[i])
                if h is None:
                    h = store.insert(make_entry(keys[i], seed=i), acquire=True)
                with h:
                    # A held entry stays on the device, intact, whatever the others do.
                    assert store.tier_of(keys[i]) == TIER_DEVICE
                    assert h.entry.metadata["seed"] == i
                    expected = make_entry(keys[i], seed=i)
                    assert payload_equal(h.entry.attention[1], expected.attention[1])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    s = store.stats()
    assert s.held_entries == 0 and s.device_bytes <= 3 * E
    assert s.hits + s.misses == 4 * 150
    store.check_consistency()


# ---- model-based check: random operation sequences against a plain reference -------------------

from collections import OrderedDict  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SIZED = [KR.segment_key([100 + i] * (2 + i % 3), 1) for i in range(6)]  # bodies of 1..3 tokens
SIZE = [make_entry(k).nbytes for k in SIZED]


class Reference:
    def __init__(self, budget, host_budget):
        self.budget, self.host_budget = budget, host_budget
        self.dev, self.host, self.ref = OrderedDict(), OrderedDict(), {}

    def _bytes(self, table):
        return sum(SIZE[i] for i in table)

    def enforce(self):
        for i in list(self.dev):
            if self._bytes(self.dev) <= self.budget:
                break
            if self.ref[i] == 0:
                del self.dev[i]
                if SIZE[i] <= self.host_budget:
                    while self._bytes(self.host) + SIZE[i] > self.host_budget:
                        self.host.popitem(last=False)
                    self.host[i] = True

    def hold(self, i):
        if i in self.host:
            del self.host[i]
            self.dev[i] = True
        self.ref[i] += 1
        self.dev.move_to_end(i)

    def insert(self, i, acquire):
        if i not in self.dev and i not in self.host:
            self.dev[i] = True
            self.ref[i] = 0
        elif not acquire:
            return False
        if acquire:
            self.hold(i)
        self.enforce()
        return acquire

    def acquire(self, i):
        if i not in self.dev and i not in self.host:
            return False
        self.hold(i)
        self.enforce()
        return True

    def release(self, i):
        self.ref[i] -= 1
        if self.ref[i] == 0:
            self.enforce()


ops_st = st.lists(
    st.tuples(st.sampled_from(["insert", "insert_acquire", "acquire", "release"]),
              st.integers(0, len(SIZED) - 1)),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=ops_st, budget=st.integers(0, 3 * max(SIZE)), host_budget=st.integers(0, 3 * max(SIZE)))
def test_store_matches_reference_model(ops, budget, host_budget):
    store = SegmentStore(device_budget_bytes=budget, host_budget_bytes=host_budget)
    ref = Reference(budget, host_budget)
    handles = []  # (index, handle)
    for op, i in ops:
        if op == "release":
            if handles:
                j, h = handles.pop(i % len(handles))
                h.release()
                ref.release(j)
        elif op == "acquire":
            h = store.acquire(SIZED[i])
            assert (h is not None) == ref.acquire(i)
            if h is not None:
                handles.append((i, h))
        else:
            acq = op == "insert_acquire"
            h = store.insert(make_entry(SIZED[i], seed=i), acquire=acq)
            assert (h is not None) == ref.insert(i, acq)
            if h is not None:
                handles.append((i, h))
        assert store.device_lru_order() == [SIZED[j] for j in ref.dev]
        assert store.host_lru_order() == [SIZED[j] for j in ref.host]
        for j, h in handles:  # every held entry is intact on the device
            assert store.tier_of(SIZED[j]) == TIER_DEVICE and h.entry.metadata["seed"] == j
        store.check_consistency()
    for _, h in handles:
        h.release()
    assert store.stats().held_entries == 0


@pytest.mark.cuda  # pinned host tier + CUDA device tier
def test_cuda_pinned_spill_and_async_promote_are_bit_identical():
    store = SegmentStore(device_budget_bytes=E, host_budget_bytes=4 * E, device="cuda")
    assert store.pin_host_memory
    reference = make_entry(key(0), seed=21)
    store.insert(reference)  # moved to the GPU
    store.insert(make_entry(key(1)))  # spills 0 to pinned host memory
    assert store.tier_of(key(0)) == TIER_HOST
    with store.acquire(key(0)) as h:  # non_blocking promotion from pinned memory
        stored = h.entry.attention[1]
        assert stored.key.is_cuda
        # Reading on the current stream is ordered after the copy.
        assert payload_equal(stored, reference.attention[1])
        assert payload_equal(h.entry.linear[0], reference.linear[0])
    store.check_consistency()


def _state(store):
    s = store.stats()
    return (s, store.device_lru_order(), store.host_lru_order(),
            [store._device[k].refcount for k in store.device_lru_order()])


def test_acquire_many_is_acquire_of_each_key_in_turn():
    # a budget of 3 entries on the device and a host tier: some keys hit on the device, some are
    # promoted from the host (evicting unheld ones), some miss, one repeats
    def filled():
        store = SegmentStore(device_budget_bytes=3 * E, host_budget_bytes=10 * E)
        for i in range(6):
            store.insert(make_entry(key(i)))
        return store

    for keys in ([key(5), key(0), key(9), key(1), key(5), key(4)], [key(7)], [], [key(i) for i in range(6)]):
        one, many = filled(), filled()
        singles = [one.acquire(k) for k in keys]
        batch = many.acquire_many(keys)
        assert [h is None for h in singles] == [h is None for h in batch]
        assert [h.key for h in singles if h] == [h.key for h in batch if h]
        assert _state(one) == _state(many)
        for h in batch:
            if h is not None:
                h.release()
        many.check_consistency()
        assert many.stats().held_entries == 0


def test_acquire_many_acquires_nothing_on_a_bad_key_or_a_failure(monkeypatch):
    store = SegmentStore(device_budget_bytes=None, host_budget_bytes=10 * E)
    for i in range(3):
        store.insert(make_entry(key(i)))
    with pytest.raises(ValueError, match="expected StoreKey"):
        store.acquire_many([key(0), "nope"])
    assert store.stats().held_entries == 0 and store.stats().hits == 0

    import hypic.pic.store as store_module

    made = []

    class FailingHandle(store_module.SegmentHandle):  # the third acquisition fails
        __slots__ = ()

        def __init__(self, *args):
            made.append(self)
            if len(made) == 3:
                raise RuntimeError("hold failed")
            super().__init__(*args)

    monkeypatch.setattr(store_module, "SegmentHandle", FailingHandle)
    with pytest.raises(RuntimeError, match="hold failed"):
        store.acquire_many([key(0), key(1), key(2)])
    assert len(made) == 3
    assert [store._device[key(i)].refcount for i in range(3)] == [0, 0, 0]
    store.check_consistency()
