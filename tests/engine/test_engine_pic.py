"""Segment caching through the engine and hypic.LLM on the embedded tiny model (trained on the
synthetic suites: prompts are suite documents and questions)."""

from __future__ import annotations

import pytest
import torch

from hypic import LLM, SamplingParams
from hypic.assets.make_seeded_tiny import write_tiny_model
from hypic.data.language import question_text
from hypic.data.suites import DocumentPool
from hypic.engine.engine import LLMEngine
from hypic.pic.segments import PIC_SEP

from .helpers import drain

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


# Held-out suite documents (36-48 tokens each: head, five facts, maybe a filler sentence).
POOL = DocumentPool("held_out", seed=0, pool_size=16, min_doc_tokens=36, max_doc_tokens=48)


def _docs(llm=None, n=3):
    return [d.text for d in POOL.documents[:n]]


def _question(relation="lives", i=0):
    return question_text(relation, POOL.documents[i].subject)


def _run(engine: LLMEngine, prompts, **kw):
    return drain(engine, [engine.add_request(p, GREEDY, **kw) for p in prompts])


def test_all_miss_hypic_generates_like_full_recompute(llm):
    docs = _docs(llm)
    prompt = PIC_SEP.join(docs + [_question("job", 1)])
    engine = LLMEngine("tiny", seed=0)
    (ref,) = _run(engine, [prompt], mode="full_recompute")
    (got,) = _run(engine, [prompt], mode="hypic")
    assert got.metrics.cached_tokens == 0
    assert got.outputs[0].token_ids == ref.outputs[0].token_ids
    assert engine.store.stats().device_entries - engine.store.stats().prefix_entries == 3  # and a checkpoint


def test_reordered_prompt_hits_the_segment_cache(llm):
    docs = _docs(llm)
    first = llm.generate(PIC_SEP.join(docs + [_question("lives", 0)]), GREEDY, use_tqdm=False)[0]
    assert first.metrics.cached_tokens == 0
    second = llm.generate(PIC_SEP.join(docs[::-1] + [_question("color", 2)]), GREEDY, use_tqdm=False)[0]
    assert second.metrics.cached_tokens > 0
    assert second.metrics.live_tokens < second.metrics.prompt_tokens
    assert len(second.outputs[0].token_ids) == 6
    stats = llm.segment_cache_stats()
    assert stats.hits >= 3 and stats.device_bytes > 0


def test_reused_segments_still_answer_the_question():
    """The trained model answers from reordered, cached documents (hypic mode, default seam) as it
    does with the full prompt recomputed: the reuse keeps what the model reads."""
    llm = LLM(model="tiny", seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=6)
    docs = _docs(n=3)
    cases = [(docs, "lives", 0), (docs[::-1], "job", 1), ([docs[1], docs[2], docs[0]], "animal", 2)]
    for order, relation, i in cases:
        prompt = PIC_SEP.join(order + [_question(relation, i)])
        out = llm.generate(prompt, params, use_tqdm=False)[0]
        ref = llm.generate(prompt, params, use_tqdm=False, pic_mode="full_recompute")[0]
        assert out.outputs[0].text == ref.outputs[0].text == POOL.documents[i].fact(relation)
        assert out.outputs[0].finish_reason == "stop"
    assert out.metrics.cached_tokens > 0  # the last order hit every document


def test_canonical_cold_policy_through_the_engine():
    """Per-request ``cold_policy="canonical"``: a cold prompt answers like full recompute, the
    scheduler charges the extra standalone pass, the metrics count it, and a reordered prompt then
    hits the canonical entries."""
    engine = LLMEngine("tiny", seed=0)
    docs = _docs(n=3)
    prompt = PIC_SEP.join(docs + [_question("job", 1)])
    (ref,) = _run(engine, [prompt], mode="full_recompute")
    # Scheduler charge of the cold request: its own pass plus the standalone pass (inline: only
    # the former).
    doc_tokens = sum(len(engine.tokenizer.encode(d)) for d in docs)
    charges = {}
    for policy in ("inline", "canonical"):
        engine.add_request(prompt, GREEDY, request_id=f"charge-{policy}", cold_policy=policy)
        charges[policy] = engine.scheduler.waiting[-1].pic.prefill_cost
        engine.abort_request(f"charge-{policy}")
    assert charges["canonical"] == charges["inline"] + doc_tokens
    (got,) = _run(engine, [prompt], cold_policy="canonical")
    assert got.outputs[0].token_ids == ref.outputs[0].token_ids
    assert got.metrics.cached_tokens == 0
    # the request's own pass plus the standalone pass over its three cold documents
    assert got.metrics.live_tokens == got.metrics.prompt_tokens + doc_tokens
    assert engine.store.stats().device_entries - engine.store.stats().prefix_entries == 3  # and a checkpoint
    (again,) = _run(engine, [PIC_SEP.join(docs[::-1] + [_question("lives", 0)])], cold_policy="canonical")
    assert again.metrics.cached_tokens > 0
    # the fact comes first (this interim model does not always stop right after it here)
    assert again.outputs[0].text.split()[0] == POOL.documents[0].fact("lives")


def test_structured_segments_and_per_call_mode(llm):
    docs = _docs(llm, 2)
    out = llm.generate({"segments": docs + [_question("lives", 0)]}, GREEDY, use_tqdm=False,
                       pic_mode="prefix_cache")[0]
    again = llm.generate({"segments": docs + [_question("mentor", 1)]}, GREEDY, use_tqdm=False,
                         pic_mode="prefix_cache")[0]
    assert out.metrics.prefix_hit_tokens == 0
    assert again.metrics.prefix_hit_tokens > 0


def test_bad_segmented_input_is_rejected_and_engine_keeps_serving(llm):
    engine = LLMEngine("tiny", seed=0)
    doc, query = _docs(n=1)[0], _question()
    good = engine.add_request(doc, GREEDY)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request(PIC_SEP.join([doc, "", query]), GREEDY)
    with pytest.raises(ValueError, match="separators"):
        engine.add_request(PIC_SEP + PIC_SEP, GREEDY)
    with pytest.raises(ValueError, match="unknown mode"):
        engine.add_request(PIC_SEP.join([doc, query]), GREEDY, mode="nope")
    with pytest.raises(ValueError, match="context length|max_model_len"):
        LLMEngine("tiny", seed=0, max_model_len=16).add_request(PIC_SEP.join(["it was quiet ."] * 3 + [query]), GREEDY)
    ok = engine.add_request(PIC_SEP.join([doc, query]), GREEDY)
    done = set()
    while engine.has_unfinished_requests():
        done |= {o.request_id for o in engine.step() if o.finished}
    assert {good, ok} <= done


def test_pic_and_plain_requests_share_a_batch():
    engine = LLMEngine("tiny", seed=0)
    doc, plain = _docs(n=1)[0], " ".join(_docs(n=2)[1:] + [_question("job", 1)])
    alone_plain = _run(LLMEngine("tiny", seed=0), [plain])[0]
    alone_pic = _run(LLMEngine("tiny", seed=0), [PIC_SEP.join([doc, _question()])])[0]
    both = _run(engine, [plain, PIC_SEP.join([doc, _question()])])
    assert both[0].outputs[0].token_ids == alone_plain.outputs[0].token_ids
    assert both[1].outputs[0].token_ids == alone_pic.outputs[0].token_ids
    assert both[0].outputs[0].token_ids != both[1].outputs[0].token_ids  # two different answers


def test_tiny_has_no_chat_template(llm):
    with pytest.raises(ValueError, match="no chat template"):
        llm.chat([{"role": "user", "content": PIC_SEP.join(_docs(n=2) + [_question()])}], GREEDY, use_tqdm=False)


@pytest.fixture(scope="module")
def seeded_llm(tmp_path_factory):
    """The seeded random test model: byte-level tokenizer and a ChatML template (the trained tiny
    model has no chat template)."""
    folder = tmp_path_factory.mktemp("seeded")
    write_tiny_model(folder)
    return LLM(model=str(folder), seed=0)


def test_chat_template_keeps_segment_tokens_and_hits_on_reorder(seeded_llm):
    llm = seeded_llm
    tok = llm.get_tokenizer()
    docs = _docs(n=2)
    first = llm.chat([{"role": "user", "content": PIC_SEP.join(docs + [_question()])}], GREEDY, use_tqdm=False)[0]
    second = llm.chat([{"role": "user", "content": PIC_SEP.join(docs[::-1] + [_question("job", 1)])}], GREEDY,
                      use_tqdm=False)[0]
    assert first.metrics.cached_tokens == 0
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


def test_each_segment_is_keyed_once_per_request(monkeypatch):
    """The scheduler's charge and the plan share one keying of the prompt's segments."""
    from hypic.pic.keys import Keyer

    engine = LLMEngine("tiny", seed=0)
    prompt = PIC_SEP.join(_docs(n=3) + [_question("job", 1)])
    _run(engine, [prompt])  # caches the three documents
    keyed, passes = [], []
    real, real_many = Keyer.segment_key, Keyer.segment_keys
    monkeypatch.setattr(Keyer, "segment_key", lambda self, *a, **k: keyed.append(a[0]) or real(self, *a, **k))
    monkeypatch.setattr(Keyer, "segment_keys",
                        lambda self, *a, **k: passes.append(len(a[0])) or real_many(self, *a, **k))
    (out,) = _run(engine, [prompt])
    # one pass over the three segments, each a remembered key (no key made alone)
    assert passes == [3] and keyed == [] and out.metrics.cached_tokens > 0


def test_addition_reads_documents_as_a_set_but_hypic_reads_their_order():
    """What makes the long suites' order-blind bound (hypic.data.long_oracle) a bound on `addition`:
    with context-free entries its answer distribution does not change when the documents before
    the last one are reordered (linear states are summed, cached keys stay where they were made),
    while `hypic`'s does."""
    engine = LLMEngine("tiny", seed=0, device="cpu")
    docs = _docs(n=3)
    question = PIC_SEP + _question("lives", 0)
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=5)

    def top(order, mode):
        (out,) = drain(engine, [engine.add_request(PIC_SEP.join(order) + question, params, mode=mode,
                                                   cold_policy="standalone")])
        return {t: round(p.logprob, 4) for t, p in out.outputs[0].logprobs[0].items()}

    assert top([docs[0], docs[1], docs[2]], "addition") == top([docs[1], docs[0], docs[2]], "addition")
    assert top([docs[0], docs[1], docs[2]], "hypic") != top([docs[1], docs[0], docs[2]], "hypic")
