"""The batched token sampler (greedy, temperature, min-p, top-k, top-p, per-request generators)
and the logits processing before it (logit bias, min_tokens, presence / frequency / repetition
penalties).

Each row of a batch is sampled with its own ``torch.Generator`` so a seeded request draws the
same tokens whichever requests share its batch. Masks (top-k, top-p) are vectorised over the
batch; only the random draw loops over rows, because generators cannot be batched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from hypic.engine.sampling_params import SamplingParams

__all__ = ["Logprob", "SamplingParams", "apply_min_p", "apply_top_k", "apply_top_p", "needs_processing",
           "process_logits", "sample", "token_logprobs"]


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability at one output position (vLLM's ``Logprob``): ``rank`` is 1 for
    the most likely token; ``decoded_token`` its text alone (None without a tokenizer)."""

    logprob: float
    rank: int
    decoded_token: str | None = None


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, num_top: list[int]) -> list[dict[int, Logprob]]:
    """Per row i: the log-probabilities of the sampled token ``token_ids[i]`` and of the
    ``num_top[i]`` most likely tokens, as ``{token_id: Logprob}`` (the sampled token first; it
    appears once when it is also among the top ones). Raw distribution: log-softmax of the fp32
    logits. logits [N, V]; token_ids [N]; one device-to-host copy for the whole batch."""
    if logits.dim() != 2 or token_ids.shape != (logits.shape[0],) or len(num_top) != logits.shape[0]:
        raise ValueError(f"logits [N, V], token_ids [N] and num_top of length N expected, got "
                         f"{tuple(logits.shape)}, {tuple(token_ids.shape)}, {len(num_top)}")
    if not logits.shape[0]:
        return []
    logp = torch.log_softmax(logits.float(), dim=1)
    chosen = logp.gather(1, token_ids.view(-1, 1)).squeeze(1)
    # rank = 1 + the number of tokens strictly more likely than the sampled one
    ranks = (logp > chosen.unsqueeze(1)).sum(dim=1) + 1
    k = min(max(num_top), logp.shape[1])
    top_values, top_ids = logp.topk(k, dim=1) if k else (logp[:, :0], token_ids.view(-1, 1)[:, :0])
    host = [t.tolist() for t in (token_ids, chosen, ranks, top_values, top_ids)]
    out = []
    for i, (token, value, rank, values, ids) in enumerate(zip(*host)):
        row = {int(token): Logprob(float(value), int(rank))}
        for r, (v, t) in enumerate(zip(values[:num_top[i]], ids[:num_top[i]])):
            row.setdefault(int(t), Logprob(float(v), r + 1))
        out.append(row)
    return out


def needs_processing(params: SamplingParams) -> bool:
    """Whether :func:`process_logits` changes this request's logits."""
    return params.logit_bias is not None or params.min_tokens > 0 or params.has_penalties


def process_logits(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    eos_token_ids: Sequence[int] = (),
) -> torch.Tensor:
    """The logits each row samples from, in vLLM's order: logit bias, then min_tokens (the row's
    end-of-sequence ids, unless ``ignore_eos``, and its ``stop_token_ids`` set to -inf while it
    has fewer than ``min_tokens`` output tokens), then the penalties: repetition over the tokens
    of the prompt and the output (a positive logit divided by it, a negative one multiplied),
    frequency (times the token's count in the output) and presence (once per token in the
    output) subtracted. logits [N, V] (any float dtype) -> a new fp32 tensor; rows whose params
    ask for none of this are returned unchanged."""
    if logits.dim() != 2 or not len(params) == len(prompt_token_ids) == len(output_token_ids) == logits.shape[0]:
        raise ValueError(f"logits [N, V] with N params, prompts and outputs expected, got {tuple(logits.shape)}, "
                         f"{len(params)}, {len(prompt_token_ids)}, {len(output_token_ids)}")
    logits = logits.float().clone()
    vocab_size, device = logits.shape[1], logits.device
    rows, ids, values = [], [], []
    for i, p in enumerate(params):
        for token, bias in p.logit_bias or ():
            if token >= vocab_size:
                raise ValueError(f"logit_bias names token {token}, outside the vocabulary [0, {vocab_size})")
            rows.append(i)
            ids.append(token)
            values.append(bias)
    if rows:
        logits.index_put_((torch.tensor(rows, device=device), torch.tensor(ids, device=device)),
                          torch.tensor(values, device=device), accumulate=True)
    rows, ids = [], []
    for i, p in enumerate(params):
        if len(output_token_ids[i]) < p.min_tokens:
            banned = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
            in_vocab = sorted(t for t in banned if t < vocab_size)
            rows.extend([i] * len(in_vocab))
            ids.extend(in_vocab)
    if rows:
        logits[torch.tensor(rows, device=device), torch.tensor(ids, device=device)] = float("-inf")
    penalised = [i for i, p in enumerate(params) if p.has_penalties]
    if penalised:
        index = torch.tensor(penalised, device=device)
        logits.index_copy_(0, index, _penalise(logits.index_select(0, index), [params[i] for i in penalised],
                                               [prompt_token_ids[i] for i in penalised],
                                               [output_token_ids[i] for i in penalised]))
    return logits


def _penalise(logits: torch.Tensor, params, prompts, outputs) -> torch.Tensor:
    num_rows, vocab_size = logits.shape
    device = logits.device
    counts = torch.zeros(num_rows, vocab_size, device=device)
    rows, ids = _flat(outputs, device)
    counts.index_put_((rows, ids), torch.ones(ids.shape[0], device=device), accumulate=True)
    generated = counts > 0
    if any(p.repetition_penalty != 1.0 for p in params):
        repetition = torch.tensor([p.repetition_penalty for p in params], device=device).unsqueeze(1)
        seen = generated.clone()
        rows, ids = _flat(prompts, device)
        seen[rows, ids] = True
        penalised = torch.where(logits > 0, logits / repetition, logits * repetition)
        logits = torch.where(seen, penalised, logits)
    frequency = torch.tensor([p.frequency_penalty for p in params], device=device).unsqueeze(1)
    presence = torch.tensor([p.presence_penalty for p in params], device=device).unsqueeze(1)
    return logits - frequency * counts - presence * generated.float()


def _flat(token_lists, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, token id) of every token of every row, as two index tensors: built on the host a row
    at a time (a 32k-token prompt is one list conversion, not a Python loop over its tokens),
    then copied to ``device`` once each."""
    lengths = torch.tensor([len(tokens) for tokens in token_lists], dtype=torch.long)
    ids = torch.cat([torch.as_tensor(tokens, dtype=torch.long) for tokens in token_lists])
    rows = torch.repeat_interleave(torch.arange(len(token_lists)), lengths)
    return rows.to(device), ids.to(device)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop the tokens of row i whose probability is below ``min_p[i]`` times the row's largest
    (min_p = 0: keep all). logits [N, V] float; min_p float tensor [N]."""
    _check_rows(logits, min_p, "min_p")
    probs = logits.softmax(dim=1)
    threshold = probs.max(dim=1, keepdim=True).values * min_p.to(probs.dtype).unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Set all but the ``top_k[i]`` largest logits of row i to -inf (top_k <= 0: keep all).

    Ties at the k-th value are all kept, so a row may keep more than k tokens.
    logits: [N, V] float; top_k: LongTensor [N].
    """
    _check_rows(logits, top_k, "top_k")
    vocab_size = logits.shape[1]
    k = torch.where(top_k <= 0, torch.full_like(top_k, vocab_size), top_k.clamp(max=vocab_size))
    sorted_logits = logits.sort(dim=1, descending=True).values
    kth_value = sorted_logits.gather(1, (k - 1).unsqueeze(1))
    return logits.masked_fill(logits < kth_value, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most probable tokens whose probability mass reaches ``top_p[i]``.

    A token is kept when the mass of the tokens strictly more probable than it is < top_p, so
    the most probable token is always kept. logits: [N, V] float; top_p: float tensor [N].
    """
    _check_rows(logits, top_p, "top_p")
    sorted_logits, order = logits.sort(dim=1, descending=True)
    probs = sorted_logits.softmax(dim=1)
    mass_before = probs.cumsum(dim=1) - probs
    remove_sorted = mass_before >= top_p.to(probs.dtype).unsqueeze(1)
    remove_sorted[:, 0] = False
    remove = torch.zeros_like(remove_sorted).scatter(1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def _check_rows(logits: torch.Tensor, values: torch.Tensor, name: str) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    if values.shape != (logits.shape[0],):
        raise ValueError(f"{name} must be [N={logits.shape[0]}], got shape {tuple(values.shape)}")


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> torch.Tensor:
    """Sample one token per row. logits [N, V] (any float dtype; maths in fp32) -> LongTensor [N].

    Greedy rows take the argmax. Other rows: divide by temperature, mask with min-p, top-k, top-p,
    and draw with the row's generator (``None``: the global torch RNG) using the exponential
    race ``argmax(p / E)``, E ~ Exp(1), which samples from p exactly.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    num_rows = logits.shape[0]
    if len(params) != num_rows or len(generators) != num_rows:
        raise ValueError(
            f"params ({len(params)}) and generators ({len(generators)}) must have one entry "
            f"per logits row ({num_rows})"
        )
    logits = logits.float()
    result = logits.argmax(dim=1)
    random_rows = [i for i, p in enumerate(params) if not p.greedy]
    if not random_rows:
        return result
    device = logits.device
    rows = torch.tensor(random_rows, device=device, dtype=torch.long)
    temperature = torch.tensor([params[i].temperature for i in random_rows], device=device)
    scaled = logits.index_select(0, rows) / temperature.unsqueeze(1)
    if any(params[i].min_p > 0.0 for i in random_rows):
        min_p = torch.tensor([params[i].min_p for i in random_rows], device=device)
        scaled = apply_min_p(scaled, min_p)
    if any(params[i].top_k > 0 for i in random_rows):
        top_k = torch.tensor([params[i].top_k for i in random_rows], device=device)
        scaled = apply_top_k(scaled, top_k)
    if any(params[i].top_p < 1.0 for i in random_rows):
        top_p = torch.tensor([params[i].top_p for i in random_rows], device=device)
        scaled = apply_top_p(scaled, top_p)
    probs = scaled.softmax(dim=1)
    noise = torch.empty_like(probs)
    for j, i in enumerate(random_rows):
        noise[j].exponential_(generator=generators[i])
    # exponential_ can return exactly 0; p / 0 would pick a masked (p = 0 -> nan) token.
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    drawn = (probs / noise).argmax(dim=1)
    return result.index_copy(0, rows, drawn)
