import pytest
import torch

from hypic.ops.linear.summary import DenseSummary, ScalarSummary
from hypic.pic.payload import (
    AttentionLayerCache,
    LinearLayerCache,
    LinearStateCheckpoint,
    SegmentEntry,
    compact_payload,
    move_payload,
    payload_equal,
    payload_nbytes,
)
from hypic.pic.store import SegmentStore
from tests.pic.helpers import FakeSummary, keyer


def test_payload_nbytes_counts_tensors_in_trees():
    t = torch.zeros(3, 4)  # 48 bytes
    h = torch.zeros(5, dtype=torch.float16)  # 10 bytes
    assert payload_nbytes(t) == 48
    assert payload_nbytes((t, [h, None], 3, "x", torch.float32)) == 58
    assert payload_nbytes(LinearLayerCache(FakeSummary(t, t), h)) == 106
    assert payload_nbytes(LinearStateCheckpoint(t)) == 48
    with pytest.raises(ValueError, match="cannot measure"):
        payload_nbytes(object())


def test_move_payload_copies_and_keeps_types():
    s = FakeSummary(torch.randn(1, 2, 3, 3), torch.randn(1, 2, 3, 4))
    tree = (LinearLayerCache(s, torch.randn(6, 3)), [torch.arange(4)], None)
    moved = move_payload(tree, "cpu")
    assert payload_equal(moved, tree)
    assert moved[0].summary.state.data_ptr() != s.state.data_ptr()
    assert type(moved[0].summary) is FakeSummary and isinstance(moved[1], list)
    same = move_payload(tree, "cpu", copy=False)
    assert same[0].summary.state.data_ptr() == s.state.data_ptr()


def test_compact_payload_clones_only_views():
    base = torch.randn(8, 2)
    whole = torch.randn(3, 2)
    out = compact_payload((base[2:4], whole, base.t()))
    assert out[0].untyped_storage().nbytes() == 2 * 2 * 4 and torch.equal(out[0], base[2:4])
    assert out[1] is whole
    assert out[2].is_contiguous() and torch.equal(out[2], base.t())


def test_payload_equal_is_bitwise():
    a = torch.tensor([float("nan"), 0.0])
    assert payload_equal(a, a.clone())
    assert not payload_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not payload_equal(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    assert not payload_equal(torch.zeros(2), torch.zeros(1, 2))
    assert payload_equal({1: (torch.ones(1),)}, {1: (torch.ones(1),)})
    assert not payload_equal(LinearStateCheckpoint(torch.ones(1)), LinearLayerCache(torch.ones(1)))


def test_attention_cache_validates():
    with pytest.raises(ValueError, match="token counts differ"):
        AttentionLayerCache(torch.zeros(3, 1, 2), torch.zeros(2, 1, 2))
    with pytest.raises(ValueError, match="key"):
        AttentionLayerCache([1], torch.zeros(1))


def test_entry_fields_and_origin():
    k = keyer().segment_key([1, 2, 3, 4], 1)
    e = SegmentEntry(k, attention={3: AttentionLayerCache(torch.zeros(3, 1, 2), torch.zeros(3, 1, 2))},
                     origin_position=17, metadata={"policy": "inline"})
    assert (e.num_tokens, e.body_start, e.num_body_tokens, e.origin_position) == (4, 1, 3, 17)
    assert e.token_ids == (1, 2, 3, 4) and e.nbytes == 48
    with pytest.raises(TypeError):
        e.metadata["x"] = 1  # read-only
    with pytest.raises(ValueError, match="origin_position"):
        SegmentEntry(k, origin_position=-1)
    with pytest.raises(ValueError, match="key"):
        SegmentEntry("k")


@pytest.mark.parametrize("cls", [DenseSummary, ScalarSummary])
def test_real_summaries_round_trip_through_the_host_tier(cls):
    g = torch.Generator().manual_seed(0)
    state = torch.randn(1, 2, 3, 4, generator=g)
    t = torch.randn(1, 2, 3, 3, generator=g) if cls is DenseSummary else -torch.rand(1, 2, generator=g)
    summary = cls(t, state)
    k = keyer().segment_key([5, 6, 7], 1)
    entry = SegmentEntry(k, linear={0: LinearLayerCache(summary, torch.randn(4, 3, generator=g))})
    store = SegmentStore(device_budget_bytes=0, host_budget_bytes=10_000)
    store.insert(entry)
    assert store.stats().host_bytes == summary.nbytes + 4 * 3 * 4 == entry.nbytes
    with store.acquire(k) as h:
        got = h.entry.linear[0].summary
        assert type(got) is cls and payload_equal(got, summary)
