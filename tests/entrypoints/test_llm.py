"""hypic.LLM: the vLLM-shaped offline API on the embedded tiny model (prompts in its suite vocabulary)."""

import dataclasses

import pytest
import torch

import hypic
from hypic import LLM, SamplingParams
from hypic.config import ENGINE_OPTIONS, EngineConfig
from hypic.assets.make_seeded_tiny import write_tiny_model

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield LLM(model="tiny", dtype="float32", device="cpu", seed=0)
    torch.set_num_threads(previous)


def test_top_level_exports():
    assert hypic.LLM is LLM and hypic.SamplingParams is SamplingParams and hypic.EngineConfig is EngineConfig


def test_generate_prompt_forms_and_output_shape(llm):
    tokenizer = llm.get_tokenizer()
    prompts = ["the mentor of kolton is", "<sep> this passage is about kolton . the river was quiet in the"]
    outputs = llm.generate(prompts, GREEDY, use_tqdm=True)
    assert [o.prompt for o in outputs] == prompts
    for out, prompt in zip(outputs, prompts):
        assert isinstance(out.request_id, str) and out.finished
        assert out.prompt_token_ids == tokenizer.encode(prompt)
        completion = out.outputs[0]
        assert len(completion.token_ids) == 4 and completion.finish_reason == "length"
        assert completion.text == tokenizer.decode(completion.token_ids)
        assert out.metrics.prompt_tokens == len(out.prompt_token_ids)
        assert out.metrics.ttft > 0
    assert len({o.request_id for o in outputs}) == 2
    # a single string, a single token-id list and a list of token-id lists give the same tokens
    single = llm.generate(prompts[0], GREEDY, use_tqdm=False)
    ids = tokenizer.encode(prompts[0])
    from_ids = llm.generate(ids, GREEDY, use_tqdm=False)
    from_id_lists = llm.generate([ids, tokenizer.encode(prompts[1])], GREEDY, use_tqdm=False)
    assert len(single) == len(from_ids) == 1
    assert single[0].outputs[0].token_ids == from_ids[0].outputs[0].token_ids == outputs[0].outputs[0].token_ids
    assert from_ids[0].prompt is None and from_ids[0].prompt_token_ids == ids
    assert [o.outputs[0].token_ids for o in from_id_lists] == [o.outputs[0].token_ids for o in outputs]
    # vLLM-style dict prompts
    from_dicts = llm.generate([{"prompt_token_ids": ids}, {"prompt": prompts[1]}], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in from_dicts] == [o.outputs[0].token_ids for o in outputs]
    assert from_dicts[1].prompt == prompts[1]
    with pytest.raises(ValueError, match="needs 'prompt' or 'prompt_token_ids'"):
        llm.generate({"text": "x"}, GREEDY, use_tqdm=False)


def test_per_prompt_sampling_params(llm):
    params = [
        SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
        SamplingParams(temperature=0.9, max_tokens=5, seed=3, ignore_eos=True),
    ]
    outputs = llm.generate(["a", "it was a"], params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [2, 5]
    again = llm.generate(["it was a"], params[1], use_tqdm=False)
    assert again[0].outputs[0].token_ids == outputs[1].outputs[0].token_ids  # seeded


def test_chat_needs_a_template(llm, tmp_path):
    # The trained tiny model has no chat template: a clear error, and the engine keeps serving.
    with pytest.raises(ValueError, match="no chat template"):
        llm.chat([{"role": "user", "content": "where does kolton live ?"}], GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    # The seeded test model (byte-level BPE, ChatML template) renders conversations.
    write_tiny_model(tmp_path)
    seeded = LLM(model=str(tmp_path), dtype="float32", device="cpu", seed=0)
    out = seeded.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False)
    tokenizer = seeded.get_tokenizer()
    expected = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert out[0].prompt_token_ids == expected
    two = seeded.chat([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]], GREEDY,
                      use_tqdm=False)
    assert len(two) == 2 and two[0].outputs[0].token_ids == out[0].outputs[0].token_ids


def test_bad_input_raises_and_leaves_engine_clean(llm):
    too_long = "the " * (llm.llm_engine.max_model_len + 1)
    with pytest.raises(ValueError, match="prompt 1: .*longer than the maximum context length"):
        llm.generate(["a", too_long], GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="sampling_params has 1 entries for 2 prompts"):
        llm.generate(["a", "the"], [GREEDY], use_tqdm=False)
    with pytest.raises(ValueError, match="prompt 0"):
        llm.generate([None], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="prompts must be"):
        llm.generate([], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[1, 99999]], GREEDY, use_tqdm=False)
    # and the engine still serves
    assert llm.generate("it was a", GREEDY, use_tqdm=False)[0].outputs[0].finish_reason == "length"


def test_llm_takes_every_engine_option():
    """``LLM(...)`` takes every field of EngineConfig by its flat name, one to one, or a config."""
    kwargs = dict(model="tiny", dtype="float32", device="cpu", seed=1, load_format="dummy", max_model_len=64,
                  pic_mode="hypic", seam=4, cold_policy="standalone", max_num_batched_tokens=64, max_num_seqs=4,
                  segment_cache_bytes=1 << 20, host_cache_bytes=1 << 20, segment_workers=1,
                  segment_devices=("cpu",), segment_assignment="round_robin", segment_group_tokens=512,
                  segment_start_timeout_s=30.0, segment_reply_timeout_s=5.0, enforce_eager=True,
                  moe_backend="torch", enable_prefix_caching=True, prefix_block_tokens=16, segment_cache_dir=None,
                  disk_cache_bytes=1 << 30, pic_segment_min_tokens=12, seam_min_tokens=2, seam_max_tokens=6)
    assert set(kwargs) == {o.name for o in ENGINE_OPTIONS}
    llm = LLM(**kwargs)
    engine = llm.llm_engine
    assert engine.config == EngineConfig.from_kwargs(**kwargs) and engine.config.to_kwargs() == kwargs
    assert engine.max_model_len == 64 and engine.store.device_budget_bytes == 1 << 20
    assert engine.pic_runner.graphs is None
    out = llm.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert out[0].metrics.live_tokens is not None  # pic_mode named: every prompt through segment caching
    assert LLM(engine.config).llm_engine.config == engine.config
    with pytest.raises(ValueError, match="not both"):
        LLM(engine.config, seed=2)
    with pytest.raises(ValueError, match="unknown engine option"):
        LLM(max_num_seq=2)
def test_generate_from_many_threads_equals_sequential(llm):
    import threading

    prompts = ["the mentor of kolton is", "a", "<sep> this passage is about kolton . kolton works as a",
               "it was a", "the river was quiet in the"]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    results, errors = {}, []

    def worker(i):
        try:
            for k in range(3):  # a batch of prompts, then one at a time
                batch = llm.generate(prompts, params, use_tqdm=False)
                results[(i, k)] = [o.outputs[0].token_ids for o in batch]
                results[(i, k, "one")] = [llm.generate(p, params, use_tqdm=False)[0].outputs[0].token_ids
                                          for p in prompts[k:k + 2]]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads)
    assert len(results) == 8 * 3 * 2
    for key, got in results.items():
        assert got == (expected if len(key) == 2 else expected[key[1]:key[1] + 2])
    assert not llm.llm_engine.has_unfinished_requests()


def test_max_tokens_beyond_max_model_len_is_refused(llm):
    room = llm.llm_engine.max_model_len - 5
    with pytest.raises(ValueError, match=f"max_tokens={room + 1} does not fit.*room for {room} generated"):
        llm.generate("the mentor of kolton is", SamplingParams(max_tokens=room + 1), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    # max_tokens=None: the room left
    small = LLM(model="tiny", dtype="float32", device="cpu", seed=0, max_model_len=12)
    out = small.generate("the mentor of kolton is", SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),
                         use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 7 and out.outputs[0].finish_reason == "length"


def test_logprobs_follow_every_generated_token(llm):
    """Each generated position's log-probabilities equal those of a fresh one-token request on the
    prompt extended by the tokens before it: decode steps score the right positions."""
    prompt = "<sep> this passage is about kolton . kolton works as a"
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=3)
    out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids) == 4
    assert llm.generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0].logprobs is None
    ids = llm.get_tokenizer().encode(prompt)
    for i, (token, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        assert entry[token].rank == 1  # greedy
        assert {lp.rank for lp in entry.values()} == {1, 2, 3}
        assert entry[token].decoded_token == llm.get_tokenizer().decode([token])
        fresh = llm.generate(ids + out.token_ids[:i], SamplingParams(temperature=0, max_tokens=1, logprobs=3),
                             use_tqdm=False)[0].outputs[0].logprobs[0]
        assert fresh.keys() == entry.keys()
        for t in entry:
            assert entry[t].logprob == pytest.approx(fresh[t].logprob, abs=1e-4)


def test_n_completions_per_prompt_are_seeded_one_after_another(llm):
    prompts = ["the mentor of kolton is", "a"]
    sampled = SamplingParams(temperature=1.0, max_tokens=6, seed=11, n=3, ignore_eos=True)
    outs = llm.generate(prompts, sampled, use_tqdm=False)
    assert [len(o.outputs) for o in outs] == [3, 3]
    for prompt, out in zip(prompts, outs):
        assert [c.index for c in out.outputs] == [0, 1, 2] and out.finished
        assert out.prompt == prompt and out.metrics.generation_tokens == 18
        for k, completion in enumerate(out.outputs):
            alone = llm.generate(prompt, SamplingParams(temperature=1.0, max_tokens=6, seed=11 + k, ignore_eos=True),
                                 use_tqdm=False)[0].outputs[0]
            assert completion.token_ids == alone.token_ids
    assert len({tuple(c.token_ids) for c in outs[0].outputs}) > 1  # three draws, not one copied
    greedy = llm.generate(prompts[0], SamplingParams(temperature=0, max_tokens=4, n=2), use_tqdm=False)[0]
    assert greedy.outputs[0].token_ids == greedy.outputs[1].token_ids
    with pytest.raises(ValueError, match="one completion per request"):
        llm.llm_engine.add_request(prompts[0], SamplingParams(n=2))
    assert not llm.llm_engine.has_unfinished_requests()


def test_n_completions_of_a_plain_prompt_resume_from_the_first_ones_checkpoints(llm):
    body = " ".join(["this passage is about divur . divur lives in santon . divur owns a snake ."] * 20)
    question = " <sep> question : where does divur live ? answer :"
    prompt_a, prompt_b = "<sep> " + body + question, "the " + body + question  # same length, nothing shared
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    alone = llm.generate(prompt_a, greedy, use_tqdm=False)[0].outputs[0]
    stats = llm.segment_cache_stats
    before = stats().prefix_hits
    llm.generate(prompt_a, greedy, use_tqdm=False)
    per_request = stats().prefix_hits - before  # checkpoints one repeat of the prompt resumes from
    assert per_request > 0
    before = stats().prefix_hits
    out = llm.generate(prompt_a, dataclasses.replace(greedy, n=3), use_tqdm=False)[0]
    assert stats().prefix_hits - before == 3 * per_request  # all three completions resume
    assert all(c.token_ids == alone.token_ids for c in out.outputs)
    before = stats().prefix_hits
    fresh = llm.generate(prompt_b, dataclasses.replace(greedy, n=3), use_tqdm=False)[0]
    # completion 0 prefills; 1 and 2 join after it and resume from its checkpoints
    assert stats().prefix_hits - before == 2 * per_request
    assert fresh.outputs[0].token_ids == fresh.outputs[1].token_ids == fresh.outputs[2].token_ids


def test_reset_prefix_cache_drops_what_no_request_holds(llm):
    prompt = " ".join(["this passage is about kolton . kolton lives in santon ."] * 12) + " where does kolton live ?"
    first = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    hit = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    assert hit.metrics.prefix_hit_tokens > 0
    assert llm.reset_prefix_cache() > 0
    stats = llm.segment_cache_stats()
    assert stats.device_entries == stats.host_entries == stats.device_bytes == 0
    again = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    assert again.metrics.prefix_hit_tokens == 0 and again.outputs[0].token_ids == first.outputs[0].token_ids
