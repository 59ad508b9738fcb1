"""LLMEngine end to end on the embedded tiny model (fp32, CPU)."""

import pytest
import torch

from hypic.engine.engine import LLMEngine, resolve_dtype
from hypic.engine.sampling_params import SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True)
# Prompts in the suite vocabulary the tiny model was trained on (hypic.data), of different lengths,
# each continued differently; the 22-token one is longer than the prefill budget (8), so it is
# prefilled in chunks with carried state while sharing steps with the others.
PROMPTS = [
    "the mentor of kolton is",
    "<sep> this passage is about kolton . kolton works as a",
    "a",
    "<sep> this passage is about kolton . kolton lives in santon . the mentor of kolton is zala . kolton owns a",
]


def test_prompts_are_in_the_model_vocabulary():
    from hypic.assets import TINY_MODEL_DIR
    from hypic.engine.tokenizer import Tokenizer

    tok = Tokenizer(TINY_MODEL_DIR)
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        assert len(ids) == len(prompt.split()) and tok.token_to_id("<unk>") not in ids


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # 2-thread OpenMP on a shared 2-core box can be 10x slower than 1 thread under load.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def engine(one_thread):
    return LLMEngine("tiny", dtype="float32", device="cpu", seed=0, max_num_batched_tokens=8, max_model_len=64)


def run_all(engine):
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out
    return outputs


def generate_alone(engine, prompt, params):
    rid = engine.add_request(prompt, params)
    return run_all(engine)[rid]


def test_batched_greedy_equals_each_alone(engine):
    params = SamplingParams(max_tokens=6, **GREEDY)
    alone = [generate_alone(engine, p, params).outputs[0].token_ids for p in PROMPTS]
    ids = [engine.add_request(p, params) for p in PROMPTS]
    outputs = run_all(engine)
    batched = [outputs[i].outputs[0].token_ids for i in ids]
    assert batched == alone
    assert all(len(t) == 6 for t in batched)
    assert len({tuple(t) for t in batched}) == len(PROMPTS)  # the model is not echoing one token
    long_prompt = outputs[ids[3]].prompt_token_ids
    assert len(long_prompt) > 8  # really chunked


def test_staggered_arrival_equals_alone(engine):
    """Requests joining while others decode (continuous batching) get the same tokens."""
    params = SamplingParams(max_tokens=5, **GREEDY)
    alone = [generate_alone(engine, p, params).outputs[0].token_ids for p in PROMPTS[:3]]
    first = engine.add_request(PROMPTS[0], params)
    engine.step()
    engine.step()
    second = engine.add_request(PROMPTS[1], params)
    engine.step()
    third = engine.add_request(PROMPTS[2], params)
    outputs = run_all(engine)
    assert [outputs[r].outputs[0].token_ids for r in (first, second, third)] == alone


def test_seeded_sampling_independent_of_batch(engine):
    params = SamplingParams(temperature=1.0, top_p=0.95, top_k=50, max_tokens=6, seed=123, ignore_eos=True)
    alone = generate_alone(engine, PROMPTS[1], params).outputs[0].token_ids
    ids = [
        engine.add_request(PROMPTS[0], SamplingParams(temperature=0.8, max_tokens=3)),
        engine.add_request(PROMPTS[1], params),
        engine.add_request(PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=8)),
    ]
    batched = run_all(engine)[ids[1]].outputs[0].token_ids
    assert batched == alone
    greedy = generate_alone(engine, PROMPTS[1], SamplingParams(max_tokens=6, **GREEDY)).outputs[0].token_ids
    assert batched != greedy  # it did sample


def test_max_tokens_and_output_fields(engine):
    out = generate_alone(engine, PROMPTS[0], SamplingParams(max_tokens=3, **GREEDY))
    completion = out.outputs[0]
    assert out.finished and completion.finish_reason == "length" and len(completion.token_ids) == 3
    assert completion.text == engine.tokenizer.decode(completion.token_ids)
    assert out.prompt == PROMPTS[0]
    assert out.prompt_token_ids == engine.tokenizer.encode(PROMPTS[0])
    assert out.metrics.prompt_tokens == len(out.prompt_token_ids)
    assert out.metrics.ttft is not None and out.metrics.ttft > 0


def test_stop_token_ids(engine):
    reference = generate_alone(engine, PROMPTS[1], SamplingParams(max_tokens=6, **GREEDY)).outputs[0]
    stop_id = reference.token_ids[3]
    assert stop_id not in reference.token_ids[:3]
    out = generate_alone(engine, PROMPTS[1], SamplingParams(max_tokens=6, stop_token_ids=[stop_id], **GREEDY))
    completion = out.outputs[0]
    assert completion.finish_reason == "stop" and completion.stop_reason == stop_id
    assert completion.token_ids == reference.token_ids[:4]
    assert completion.text == engine.tokenizer.decode(reference.token_ids[:3])


def test_stop_string_trims_output(engine):
    reference = generate_alone(engine, PROMPTS[0], SamplingParams(max_tokens=12, **GREEDY)).outputs[0]
    text = reference.text
    # a stop string from the middle of the greedy text, made of ordinary characters
    start = next(i for i in range(4, len(text) - 3) if text[i : i + 3].isprintable() and "\ufffd" not in text[i : i + 3])
    stop = text[start : start + 3]
    expected = text[: text.find(stop)]
    out = generate_alone(engine, PROMPTS[0], SamplingParams(max_tokens=12, stop=[stop], **GREEDY)).outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == expected
    assert out.token_ids == reference.token_ids[: len(out.token_ids)]
    assert len(out.token_ids) < 12


def test_eos_stops_unless_ignored(engine):
    reference = generate_alone(engine, PROMPTS[2], SamplingParams(max_tokens=4, **GREEDY)).outputs[0]
    # pretend the second greedy token is an end-of-sequence token
    saved = engine.scheduler.eos_token_ids
    engine.scheduler.eos_token_ids = frozenset({reference.token_ids[1]})
    try:
        stopped = generate_alone(engine, PROMPTS[2], SamplingParams(temperature=0, max_tokens=4)).outputs[0]
        ignored = generate_alone(engine, PROMPTS[2], SamplingParams(max_tokens=4, **GREEDY)).outputs[0]
    finally:
        engine.scheduler.eos_token_ids = saved
    assert stopped.finish_reason == "stop" and stopped.stop_reason is None
    assert stopped.token_ids == reference.token_ids[:2]
    assert ignored.token_ids == reference.token_ids


def test_too_long_prompt_errors_while_others_complete(engine):
    params = SamplingParams(max_tokens=4, **GREEDY)
    ok = engine.add_request(PROMPTS[0], params)
    engine.step()
    with pytest.raises(ValueError, match="longer than the maximum context length"):
        engine.add_request(list(range(3, 3 + 65)), params)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request([1, 2, 5000], params)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("", params)
    with pytest.raises(ValueError, match="prompt must be"):
        engine.add_request(3.5, params)
    other = engine.add_request(PROMPTS[2], params)
    outputs = run_all(engine)
    assert set(outputs) == {ok, other}
    assert all(o.outputs[0].finish_reason == "length" for o in outputs.values())


def test_max_tokens_beyond_the_context_is_refused(engine):
    prompt = engine.tokenizer.encode(PROMPTS[3])
    room = 64 - len(prompt)
    with pytest.raises(ValueError, match=f"max_tokens=100 does not fit.*leaves room for {room} "):
        engine.add_request(prompt, SamplingParams(max_tokens=100, **GREEDY))
    assert not engine.has_unfinished_requests()
    out = generate_alone(engine, prompt, SamplingParams(max_tokens=room, **GREEDY))
    assert out.outputs[0].finish_reason == "length"
    assert len(prompt) + len(out.outputs[0].token_ids) == 64


def test_abort_frees_request(engine):
    rid = engine.add_request(PROMPTS[1], SamplingParams(max_tokens=50, **GREEDY))
    keep = engine.add_request(PROMPTS[0], SamplingParams(max_tokens=2, **GREEDY))
    engine.step()
    assert engine.abort_request(rid) and not engine.abort_request(rid)
    outputs = run_all(engine)
    assert set(outputs) == {keep}


def test_construction_errors():
    with pytest.raises(ValueError, match="no such folder"):
        LLMEngine("/nonexistent/model/folder")
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int8", torch.device("cpu"))
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    with pytest.raises(ValueError, match="max_model_len"):
        LLMEngine("tiny", device="cpu", max_model_len=10**9)


def test_min_tokens_holds_back_eos_and_stop_ids(engine):
    reference = generate_alone(engine, PROMPTS[2], SamplingParams(max_tokens=6, **GREEDY)).outputs[0]
    saved = engine.scheduler.eos_token_ids
    # pretend the first greedy token ends the sequence: without min_tokens the request stops at once
    engine.scheduler.eos_token_ids = frozenset({reference.token_ids[0]})
    engine.eos_token_ids = tuple(engine.scheduler.eos_token_ids)
    try:
        stopped = generate_alone(engine, PROMPTS[2], SamplingParams(temperature=0, max_tokens=6)).outputs[0]
        held = generate_alone(engine, PROMPTS[2], SamplingParams(temperature=0, max_tokens=6, min_tokens=3)).outputs[0]
    finally:
        engine.scheduler.eos_token_ids = saved
        engine.eos_token_ids = tuple(saved)
    assert stopped.finish_reason == "stop" and stopped.token_ids == reference.token_ids[:1]
    assert len(held.token_ids) >= 3 and reference.token_ids[0] not in held.token_ids[:3]
    # a stop id in the greedy text is not honoured before min_tokens either
    stop_id = reference.token_ids[1]
    early = generate_alone(engine, PROMPTS[2], SamplingParams(max_tokens=6, stop_token_ids=[stop_id], min_tokens=4,
                                                              **GREEDY)).outputs[0]
    assert len(early.token_ids) >= 4 and stop_id not in early.token_ids[:4]


def test_logit_bias_and_penalties_steer_greedy_decoding(engine):
    plain = generate_alone(engine, PROMPTS[0], SamplingParams(max_tokens=8, **GREEDY)).outputs[0]
    forced_id = engine.tokenizer.encode("santon")[0]
    forced = generate_alone(engine, PROMPTS[0], SamplingParams(max_tokens=4, logit_bias={forced_id: 100.0},
                                                               **GREEDY)).outputs[0]
    assert forced.token_ids == [forced_id] * 4
    # repeated tokens of the plain greedy text are penalised away
    assert len(set(plain.token_ids)) < len(plain.token_ids)
    penalised = generate_alone(engine, PROMPTS[0], SamplingParams(max_tokens=8, presence_penalty=2.0,
                                                                  frequency_penalty=2.0, repetition_penalty=10.0,
                                                                  **GREEDY)).outputs[0]
    assert penalised.token_ids != plain.token_ids
    assert len(set(penalised.token_ids)) > len(set(plain.token_ids))
    with pytest.raises(ValueError, match="logit_bias"):
        engine.add_request(PROMPTS[0], SamplingParams(logit_bias={10**6: 1.0}))


def test_prompt_logprobs_equal_a_full_transformers_forward(engine):
    # the fixture's 8-token budget prefills the 20-token prompt in three chunks
    import transformers

    from hypic.assets import TINY_MODEL_DIR

    prompt = PROMPTS[3]
    out = generate_alone(engine, prompt, SamplingParams(max_tokens=2, prompt_logprobs=3, **GREEDY))
    ids = out.prompt_token_ids
    assert len(out.prompt_logprobs) == len(ids) and out.prompt_logprobs[0] is None
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(TINY_MODEL_DIR), dtype=torch.float32)
    with torch.no_grad():
        want = torch.log_softmax(reference(torch.tensor([ids])).logits[0].float(), dim=-1)
    for p in range(1, len(ids)):
        entry = out.prompt_logprobs[p]
        chosen = entry[ids[p]]
        assert abs(chosen.logprob - float(want[p - 1, ids[p]])) < 1e-4, p
        assert chosen.rank == 1 + int((want[p - 1] > want[p - 1, ids[p]]).sum())
        top = sorted((lp.rank, t) for t, lp in entry.items() if lp.rank <= 3)
        assert [t for _, t in top] == want[p - 1].topk(3).indices.tolist()
        assert chosen.decoded_token == engine.tokenizer.decode([ids[p]])
    # the same prompt again, with the prefix cache holding it: still scored in full
    again = generate_alone(engine, prompt, SamplingParams(max_tokens=2, prompt_logprobs=0, **GREEDY))
    assert [e and e[t].logprob for e, t in zip(again.prompt_logprobs, ids)] == \
        [e and e[t].logprob for e, t in zip(out.prompt_logprobs, ids)]
    assert again.outputs[0].token_ids == out.outputs[0].token_ids
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
