"""The HTTP server on the embedded tiny model (CPU): OpenAI and SGLang routes through FastAPI's
TestClient, and a real uvicorn server driven by the official ``openai`` client (on the seeded
test model, which has a chat template)."""

import asyncio
import json
import threading
import time

import pytest

# The server's dependencies are part of the package's install; a machine without them (a GPU box
# running `pytest -m cuda tests`) skips this module instead of failing its collection.
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
TestClient = pytest.importorskip("fastapi.testclient").TestClient
text_string_to_metric_families = pytest.importorskip("prometheus_client.parser").text_string_to_metric_families

from hypic import LLM, SamplingParams
from hypic.data.language import question_text
from hypic.data.suites import DocumentPool
from hypic.engine.async_engine import AsyncLLMEngine
from hypic.engine.engine import LLMEngine
from hypic.entrypoints.cli import build_parser
from hypic.entrypoints.openai.api_server import create_app
from hypic.entrypoints.openai.serve import build_async_engine
from hypic.pic.segments import PIC_SEP

from .helpers import ENGINE

PROMPTS = ["the mentor of kolton is", "<sep> this passage is about kolton . kolton works as a", "a"]
POOL = DocumentPool("held_out", seed=0, pool_size=8, min_doc_tokens=36, max_doc_tokens=48)
DOCS = [d.text for d in POOL.documents[:3]]
QUESTION = question_text("lives", POOL.documents[0].subject)


# one OpenMP thread: the engine loop, the event loop and the client share a 2-core CI box
pytestmark = pytest.mark.usefixtures("single_thread_torch")


@pytest.fixture(scope="module")
def reference():
    return LLM("tiny", **ENGINE)


@pytest.fixture(scope="module")
def engine():
    engine = AsyncLLMEngine(LLMEngine("tiny", **ENGINE), max_waiting_requests=64)
    yield engine
    engine.shutdown(timeout_s=5)


@pytest.fixture(scope="module")
def client(engine):
    with TestClient(create_app(engine, served_model_name="tiny")) as c:
        yield c


def greedy(reference, prompt, max_tokens=8, **kw):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, **kw)
    return reference.generate(prompt, params, use_tqdm=False)[0].outputs[0]


def sse_events(text):
    lines = [line for line in text.split("\n\n") if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: "):]) for line in lines[:-1]]


def test_completion_equals_llm_generate(client, reference):
    for prompt in PROMPTS:
        body = client.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 8,
                                                    "temperature": 0}).json()
        expected = greedy(reference, prompt)
        assert body["object"] == "text_completion" and body["model"] == "tiny"
        (choice,) = body["choices"]
        assert choice["text"] == expected.text and choice["finish_reason"] == expected.finish_reason
        usage = body["usage"]
        assert usage["prompt_tokens"] == len(reference.get_tokenizer().encode(prompt))
        assert usage["completion_tokens"] == len(expected.token_ids)
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


def test_prompt_forms_n_and_seed(client, reference):
    ids = reference.get_tokenizer().encode(PROMPTS[0])
    expected = [greedy(reference, p).text for p in PROMPTS[:2]]
    body = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 8, "temperature": 0}).json()
    assert body["choices"][0]["text"] == expected[0]
    body = client.post("/v1/completions", json={"prompt": PROMPTS[:2], "max_tokens": 8, "temperature": 0,
                                                "n": 2}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in body["choices"]] == [expected[0]] * 2 + [expected[1]] * 2
    sampled = dict(prompt=PROMPTS[0], max_tokens=8, temperature=1.0, seed=7, n=2, ignore_eos=True)
    first, again = (client.post("/v1/completions", json=sampled).json() for _ in range(2))
    assert [c["text"] for c in first["choices"]] == [c["text"] for c in again["choices"]]
    seeded = reference.generate(PROMPTS[0], SamplingParams(temperature=1.0, max_tokens=8, seed=7, ignore_eos=True),
                                use_tqdm=False)[0].outputs[0]
    assert first["choices"][0]["text"] == seeded.text


def test_streaming_equals_non_streamed(client):
    for extra in ({}, {"stop": ["owns a"]}, {"stop": "."}):
        request = {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0, **extra}
        whole = client.post("/v1/completions", json=request).json()
        response = client.post("/v1/completions", json={**request, "stream": True,
                                                         "stream_options": {"include_usage": True}})
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.text)
        *chunks, usage = events
        assert usage["choices"] == [] and usage["usage"] == whole["usage"]
        assert all(c["usage"] is None for c in chunks)
        assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
        assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    # without include_usage: no usage chunk, no usage key
    events = sse_events(client.post("/v1/completions", json={"prompt": "a", "max_tokens": 3, "stream": True}).text)
    assert all("usage" not in e and len(e["choices"]) == 1 for e in events)


def test_logprobs_plain_and_streamed(client, reference):
    request = {"prompt": PROMPTS[1], "max_tokens": 6, "temperature": 0, "logprobs": 2, "ignore_eos": True}
    expected = greedy(reference, PROMPTS[1], max_tokens=6, logprobs=2, ignore_eos=True)
    whole = client.post("/v1/completions", json=request).json()["choices"][0]
    logprobs = whole["logprobs"]
    assert len(logprobs["tokens"]) == len(expected.token_ids) == 6
    for k, (token, entry) in enumerate(zip(expected.token_ids, expected.logprobs)):
        assert logprobs["token_logprobs"][k] == pytest.approx(entry[token].logprob, abs=1e-6)
        assert logprobs["tokens"][k] == entry[token].decoded_token
        assert len(logprobs["top_logprobs"][k]) == 2
        assert max(logprobs["top_logprobs"][k].values()) == pytest.approx(logprobs["token_logprobs"][k], abs=1e-6)
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0 and all(b == a + len(t) for a, b, t in zip(offsets, offsets[1:], logprobs["tokens"]))
    events = sse_events(client.post("/v1/completions", json={**request, "stream": True}).text)
    streamed = [e["choices"][0]["logprobs"] for e in events]
    assert [t for lp in streamed for t in lp["tokens"]] == logprobs["tokens"]
    assert [o for lp in streamed for o in lp["text_offset"]] == offsets
    assert client.post("/v1/completions", json={"prompt": "a", "max_tokens": 2}).json()["choices"][0]["logprobs"] is None


def test_segmented_prompts(client, reference):
    text = PIC_SEP.join(DOCS + [QUESTION])
    expected = greedy(reference, text)
    first = client.post("/v1/completions", json={"prompt": text, "max_tokens": 8, "temperature": 0}).json()
    assert first["choices"][0]["text"] == expected.text
    structured = client.post("/v1/completions", json={"segments": DOCS + [QUESTION], "max_tokens": 8,
                                                      "temperature": 0}).json()
    assert structured["choices"][0]["text"] == expected.text
    assert structured["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the documents are stored
    reordered = client.post("/generate", json={"segments": DOCS[::-1] + [QUESTION],
                                               "sampling_params": {"max_new_tokens": 4, "temperature": 0}}).json()
    assert reordered["meta_info"]["cached_tokens"] > 0
    usage = structured["usage"]
    pic = usage["pic"]
    assert pic["segment_hit_tokens"] + pic["prefix_hit_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert pic["segment_hit_tokens"] > 0 and pic["live_tokens"] < usage["prompt_tokens"]


def test_token_id_segments_stream_one_chunk_per_token(client, reference):
    """Segments given as token-id lists (a model without a tokenizer is served so): the same
    output as the text form, and with ``return_token_ids`` every streamed chunk carries the ids
    of its tokens, one chunk per generated token, also while a stop string holds the text back."""
    tok = reference.get_tokenizer()
    pieces = DOCS[::-1] + [QUESTION]
    ids = [tok.encode(p) for p in pieces]
    request = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    text = client.post("/v1/completions", json={**request, "segments": pieces}).json()
    by_ids = client.post("/v1/completions", json={**request, "segments": ids, "return_token_ids": True}).json()
    assert by_ids["choices"][0]["text"] == text["choices"][0]["text"]
    assert len(by_ids["choices"][0]["token_ids"]) == 6 and "token_ids" not in text["choices"][0]
    for extra in ({}, {"stop": ["no such words at all"]}):
        events = sse_events(client.post("/v1/completions", json={
            **request, **extra, "segments": ids, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}}).text)
        *chunks, usage = events
        assert [len(c["choices"][0]["token_ids"]) for c in chunks] == [1] * 6
        assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == by_ids["choices"][0]["token_ids"]
        assert "".join(c["choices"][0]["text"] for c in chunks) == text["choices"][0]["text"]
        assert usage["usage"]["completion_tokens"] == 6
    assert "token_ids" not in sse_events(client.post("/v1/completions", json={
        **request, "segments": ids, "stream": True}).text)[0]["choices"][0]


def test_cache_salt_keeps_tenants_apart_and_flush_cache(client):
    request = {"segments": DOCS[1:] + [QUESTION], "max_tokens": 2, "temperature": 0}

    def cached(salt):
        body = client.post("/v1/completions", json={**request, "cache_salt": salt}).json()
        return body["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("tenant-a") == 0 and cached("tenant-a") > 0
    assert cached("tenant-b") == 0  # not the other tenant's entries
    assert client.post("/flush_cache").json()["flushed_entries"] > 0
    assert cached("tenant-a") == 0


@pytest.mark.parametrize("body, status, param", [
    ({"prompt": "a", "logprobs": 21}, 400, "logprobs"),
    ({"prompt": "a", "suffix": "b"}, 400, "suffix"),
    ({"prompt": "a", "presence_penalty": 2.5}, 400, None),
    ({"prompt": "a", "logit_bias": {"x": 1.0}}, 400, "logit_bias"),
    ({"prompt": "a", "logit_bias": {"99999": 1.0}}, 400, None),
    ({"prompt": "a", "max_tokens": 2, "min_tokens": 3}, 400, None),
    ({"prompt": "a", "model": "nope"}, 404, "model"),
    ({"prompt": ""}, 400, None),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": [1, 99999]}, 400, None),
    ({"prompt": "a", "max_tokens": 1000}, 400, None),
    ({"prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "a", "temperature": -1}, 400, None),
    ({"prompt": "a", "top_p": 0}, 400, None),
    ({"prompt": "a", "n": "two"}, 400, "n"),
    ({"prompt": "a", "stop_token_ids": 5}, 400, "stop_token_ids"),
    ({"prompt": "a", "max_tokens": 2, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"prompt": PIC_SEP.join(["a", "", "b"])}, 400, None),
    ({"max_tokens": 2}, 400, "prompt"),
    ({"prompt": "the " * 300}, 400, None),
])
def test_bad_input_is_a_4xx_and_the_engine_keeps_serving(client, engine, body, status, param):
    response = client.post("/v1/completions", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    ok = client.post("/v1/completions", json={"prompt": "a", "max_tokens": 2})
    assert ok.status_code == 200
    assert engine.num_unfinished_requests == 0


def test_malformed_json_and_other_routes(client):
    response = client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "error" in response.json()
    assert client.get("/nowhere").status_code == 404
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == "tiny"
    assert client.get("/health").status_code == 200
    tokens = client.post("/tokenize", json={"prompt": PROMPTS[0]}).json()["tokens"]
    assert client.post("/detokenize", json={"tokens": tokens}).json()["prompt"] == PROMPTS[0]
    assert client.post("/detokenize", json={"tokens": [10**6]}).status_code == 400
    # the tiny model has no chat template: a clear 400
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}]})
    assert chat.status_code == 400 and "chat template" in chat.json()["error"]["message"]


def test_sglang_generate(client, reference):
    expected = greedy(reference, PROMPTS[1], max_tokens=6)
    request = {"text": PROMPTS[1], "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    body = client.post("/generate", json=request).json()
    assert body["text"] == expected.text and body["output_ids"] == expected.token_ids
    meta = body["meta_info"]
    assert meta["completion_tokens"] == 6 and meta["finish_reason"] == {"type": "length", "length": 6}
    ids = reference.get_tokenizer().encode(PROMPTS[1])
    assert client.post("/generate", json={"input_ids": ids, "sampling_params": request["sampling_params"]}
                       ).json()["text"] == expected.text
    events = sse_events(client.post("/generate", json={**request, "stream": True}).text)
    assert events[-1]["text"] == expected.text  # cumulative, as SGLang streams
    bad = client.post("/generate", json={"text": "a", "sampling_params": {"regex": "a+"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "sampling_params.regex"
    penalised = {"max_new_tokens": 6, "temperature": 0, "presence_penalty": 2.0, "frequency_penalty": 1.0,
                 "repetition_penalty": 5.0, "min_new_tokens": 6}
    body = client.post("/generate", json={"text": PROMPTS[0], "sampling_params": penalised}).json()
    want = greedy(reference, PROMPTS[0], max_tokens=6, presence_penalty=2.0, frequency_penalty=1.0,
                  repetition_penalty=5.0, min_tokens=6)
    assert body["output_ids"] == want.token_ids


def test_penalties_logit_bias_and_min_tokens_match_the_offline_engine(client, reference):
    plain = greedy(reference, PROMPTS[0], max_tokens=8)
    favoured = reference.get_tokenizer().encode("santon")[0]
    knobs = dict(presence_penalty=1.5, frequency_penalty=0.5, repetition_penalty=2.0, min_tokens=5)
    want = greedy(reference, PROMPTS[0], max_tokens=8, logit_bias={favoured: 4.0}, **knobs)
    assert want.token_ids != plain.token_ids  # the settings change the greedy text
    body = client.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0,
                                                "logit_bias": {str(favoured): 4.0}, **knobs}).json()
    assert body["choices"][0]["text"] == want.text
    sampled = client.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 1.0,
                                                   "min_p": 0.2, "seed": 3}).json()
    offline = reference.generate(PROMPTS[0], SamplingParams(temperature=1.0, max_tokens=8, min_p=0.2, seed=3),
                                 use_tqdm=False)[0].outputs[0]
    assert sampled["choices"][0]["text"] == offline.text


def test_metrics_parse_and_count_tokens(client):
    def scrape():
        families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
        return {s.name: s.value for f in families.values() for s in f.samples if not s.name.endswith("_created")}

    before = scrape()
    bodies = [{"prompt": p} for p in PROMPTS] + [{"segments": DOCS + [QUESTION]}, {"segments": DOCS[1:] + [QUESTION]}]
    usages = [client.post("/v1/completions", json={**b, "max_tokens": 5, "temperature": 0}).json()["usage"]
              for b in bodies]
    after = scrape()
    for name, key in (("hypic:prompt_tokens_total", "prompt_tokens"),
                      ("hypic:generation_tokens_total", "completion_tokens")):
        assert after[name] - before[name] == sum(u[key] for u in usages)
    for name, key in (("hypic:prompt_segment_hit_tokens_total", "segment_hit_tokens"),
                      ("hypic:prompt_prefix_hit_tokens_total", "prefix_hit_tokens")):
        assert after[name] - before[name] == sum(u["pic"][key] for u in usages)
    assert after["hypic:prompt_segment_hit_tokens_total"] > before["hypic:prompt_segment_hit_tokens_total"]
    assert after["hypic:time_to_first_token_seconds_count"] - before["hypic:time_to_first_token_seconds_count"] == 5
    assert after["hypic:e2e_request_latency_seconds_count"] - before["hypic:e2e_request_latency_seconds_count"] == 5
    assert after["hypic:inter_token_latency_seconds_count"] > before["hypic:inter_token_latency_seconds_count"]
    for name in ("hypic:num_requests_running", "hypic:num_requests_waiting", "hypic:segment_cache_hits_total",
                 "hypic:segment_cache_misses_total", "hypic:segment_cache_device_bytes", "hypic:prefix_cache_hits_total",
                 "hypic:prefix_cache_bytes", "hypic:segment_cache_disk_bytes"):
        assert name in after
    assert after["hypic:segment_workers_live"] == 0 and after["hypic:segment_worker_faults_total"] == 0
    assert after["hypic:segment_worker_recomputed_segments_total"] == 0
    again = client.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 5, "temperature": 0}).json()
    final = scrape()
    hit = again["usage"]["pic"]["prefix_hit_tokens"]
    assert hit == again["usage"]["prompt_tokens"] - 1  # the same prompt again
    assert final["hypic:prompt_prefix_hit_tokens_total"] - after["hypic:prompt_prefix_hit_tokens_total"] == hit
    assert final["hypic:prefix_cache_hits_total"] > after["hypic:prefix_cache_hits_total"]


def test_concurrent_requests_all_complete(engine, reference):
    app = create_app(engine, served_model_name="tiny")
    prompts = [PROMPTS[i % 3] for i in range(12)]
    expected = [greedy(reference, p).text for p in prompts]

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            responses = await asyncio.gather(*(
                c.post("/v1/completions", json={"prompt": p, "max_tokens": 8, "temperature": 0}) for p in prompts))
        return [r.json()["choices"][0]["text"] for r in responses]

    assert asyncio.run(main()) == expected
    assert engine.num_unfinished_requests == 0


@pytest.mark.slow
def test_load_of_500_requests_64_in_flight(engine, reference):
    prompts = [PROMPTS[i % 3] + " ." * (i % 5) for i in range(500)]
    expected = {p: greedy(reference, p, max_tokens=4).text for p in set(prompts)}
    app = create_app(engine, served_model_name="tiny")

    async def main():
        gate = asyncio.Semaphore(64)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as c:
            async def one(p):
                async with gate:
                    return await c.post("/v1/completions", json={"prompt": p, "max_tokens": 4, "temperature": 0})

            return await asyncio.wait_for(asyncio.gather(*(one(p) for p in prompts)), 120)

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [200] * 500
    assert [r.json()["choices"][0]["text"] for r in responses] == [expected[p] for p in prompts]
    assert engine.num_unfinished_requests == 0


def test_queue_full_is_a_503(hold_steps):
    engine = LLMEngine("tiny", **ENGINE)
    release = hold_steps(engine)
    async_engine = AsyncLLMEngine(engine, max_waiting_requests=1)
    try:
        with TestClient(create_app(async_engine, served_model_name="tiny")) as c:
            results = {}
            first = threading.Thread(target=lambda: results.setdefault(
                "first", c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2})))
            first.start()
            deadline = time.monotonic() + 10
            while async_engine.num_waiting_requests == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            busy = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2})
            assert busy.status_code == 503 and busy.json()["error"]["type"] == "service_unavailable"
            release.set()
            first.join(10)
            assert results["first"].status_code == 200
            assert c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2}).status_code == 200
    finally:
        release.set()
        async_engine.shutdown(timeout_s=5)


def test_api_key(engine):
    with TestClient(create_app(engine, served_model_name="tiny", api_key="secret")) as c:
        assert c.post("/v1/completions", json={"prompt": "a"}).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer secret"}).status_code == 200
        assert c.get("/health").status_code == 200


# ---- a real server ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seeded_reference(seeded_dir):
    return LLM(str(seeded_dir), **ENGINE)


def test_openai_client_against_a_real_server(live_server, seeded_reference):
    url, engine = live_server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    params = SamplingParams(temperature=0, max_tokens=10)
    prompt = "hello world, this is"
    expected = seeded_reference.generate(prompt, params, use_tqdm=False)[0].outputs[0]
    completion = client.completions.create(model="seeded", prompt=prompt, max_tokens=10, temperature=0)
    assert completion.choices[0].text == expected.text
    assert completion.usage.completion_tokens == len(expected.token_ids)
    stream = client.completions.create(model="seeded", prompt=prompt, max_tokens=10, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == expected.text

    messages = [{"role": "user", "content": "hi there"}]
    expected_chat = seeded_reference.chat(messages, params, use_tqdm=False)[0].outputs[0]
    chat = client.chat.completions.create(model="seeded", messages=messages, max_completion_tokens=10,
                                          temperature=0)
    assert chat.choices[0].message.content == expected_chat.text
    assert chat.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model="seeded", messages=messages, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected_chat.text
    assert chunks[-1].usage.completion_tokens == len(expected_chat.token_ids)
    # content parts: each text part of the last message is a segment
    parts = [{"type": "text", "text": "first document here."}, {"type": "text", "text": "second one."},
             {"type": "text", "text": "what now?"}]
    segmented = seeded_reference.chat([{"role": "user", "content": PIC_SEP.join(p["text"] for p in parts)}],
                                      params, use_tqdm=False)[0].outputs[0]
    chat = client.chat.completions.create(model="seeded", messages=[{"role": "user", "content": parts}],
                                          max_tokens=10, temperature=0)
    assert chat.choices[0].message.content == segmented.text
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt=prompt, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs=true"):
        client.chat.completions.create(model="seeded", messages=messages, top_logprobs=2)
    scored = client.chat.completions.create(model="seeded", messages=messages, max_tokens=10, temperature=0,
                                            logprobs=True, top_logprobs=2)
    content = scored.choices[0].logprobs.content
    assert [c.token for c in content] == [seeded_reference.get_tokenizer().decode([t])
                                          for t in expected_chat.token_ids]
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob == pytest.approx(c.logprob) for c in content)
    streamed = client.chat.completions.create(model="seeded", messages=messages, max_tokens=10, temperature=0,
                                              logprobs=True, top_logprobs=2, stream=True)
    assert [c.token for chunk in streamed if chunk.choices and chunk.choices[0].logprobs
            for c in chunk.choices[0].logprobs.content] == [c.token for c in content]
    assert engine.num_unfinished_requests == 0


def test_disconnect_mid_stream_aborts_the_request(live_server):
    url, engine = live_server
    request = {"prompt": PIC_SEP.join(["first document here.", "what now?"]), "max_tokens": 200,
               "ignore_eos": True, "temperature": 0, "stream": True}
    aborted = engine.num_aborted_requests
    with httpx.Client(base_url=url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=request) as response:
            assert response.status_code == 200
            next(response.iter_lines())  # one token arrived; then the client goes away
    deadline = time.monotonic() + 20
    while engine.num_unfinished_requests and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.num_unfinished_requests == 0
    assert engine.num_aborted_requests == aborted + 1  # it did not just run to its end
    assert not engine.engine.has_unfinished_requests()
    assert engine.segment_cache_stats().held_entries == 0
    with httpx.Client(base_url=url, timeout=30) as http:
        ok = http.post("/v1/completions", json={**request, "stream": False, "max_tokens": 3}).json()
    assert ok["usage"]["completion_tokens"] == 3


def test_serve_command_line_builds_the_engine():
    args = build_parser().parse_args(["serve", "tiny", "--device", "cpu", "--max-model-len", "128",
                                      "--max-num-batched-tokens", "32", "--max-waiting-requests", "3",
                                      "--seam", "0.5", "--port", "0", "--api-key", "k"])
    assert args.func.__name__ == "_run_serve" and args.model_tag == "tiny" and args.api_key == "k"
    args.model = args.model_tag
    engine = build_async_engine(args)
    try:
        assert engine.max_waiting_requests == 3 and engine.max_model_len == 128
        assert engine.engine.scheduler.config.max_num_batched_tokens == 32
        assert engine.engine.pic.seam == 0.5
    finally:
        engine.shutdown(timeout_s=1)


def test_echo_with_logprobs_scores_the_prompt_as_the_offline_engine_does(client, reference):
    # the request an evaluation harness sends for a log-likelihood: echo, logprobs, one token
    prompt = PROMPTS[1]
    body = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1, "temperature": 0, "echo": True,
                                                "logprobs": 2}).json()
    want = reference.generate(prompt, SamplingParams(temperature=0, max_tokens=1, logprobs=2, prompt_logprobs=2),
                              use_tqdm=False)[0]
    choice = body["choices"][0]
    assert choice["text"] == prompt + want.outputs[0].text
    lp = choice["logprobs"]
    ids = want.prompt_token_ids + want.outputs[0].token_ids
    assert len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    expected = [e[t].logprob for e, t in zip(want.prompt_logprobs[1:], want.prompt_token_ids[1:])]
    expected.append(want.outputs[0].logprobs[0][ids[-1]].logprob)
    assert lp["token_logprobs"][1:] == pytest.approx(expected, abs=1e-5)
    assert all(len(top) <= 3 for top in lp["top_logprobs"][1:])
    assert lp["text_offset"] == sorted(lp["text_offset"])
    # streamed: the prompt goes out with the first token, and the chunks add up to the same choice
    events = sse_events(client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 3, "temperature": 0,
                                                             "echo": True, "logprobs": 2, "stream": True}).text)
    whole = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 3, "temperature": 0, "echo": True,
                                                 "logprobs": 2}).json()["choices"][0]
    pieces = [e["choices"][0] for e in events if e["choices"]]
    assert pieces[0]["text"].startswith(prompt) and "".join(p["text"] for p in pieces) == whole["text"]
    for key in ("tokens", "token_logprobs", "text_offset"):
        assert [x for p in pieces if p["logprobs"] for x in p["logprobs"][key]] == whole["logprobs"][key]
    # without logprobs: the text only; a segmented prompt is echoed as its tokens' text, scored in full
    plain = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "temperature": 0,
                                                 "echo": True}).json()["choices"][0]
    assert plain["text"].startswith(prompt) and plain["logprobs"] is None
    segmented = PIC_SEP.join(DOCS[:2] + [QUESTION])
    body = client.post("/v1/completions", json={"prompt": segmented, "max_tokens": 1, "temperature": 0,
                                                "echo": True, "logprobs": 0}).json()
    tokenizer = reference.get_tokenizer()
    ids = tokenizer.encode(DOCS[0]) + tokenizer.encode(DOCS[1]) + tokenizer.encode(QUESTION)
    assert body["choices"][0]["text"].startswith(tokenizer.decode(ids))
    assert len(body["choices"][0]["logprobs"]["tokens"]) == len(ids) + 1
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_n_samples_of_a_plain_prompt_reuse_the_first_ones_prefill(client, engine, reference):
    body_text = " ".join(["this passage is about divur . divur lives in santon . divur owns a snake ."] * 10)
    prompt = "the " + body_text + " <sep> question : where does divur live ? answer :"
    before = engine.segment_cache_stats().prefix_hits
    body = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 3, "temperature": 0, "n": 3}).json()
    hits = engine.segment_cache_stats().prefix_hits - before
    # sample 0 prefills the fresh prompt; samples 1 and 2 start after its first token, from its checkpoints
    assert hits >= 2 and hits % 2 == 0
    want = greedy(reference, prompt, max_tokens=3)
    assert [c["text"] for c in body["choices"]] == [want.text] * 3
