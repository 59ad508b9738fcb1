"""Scheduler and request life cycle, in plain Python (no torch, no model)."""

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.engine.request import PicState, Request, RequestStatus
from hypic.engine.sampling_params import SamplingParams
from hypic.engine.scheduler import Scheduler, SchedulerConfig

EOS = 0
# A toy vocabulary: id -> text; id 0 is the special eos, 1 a special "<x>".
VOCAB = {0: "</s>", 1: "<x>"} | {i: chr(ord("a") + i - 2) for i in range(2, 28)} | {28: " ", 29: "!"}
SPECIAL = {0, 1}


def detok(ids, skip_special_tokens):
    return "".join(VOCAB[i] for i in ids if not (skip_special_tokens and i in SPECIAL))


def tok(text):
    inv = {v: k for k, v in VOCAB.items()}
    return [inv[c] for c in text]


def make_scheduler(max_model_len=64, budget=16, max_num_seqs=8):
    return Scheduler(
        SchedulerConfig(budget, max_num_seqs), max_model_len=max_model_len, eos_token_ids=[EOS], detokenize=detok
    )


def req(rid, n_prompt, **params):
    params.setdefault("max_tokens", 100)
    return Request(rid, list(range(2, 2 + n_prompt)), SamplingParams(**params))


def run_step(s, next_tokens):
    """Schedule one batch, "sample" next_tokens[request_id] for every sampling request."""
    batch = s.schedule()
    assert batch is not None
    sampled = [next_tokens[r.request_id] for r in batch.sampling_requests]
    return batch, s.postprocess(batch, sampled)


def test_scheduler_modules_do_not_import_torch():
    code = "import sys, hypic.engine.scheduler, hypic.engine.request; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_config_validation():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(0)
    with pytest.raises(ValueError, match="max_num_seqs"):
        SchedulerConfig(16, 0)
    with pytest.raises(ValueError, match="max_model_len"):
        Scheduler(SchedulerConfig(), max_model_len=0)


def test_request_validation():
    with pytest.raises(ValueError, match="prompt_token_ids"):
        Request("a", [], SamplingParams())
    with pytest.raises(ValueError, match="prompt_token_ids"):
        Request("a", [1, -2], SamplingParams())
    with pytest.raises(ValueError, match="sampling_params"):
        Request("a", [1], {"temperature": 0})


def test_prefill_respects_token_budget_and_chunks_long_prompts():
    s = make_scheduler(budget=10)
    for rid, n in [("a", 4), ("b", 4), ("c", 7)]:
        s.add(req(rid, n))
    batch = s.schedule()
    assert batch.is_prefill
    assert [r.request_id for r in batch.requests] == ["a", "b", "c"]
    assert batch.num_scheduled_tokens == [4, 4, 2] and batch.num_tokens == 10
    assert batch.start_positions == [0, 0, 0]
    assert batch.samples == [True, True, False]  # c's prompt is not done: no token for it
    assert batch.token_ids(2) == [2, 3]
    updated = s.postprocess(batch, [5, 6])
    assert [r.request_id for r in updated] == ["a", "b"]
    assert [r.request_id for r in s.running] == ["a", "b"]
    c = s.waiting[0]
    assert c.status == RequestStatus.WAITING and c.num_computed_tokens == 2
    # a and b run: a decode step comes before the next prefill chunk
    batch = s.schedule()
    assert not batch.is_prefill and batch.num_scheduled_tokens == [1, 1] and batch.start_positions == [4, 4]
    s.postprocess(batch, [5, 6])
    # then c's prompt is finished
    batch = s.schedule()
    assert batch.is_prefill and batch.num_scheduled_tokens == [5] and batch.start_positions == [2]
    assert batch.token_ids(0) == list(range(4, 9))
    s.postprocess(batch, [7])
    assert c.status == RequestStatus.RUNNING and c.output_token_ids == [7]
    # now a decode step over all three, each feeding its last token at the next position
    batch = s.schedule()
    assert not batch.is_prefill and batch.num_scheduled_tokens == [1, 1, 1]
    assert batch.start_positions == [5, 5, 7]
    assert [batch.token_ids(i) for i in range(3)] == [[5], [6], [7]]


def test_running_requests_decode_between_prefill_chunks():
    s = make_scheduler(budget=4)
    s.add(req("a", 2))
    run_step(s, {"a": 5})
    s.add(req("long", 12))
    kinds = []
    while not any(r.request_id == "long" for r in s.running):
        batch, _ = run_step(s, {"a": 5, "long": 6})
        kinds.append("prefill" if batch.is_prefill else "decode")
    assert kinds == ["decode", "prefill"] * 3  # 12 tokens in chunks of 4, a decode step before each
    assert s.running[0].num_output_tokens == 4  # a kept producing tokens meanwhile


def test_prompt_longer_than_budget_takes_several_steps():
    s = make_scheduler(budget=4)
    s.add(req("a", 11))
    counts = []
    while not s.running:
        batch, _ = run_step(s, {"a": 9})
        counts.append(batch.num_scheduled_tokens[0])
    assert counts == [4, 4, 3]


def test_join_and_leave_between_steps():
    s = make_scheduler()
    s.add(req("a", 3, max_tokens=3))
    run_step(s, {"a": 5})  # prefill a
    run_step(s, {"a": 5})  # decode a
    s.add(req("b", 2, max_tokens=2))  # joins while a runs
    batch, _ = run_step(s, {"b": 6})
    assert batch.is_prefill and [r.request_id for r in batch.requests] == ["b"]
    batch, updated = run_step(s, {"a": 7, "b": 8})
    assert [r.request_id for r in batch.requests] == ["a", "b"]
    assert all(r.is_finished and r.finish_reason == "length" for r in updated)
    assert not s.has_unfinished() and s.schedule() is None


def test_max_num_seqs_limits_admission_in_arrival_order():
    s = make_scheduler(max_num_seqs=2)
    for rid in "abc":
        s.add(req(rid, 2, max_tokens=2))
    batch, _ = run_step(s, {"a": 5, "b": 5})
    assert [r.request_id for r in batch.requests] == ["a", "b"]
    batch, updated = run_step(s, {"a": 5, "b": 5})  # c must wait: decode a, b
    assert not batch.is_prefill and len(updated) == 2 and all(r.is_finished for r in updated)
    batch, _ = run_step(s, {"c": 5})
    assert [r.request_id for r in batch.requests] == ["c"]


def test_finish_on_eos_unless_ignored():
    s = make_scheduler()
    a, b = req("a", 2), req("b", 2, ignore_eos=True, max_tokens=2)
    s.add(a)
    s.add(b)
    run_step(s, {"a": tok("h")[0], "b": EOS})
    _, updated = run_step(s, {"a": EOS, "b": EOS})
    assert a.finish_reason == "stop" and a.stop_reason is None
    assert a.output_token_ids == [tok("h")[0], EOS] and a.output_text == "h"
    assert b.finish_reason == "length" and b.output_token_ids == [EOS, EOS]


def test_stop_token_ids_and_text_excludes_the_stop_token():
    s = make_scheduler()
    a = req("a", 2, stop_token_ids=[tok("z")[0]], skip_special_tokens=False)
    s.add(a)
    for t in tok("hiz"):
        run_step(s, {"a": t})
    assert a.finish_reason == "stop" and a.stop_reason == tok("z")[0]
    assert a.output_token_ids == tok("hiz") and a.output_text == "hi"


def test_stop_string_trims_text_and_keeps_tokens():
    s = make_scheduler()
    a = req("a", 2, stop=["lo w", "xyz"])
    s.add(a)
    text = "hello world"
    for t in tok(text):
        run_step(s, {"a": t})
        if a.is_finished:
            break
    assert a.finish_reason == "stop" and a.stop_reason == "lo w"
    assert a.output_text == "hel"
    assert a.output_token_ids == tok("hello w")


def test_earliest_stop_string_wins():
    s = make_scheduler()
    a = req("a", 2, stop=["cd", "bcde"])
    s.add(a)
    for t in tok("abcde"):
        run_step(s, {"a": t})
        if a.is_finished:
            break
    # "cd" completes first (at token d), so it fires even though "bcde" would start earlier
    assert a.stop_reason == "cd" and a.output_text == "ab"


def test_special_tokens_skipped_in_text():
    s = make_scheduler()
    a, b = req("a", 2, max_tokens=3), req("b", 2, max_tokens=3, skip_special_tokens=False)
    s.add(a)
    s.add(b)
    for t in [tok("h")[0], 1, tok("i")[0]]:
        run_step(s, {"a": t, "b": t})
    assert a.output_text == "hi" and b.output_text == "h<x>i"


def test_max_model_len_finishes_with_length():
    s = make_scheduler(max_model_len=6)
    a = req("a", 4)
    s.add(a)
    run_step(s, {"a": 5})
    run_step(s, {"a": 5})
    assert a.is_finished and a.finish_reason == "length" and a.num_tokens == 6


def test_prompt_too_long_is_rejected_and_others_continue():
    s = make_scheduler(max_model_len=8)
    s.add(req("ok", 3, max_tokens=2))
    with pytest.raises(ValueError, match="longer than the maximum context length"):
        s.add(req("long", 9))
    with pytest.raises(ValueError, match="already in use"):
        s.add(req("ok", 2))
    run_step(s, {"ok": 5})
    run_step(s, {"ok": 5})
    assert not s.has_unfinished()


def test_stop_strings_need_a_detokenizer():
    s = Scheduler(SchedulerConfig(), max_model_len=16)
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        s.add(req("a", 2, stop=["x"]))


def test_abort_removes_request():
    s = make_scheduler()
    s.add(req("a", 2))
    s.add(req("b", 2))
    run_step(s, {"a": 5, "b": 5})
    aborted = s.abort("a")
    assert aborted.finish_reason == "abort" and aborted.is_finished
    assert s.abort("zzz") is None
    batch = s.schedule()
    assert [r.request_id for r in batch.requests] == ["b"]


def test_metrics_timestamps():
    s = make_scheduler()
    a = req("a", 3, max_tokens=2)
    s.add(a)
    run_step(s, {"a": 5})
    run_step(s, {"a": 5})
    m = a.metrics
    assert m.prompt_tokens == 3 and m.generation_tokens == 2
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
    assert m.ttft is not None and m.ttft >= 0 and m.e2e_latency >= m.ttft


def test_postprocess_checks_token_count():
    s = make_scheduler()
    s.add(req("a", 2))
    batch = s.schedule()
    with pytest.raises(ValueError, match="sampled_token_ids"):
        s.postprocess(batch, [])


@settings(max_examples=60, deadline=None)
@given(
    prompt_lens=st.lists(st.integers(1, 30), min_size=1, max_size=8),
    max_tokens=st.lists(st.integers(1, 6), min_size=8, max_size=8),
    arrival_steps=st.lists(st.integers(0, 6), min_size=8, max_size=8),
    budget=st.integers(1, 20),
    max_num_seqs=st.integers(1, 4),
)
def test_random_workloads_keep_invariants(prompt_lens, max_tokens, arrival_steps, budget, max_num_seqs):
    """Every request finishes with exactly max_tokens tokens; no step exceeds the token budget or
    max_num_seqs; each request's computed positions are contiguous from 0 with no gaps."""
    s = make_scheduler(max_model_len=64, budget=budget, max_num_seqs=max_num_seqs)
    requests = [req(f"r{i}", n, max_tokens=max_tokens[i]) for i, n in enumerate(prompt_lens)]
    arrivals = {i: arrival_steps[i] for i in range(len(requests))}
    next_position = {r.request_id: 0 for r in requests}
    step = 0
    while step < 1000:
        for i, r in enumerate(requests):
            if arrivals[i] == step:
                s.add(r)
        batch = s.schedule()
        if batch is None:
            if all(a < step for a in arrivals.values()):
                break
            step += 1
            continue
        assert len(batch.requests) <= max_num_seqs
        if batch.is_prefill:
            assert 1 <= batch.num_tokens <= budget
        in_batch = {r.request_id for r in batch.requests}
        holders = {r.request_id for r in s.running} | {
            r.request_id for r in s.waiting if r.num_computed_tokens or r.request_id in in_batch
        }
        assert len(holders) <= max_num_seqs
        for r, start, n in zip(batch.requests, batch.start_positions, batch.num_scheduled_tokens):
            assert start == next_position[r.request_id]
            next_position[r.request_id] += n
        s.postprocess(batch, [7] * len(batch.sampling_requests))
        step += 1
    assert not s.has_unfinished()
    for r in requests:
        assert r.finish_reason == "length" and r.num_output_tokens == r.sampling_params.max_tokens
        # positions fed: the whole prompt, then every output token but the last
        assert next_position[r.request_id] == r.num_prompt_tokens + r.num_output_tokens - 1


def _atomic(rid, n_prompt, cost):
    params = SamplingParams(max_tokens=100)
    # any PIC state makes the prefill atomic (the scheduler reads its cost alone)
    return Request(rid, list(range(2, 2 + n_prompt)), params, pic=PicState(object(), object(), cost))


def test_atomic_prefill_is_never_chunked_and_charged_its_cost():
    s = make_scheduler(budget=16)
    big = _atomic("big", 40, cost=40)  # more than the budget: runs whole, alone
    s.add(big)
    batch = s.schedule()
    assert batch.requests == [big] and batch.num_scheduled_tokens == [40] and batch.samples == [True]


def test_atomic_prefill_waits_when_it_does_not_fit_beside_others():
    s = make_scheduler(budget=16)
    plain, cheap, costly = req("plain", 10), _atomic("cheap", 30, cost=4), _atomic("costly", 30, cost=20)
    for r in (plain, cheap, costly):
        s.add(r)
    batch = s.schedule()
    # plain (10) + cheap (charged 4 of its 30 tokens) fit; costly (20) waits for the next step
    assert [r.request_id for r in batch.requests] == ["plain", "cheap"]
    assert batch.num_scheduled_tokens == [10, 30]
    s.postprocess(batch, [5, 5])
    decode = s.schedule()
    assert not decode.is_prefill  # plain and cheap run: a decode step comes first
    s.postprocess(decode, [5, 5])
    batch = s.schedule()
    assert [r.request_id for r in batch.requests] == ["costly"] and batch.num_scheduled_tokens == [30]


def test_a_long_prompt_leaves_half_the_budget_to_those_behind_it():
    s = make_scheduler(budget=8)
    s.add(req("long", 30))
    batch, _ = run_step(s, {})
    assert batch.num_scheduled_tokens == [8]  # alone: the whole budget
    s.add(req("short", 3))
    batch, _ = run_step(s, {"short": 5})
    assert [r.request_id for r in batch.requests] == ["long", "short"]
    assert batch.num_scheduled_tokens == [4, 3] and batch.samples == [False, True]


def test_staged_pic_prefill_runs_one_stage_a_step_between_decode_steps():
    from hypic.engine.request import PicStages

    staged = _atomic("staged", 30, cost=30)

    def stage(request):  # two cold segments of 12 and 14 tokens, then its own 6-token forward
        request.pic_stages = PicStages([12, 14], ["g0", "g1"], own_tokens=6)

    s = Scheduler(SchedulerConfig(16, 8), max_model_len=64, eos_token_ids=[EOS], detokenize=detok, stage_pic=stage)
    short = req("short", 3)
    s.add(short)
    run_step(s, {"short": 5})  # short runs
    s.add(staged)
    seen = []
    for _ in range(6):
        batch = s.schedule()
        if batch.is_prefill:
            assert batch.requests == [staged]
            seen.append((staged.pic_stages.done, batch.num_scheduled_tokens[0], batch.samples[0]))
            if not batch.samples[0]:
                staged.pic_stages.pop_stage()  # the engine ran the stage
        s.postprocess(batch, [5] * len(batch.sampling_requests))
    # stages compute none of the request's own tokens; its own forward (the last) all of them;
    # a decode step of the running request between every two of them
    assert seen == [(0, 0, False), (1, 0, False), (2, 30, True)]
    assert staged.num_computed_tokens == 30 and staged.status == RequestStatus.RUNNING
    assert short.num_output_tokens >= 3


def _staged_scheduler(budget, lengths, own_tokens=6, max_num_seqs=8):
    from hypic.engine.request import PicStages

    def stage(request):
        if request.request_id.startswith("long"):
            request.pic_stages = PicStages(list(lengths), [f"g{i}" for i in range(len(lengths))], own_tokens)

    return Scheduler(SchedulerConfig(budget, max_num_seqs), max_model_len=512, eos_token_ids=[EOS], detokenize=detok,
                     stage_pic=stage)


def test_a_stage_leaves_room_for_the_segmented_prompt_behind_it():
    s = _staged_scheduler(budget=16, lengths=[4, 4, 4, 4, 4, 4])
    long = _atomic("long", 40, cost=40)
    s.add(long)
    s.add(_atomic("short", 20, cost=7))
    batch = s.schedule()
    # half the budget (8) would leave 8 >= 7; room 16 - 7 = 9 takes two 4-token segments
    assert [r.request_id for r in batch.requests] == ["long", "short"]
    assert long.pic_stages.next_count == 2 and batch.num_scheduled_tokens == [0, 20]


def test_a_stage_yields_one_step_in_two_to_a_segmented_prompt_that_finds_no_room_beside_it():
    s = _staged_scheduler(budget=16, lengths=[10, 10, 10, 10])
    long = _atomic("long", 60, cost=60)
    s.add(long)
    ran = []
    for i in range(6):  # a 12-token segmented prompt arrives before every step
        s.add(_atomic(f"short{i}", 20, cost=12))
        batch = s.schedule()
        assert batch.is_prefill  # no request runs: nothing decodes
        ran.append(tuple(r.request_id for r in batch.requests))
        if long in batch.requests and not batch.samples[batch.requests.index(long)]:
            long.pic_stages.pop_stage()
        for r in batch.sampling_requests:  # finish the short ones at once
            r.sampling_params = SamplingParams(max_tokens=1)
        s.postprocess(batch, [5] * len(batch.sampling_requests))
    # the stage (10 tokens) never fits beside a 12-token prompt in 16: it yields, then takes its
    # step, in turn; no short request waits more than one step, and the long prompt advances
    assert ran[0] == ("short0",) and ran[1][0] == "long"
    assert all("long" in ran[i] or "long" in ran[i + 1] for i in range(len(ran) - 1))
    assert long.pic_stages.done >= 2


def test_a_yielding_stage_takes_the_step_when_nothing_behind_it_can_run():
    s = _staged_scheduler(budget=16, lengths=[10, 10], max_num_seqs=1)  # no slot for the short one
    long = _atomic("long", 30, cost=30)
    s.add(long)
    s.add(_atomic("short", 20, cost=12))
    batch = s.schedule()
    assert batch.requests == [long] and long.pic_stages.next_count == 1


def test_a_plain_chunk_leaves_room_for_the_segmented_prompt_behind_it():
    s = make_scheduler(budget=16)
    s.add(req("long", 60))
    s.add(_atomic("short", 20, cost=11))
    batch = s.schedule()
    assert [r.request_id for r in batch.requests] == ["long", "short"]
    assert batch.num_scheduled_tokens == [5, 20]


def test_a_request_waiting_for_its_sibling_starts_after_the_siblings_first_token():
    s = make_scheduler(budget=16)
    first, second, other = req("a", 20), req("b", 20), req("c", 4)
    second.waits_for = first
    for r in (first, second, other):
        s.add(r)
    scheduled: list[list[str]] = []
    while not first.output_token_ids:  # a prefills in chunks; c, behind b, is not held up by it
        batch = s.schedule()
        scheduled.append([r.request_id for r in batch.requests])
        s.postprocess(batch, [5] * len(batch.sampling_requests))
    assert all("b" not in ids for ids in scheduled) and any("c" in ids for ids in scheduled)
    for _ in range(4):  # then b starts at the next prefill
        batch = s.schedule()
        s.postprocess(batch, [6] * len(batch.sampling_requests))
        if second.prefill_started:
            break
    assert second.prefill_started and second.waits_for is None
    # a sibling that finishes (an abort here) releases the wait as well
    s2 = make_scheduler()
    x, y = req("x", 4), req("y", 4)
    y.waits_for = x
    s2.add(x)
    s2.add(y)
    s2.abort("x")
    assert [r.request_id for r in s2.schedule().requests] == ["y"]
