"""`hypic bench deviation` on the embedded model at small sizes: what it splices is what serving reads."""

import pytest
import torch

from hypic.bench.deviation import (
    OFFSET_BINS, DeviationRun, RequestTokens, donor_order, measure_request, offset_bin,
)
from hypic.bench.deviation_capture import splice
from hypic.bench.quality_run import PromptEncoder, encode_requests
from hypic.data import SuiteConfig, generate_suite
from hypic.ops.rope import apply_rotary

pytestmark = pytest.mark.usefixtures("single_thread_torch")


@pytest.fixture(scope="module")
def run():
    runner = DeviationRun("tiny", "cpu", "float32", 0)
    yield runner
    runner.recorder.close()


@pytest.fixture(scope="module")
def request_tokens(run):
    requests = generate_suite(SuiteConfig(task="summary", min_docs=3, max_docs=3, min_doc_tokens=40,
                                          max_doc_tokens=60, pool_size=8), 1)
    (encoded,) = encode_requests(PromptEncoder(run.engine.model_path, run.spec.vocab_size), requests)
    return RequestTokens(encoded.segments, encoded.request.request_id)


def _rows(accumulators, policy, seam, metric):
    return [v for v in accumulators[(policy, seam)].means()[metric] if v is not None]


def test_a_seam_covering_every_segment_splices_the_full_recompute(run, request_tokens):
    accumulators, answers = {}, {}
    measure_request(run, request_tokens, [("standalone", 1.0), ("inline", 1.0)], accumulators, answers)
    for policy in ("standalone", "inline"):
        for metric in ("k/L3", "v/L7", "attn/L7", "hidden/L7", "final"):
            assert max(_rows(accumulators, policy, 1.0, metric)) < 1e-4, (policy, metric)
        assert answers[(policy, 1.0)][0]["top1_agrees"] and answers[(policy, 1.0)][0]["kl_last"] < 1e-6


def test_bodies_spliced_are_the_entries_serving_reads(run, request_tokens):
    """The writer forwards the bench splices in (segment alone; donor prompt for inline) hold the
    K/V the store entries hold, at every full-attention layer: the measurement models the cache."""
    docs = request_tokens.documents
    seam = 4
    for policy in ("standalone", "inline"):
        run.engine.store.clear()
        order = donor_order(len(docs), request_tokens.request_id)
        served = [docs[i] for i in order] if policy == "inline" else list(docs)
        run.serve(served + [request_tokens.segments[-1]], policy, seam, record=False)
        writer = run.forward([t for d in served for t in d])
        start = 0
        for doc in served:
            key = run.engine.keyer.segment_key(tuple(doc), seam)
            handle = run.engine.store.acquire(key)
            assert handle is not None
            entry = handle.entry
            # rows of the writer forward = the body's positions there (K is stored RoPE'd at them)
            source = writer if policy == "inline" else run.forward(doc)
            offset = start if policy == "inline" else 0
            body = torch.arange(offset + seam, offset + len(doc))
            cos, sin = run.rotary.cos_sin(body)
            for layer in run.attention_layers:
                expected = apply_rotary(source.k[layer].index_select(0, body), cos, sin)
                torch.testing.assert_close(entry.attention[layer].key.float(), expected, atol=2e-5, rtol=2e-5)
                torch.testing.assert_close(entry.attention[layer].value.float().flatten(1),
                                           source.v[layer].index_select(0, body), atol=2e-5, rtol=2e-5)
            handle.release()
            start += len(doc)
    run.engine.store.clear()


def test_standalone_and_canonical_entries_deviate_alike_and_the_first_offsets_most(run, request_tokens):
    accumulators, answers = {}, {}
    measure_request(run, request_tokens, [("standalone", 0), ("canonical", 0), ("standalone", 8)], accumulators,
                    answers)
    for metric in ("k/L3", "attn/L7", "final", "logits_kl"):
        assert _rows(accumulators, "standalone", 0, metric) == _rows(accumulators, "canonical", 0, metric)
    k3 = accumulators[("standalone", 0)].means()["k/L3"]
    # the first full-attention layer's keys deviate at the segment's first tokens, not at its end
    assert k3[offset_bin(0)] > 100 * k3[offset_bin(20)]
    # a seam of 8 replaces those rows with live ones
    assert accumulators[("standalone", 8)].means()["k/L3"][offset_bin(0)] < 0.5 * k3[offset_bin(0)]


def test_splice_refuses_positions_nobody_computed(run, request_tokens):
    live = run.forward(request_tokens.flat)
    lengths = [len(d) for d in request_tokens.documents]
    with pytest.raises(ValueError, match="neither live nor cached"):
        splice(live.rows(torch.arange(5)), [None] * len(lengths), [0, lengths[0], lengths[0] + lengths[1]], lengths,
               len(request_tokens.flat))
    assert offset_bin(0) == 0 and offset_bin(10 ** 6) == len(OFFSET_BINS) - 1
