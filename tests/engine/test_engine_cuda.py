"""The engine on CUDA (fla kernels, the fused chain forward, CUDA graphs of the row-wise phases in
prefill and in every decode step) against the same engine on CPU: greedy generation of the
embedded tiny model, cached segments reused in another order, several requests decoding in one
batch."""

from __future__ import annotations

import pytest

from hypic import LLM, SamplingParams
from hypic.data import PIC_SEP, SuiteConfig, generate_suite

pytestmark = pytest.mark.cuda


def _prompts():
    requests = generate_suite(SuiteConfig("single_hop", min_docs=2, max_docs=3, min_doc_tokens=36,
                                          max_doc_tokens=64), 6)
    # each request twice, the second time with its documents in reverse order: cached segments
    # reused after another prefix
    prompts = [r.prompt() for r in requests]
    return prompts + [PIC_SEP.join(tuple(reversed(r.documents)) + (r.query,)) for r in requests], requests


def _generate(llm, prompts, params, half):
    # two calls: the reordered prompts come after the first ones have written their documents
    return llm.generate(prompts[:half], params, use_tqdm=False) + llm.generate(prompts[half:], params, use_tqdm=False)


def test_generation_on_cuda_matches_cpu_with_graphs_in_prefill_and_decode(device="cuda"):
    prompts, requests = _prompts()
    half = len(requests)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    # a 256-token step budget: start-up captures the buckets up to 256 (8 of them) instead of up to
    # the default 2048, each with compiled glue; prefill and decode steps still replay graphs
    cpu = LLM("tiny", dtype="float32", device="cpu", seed=0, max_num_batched_tokens=256)
    gpu = LLM("tiny", dtype="float32", device=device, seed=0, max_num_batched_tokens=256)
    graphs = gpu.llm_engine.pic_runner.graphs
    if device == "cuda":
        assert graphs is not None and graphs.num_captures > 0  # captured at start-up
    want = _generate(cpu, prompts, params, half)
    got = _generate(gpu, prompts, params, half)
    if graphs is not None:
        assert not graphs.failures(), graphs.failures()
    # The answer tokens must agree; past them (ignore_eos) a near tie may break differently in
    # fp32 with TF32 summaries, so the tokens up to the first <eos> are compared.
    for w, g, prompt in zip(want, got, prompts):
        ref, out = w.outputs[0].token_ids, g.outputs[0].token_ids
        stop = ref.index(2) + 1 if 2 in ref else len(ref)
        assert out[:stop] == ref[:stop], (prompt[-60:], ref, out)
    # the reordered prompts reused the cached documents
    assert all(g.metrics.cached_tokens > 0 for g in got[half:])


def test_enforce_eager_runs_without_graphs_on_cuda():
    llm = LLM("tiny", dtype="float32", device="cuda", seed=0, enforce_eager=True)
    assert llm.llm_engine.pic_runner.graphs is None
    out = llm.generate("the mentor of kolton is", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
