import random
from collections import Counter

import pytest

from hypic.bench.rag_trace import RagTrace, RagTraceConfig, chunk


def small_config(**kw):
    base = dict(vocab_size=97, prompt_tokens=512, segment_tokens=32, doc_tokens_min=24, doc_tokens_max=80,
                system_tokens=40, query_tokens_min=4, query_tokens_max=12, seed=3)
    base.update(kw)
    return RagTraceConfig(**base)


def test_deterministic_by_seed():
    a, b = RagTrace(small_config()), RagTrace(small_config())
    assert a.documents == b.documents and a.system_prompt == b.system_prompt
    assert a.requests(5) == b.requests(5)
    assert a.warmup_requests(3) == b.warmup_requests(3)
    c = RagTrace(small_config(seed=4))
    assert c.documents != a.documents
    assert c.requests(5) != a.requests(5)
    # independent streams: warm-up and measured requests differ
    assert [r.doc_ids for r in a.requests(3)] != [r.doc_ids for r in a.requests(3, stream="other")]


def test_request_structure_and_lengths():
    cfg = small_config()
    trace = RagTrace(cfg)
    assert all(cfg.doc_tokens_min <= len(d) <= cfg.doc_tokens_max for d in trace.documents)
    system_segments = chunk(trace.system_prompt, cfg.segment_tokens)
    assert len(system_segments) == 2  # 40 tokens in segments of 32
    gaps = []
    for req in trace.requests(40):
        prompt = req.prompt
        assert len(set(req.doc_ids)) == len(req.doc_ids)  # without replacement
        assert prompt.segments[:2] == system_segments  # the system prompt comes first
        expected = list(system_segments)
        for i in req.doc_ids:  # documents in relevance order, each chunked the same way
            expected.extend(chunk(trace.documents[i], cfg.segment_tokens))
        assert prompt.segments == tuple(expected)
        assert all(1 <= len(s) <= cfg.segment_tokens for s in prompt.segments)
        assert cfg.query_tokens_min <= len(prompt.query) <= cfg.query_tokens_max
        n = prompt.num_tokens
        # within the target, and short of it by less than the longest document (+ question slack):
        # a gap that no remaining document fits stays open
        assert n <= cfg.prompt_tokens
        assert n > cfg.prompt_tokens - cfg.doc_tokens_max - (cfg.query_tokens_max - cfg.query_tokens_min)
        gaps.append(cfg.prompt_tokens - n)
        assert all(1 <= t < cfg.vocab_size for s in prompt.segments for t in s)
        assert all(1 <= t < cfg.vocab_size for t in prompt.query)
    assert sum(gaps) / len(gaps) < cfg.doc_tokens_min + cfg.query_tokens_max  # usually much closer


def test_zipf_popularity_of_first_retrieved_document():
    """Sequential weighted sampling: the first document is i with probability w_i / sum(w)."""
    trace = RagTrace(small_config())
    weights = trace.popularity
    assert weights[0] == 1.0 and weights[3] == pytest.approx(0.25)
    rng = random.Random(0)
    n = 3000
    first = Counter(trace.retrieve(rng)[0] for _ in range(n))
    total = sum(weights)
    for i in (0, 1, 4):
        assert first[i] / n == pytest.approx(weights[i] / total, abs=0.03)
    assert first[0] > 5 * first[len(weights) - 1]
    # more popular documents are retrieved more often overall
    counts = Counter(i for _ in range(500) for i in trace.retrieve(rng))
    assert counts[0] > counts[len(weights) - 1]


def test_uniform_popularity_with_zero_exponent():
    trace = RagTrace(small_config(zipf_exponent=0.0))
    assert set(trace.popularity) == {1.0}


def test_k_grows_with_prompt_length_and_corpus_size():
    short, long = RagTrace(small_config(prompt_tokens=256)), RagTrace(small_config(prompt_tokens=1024))
    k_short = sum(len(r.doc_ids) for r in short.requests(10))
    k_long = sum(len(r.doc_ids) for r in long.requests(10))
    assert k_long > 2 * k_short
    assert len(long.documents) > len(short.documents)
    assert len(RagTrace(small_config(num_documents=7)).documents) == 7


def test_warmup_covers_every_document():
    for max_sampled in (0, 2, 50):
        trace = RagTrace(small_config())
        seen = {i for r in trace.warmup_requests(max_sampled) for i in r.doc_ids}
        assert seen == set(range(len(trace.documents)))


@pytest.mark.parametrize("kw", [
    dict(prompt_tokens=100),  # no room for the longest document
    dict(vocab_size=1),
    dict(doc_tokens_min=90),  # min > max
    dict(query_tokens_min=0),
    dict(zipf_exponent=-1.0),
    dict(corpus_factor=0.5),
    dict(segment_tokens=0),
])
def test_config_errors(kw):
    with pytest.raises(ValueError):
        small_config(**kw)


def test_chunk():
    assert chunk((1, 2, 3, 4, 5), 2) == ((1, 2), (3, 4), (5,))
    with pytest.raises(ValueError):
        chunk((1,), 0)
