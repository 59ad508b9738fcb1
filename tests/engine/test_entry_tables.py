"""Tests of hypic/engine/entry_tables.py: each entry's pointer tables, kept on the entry."""

import copy
import dataclasses

import torch

from hypic.engine.entry_tables import entry_tables, kv_pointers, summary_pointers
from hypic.ops.linear.summary import DenseSummary
from hypic.pic.keys import Keyer, KeyNamespace
from hypic.pic.payload import AttentionLayerCache, LinearLayerCache, SegmentEntry

KEYER = Keyer(KeyNamespace("entry-tables-test", "float32"))
CPU = torch.device("cpu")


def entry(i):
    summary = DenseSummary(torch.randn(1, 2, 4, 4), torch.randn(1, 2, 4, 4))
    return SegmentEntry(key=KEYER.segment_key((i, i + 1, i + 2), 1),
                        linear={0: LinearLayerCache(summary, torch.zeros(8, 3))},
                        attention={1: AttentionLayerCache(torch.randn(2, 2, 8), torch.randn(2, 2, 8))})


def test_tables_are_made_once_and_kept_on_the_entry():
    a, b = entry(1), entry(5)
    first = entry_tables([a, b], CPU)
    assert entry_tables([b, a], "cpu") == first[::-1]  # the same objects
    assert a.engine_tables == {CPU: first[0]}
    summaries = summary_pointers([a, b], first)
    kv, fmt = kv_pointers([a, b], first)
    assert summaries[0].tolist() == [a.linear[0].summary.transition.data_ptr(), a.linear[0].summary.state.data_ptr()]
    assert kv[1].tolist() == [0, 0, b.attention[1].key.data_ptr(), b.attention[1].value.data_ptr()]
    assert fmt is not None and kv_pointers([b], [first[1]])[1] is fmt
    assert summary_pointers([a], [first[0]])[0] is summaries[0]  # computed once


def test_copies_and_new_entries_start_without_tables():
    a = entry(1)
    entry_tables([a], CPU)
    summary_pointers([a], entry_tables([a], CPU))
    for other in (a.map_payload(lambda o: o), a.map_payload(lambda o: dataclasses.replace(o))):
        assert other.engine_tables == {}
        got = summary_pointers([other], entry_tables([other], CPU))[0]
        want = other.linear[0].summary
        assert got.tolist() == [want.transition.data_ptr(), want.state.data_ptr()]
    assert a.engine_tables  # the original keeps its own
    assert copy.copy(a).engine_tables is a.engine_tables  # a shallow copy: the same tensors
    # not a field: not compared, shown or replaced
    assert "engine_tables" not in {f.name for f in dataclasses.fields(SegmentEntry)}
    assert "engine_tables" not in repr(a)
