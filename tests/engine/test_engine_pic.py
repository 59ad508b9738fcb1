"""Segment caching through the engine and hypic.LLM on the embedded tiny model."""

from __future__ import annotations

import pytest
import torch

from hypic import LLM, SamplingParams
from hypic.engine.engine import LLMEngine
from hypic.pic.modes import PICConfig
from hypic.pic.segments import PIC_SEP

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def llm():
    return LLM(model="tiny", seed=0)


WORDS = ("the quick brown fox jumps over the lazy dog and then some more words appear here while a "
         "river story answer comes to the old stone bridge near the small town").split()


def _docs(llm=None, n=3):
    return [" ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(30)) for i in range(n)]


def _run(engine: LLMEngine, prompts, **kw):
    ids = [engine.add_request(p, GREEDY, **kw) for p in prompts]
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return [done[i] for i in ids]


def test_all_miss_hypic_generates_like_full_recompute(llm):
    docs = _docs(llm)
    prompt = PIC_SEP.join(docs + ["what now ?"])
    engine = LLMEngine("tiny", seed=0)
    (ref,) = _run(engine, [prompt], mode="full_recompute")
    (got,) = _run(engine, [prompt], mode="hypic")
    assert got.metrics.cached_tokens == 0
    assert got.outputs[0].token_ids == ref.outputs[0].token_ids
    assert len(engine.store) == 3


def test_reordered_prompt_hits_the_segment_cache(llm):
    docs = _docs(llm)
    first = llm.generate(PIC_SEP.join(docs + ["first question"]), GREEDY, use_tqdm=False)[0]
    assert first.metrics.cached_tokens == 0
    second = llm.generate(PIC_SEP.join(docs[::-1] + ["second question"]), GREEDY, use_tqdm=False)[0]
    assert second.metrics.cached_tokens > 0
    assert second.metrics.live_tokens < second.metrics.prompt_tokens
    assert len(second.outputs[0].token_ids) == 6
    stats = llm.segment_cache_stats()
    assert stats.hits >= 3 and stats.device_bytes > 0


def test_structured_segments_and_per_call_mode(llm):
    docs = _docs(llm, 2)
    out = llm.generate({"segments": docs + ["a question"]}, GREEDY, use_tqdm=False, pic_mode="prefix_cache")[0]
    again = llm.generate({"segments": docs + ["another question"]}, GREEDY, use_tqdm=False,
                         pic_mode="prefix_cache")[0]
    assert out.metrics.prefix_hit_tokens == 0
    assert again.metrics.prefix_hit_tokens > 0


def test_bad_segmented_input_is_rejected_and_engine_keeps_serving(llm):
    engine = LLMEngine("tiny", seed=0)
    good = engine.add_request("hello there", GREEDY)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request(PIC_SEP.join(["doc", "", "q"]), GREEDY)
    with pytest.raises(ValueError, match="separators"):
        engine.add_request(PIC_SEP + PIC_SEP, GREEDY)
    with pytest.raises(ValueError, match="unknown mode"):
        engine.add_request(PIC_SEP.join(["doc", "q"]), GREEDY, mode="nope")
    with pytest.raises(ValueError, match="context length|max_model_len"):
        LLMEngine("tiny", seed=0, max_model_len=16).add_request(PIC_SEP.join(["a b c d e f g h"] * 3 + ["q"]), GREEDY)
    ok = engine.add_request(PIC_SEP.join(["doc one", "q"]), GREEDY)
    done = set()
    while engine.has_unfinished_requests():
        done |= {o.request_id for o in engine.step() if o.finished}
    assert {good, ok} <= done


def test_pic_and_plain_requests_share_a_batch():
    engine = LLMEngine("tiny", seed=0, pic=PICConfig(mode="hypic"))
    doc = _docs(n=1)[0]
    alone_plain = _run(LLMEngine("tiny", seed=0), ["plain prompt here"])[0]
    alone_pic = _run(LLMEngine("tiny", seed=0), [PIC_SEP.join([doc, "q"])])[0]
    both = _run(engine, ["plain prompt here", PIC_SEP.join([doc, "q"])])
    assert both[0].outputs[0].token_ids == alone_plain.outputs[0].token_ids
    assert both[1].outputs[0].token_ids == alone_pic.outputs[0].token_ids


def test_chat_template_keeps_segment_tokens_and_hits_on_reorder(llm):
    tok = llm.get_tokenizer()
    docs = _docs(n=2)
    first = llm.chat([{"role": "user", "content": PIC_SEP.join(docs + ["which one ?"])}], GREEDY, use_tqdm=False)[0]
    second = llm.chat([{"role": "user", "content": PIC_SEP.join(docs[::-1] + ["and now ?"])}], GREEDY,
                      use_tqdm=False)[0]
    assert second.metrics.cached_tokens > 0
    ids = second.prompt_token_ids
    for doc in docs:  # each document's tokens appear unchanged inside the templated prompt
        d = tok.encode(doc, add_special_tokens=False)
        assert any(ids[i:i + len(d)] == d for i in range(len(ids) - len(d) + 1))
    # the template's assistant header ends the prompt, as in the plain chat rendering
    plain = tok.encode(tok.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True),
                       add_special_tokens=False)
    tail = plain[plain.index(tok.encode("x", add_special_tokens=False)[-1]) + 1:]
    assert ids[-len(tail):] == tail
    assert first.outputs[0].token_ids and second.outputs[0].token_ids
