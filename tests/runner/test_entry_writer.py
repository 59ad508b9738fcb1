"""Tests of hypic/runner/entry_writer.py: a forward's store entries, copied from its records."""

from __future__ import annotations

import pytest
import torch

from hypic.runner import entry_writer
from hypic.runner.entry_writer import EntryWriter
from hypic.pic.modes import PICConfig
from tests.runner.pic_helpers import PicHarness, full_logits, random_segment, tiny_model


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(seed=11)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@pytest.mark.parametrize("mode", ["hypic", "prefix_cache"])
def test_entries_are_exact_copies_of_each_layers_rows_in_buffers_of_their_own(tiny, monkeypatch, mode):
    # Each layer's records are kept until the forward ends, then copied; an entry's tensors are
    # the rows of one buffer per field (its bytes exactly), never shared with another entry or
    # with the forward's records.
    spec, model = tiny
    rows = {}  # (write, layer, field) -> a copy of what the layer recorded
    in_place = set()  # layers whose op wrote the summaries into the entries
    real_linear, real_attention = EntryWriter.linear_done, EntryWriter.attention_done

    def linear_done(self, layer_idx, rec):
        for i, (_, _, w) in enumerate(self.writes):
            rows[i, layer_idx, "tail"] = rec.tails[i].clone()
            if layer_idx in self._in_place:  # the op wrote the summaries into the entries' rows
                assert rec.write_summaries is None and w.kind == "segment"
                item = self._targets[self._linear_row[layer_idx]].items[i]
                rows[i, layer_idx, "transition"], rows[i, layer_idx, "state"] = (item.transition.clone(),
                                                                                  item.state.clone())
                in_place.add(layer_idx)
            elif rec.write_summaries is not None and w.kind == "segment":
                t, s = rec.write_summaries.parts()
                rows[i, layer_idx, "transition"], rows[i, layer_idx, "state"] = t[i:i + 1].clone(), s[i:i + 1].clone()
            else:
                rows[i, layer_idx, "state"] = rec.write_states[i].clone()
        real_linear(self, layer_idx, rec)
        # kept for the copy after the forward (nothing to keep when the summaries were written
        # in place)
        assert (rec.write_summaries is None and rec.write_states is None) == (layer_idx in self._in_place)

    def attention_done(self, layer_idx, rec):
        for i, (a, z) in enumerate(self.key_rows):
            rows[i, layer_idx, "key"], rows[i, layer_idx, "value"] = rec.keys[a:z].clone(), rec.values[a:z].clone()
        real_attention(self, layer_idx, rec)

    monkeypatch.setattr(EntryWriter, "linear_done", linear_done)
    monkeypatch.setattr(EntryWriter, "attention_done", attention_done)
    h = PicHarness(spec, model, config=PICConfig(mode=mode, cold_policy="inline", segment_min_tokens=0))
    # bodies long enough to be stored dense (test_short_bodies_are_stored_factored has the others)
    segs = [random_segment(n, 700 + n) for n in (21, 34, 23)]
    query = random_segment(6, 5)
    h.run(segs, query)
    entries = h.store.snapshot()
    assert entries and rows
    storages = []
    for entry in entries:
        mine = set()
        for layer, cache in entry.linear.items():
            if hasattr(cache, "summary"):
                parts = dict(zip(("transition", "state"), cache.summary.parts()))
                parts["tail"] = cache.conv_tail
            else:
                parts = {"state": cache.state, "tail": cache.conv_state}
            for field, got in parts.items():
                mine.add(_storage(got))
                assert got.is_contiguous()
        for layer, cache in entry.attention.items():
            mine.update((_storage(cache.key), _storage(cache.value)))
        # one buffer per field, each holding exactly its rows
        fields = 5 if entry.attention and any(hasattr(c, "summary") for c in entry.linear.values()) else None
        if fields is not None:
            assert len(mine) == fields
        storages.append(mine)
    for a in range(len(storages)):
        for b in range(a + 1, len(storages)):
            assert not storages[a] & storages[b]
    # the entries hold the rows the layers recorded, bit for bit (match by key rows / tails)
    want_tails = {k: v for k, v in rows.items() if k[2] == "tail"}
    got_tails = [c.conv_tail if hasattr(c, "conv_tail") else c.conv_state for e in entries for c in e.linear.values()]
    assert len(got_tails) == len(want_tails)
    for got in got_tails:
        assert any(torch.equal(got, want) for want in want_tails.values())
    for entry in entries:
        for layer, cache in entry.linear.items():
            if hasattr(cache, "summary"):
                t, s = cache.summary.parts()
                assert any(torch.equal(t, v) for k, v in rows.items() if k[1:] == (layer, "transition"))
                assert any(torch.equal(s, v) for k, v in rows.items() if k[1:] == (layer, "state"))
    # a cold hypic forward writes segment summaries in place (prefix_cache writes checkpoints)
    assert bool(in_place) == (mode == "hypic")
    # and serve the next request exactly
    _, again = h.run(segs, query)
    want = full_logits(spec, model, [t for s in segs for t in s] + list(query))
    assert (again.logits - want).abs().max() < 1e-4


def test_writer_checks_its_calls(tiny):
    spec, model = tiny
    h = PicHarness(spec, model)
    seen = {}
    real = h.runner._forward

    def forward(layouts, want_caches=True):
        logits, caches, ctx = real(layouts, want_caches)
        seen["ctx"] = ctx
        return logits, caches, ctx

    h.runner._forward = forward
    h.run([random_segment(20, 1)], random_segment(4, 2))
    writer = seen["ctx"].writer
    assert isinstance(writer, EntryWriter)
    with pytest.raises(ValueError, match="already written"):
        writer.linear_done(spec.linear_layer_ids[0], seen["ctx"].records[spec.linear_layer_ids[0]])
    attention = [i for i in range(len(spec.layer_types)) if i not in spec.linear_layer_ids]
    with pytest.raises(ValueError, match="not one of the forward's linear layers"):
        writer.linear_done(attention[0], None)
    fresh = EntryWriter(seen["ctx"].layout, spec.linear_layer_ids, attention, torch.device("cpu"))
    with pytest.raises(ValueError, match="recorded nothing"):
        fresh.finish()


def test_segment_writes_store_t_packed_when_presplit(tiny, monkeypatch):
    """With T pre-split (as on CUDA; forced on here, where the CPU walk reads fp32 T) every
    segment write's T is stored as bf16 planes: the same bytes' worth, T's values within 16
    significant bits of the fp32 entry, S unchanged, and the next request's logits close."""
    from hypic.ops.linear import t_planes

    spec, model = tiny
    segs = [random_segment(n, 700 + n) for n in (23, 20, 40)]  # bodies long enough to be stored dense
    query = random_segment(5, 19)
    got = {}
    for packed in (False, True):
        monkeypatch.setattr(entry_writer, "presplit_wanted", lambda device, packed=packed: packed)
        h = PicHarness(spec, model)
        h.run(segs, query)
        got[packed] = ({e.key: e for e in h.store.snapshot()}, h.run(segs, query)[1].logits)
    (plain, logits_plain), (packed, logits_packed) = got[False], got[True]
    assert plain.keys() == packed.keys() and plain
    for key, entry in packed.items():
        for layer, cache in entry.linear.items():
            want = plain[key].linear[layer].summary
            assert cache.summary.t_packed and not want.t_packed
            assert torch.equal(cache.summary.t_storage, t_planes.pack_planes(want.transition))
            assert torch.equal(cache.summary.state, want.state)
    assert float((logits_packed - logits_plain).abs().max() / logits_plain.abs().max()) < 1e-3
    assert t_planes.presplit_wanted(torch.device("cuda")) and not t_planes.presplit_wanted(torch.device("cpu"))


def test_short_bodies_are_stored_factored(tiny):
    """A body short enough (hypic.ops.linear.low_rank.low_rank_is_smaller) is stored as its
    factors, per layer one row of a buffer of its own, its bytes what entry_nbytes says; a
    request reusing it gives what the dense form gives."""
    from hypic.ops.linear.low_rank import LowRankSummary

    spec, model = tiny
    segs = [random_segment(n, 800 + n) for n in (15, 30, 12)]  # bodies 7, 22, 4 at seam 8
    query = random_segment(5, 9)
    h = PicHarness(spec, model)
    h.run(segs, query)
    by_tokens = {e.num_body_tokens: e for e in h.store.snapshot()}
    for n, entry in by_tokens.items():
        kinds = {type(c.summary).__name__ for c in entry.linear.values()}
        assert kinds == ({"LowRankSummary"} if n < 10 else {"DenseSummary"})
        assert entry.nbytes == h.runner.entry_nbytes(n, checkpoint=False)
        if n < 10:
            first = next(iter(entry.linear.values())).summary
            assert first.rank == n and first.keys.untyped_storage().nbytes() == first.keys.nbytes * len(entry.linear)
    _, reused = h.run(segs[::-1], query)
    dense = PicHarness(spec, model)
    dense.runner._factored = lambda num_tokens: False
    dense.run(segs, query)
    _, want = dense.run(segs[::-1], query)
    assert not any(isinstance(c.summary, LowRankSummary) for e in dense.store.snapshot() for c in e.linear.values())
    torch.testing.assert_close(reused.logits, want.logits, rtol=1e-4, atol=1e-4)
