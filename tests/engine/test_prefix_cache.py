"""Automatic prefix caching through hypic.LLM on the embedded tiny model: plain prompts sent
again, the turns of a chat, chunked prefills, PIC after a cached prefix, tenants, and the
persistent store across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from hypic import LLM, SamplingParams
from hypic.data.language import question_text
from hypic.data.suites import DocumentPool
from hypic.pic.segments import PIC_SEP

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
POOL = DocumentPool("held_out", seed=0, pool_size=40, min_doc_tokens=36, max_doc_tokens=48)
DOCS = [d.text for d in POOL.documents]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


pytestmark = pytest.mark.usefixtures("single_thread_torch")


@pytest.fixture(scope="module")
def reference():
    """Full recompute: no prefix cache, plain prompts through the plain context."""
    return LLM("tiny", seed=0, enable_prefix_caching=False)


def plain_prompt(num_docs: int, question: int = 0) -> str:
    return " ".join(DOCS[:num_docs]) + " " + question_text("lives", POOL.documents[question].subject)


def greedy(llm, prompt, **kw):
    return llm.generate(prompt, GREEDY, use_tqdm=False, **kw)[0]


def test_the_same_plain_prompt_twice_is_a_prefix_hit(reference):
    llm = LLM("tiny", seed=0)
    prompt = plain_prompt(28)  # ~1,250 tokens, several spine blocks
    want = greedy(reference, prompt)
    first, second = greedy(llm, prompt), greedy(llm, prompt)
    n = len(first.prompt_token_ids)
    assert n > 4 * llm.llm_engine.prefix_block_tokens
    assert first.metrics.prefix_hit_tokens == 0 and first.metrics.live_tokens == n
    assert second.metrics.prefix_hit_tokens == n - 1 >= 0.9 * n and second.metrics.live_tokens == 1
    assert first.outputs[0].token_ids == second.outputs[0].token_ids == want.outputs[0].token_ids
    stats = llm.segment_cache_stats()
    assert stats.prefix_entries == n // llm.llm_engine.prefix_block_tokens + 1  # the spine and the end
    assert stats.prefix_entries == stats.device_entries and stats.held_entries == 0


def test_chat_turns_hit_the_turns_before_them(reference):
    llm = LLM("tiny", seed=0)
    prompt = plain_prompt(6, 1)
    previous = None  # the last turn's prompt tokens
    for turn in range(3):
        got, want = greedy(llm, prompt), greedy(reference, prompt)
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        if turn:
            # the previous turn's prompt (but its last token) is found: its end is a checkpoint
            assert got.metrics.prefix_hit_tokens == previous - 1
        previous = len(got.prompt_token_ids)
        prompt = f"{prompt} {got.outputs[0].text} {question_text('job', turn + 2)}"


def test_chunked_prefill_writes_and_reuses_the_same_checkpoints(reference):
    prompt = plain_prompt(12, 2)
    want = greedy(reference, prompt)
    chunked = LLM("tiny", seed=0, max_num_batched_tokens=100, prefix_block_tokens=64)
    whole = LLM("tiny", seed=0, prefix_block_tokens=64)
    a, b = greedy(chunked, prompt), greedy(whole, prompt)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids == want.outputs[0].token_ids
    assert {e.key for e in chunked.llm_engine.store.snapshot()} == {e.key for e in whole.llm_engine.store.snapshot()}
    again = greedy(chunked, prompt)
    assert again.metrics.prefix_hit_tokens == len(again.prompt_token_ids) - 1
    # a longer prompt over a smaller budget: resumes from the stored chain, then chunk by chunk
    longer = prompt + " " + " ".join(DOCS[12:16])
    got = greedy(chunked, longer)
    assert got.metrics.prefix_hit_tokens == len(again.prompt_token_ids) - 1
    assert got.outputs[0].token_ids == greedy(reference, longer).outputs[0].token_ids


@pytest.mark.parametrize("cold_policy", ["inline", "standalone"])
def test_segments_are_reused_after_a_cached_prefix(cold_policy):
    llm = LLM("tiny", seed=0, prefix_block_tokens=64, cold_policy=cold_policy)
    system, docs, question = " ".join(DOCS[:4]), DOCS[4:8], question_text("lives", POOL.documents[5].subject)
    system_tokens = len(llm.get_tokenizer().encode(system))
    # the system part as a plain prompt (a chat's first turn) writes its prefix; then a segmented
    # request (the documents as segments) finds it, and, reordered, its documents too
    greedy(llm, f"{system} {question_text('job', 2)}")
    first = greedy(llm, PIC_SEP.join([system] + docs + [question]))
    assert system_tokens - 64 < first.metrics.prefix_hit_tokens <= system_tokens
    out = greedy(llm, PIC_SEP.join([system] + docs[::-1] + [question]))
    assert system_tokens - 64 < out.metrics.prefix_hit_tokens <= system_tokens
    assert out.metrics.cached_tokens > 0  # the documents after it, from their segment entries


def test_cache_salt_keeps_tenants_apart_offline():
    llm = LLM("tiny", seed=0)
    segmented = PIC_SEP.join(DOCS[:3] + [question_text("lives", POOL.documents[0].subject)])
    plain = plain_prompt(8)
    for prompt in (segmented, plain):
        first = greedy(llm, prompt, cache_salt="tenant-a")
        other = greedy(llm, prompt, cache_salt="tenant-b")
        unsalted = greedy(llm, {"prompt": prompt})
        for out in (other, unsalted):
            assert out.metrics.prefix_hit_tokens == 0 and out.metrics.cached_tokens == 0
        again = greedy(llm, {"prompt": prompt, "cache_salt": "tenant-a"})  # per prompt
        assert again.metrics.prefix_hit_tokens + again.metrics.cached_tokens > 0
        assert first.outputs[0].token_ids == other.outputs[0].token_ids == again.outputs[0].token_ids
    with pytest.raises(ValueError, match="cache_salt"):
        greedy(llm, plain, cache_salt="")
    with pytest.raises(ValueError, match="two different cache_salt"):
        greedy(llm, {"prompt": plain, "cache_salt": "x"}, cache_salt="y")


def test_prefix_cache_mode_needs_the_prefix_cache(reference):
    with pytest.raises(ValueError, match="prefix_cache needs enable_prefix_caching"):
        LLM("tiny", seed=0, pic_mode="prefix_cache", enable_prefix_caching=False)
    # without it, plain prompts take the plain path and nothing is stored
    assert reference.generate(plain_prompt(3), GREEDY, use_tqdm=False)[0].metrics.prefix_hit_tokens == 0
    assert reference.segment_cache_stats().prefix_entries == 0


SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    import torch
    torch.set_num_threads(1)
    from hypic import LLM, SamplingParams
    directory, dtype, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            llm = LLM("tiny", seed=0, dtype=dtype, segment_cache_dir=directory)
        except ValueError as e:
            print(json.dumps({"error": str(e)}))
            sys.exit(0)
        outs = [llm.generate(p, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)[0]
                for p in prompts]
        llm.shutdown()
    print(json.dumps({"tokens": [o.outputs[0].token_ids for o in outs],
                      "prefix_hits": [o.metrics.prefix_hit_tokens for o in outs],
                      "segment_hits": [o.metrics.cached_tokens for o in outs],
                      "warnings": [str(w.message) for w in caught if "segment store" in str(w.message)]}))
""")


def run_process(directory, prompts, dtype="float32"):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(directory), dtype, json.dumps(prompts)], cwd=REPO,
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_new_process_on_the_segment_cache_dir_reports_the_hits(tmp_path):
    question = question_text("lives", POOL.documents[1].subject)
    prompts = [plain_prompt(10), PIC_SEP.join(DOCS[10:13] + [question])]
    reordered = PIC_SEP.join(DOCS[10:13][::-1] + [question])
    first = run_process(tmp_path, prompts)
    assert first["prefix_hits"] == [0, 0] and first["segment_hits"] == [0, 0]
    second = run_process(tmp_path, prompts + [reordered])
    assert second["tokens"][:2] == first["tokens"]
    assert second["prefix_hits"][0] > 0.9 * len(" ".join(DOCS[:10]).split())
    # the segmented prompt's documents (segment entries), again and reordered
    assert second["segment_hits"][1] > 0 and second["segment_hits"][2] > 0 and second["warnings"] == []
    # another dtype: refused with a clear error, nothing read
    refused = run_process(tmp_path, prompts, dtype="float64")
    assert "another model, dtype or configuration" in refused["error"] and "float32" in refused["error"]
    # a corrupted entry file: skipped with a warning, the request served (recomputed) all the same
    files = sorted((p for p in tmp_path.iterdir() if p.suffix == ".safetensors"), key=lambda p: p.stat().st_size)
    for victim in files:
        data = bytearray(victim.read_bytes())
        data[-3] ^= 0x55
        victim.write_bytes(bytes(data))
    third = run_process(tmp_path, prompts)
    assert third["tokens"] == first["tokens"]
    assert third["warnings"] and all("checksum mismatch" in w for w in third["warnings"])
