"""Segment parallelism (hypic.runner.segment_parallel): the LPT and round-robin splits, the
entries' wire format, the scatter report, and cold standalone segments prefilled by a second
process through the engine, against the same engine without workers (faults:
test_segment_faults.py)."""

from __future__ import annotations

import queue
import random

import pytest
import torch

from hypic.engine.engine import LLMEngine
from hypic.runner.pic_runner import PicRunner
from hypic.runner.segment_assign import assign, lpt_assign, rank_loads, round_robin_assign, segment_cost_fn
from hypic.runner.segment_report import ScatterReport, union_s
from hypic.runner.segment_parallel import SegmentParallel, SegmentParallelConfig
from hypic.runner.segment_wire import pack_tensors, share_groups, unpack_tensors
from hypic.pic.keys import Keyer, KeyNamespace
from hypic.pic.payload import payload_equal
from hypic.pic.persist import decode_entries, encode_entries
from hypic.pic.segments import PIC_SEP
from tests.runner.pic_helpers import random_segment, tiny_model
from tests.engine.test_engine_pic import _docs, _question, _run


def test_lpt_balances_and_is_deterministic():
    costs = [7, 3, 5, 5, 2, 8, 1, 4]
    shares = lpt_assign(costs, 3)
    assert sorted(i for s in shares for i in s) == list(range(len(costs)))
    loads = [sum(costs[i] for i in s) for s in shares]
    assert max(loads) - min(loads) <= max(costs)  # LPT's bound; here 12, 12, 11
    assert max(loads) == 12
    assert lpt_assign(costs, 3) == shares
    assert lpt_assign([], 2) == [[], []]
    assert lpt_assign([1.0, 1.0], 4) == [[0], [1], [], []]  # ties: lower index to lower rank
    assert lpt_assign(costs, 1) == [sorted(range(len(costs)), key=lambda i: (-costs[i], i))]
    # random cases: within 4/3 of the trivial lower bound max(mean load, largest item) + slack
    rng = random.Random(0)
    for _ in range(50):
        c = [rng.randint(1, 100) for _ in range(rng.randint(1, 40))]
        m = rng.randint(1, 8)
        best = max(sum(c) / m, max(c))
        assert max(sum(c[i] for i in s) for s in lpt_assign(c, m)) <= 4 / 3 * best + max(c) / 3 + 1e-9
    with pytest.raises(ValueError, match="num_workers"):
        lpt_assign([1], 0)
    with pytest.raises(ValueError, match="costs"):
        lpt_assign([1, -1], 2)


def test_round_robin_deals_in_turn_and_assign_names_the_policies():
    costs = [9, 1, 1, 1, 9, 1]
    assert round_robin_assign(costs, 2) == [[0, 2, 4], [1, 3, 5]]
    assert round_robin_assign(costs, 4) == [[0, 4], [1, 5], [2], [3]] and round_robin_assign([], 3) == [[], [], []]
    assert rank_loads(costs, round_robin_assign(costs, 2)) == [19.0, 3.0]
    assert rank_loads(costs, assign("lpt", costs, 2)) == [11.0, 11.0]
    assert assign("round_robin", costs, 3) == round_robin_assign(costs, 3)
    with pytest.raises(ValueError, match="lpt, round_robin"):
        assign("random", costs, 2)
    with pytest.raises(ValueError, match="num_workers"):
        round_robin_assign(costs, 0)
    with pytest.raises(ValueError, match="costs"):
        round_robin_assign([-1], 2)


def test_share_groups_cut_at_the_token_budget():
    items = [(k, (tuple(range(n)), 0)) for k, n in zip("abcde", (3, 4, 9, 2, 2))]
    assert [[k for k, _ in g] for g in share_groups(items, 7)] == [["a", "b"], ["c"], ["d", "e"]]  # c alone: too long
    assert [[k for k, _ in g] for g in share_groups(items, None)] == [list("abcde")]
    assert [[k for k, _ in g] for g in share_groups(items, 1)] == [[k] for k in "abcde"]
    assert list(share_groups([], 7)) == []


def test_scatter_report_splits_compute_and_exposed_transfer():
    assert union_s([(0, 2), (1, 3), (5, 6), (5.5, 5.8)]) == 4 and union_s([]) == 0
    r = ScatterReport(1, "lpt", 4, 100, [3.0, 1.0], started_at=10.0, finished_at=16.0, local_done_at=13.0,
                      worker_done_at={1: 14.0}, transfers=[(12.0, 13.0), (14.0, 16.0)])
    assert r.scatter_s == 6 and r.compute_s == 4 and r.transfer_s == 3
    assert r.exposed_transfer_s == 2 and r.transfer_overlap == pytest.approx(1 / 3)
    assert r.estimated_imbalance == 1.5
    no_workers = ScatterReport(2, "lpt", 1, 10, [1.0], started_at=0.0, finished_at=1.0, local_done_at=1.0)
    assert no_workers.exposed_transfer_s == 0 and no_workers.transfer_overlap is None


def test_without_live_workers_the_engine_runs_its_share_in_one_call():
    """Groups only let workers' entries in between them: with no worker live, the whole batch is
    one ``run_share`` call whatever ``group_tokens`` (the runner still splits it to fit)."""
    pool = SegmentParallel([], queue.Queue(), torch.device("cpu"), float, SegmentParallelConfig(group_tokens=4))
    todo = {k: (tuple(range(n)), 0) for k, n in zip("abc", (3, 4, 5))}
    ran, received = [], []
    report = pool.prefill(todo, ran.append, received.extend)
    assert ran == [todo] and received == [] and pool.segments_by_rank == [3]
    assert report.num_segments == 3 and report.num_tokens == 12 and report.estimated_loads == [12.0]
    assert report.own_compute_s >= 0 and report.fallback_segments == 0 and report.transfer_overlap is None


def test_segment_cost_grows_faster_than_length():
    spec, _ = tiny_model(seed=0)
    cost = segment_cost_fn(spec)
    assert 0 < cost(64) < cost(128) and cost(128) > 2 * cost(64)  # local attention is quadratic


def test_config_is_validated():
    with pytest.raises(ValueError, match="num_workers"):
        SegmentParallelConfig(num_workers=0)
    with pytest.raises(ValueError, match="one device per worker"):
        SegmentParallelConfig(num_workers=2, devices=("cpu",))
    with pytest.raises(ValueError, match="lpt, round_robin"):
        SegmentParallelConfig(num_workers=2, assignment="random")
    with pytest.raises(ValueError, match="group_tokens"):
        SegmentParallelConfig(num_workers=2, group_tokens=0)
    with pytest.raises(ValueError, match="start_timeout_s"):
        SegmentParallelConfig(num_workers=2, start_timeout_s=0)
    with pytest.raises(ValueError, match="reply_timeout_s"):
        SegmentParallelConfig(num_workers=2, reply_timeout_s=True)
    cfg = SegmentParallelConfig(num_workers=3)
    assert cfg.rank_devices(torch.device("cuda", 1)) == tuple(torch.device("cuda", i) for i in (1, 2, 3))
    assert cfg.rank_devices(torch.device("cpu")) == (torch.device("cpu"),) * 3
    listed = SegmentParallelConfig(num_workers=2, devices=("cuda", "cuda:1"))
    assert listed.rank_devices(torch.device("cuda", 0)) == (torch.device("cuda"), torch.device("cuda", 1))
    with pytest.raises(ValueError, match="rank 0, the engine itself"):
        listed.rank_devices(torch.device("cpu"))
    with pytest.raises(ValueError, match="segment_parallel"):  # an unknown option names the valid ones
        LLMEngine("tiny", segment_parallel=2)
    with pytest.raises(ValueError, match="num_workers"):
        LLMEngine("tiny", segment_workers=0)


def test_pack_unpack_roundtrip():
    tensors = {"a": torch.randn(3, 5), "b": torch.arange(7), "c": torch.randn(2, 3).bfloat16(),
               "d": torch.zeros(0, 4), "e": torch.randn(4, 4).t()}  # a non-contiguous one too
    buffer, specs = pack_tensors(tensors, torch.device("cpu"))
    assert buffer.dtype == torch.uint8 and all(start % 16 == 0 for *_, start in specs)
    out = unpack_tensors(buffer, specs)
    assert out.keys() == tensors.keys()
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and torch.equal(out[name], t), name


def test_entries_survive_the_wire():
    """Real standalone entries (summaries, conv tails, K/V) encoded on the device, packed,
    unpacked and decoded equal the originals."""
    spec, model = tiny_model(seed=1)
    runner = PicRunner(model, spec, None, torch.device("cpu"), torch.float32)
    keyer = Keyer(KeyNamespace("wire-test", "float32"))
    todo = {}
    for i, n in enumerate((24, 40)):
        tokens = tuple(random_segment(n, seed=i))
        todo[keyer.segment_key(tokens, 4)] = (tokens, 4)
    (entries,) = runner.standalone_entry_groups(todo)  # one forward: the CPU reports no memory limit
    manifest, tensors = encode_entries(entries, to_cpu=False)
    buffer, specs = pack_tensors(tensors, torch.device("cpu"))
    back = decode_entries(manifest, unpack_tensors(buffer, specs), keyer=keyer)
    assert [e.key for e in back] == [e.key for e in entries]
    for a, b in zip(entries, back):
        assert a.origin_position == b.origin_position and a.nbytes == b.nbytes
        for layer in a.linear:
            assert payload_equal(a.linear[layer], b.linear[layer])
        for layer in a.attention:
            assert payload_equal(a.attention[layer], b.attention[layer])


@pytest.mark.slow
def test_cold_standalone_segments_over_two_processes():
    """The standalone cold policy with a second process: every cold document is prefilled by one
    of the two ranks (both get work), and the answers, the cache hits and the logits of the next
    (reordered, cached) request match the engine without workers."""
    docs = _docs(n=4)
    prompts = [PIC_SEP.join(docs + [_question("job", 1)]), PIC_SEP.join(docs[::-1] + [_question("lives", 0)])]
    base = LLMEngine("tiny", seed=0)
    want = _run(base, prompts[:1], cold_policy="standalone") + _run(base, prompts[1:], cold_policy="standalone")
    engine = LLMEngine("tiny", seed=0, segment_workers=2, segment_reply_timeout_s=120)
    try:
        got = _run(engine, prompts[:1], cold_policy="standalone") + _run(engine, prompts[1:], cold_policy="standalone")
        workers = engine.segment_workers
        assert workers.num_batches == 1  # the second request found every document cached
        assert workers.segments_by_rank[0] > 0 and workers.segments_by_rank[1] > 0
        assert sum(workers.segments_by_rank) == len(docs)
        assert len(engine.store) == len(docs)
        report = workers.last_report
        assert report.num_segments == len(docs) and report.received_bytes > 0 and not report.faults
        assert report.compute_s <= report.scatter_s and 0 <= report.exposed_transfer_s <= report.scatter_s
        # a share the worker cannot prefill (token ids past the vocabulary): it answers with its
        # error, the engine takes that segment into its own queue, and the worker serves on
        keyer, vocab = engine.keyer, engine.spec.vocab_size
        good, bad = (1, 2, 3, 4, 5, 6, 7, 8), (vocab + 5,) * 8
        key_good, key_bad = keyer.segment_key(good, 2), keyer.segment_key(bad, 2)
        ran, received = [], []
        report = workers.prefill({key_good: (good, 2), key_bad: (bad, 2)}, ran.append, received.extend)  # rank 1: bad
        assert [list(s) for s in ran] == [[key_good], [key_bad]] and received == []
        assert [(f.rank, f.kind, f.segments_recomputed) for f in report.faults] == [(1, "raised", 1)]
        assert "IndexError" in report.faults[0].detail and report.fallback_segments == 1
        assert engine.stats.num_segment_worker_faults == 1 and engine.stats.num_segments_recomputed == 1
        assert workers.live_ranks == [1]
        (again,) = _run(engine, [PIC_SEP.join(_docs(n=6)[4:] + [_question("job", 4)])], cold_policy="standalone")
        assert again.metrics.cached_tokens == 0 and workers.num_batches == 3
        assert workers.last_report.fallback_segments == 0 and workers.segments_by_rank[1] > 2
    finally:
        engine.shutdown()
    assert engine.segment_workers is None
    engine.shutdown()  # idempotent
    for g, w in zip(got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert g.metrics.cached_tokens == w.metrics.cached_tokens
        assert g.metrics.live_tokens == w.metrics.live_tokens
