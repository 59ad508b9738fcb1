"""Tests of hypic/pic/disk_tier.py and the store's disk tier: write-through, a restart reading
entries back, refusal of another engine's directory, corrupted and truncated files skipped."""

import json
import os

import pytest
import torch

from hypic.ops.linear.summary import DenseSummary
from hypic.pic.disk_tier import STORE_FILE, DiskTier
from hypic.pic.payload import AttentionLayerCache, LinearLayerCache, LinearStateCheckpoint, SegmentEntry, payload_equal
from hypic.pic.prefix import match_prefix
from hypic.pic.store import SegmentStore
from tests.pic.helpers import keyer

KR = keyer()
FINGERPRINT = {"model": "tiny-test", "dtype": "float32", "key_hash": "sha256"}


def segment_entry(tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    key = KR.segment_key(tokens, 1)
    summary = DenseSummary(torch.randn(1, 2, 3, 3, generator=g), torch.randn(1, 2, 3, 4, generator=g))
    n = len(tokens) - 1
    return SegmentEntry(key, linear={0: LinearLayerCache(summary, torch.randn(5, 3, generator=g))},
                        attention={1: AttentionLayerCache(torch.randn(n, 1, 4, generator=g),
                                                          torch.randn(n, 1, 4, generator=g))}, origin_position=3)


def checkpoint_entry(key, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = key.num_tokens
    return SegmentEntry(key, linear={0: LinearStateCheckpoint(torch.randn(2, 3, 4, generator=g),
                                                              torch.randn(5, 3, generator=g))},
                        attention={1: AttentionLayerCache(torch.randn(n, 1, 4, generator=g),
                                                          torch.randn(n, 1, 4, generator=g))},
                        origin_position=key.position - n)


def disk_store(path, budget=1 << 30, fingerprint=FINGERPRINT):
    return SegmentStore(None, device="cpu", disk=DiskTier(str(path), budget, fingerprint))


def entry_files(path):
    return sorted(p for p in os.listdir(path) if p.endswith(".safetensors"))


def test_entries_survive_a_restart(tmp_path):
    seg = segment_entry((1, 2, 3, 4))
    chain = KR.prefix_chain(tuple(range(10, 23)), 4)  # spine 4, 8, 12 and a leaf to 13
    store = disk_store(tmp_path)
    store.insert(seg)
    for i, k in enumerate(chain):
        store.insert(checkpoint_entry(k, seed=i))
    store.close()
    assert len(entry_files(tmp_path)) == 5 and store.stats().disk_writes == 5

    fresh = disk_store(tmp_path)  # a new process on the same directory
    assert len(fresh) == 0 and fresh.stats().disk_entries == 5
    handle = fresh.acquire(KR.segment_key((1, 2, 3, 4), 1))
    assert handle is not None and payload_equal(dict(handle.entry.linear), dict(seg.linear))
    assert payload_equal(dict(handle.entry.attention), dict(seg.attention)) and handle.entry.origin_position == 3
    handle.release()
    # a prefix chain, found on disk block by block, and its leaf through the disk's index
    handles, n = match_prefix(fresh, KR, tuple(range(10, 30)), block_tokens=4, limit=19)
    assert n == 13 and [h.key for h in handles] == list(chain)
    assert handles[-1].key.parent is handles[-2].key  # one chain of key objects
    for h in handles:
        h.release()
    st = fresh.stats()
    assert st.disk_hits == 5 and st.prefix_hits == 4 and st.device_entries == 5
    assert fresh.clear() == 5 + 5 and entry_files(tmp_path) == []  # memory entries and files
    assert fresh.acquire(seg.key) is None
    fresh.close()


def test_another_engines_directory_is_refused_before_any_read(tmp_path):
    store = disk_store(tmp_path)
    store.insert(segment_entry((5, 6, 7)))
    store.close()
    for field, value in (("model", "other-model"), ("dtype", "bfloat16")):
        with pytest.raises(ValueError, match=f"another model, dtype or configuration.*{field}"):
            DiskTier(str(tmp_path), 1 << 30, dict(FINGERPRINT, **{field: value}))
    assert len(entry_files(tmp_path)) == 1  # nothing read, nothing deleted
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / ("ab" * 32 + ".safetensors")).write_bytes(b"x")
    with pytest.raises(ValueError, match=f"no {STORE_FILE}"):
        DiskTier(str(stray), 1 << 30, FINGERPRINT)


def test_corrupted_and_truncated_files_are_skipped_with_a_warning(tmp_path):
    a, b, c = segment_entry((1, 2, 3), 1), segment_entry((4, 5, 6), 2), segment_entry((7, 8, 9), 3)
    store = disk_store(tmp_path)
    for e in (a, b, c):
        store.insert(e)
    store.close()
    path = {e.key: tmp_path / (e.key.digest.hex() + ".safetensors") for e in (a, b, c)}
    data = bytearray(path[a.key].read_bytes())
    data[-5] ^= 0xFF  # one tensor byte flipped: the checksum catches it
    path[a.key].write_bytes(bytes(data))
    path[b.key].write_bytes(path[b.key].read_bytes()[:40])  # truncated: its header is cut
    with pytest.warns(RuntimeWarning, match="skipping entry file"):
        fresh = disk_store(tmp_path)  # the truncated header is caught when the index is read
    assert not path[b.key].exists() and fresh.stats().disk_entries == 2
    with pytest.warns(RuntimeWarning, match="checksum mismatch"):
        assert fresh.acquire(a.key) is None  # a miss, not an error
    assert not path[a.key].exists() and fresh.stats().disk_corrupt == 2
    handle = fresh.acquire(c.key)  # the others still serve
    assert handle is not None and payload_equal(dict(handle.entry.linear), dict(c.linear))
    handle.release()
    fresh.close()


def test_disk_budget_keeps_the_most_recent_files(tmp_path):
    entries = [segment_entry((i, i + 1, i + 2), i) for i in range(0, 40, 4)]
    store = disk_store(tmp_path)
    store.insert(entries[0])
    store.flush()
    one = store.stats().disk_bytes
    store.close()
    small = disk_store(tmp_path, budget=3 * one + one // 2)
    for e in entries[1:]:
        small.insert(e)
    small.flush()
    st = small.stats()
    assert st.disk_entries == 3 and st.disk_bytes <= st.disk_budget_bytes
    kept = {f[:-len(".safetensors")] for f in entry_files(tmp_path)}
    assert kept == {e.key.digest.hex() for e in entries[-3:]}
    assert json.loads((tmp_path / STORE_FILE).read_text())["model"] == "tiny-test"
    small.close()
