"""Segment workers that fail in the middle of a request (hypic.runner.segment_parallel): killed
from outside (SIGKILL), dying, hanging or raising on their own after part of their share was
sent. Every request completes with the output of the engine without workers, later requests are
served (by the surviving workers, or the engine alone), each fault is counted in the engine's
stats, and nothing waits long: a death is seen at once, a hang after the reply timeout.

Each case runs on the CPU (CI) and, marked ``cuda``, on two GPUs (without CUDA graphs: start-up
would capture them in every engine, and faults do not depend on them)."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from hypic.engine.engine import LLMEngine
from hypic.pic.segments import PIC_SEP
from hypic.runner.segment_assign import segment_cost_fn
from hypic.runner.segment_parallel import SegmentParallelConfig, launch
from tests.engine.test_engine_pic import _docs, _question, _run
from tests.runner.segment_fault_workers import FAULT_DIE, FAULT_HANG, FAULT_RAISE, faulty_worker_main

pytestmark = pytest.mark.slow

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices")]),
]
DEATH_SEEN_S = 15.0  # a killed worker is seen through its pipe in milliseconds; this bounds a slow CI box
HANG_TIMEOUT_S = 2.0


def _prompts():
    """Two cold prompts on distinct documents, and a third on the first's documents reordered."""
    docs = _docs(n=8)
    return [PIC_SEP.join(docs[:4] + [_question("job", 1)]), PIC_SEP.join(docs[4:7] + [_question("lives", 5)]),
            PIC_SEP.join(docs[7:8] + docs[:2] + [_question("job", 0)])]


def _tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def reference():
    """Each prompt's output on the engine without workers, by device."""
    out = {}

    def get(device):
        if device not in out:
            base = LLMEngine("tiny", seed=0, device=device, enforce_eager=True)
            out[device] = [_tokens(_run(base, [p], cold_policy="standalone"))[0] for p in _prompts()]
        return out[device]

    return get


@pytest.mark.parametrize("device", DEVICES)
def test_worker_killed_mid_request_then_the_survivor_then_none(device, reference):
    """Three ranks. Worker 1 is SIGKILLed while the engine prefills its own share (stopped first,
    so it cannot have answered): the request completes with the reference output well within
    the reply timeout, its share prefilled by the engine. The next request is split between the
    engine and worker 2; worker 2 is then killed while idle, and the last request runs on the
    engine alone. Both faults are counted and logged."""
    want = reference(device)
    # on CUDA both workers share the second GPU: the test needs two, not three
    devices = ("cuda:0", "cuda:1", "cuda:1") if device == "cuda" else None
    engine = LLMEngine("tiny", seed=0, device=device, enforce_eager=True, segment_workers=3, segment_devices=devices,
                       segment_group_tokens=64, segment_reply_timeout_s=120)
    try:
        pool = engine.segment_workers
        victim, survivor = pool.links[1], pool.links[2]
        assert engine.num_live_segment_workers == 2
        real_groups = engine.pic_runner.standalone_entry_groups
        killed = []

        def own_share_then_kill(todo):
            if not killed:  # the engine's own share starts: worker 1 holds its share by now
                os.kill(victim.pid, signal.SIGKILL)
                killed.append(time.monotonic())
            yield from real_groups(todo)

        engine.pic_runner.standalone_entry_groups = own_share_then_kill
        os.kill(victim.pid, signal.SIGSTOP)
        prompts = _prompts()
        (first,) = _run(engine, prompts[:1], cold_policy="standalone")
        assert killed and time.monotonic() - killed[0] < DEATH_SEEN_S
        assert _tokens([first]) == want[:1]
        report = pool.last_report
        assert [(f.rank, f.kind) for f in report.faults] == [(1, "died")] and "signal 9" in report.faults[0].detail
        assert report.fallback_segments >= 1 and engine.stats.num_segment_worker_faults == 1
        assert engine.stats.num_segments_recomputed == report.fallback_segments
        assert pool.live_ranks == [2] and engine.num_live_segment_workers == 1 and not victim.process.is_alive()

        before = pool.segments_by_rank[2]
        (second,) = _run(engine, prompts[1:2], cold_policy="standalone")
        assert _tokens([second]) == want[1:2]
        assert pool.segments_by_rank[2] > before and not pool.last_report.faults

        os.kill(survivor.pid, signal.SIGKILL)
        survivor.process.join(DEATH_SEEN_S)
        (third,) = _run(engine, prompts[2:], cold_policy="standalone")
        assert _tokens([third]) == want[2:]
        assert engine.stats.num_segment_worker_faults == 2 and engine.num_live_segment_workers == 0
        assert [f.kind for f in pool.faults] == ["died", "died"]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fault", [FAULT_DIE, FAULT_HANG, FAULT_RAISE])
def test_worker_fails_after_part_of_its_share(device, fault, reference, caplog):
    """One worker that sends its first group's entries and then dies, hangs or raises: only the
    segments it did not send are prefilled again by the engine, the request's output is the
    reference's, and the fault is counted and logged. A dead or hung worker is dropped and the
    engine serves on alone; one that raised serves the next request."""
    want = reference(device)
    engine = LLMEngine("tiny", seed=0, device=device, enforce_eager=True)
    config = SegmentParallelConfig(num_workers=2, group_tokens=1, reply_timeout_s=HANG_TIMEOUT_S)
    worker_device = "cuda:1" if device == "cuda" else "cpu"
    args = (fault, 2, str(engine.model_path), worker_device, str(engine.dtype).removeprefix("torch."), 0, 1)
    pool = launch(faulty_worker_main, [args], engine.device, segment_cost_fn(engine.spec), config,
                  engine._on_segment_worker_fault)
    engine.segment_workers = engine.pic_runner.segment_parallel = pool
    try:
        prompts = _prompts()
        start = time.monotonic()
        with caplog.at_level("WARNING", logger="hypic.runner.segment_parallel"):
            (first,) = _run(engine, prompts[:1], cold_policy="standalone")
        elapsed_s = time.monotonic() - start
        assert _tokens([first]) == want[:1]
        report = pool.last_report
        kind = {FAULT_DIE: "died", FAULT_HANG: "hung", FAULT_RAISE: "raised"}[fault]
        # four documents over two ranks: the worker gets two, sends the first, fails at the second
        assert [(f.rank, f.kind, f.segments_recomputed) for f in report.faults] == [(1, kind, 1)]
        assert pool.segments_by_rank == [3, 1] and report.fallback_segments == 1
        assert engine.stats.num_segment_worker_faults == 1 and engine.stats.num_segments_recomputed == 1
        assert any(f"segment worker 1 (pid {pool.links[1].pid}) {kind}" in r.getMessage() for r in caplog.records)
        if fault == FAULT_HANG:
            assert HANG_TIMEOUT_S <= elapsed_s < HANG_TIMEOUT_S + DEATH_SEEN_S
        else:
            assert elapsed_s < DEATH_SEEN_S

        (second,) = _run(engine, prompts[1:2], cold_policy="standalone")
        assert _tokens([second]) == want[1:2]
        assert engine.stats.num_segment_worker_faults == 1
        if fault == FAULT_RAISE:
            assert pool.live_ranks == [1] and pool.segments_by_rank[1] > 1
        else:
            assert pool.live_ranks == [] and not pool.links[1].process.is_alive()
            assert pool.segments_by_rank == [6, 1]
    finally:
        engine.shutdown()
