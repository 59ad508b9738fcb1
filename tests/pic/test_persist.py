import json

import pytest
import torch
from safetensors.torch import save_file

from hypic.ops.linear.summary import DenseSummary
from hypic.pic.payload import LinearLayerCache, LinearStateCheckpoint, SegmentEntry, payload_equal
from hypic.pic.persist import load_entries, save_entries
from hypic.pic.store import SegmentStore
from tests.pic.helpers import keyer, make_entry

KR = keyer()


def test_round_trip_is_bit_identical(tmp_path):
    store = SegmentStore(device_budget_bytes=None)
    seg = make_entry(KR.segment_key([1, 2, 3, 4], 2), seed=5, origin=9)
    g = torch.Generator().manual_seed(1)
    dense = DenseSummary(torch.randn(1, 2, 3, 3, generator=g), torch.randn(1, 2, 3, 4, generator=g))
    ckpt_key = KR.prefix_chain([7, 8, 9], 2)[1]
    ckpt = SegmentEntry(ckpt_key, linear={0: LinearStateCheckpoint(torch.randn(1, 2, 3, 4), None),
                                          2: LinearLayerCache(dense, torch.randn(5, 3))},
                        metadata={"policy": "standalone"})
    store.insert(seg)
    store.insert(ckpt)
    path = tmp_path / "cache.safetensors"
    assert save_entries(store.snapshot(), path) == 2
    loaded = load_entries(path, keyer=KR, allowed_modules=("hypic.", "tests."))
    assert [e.key for e in loaded] == [seg.key, ckpt_key]
    for got, want in zip(loaded, (seg, ckpt)):
        assert got.origin_position == want.origin_position
        assert dict(got.metadata) == dict(want.metadata)
        assert payload_equal(dict(got.linear), dict(want.linear))
        assert payload_equal(dict(got.attention), dict(want.attention))
    assert type(loaded[1].linear[2].summary) is DenseSummary
    fresh = SegmentStore(device_budget_bytes=None)
    for e in loaded:
        fresh.insert(e)
    assert fresh.stats().device_bytes == store.stats().device_bytes


def test_disallowed_class_and_bad_files(tmp_path):
    path = tmp_path / "c.safetensors"
    save_entries([make_entry(KR.segment_key([1, 2], 1))], path)
    with pytest.raises(ValueError, match="outside the allowed modules"):
        load_entries(path)  # FakeSummary lives in tests., not hypic.
    with pytest.raises(ValueError, match="does not match"):
        load_entries(path, keyer=keyer(hash_fn=lambda b: b"x"), allowed_modules=("tests.",))
    other = tmp_path / "other.safetensors"
    save_file({"a": torch.zeros(1)}, str(other))
    with pytest.raises(ValueError, match="no hypic segment entries"):
        load_entries(other)
    bad = SegmentEntry(KR.segment_key([1], 0), metadata={"obj": object()})
    with pytest.raises(ValueError, match="JSON"):
        save_entries([bad], tmp_path / "bad.safetensors")
    # A tampered manifest (token ids changed) is caught by the digest check.
    e = SegmentEntry(KR.segment_key([3, 4], 1), linear={0: LinearStateCheckpoint(torch.ones(2))})
    save_entries([e], path)
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    manifest = json.loads(meta["hypic.pic.entries"])
    manifest["entries"][0]["key"]["material"] = [3, 5]
    save_file(tensors, str(path), metadata={"hypic.pic.entries": json.dumps(manifest)})
    with pytest.raises(ValueError, match="does not match"):
        load_entries(path, keyer=KR)


def test_packed_t_round_trips_as_stored(tmp_path):
    """A DenseSummary whose T is stored as bf16 planes is saved and loaded (and moved) as its
    packed words with its flag: bit for bit, and its values still T's."""
    from hypic.ops.linear.t_planes import pack_planes
    from hypic.pic.payload import move_payload

    g = torch.Generator().manual_seed(3)
    t = torch.randn(1, 2, 4, 4, generator=g)
    packed = DenseSummary(pack_planes(t), torch.randn(1, 2, 4, 3, generator=g), True)
    entry = SegmentEntry(KR.segment_key([5, 6, 7], 1), linear={0: LinearLayerCache(packed, torch.randn(5, 3))})
    path = tmp_path / "packed.safetensors"
    save_entries([entry], path)
    (loaded,) = load_entries(path, keyer=KR)
    got = loaded.linear[0].summary
    assert got.t_packed and payload_equal(got, packed)
    assert torch.equal(got.transition, packed.transition) and float((got.transition - t).abs().max()) < 1e-4
    moved = move_payload(packed, "cpu")
    assert moved.t_packed and moved.t_storage is not packed.t_storage and payload_equal(moved, packed)
    # a file of plain summaries (no flag in it) loads them plain
    plain = DenseSummary(t, packed.state)
    save_entries([SegmentEntry(KR.segment_key([8, 9], 1), linear={0: LinearLayerCache(plain, None)})], path)
    (loaded,) = load_entries(path, keyer=KR)
    assert not loaded.linear[0].summary.t_packed and torch.equal(loaded.linear[0].summary.transition, t)
