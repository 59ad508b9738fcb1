"""Staged prefill of segmented prompts (hypic/engine/pic_stages.py): under the standalone cold
policy, a prompt whose cold segments exceed the step budget prefills them over earlier steps, each
within the budget, then runs its own forward; outputs equal the one-step prefill's."""

from __future__ import annotations

import pytest

from hypic import SamplingParams
from hypic.data.language import question_text
from hypic.data.suites import DocumentPool
from hypic.engine.engine import LLMEngine
from hypic.engine.request import PicStages
from hypic.pic.segments import PIC_SEP

from .helpers import drain

pytestmark = pytest.mark.usefixtures("single_thread_torch")

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
POOL = DocumentPool("held_out", seed=0, pool_size=16, min_doc_tokens=36, max_doc_tokens=48)
DOCS = [d.text for d in POOL.documents[:8]]
PROMPT = PIC_SEP.join(DOCS + [question_text("lives", POOL.documents[2].subject)])


def _engine(budget: int) -> LLMEngine:
    return LLMEngine("tiny", seed=0, dtype="float32", device="cpu", max_num_batched_tokens=budget,
                     cold_policy="standalone")


def test_stages_stay_within_the_budget_and_equal_the_one_step_prefill():
    (one_step,) = drain(big := _engine(4096), [big.add_request(PROMPT, GREEDY)])
    engine = _engine(100)  # 8 cold documents of 36-48 tokens: at most 2 a stage
    request_id = engine.add_request(PROMPT, GREEDY)
    request = engine.scheduler.waiting[0]
    stage_tokens = []
    while request.pic_stages is None or not request.pic_stages.final:
        done = 0 if request.pic_stages is None else request.pic_stages.done
        before = 0 if request.pic_stages is None else request.pic_stages.standalone_tokens
        assert engine.step() == []  # a stage samples nothing
        assert request.pic_stages.done == done + 1  # one stage a step
        stage_tokens.append(request.pic_stages.standalone_tokens - before)
    assert len(stage_tokens) >= 4 and max(stage_tokens) <= 100
    assert sum(stage_tokens) == sum(len(engine.tokenizer.encode(d)) for d in DOCS)
    assert engine.segment_cache_stats().held_entries == len(DOCS)  # pinned until the last stage
    (staged,) = drain(engine, [request_id])
    assert staged.outputs[0].token_ids == one_step.outputs[0].token_ids
    assert staged.metrics.cached_tokens == one_step.metrics.cached_tokens == 0  # computed for it
    assert staged.metrics.live_tokens == one_step.metrics.live_tokens
    assert engine.segment_cache_stats().held_entries == 0
    # the entries are the one-step pass's: a reordered repeat hits them in both engines alike
    reordered = PIC_SEP.join(DOCS[::-1] + [question_text("lives", POOL.documents[2].subject)])
    (a,) = drain(big, [big.add_request(reordered, GREEDY)])
    (b,) = drain(engine, [engine.add_request(reordered, GREEDY)])
    assert a.outputs[0].token_ids == b.outputs[0].token_ids and a.metrics.cached_tokens == b.metrics.cached_tokens > 0


def test_running_streams_get_tokens_between_stages():
    engine = _engine(100)
    short = engine.add_request("the mentor of kolton is", SamplingParams(temperature=0, max_tokens=40,
                                                                      ignore_eos=True))
    engine.step()  # the short request is running
    engine.add_request(PROMPT, GREEDY)
    tokens_during_stages = 0
    request = engine.scheduler.waiting[0]
    while request.pic_stages is None or not request.pic_stages.final:
        for out in engine.step():
            if out.request_id == short:
                tokens_during_stages += 1
    assert request.pic_stages.done >= 4 and tokens_during_stages >= request.pic_stages.done - 1


def test_an_abort_between_stages_releases_the_entries():
    engine = _engine(100)
    request_id = engine.add_request(PROMPT, GREEDY)
    engine.step()
    engine.step()
    assert engine.segment_cache_stats().held_entries > 0
    assert engine.abort_request(request_id)
    assert engine.segment_cache_stats().held_entries == 0 and not engine.has_unfinished_requests()


@pytest.mark.parametrize("policy, budget", [("standalone", 4096), ("inline", 100), ("canonical", 100)])
def test_one_step_when_it_fits_and_for_other_cold_policies(policy, budget):
    engine = LLMEngine("tiny", seed=0, dtype="float32", device="cpu", max_num_batched_tokens=budget,
                       cold_policy=policy)
    engine.add_request(PROMPT, GREEDY)
    (out,) = engine.step()  # prefilled in one step: its first token
    assert len(out.outputs[0].token_ids) == 1 and engine.scheduler.running[0].pic_stages is None


def test_stages_take_what_fits_and_at_least_one_segment():
    stages = PicStages([40, 30, 50, 20], ["a", "b", "c", "d"], own_tokens=12)
    assert stages.take(100) == 70 and stages.pop_stage() == ["a", "b"]
    assert stages.take(10) == 50 and stages.pop_stage() == ["c"]  # longer than the budget: alone
    assert stages.take(100) == 20 and stages.pop_stage() == ["d"] and stages.final and stages.done == 3
    assert stages.take(100) == 12  # the request's own forward
    with pytest.raises(ValueError, match="no stage was picked"):
        stages.pop_stage()
    with pytest.raises(ValueError, match="one positive length per segment"):
        PicStages([10], [], own_tokens=1)
