import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.engine.sampling import SamplingParams, apply_top_k, apply_top_p, sample


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
        ({"n": 2}, "n"),
        ({"ignore_eos": 1}, "ignore_eos"),
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
