import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.engine.sampling import (
    SamplingParams, apply_min_p, apply_top_k, apply_top_p, needs_processing, process_logits, sample,
)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_defaults_match_vllm_and_normalise_stop():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.n) == (1.0, 1.0, 0, 16, 1)
    assert SamplingParams(stop="x").stop == ("x",)
    assert SamplingParams(stop=["a", "b"], stop_token_ids=[3]).stop == ("a", "b")
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)
    assert SamplingParams(temperature=0).greedy and not SamplingParams(temperature=0.5).greedy


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"seed": -3}, "seed"),
        ({"n": 0}, "n"),
        ({"n": 1.5}, "n"),
        ({"n": 129}, "n"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"min_p": 1.5}, "min_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {3: 101.0}}, "logit_bias"),
        ({"logit_bias": [(3, 1.0), (3, 2.0)]}, "logit_bias"),
        ({"logit_bias": "x"}, "logit_bias"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 20, "max_tokens": 4}, "min_tokens"),
    ],
)
def test_validation_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_frozen():
    with pytest.raises(Exception):
        SamplingParams().temperature = 0.3  # type: ignore[misc]


def test_greedy_is_argmax_and_ignores_generator():
    logits = torch.randn(5, 37, generator=_gen(0))
    params = [SamplingParams(temperature=0.0, top_k=3, top_p=0.1)] * 5
    out = sample(logits, params, [None] * 5)
    assert out.tolist() == logits.argmax(dim=1).tolist()


def test_top_k_mask():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0], [1.0, 5.0, 3.0, 4.0, 2.0]])
    masked = apply_top_k(logits, torch.tensor([2, 0]))
    assert torch.isinf(masked[0]).tolist() == [True, False, True, False, True]
    assert torch.equal(masked[1], logits[1])  # 0 disables
    assert torch.equal(apply_top_k(logits, torch.tensor([-1, 99])), logits)


def test_top_p_mask_keeps_smallest_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    # mass before each token: 0, .5, .8, .95 -> with top_p .75 keep the first two
    kept = ~torch.isinf(apply_top_p(logits, torch.tensor([0.75])))
    assert kept.tolist() == [[True, True, False, False]]
    kept = ~torch.isinf(apply_top_p(logits, torch.tensor([0.8001])))
    assert kept.tolist() == [[True, True, True, False]]
    # the most probable token always survives
    kept = ~torch.isinf(apply_top_p(logits, torch.tensor([1e-6])))
    assert kept.tolist() == [[True, False, False, False]]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(0.05, 1.0), st.integers(0, 9))
def test_masks_match_reference_on_random_rows(seed, top_p, top_k):
    logits = torch.randn(3, 10, generator=_gen(seed), dtype=torch.float64)
    masked = apply_top_p(apply_top_k(logits, torch.full((3,), top_k)), torch.full((3,), top_p))
    for row, out in zip(logits, masked):
        order = row.argsort(descending=True).tolist()
        keep = set(order[: top_k if top_k > 0 else 10])
        sub = torch.full_like(row, -math.inf)
        sub[list(keep)] = row[list(keep)]
        p = sub.softmax(0)
        mass, kept = 0.0, set()
        for idx in order:
            if idx not in keep or mass >= top_p:
                break
            kept.add(idx)
            mass += float(p[idx])
        assert {i for i in range(10) if out[i] != -math.inf} == kept


def test_samples_only_inside_masks():
    logits = torch.randn(1, 50, generator=_gen(1))
    top5 = set(logits[0].topk(5).indices.tolist())
    params = [SamplingParams(temperature=2.0, top_k=5)]
    gen = _gen(3)
    draws = {int(sample(logits, params, [gen])[0]) for _ in range(200)}
    assert draws <= top5 and len(draws) > 1


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().unsqueeze(0).repeat(4000, 1)
    gens = [_gen(i) for i in range(4000)]
    out = sample(logits, [SamplingParams(temperature=1.0)] * 4000, gens)
    freq = torch.bincount(out, minlength=3).double() / 4000
    assert torch.allclose(freq, probs.double(), atol=0.03)


def test_temperature_sharpens():
    logits = torch.tensor([[2.0, 1.0, 0.0]]).repeat(2000, 1)
    cold = sample(logits, [SamplingParams(temperature=0.2)] * 2000, [_gen(i) for i in range(2000)])
    hot = sample(logits, [SamplingParams(temperature=5.0)] * 2000, [_gen(i) for i in range(2000)])
    assert (cold == 0).float().mean() > 0.95
    assert (hot == 0).float().mean() < 0.6


def test_seeded_rows_do_not_depend_on_batch_neighbours():
    torch.manual_seed(0)
    row = torch.randn(1, 64)
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    alone = [int(sample(row, [p], [_gen(7)])[0]) for _ in range(1)]
    g_alone = _gen(7)
    seq_alone = [int(sample(row, [p], [g_alone])[0]) for _ in range(10)]
    g_batched = _gen(7)
    seq_batched = []
    for step in range(10):
        others = torch.randn(3, 64)
        batch = torch.cat([others[:1], row, others[1:]])
        params = [SamplingParams(temperature=0.7), p, SamplingParams(temperature=0), SamplingParams(top_k=3)]
        out = sample(batch, params, [_gen(100 + step), g_batched, None, _gen(200 + step)])
        seq_batched.append(int(out[1]))
    assert seq_alone == seq_batched
    assert alone[0] == seq_alone[0]
    assert len(set(seq_alone)) > 1  # really sampling, not argmax


def test_sample_validates_lengths_and_shapes():
    logits = torch.randn(2, 5)
    with pytest.raises(ValueError, match="one entry per logits row"):
        sample(logits, [SamplingParams()], [None])
    with pytest.raises(ValueError, match="logits"):
        sample(torch.randn(5), [SamplingParams()], [None])
    with pytest.raises(ValueError, match="top_k"):
        apply_top_k(logits, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="top_p"):
        apply_top_p(logits, torch.tensor([[0.5, 0.5]]))


def test_token_logprobs_are_the_raw_log_softmax_with_ranks():
    from hypic.engine.sampling import token_logprobs

    torch.manual_seed(0)
    logits = torch.randn(3, 11)
    tokens = torch.tensor([4, int(logits[1].argmax()), 0])
    rows = token_logprobs(logits, tokens, [2, 0, 11])
    expected = torch.log_softmax(logits.double(), dim=1)
    for i, row in enumerate(rows):
        token = int(tokens[i])
        assert next(iter(row)) == token  # the sampled token first
        order = expected[i].argsort(descending=True).tolist()
        assert row[token].rank == order.index(token) + 1
        for t, lp in row.items():
            assert lp.logprob == pytest.approx(float(expected[i, t]), abs=1e-5)
            assert lp.rank == order.index(t) + 1
        top = sorted((lp.rank, t) for t, lp in row.items() if lp.rank <= [2, 0, 11][i])
        assert [t for _, t in top] == order[:[2, 0, 11][i]]
    assert len(rows[1]) == 1 and rows[1][int(tokens[1])].rank == 1
    assert len(rows[2]) == 11
    with pytest.raises(ValueError, match="num_top of length N"):
        token_logprobs(logits, tokens, [1])


@pytest.mark.parametrize("bad", [-1, 21, 1.5, True])
def test_logprobs_count_is_validated(bad):
    with pytest.raises(ValueError, match="logprobs must be None or an int in \\[0, 20\\]"):
        SamplingParams(logprobs=bad)


def test_logit_bias_is_stored_as_sorted_pairs():
    p = SamplingParams(logit_bias={7: -1, 2: 0.5})
    assert p.logit_bias == ((2, 0.5), (7, -1.0)) and hash(p) == hash(SamplingParams(logit_bias=[(2, 0.5), (7, -1)]))
    assert SamplingParams(logit_bias={}).logit_bias is None
    assert not needs_processing(SamplingParams()) and needs_processing(SamplingParams(min_tokens=1))


def test_process_logits_applies_bias_min_tokens_and_penalties_in_vllms_order():
    logits = torch.tensor([[1.0, -1.0, 2.0, 0.5], [0.0, 0.0, 0.0, 0.0], [0.3, 0.2, 0.1, 0.0]])
    params = [SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
              SamplingParams(logit_bias={3: 5.0}, min_tokens=2, stop_token_ids=[0]),
              SamplingParams()]
    out = process_logits(logits, params, [[0], [1], [2]], [[1, 1, 2], [0], [2, 2]], eos_token_ids=(2,))
    # row 0: token 0 in the prompt (1 / 2); token 1 twice in the output (-1 * 2 - 2 * 0.5 - 0.25);
    # token 2 once (2 / 2 - 0.5 - 0.25); token 3 untouched
    assert torch.equal(out[0], torch.tensor([0.5, -3.25, 0.25, 0.5]))
    # row 1: one output token of the two min_tokens asks for: its eos (2) and stop id (0) masked
    assert torch.equal(out[1], torch.tensor([float("-inf"), 0.0, float("-inf"), 5.0]))
    assert torch.equal(out[2], logits[2]) and torch.equal(logits[1], torch.zeros(4))  # input untouched
    done = process_logits(logits[1:2], params[1:2], [[1]], [[0, 3]], eos_token_ids=(2,))
    assert torch.equal(done[0], torch.tensor([0.0, 0.0, 0.0, 5.0]))  # min_tokens reached: nothing masked
    ignored = SamplingParams(min_tokens=2, ignore_eos=True)
    assert torch.equal(process_logits(logits[1:2], [ignored], [[1]], [[]], eos_token_ids=(2,))[0], torch.zeros(4))
    with pytest.raises(ValueError, match="vocabulary"):
        process_logits(logits[:1], [SamplingParams(logit_bias={9: 1.0})], [[0]], [[]])
    with pytest.raises(ValueError, match="N params"):
        process_logits(logits, params[:2], [[0]] * 3, [[]] * 3)


def test_repetition_penalty_matches_the_definition_on_random_rows():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=gen)
    prompts = [[1, 2, 3], [4], [5, 5, 6]]
    outputs = [[7, 7], [], [1]]
    params = [SamplingParams(repetition_penalty=r) for r in (1.5, 0.7, 3.0)]
    out = process_logits(logits, params, prompts, outputs)
    for i, p in enumerate(params):
        want = logits[i].clone()
        for t in set(prompts[i]) | set(outputs[i]):
            want[t] = want[t] / p.repetition_penalty if want[t] > 0 else want[t] * p.repetition_penalty
        assert torch.allclose(out[i], want)


def test_min_p_keeps_tokens_within_the_ratio_of_the_most_likely():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]]))
    kept = apply_min_p(logits, torch.tensor([0.5, 0.9])) > float("-inf")
    assert kept.tolist() == [[True, True, False, False], [True, True, True, True]]
    assert torch.equal(apply_min_p(logits, torch.zeros(2)), logits)
    gen = [torch.Generator().manual_seed(s) for s in range(200)]
    drawn = {int(sample(logits[:1], [SamplingParams(min_p=0.5)], [g])[0]) for g in gen}
    assert drawn == {0, 1}
