"""Tests of hypic/runner/entry_tables.py: each entry's pointer tables, kept on the entry as rows
of a pool that are freed when the entry dies."""

import copy
import dataclasses
import gc

import numpy as np
import pytest
import torch

from hypic.runner.entry_tables import PointerPool, entry_tables, kv_pointers, summary_pointers
from hypic.ops.linear.summary import DenseSummary
from hypic.pic.keys import Keyer, KeyNamespace
from hypic.pic.payload import AttentionLayerCache, LinearLayerCache, SegmentEntry

KEYER = Keyer(KeyNamespace("entry-tables-test", "float32"))
CPU = torch.device("cpu")


def entry(i, attention_layers=(1,)):
    summary = DenseSummary(torch.randn(1, 2, 4, 4), torch.randn(1, 2, 4, 4))
    return SegmentEntry(key=KEYER.segment_key((i, i + 1, i + 2), 1),
                        linear={0: LinearLayerCache(summary, torch.zeros(8, 3))},
                        attention={layer: AttentionLayerCache(torch.randn(2, 2, 8), torch.randn(2, 2, 8))
                                   for layer in attention_layers})


def summary_ptrs(e):
    return [e.linear[0].summary.t_storage.data_ptr(), e.linear[0].summary.state.data_ptr()]


def test_tables_are_made_once_and_kept_on_the_entry():
    a, b = entry(1), entry(5)
    first = entry_tables([a, b], CPU)
    assert entry_tables([b, a], "cpu") == first[::-1]  # the same objects
    assert a.engine_tables == {CPU: first[0]}
    summaries = summary_pointers([a, b], first)
    kv, fmt = kv_pointers([a, b], first)
    assert summaries.width == 2 and summaries.stacked().tolist() == [summary_ptrs(a), summary_ptrs(b)]
    assert kv.stacked()[1].tolist() == [0, 0, b.attention[1].key.data_ptr(), b.attention[1].value.data_ptr()]
    assert fmt is not None and kv_pointers([b], [first[1]])[1] is fmt
    again = summary_pointers([b, a], entry_tables([b, a], CPU))
    assert again.pool is summaries.pool and again.rows == summaries.rows[::-1]  # computed once
    # another layer count: another pool, so no common table
    c = entry(9, attention_layers=(1, 3))
    assert kv_pointers([a, c], entry_tables([a, c], CPU)) == (None, None)
    assert kv_pointers([c], entry_tables([c], CPU))[0].width == 8


def test_copies_and_new_entries_start_without_tables():
    a = entry(1)
    summary_pointers([a], entry_tables([a], CPU))
    for other in (a.map_payload(lambda o: o), a.map_payload(lambda o: dataclasses.replace(o))):
        assert other.engine_tables == {}
        assert summary_pointers([other], entry_tables([other], CPU)).stacked().tolist() == [summary_ptrs(other)]
    assert a.engine_tables  # the original keeps its own
    assert copy.copy(a).engine_tables is a.engine_tables  # a shallow copy: the same tensors
    # not a field: not compared, shown or replaced
    assert "engine_tables" not in {f.name for f in dataclasses.fields(SegmentEntry)}
    assert "engine_tables" not in repr(a)


def test_an_entrys_rows_are_freed_when_it_dies():
    entries = [entry(100 + i) for i in range(3)]
    rows = summary_pointers(entries, entry_tables(entries, CPU))
    pool = rows.pool
    used = pool.num_used
    dead = rows.rows[1]
    del entries[1], rows
    gc.collect()
    assert pool.num_used == used - 1 and not pool.rows[dead].any()
    fresh = entry(200)
    new = summary_pointers([fresh], entry_tables([fresh], CPU))
    assert new.rows == [dead] and new.stacked().tolist() == [summary_ptrs(fresh)]  # the row reused
    left = summary_pointers(entries, entry_tables(entries, CPU)).stacked().tolist()
    assert left == [summary_ptrs(e) for e in entries]  # the others' rows untouched


def full(width, value):
    return np.full(width, value, dtype=np.int64)


def test_pool_grows_keeping_its_rows():
    pool = PointerPool(4)
    assert pool.rows.shape == (0, 4) and pool.num_used == 0
    rows = [pool.put(full(4, i)) for i in range(40)]
    assert len(set(rows)) == 40 and pool.num_used == 40 and pool.rows.shape[0] >= 40
    assert rows[:16] == list(range(16))  # first 16 rows, lowest first; then doubled twice
    assert pool.rows.shape == (64, 4) and pool.rows.dtype == np.int64
    assert all(pool.rows[r].tolist() == [i] * 4 for i, r in enumerate(rows))
    assert not pool.rows[40:].any()  # rows not handed out are zeros
    pool.free(rows[3])
    assert pool.put(full(4, 77)) == rows[3] and pool.num_used == 40


def test_pool_reuses_the_last_freed_row_first_and_grows_only_when_full():
    pool = PointerPool(2)
    rows = [pool.put(full(2, i + 1)) for i in range(16)]
    array = pool.rows
    pool.free(rows[5])
    pool.free(rows[9])
    assert pool.num_used == 14 and not pool.rows[rows[5]].any() and not pool.rows[rows[9]].any()
    assert pool.put(full(2, 50)) == rows[9] and pool.put(full(2, 60)) == rows[5]  # a stack
    assert pool.rows is array  # reused, not grown
    assert pool.rows[rows[9]].tolist() == [50, 50] and pool.rows[rows[5]].tolist() == [60, 60]
    extra = pool.put(full(2, 70))  # full: doubled
    assert extra == 16 and pool.rows.shape == (32, 2) and pool.rows is not array
    assert pool.rows[:16].tolist() == [[50, 50] if r == rows[9] else [60, 60] if r == rows[5] else [r + 1] * 2
                                       for r in range(16)]


def test_pool_release_of_every_row_keeps_its_size():
    pool = PointerPool(3)
    rows = [pool.put(full(3, i)) for i in range(20)]
    for r in rows:
        pool.free(r)
    assert pool.num_used == 0 and pool.rows.shape == (32, 3) and not pool.rows.any()
    again = [pool.put(full(3, 9)) for _ in range(32)]  # fits without growing
    assert sorted(again) == list(range(32)) and pool.rows.shape == (32, 3)


def test_pool_accepts_any_integer_table():
    pool = PointerPool(2)
    row = pool.put(np.array([3, 4], dtype=np.int32))
    assert pool.rows[row].tolist() == [3, 4] and pool.rows.dtype == np.int64
    assert pool.rows[pool.put([5, 6])].tolist() == [5, 6]


def test_pool_errors_on_bad_input():
    for width in (0, -1, 2.0, True, "4"):
        with pytest.raises(ValueError):
            PointerPool(width)
    pool = PointerPool(4)
    row = pool.put(full(4, 1))
    for table in (full(3, 1), full(5, 1), np.ones((2, 2), dtype=np.int64), np.int64(7),
                  np.ones(4, dtype=np.float64), np.array(["a"] * 4)):
        with pytest.raises(ValueError):
            pool.put(table)
    assert pool.num_used == 1 and pool.rows[row].tolist() == [1] * 4  # nothing taken or written
    for bad in (-1, 16, 1000, row + 1):  # out of range, or never handed out
        with pytest.raises(ValueError):
            pool.free(bad)
    pool.free(row)
    with pytest.raises(ValueError):
        pool.free(row)  # twice: would hand the row out twice
    assert pool.num_used == 0 and pool.put(full(4, 2)) == row and pool.put(full(4, 3)) != row


def test_pool_free_from_the_collector_during_growth_is_kept():
    """A free() that runs inside put() (the collector dropping an entry) is not lost when the
    pool grows."""
    pool = PointerPool(2)
    rows = [pool.put(full(2, i)) for i in range(16)]
    real_zeros = np.zeros

    def zeros_freeing(*args, **kwargs):  # as if the collector ran an EntryTables.__del__ here
        np.zeros = real_zeros
        pool.free(rows[7])
        return real_zeros(*args, **kwargs)

    np.zeros = zeros_freeing
    try:
        new = pool.put(full(2, 99))
    finally:
        np.zeros = real_zeros
    assert pool.rows.shape == (32, 2) and pool.num_used == 16
    handed = {pool.put(full(2, 5)) for _ in range(16)}  # every free row once, row 7 among them
    assert rows[7] in handed and new not in handed and len(handed) == 16 and pool.num_used == 32


def test_pools_are_shared_by_width_and_rows_freed_with_their_entry():
    a, c = entry(300), entry(301, attention_layers=(1, 3))
    kv_a = kv_pointers([a], entry_tables([a], CPU))[0]
    kv_c = kv_pointers([c], entry_tables([c], CPU))[0]
    assert kv_a.pool is not kv_c.pool and (kv_a.width, kv_c.width) == (4, 8)
    b = entry(302)
    assert kv_pointers([b], entry_tables([b], CPU))[0].pool is kv_a.pool  # one pool per width
    pool, row = kv_c.pool, kv_c.rows[0]
    used = pool.num_used
    del c, kv_c
    gc.collect()
    assert pool.num_used == used - 1 and not pool.rows[row].any()


def test_bodies_are_read_in_place_only_in_one_t_storage_form():
    from hypic.ops.linear.t_planes import pack_planes

    def packed_entry(i):
        e = entry(i)
        s = e.linear[0].summary
        return SegmentEntry(key=e.key, linear={0: LinearLayerCache(DenseSummary(pack_planes(s.transition), s.state,
                                                                                True), torch.zeros(8, 3))},
                            attention=e.attention)

    a, b, c = packed_entry(400), packed_entry(401), entry(402)
    both = summary_pointers([a, b], entry_tables([a, b], CPU))
    assert both.t_packed and both.stacked().tolist() == [summary_ptrs(a), summary_ptrs(b)]
    assert [e.linear[0].summary.t_storage.data_ptr() for e in (a, b)] == [p[0] for p in both.stacked().tolist()]
    plain = summary_pointers([c], entry_tables([c], CPU))
    assert not plain.t_packed and plain.pool is not both.pool  # a pool per form
    assert summary_pointers([a, c], entry_tables([a, c], CPU)) is None  # a mix: copied, as values
