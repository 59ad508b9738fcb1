"""Tests of hypic/engine/entry_tables.py: each entry's pointer tables, kept on the entry as rows
of a pool that are freed when the entry dies."""

import copy
import dataclasses
import gc

import numpy as np
import torch

from hypic.engine.entry_tables import PointerPool, entry_tables, kv_pointers, summary_pointers
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
    return [e.linear[0].summary.transition.data_ptr(), e.linear[0].summary.state.data_ptr()]


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


def test_pool_grows_keeping_its_rows():
    pool = PointerPool(4)
    rows = [pool.put(np.full(4, i, dtype=np.int64)) for i in range(40)]
    assert len(set(rows)) == 40 and pool.num_used == 40 and pool.rows.shape[0] >= 40
    assert all(pool.rows[r].tolist() == [i] * 4 for i, r in enumerate(rows))
    pool.free(rows[3])
    assert pool.put(np.full(4, 77, dtype=np.int64)) == rows[3] and pool.num_used == 40
