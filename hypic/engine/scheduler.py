"""Continuous-batching scheduler (plain Python, testable without torch).

Each step is either

* a **prefill** step: waiting requests in arrival order, each given as many of its remaining
  prompt tokens as fit in the ``max_num_batched_tokens`` budget; a prompt longer than what is
  left of the budget is prefilled in chunks over several steps (the runner carries its state),
  at most half a budget per step while other requests wait behind it, and never so much that
  a segmented prompt right behind it (prefilled whole, never chunked) finds no room; or
* a **decode** step: one token for every running request.

Prefill goes first whenever a waiting request can be admitted (fewer than ``max_num_seqs``
requests hold a cache), except right after a prefill step while requests are running: then a
decode step comes first, so prefill and decode steps alternate and a long prompt prefilled in
chunks never freezes the token streams of running requests (each running request gets a token
every other step instead of none until the prompt is done). Requests join and leave between steps.
A request whose prompt starts with tokens the engine's prefix cache holds starts its prefill
after them (``lookup_prefix``). A segmented (PIC) prompt is prefilled in one forward, charged its
live tokens; where its cold segments exceed the budget, the engine spreads their standalone
prefill over earlier steps first (``stage_pic``: each stage charged its tokens, within the budget
unless one segment alone exceeds it), so a long cold segmented prompt shares steps like a plain
one; a stage whose first segment leaves no room for a segmented prompt arriving behind it yields
that step to it, at most one step in two. The scheduler decides how many
tokens each request computes; :meth:`Scheduler.postprocess` appends the sampled tokens and
applies the stop rules (eos / stop token ids / stop strings -> ``"stop"``; max_tokens or the
context length -> ``"length"``). Stop strings are matched on the detokenised output text, and
the text is cut before the stop string (vLLM's behaviour without include_stop_str_in_output).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

from hypic.engine.request import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_STOP,
    Request,
    RequestStatus,
)

# detokenize(token_ids, skip_special_tokens) -> text
Detokenize = Callable[[list[int], bool], str]


@dataclass(frozen=True)
class SchedulerConfig:
    """max_num_batched_tokens: token budget of one prefill step (long plain prompts are chunked
    to it). max_num_seqs: requests holding a cache at once (running + part-way through prefill).
    Part of :class:`hypic.config.EngineConfig`."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            _check_positive_int(name, getattr(self, name))


def _check_positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@dataclass
class ScheduledBatch:
    """One step's work. ``num_scheduled_tokens[i]`` tokens of ``requests[i]`` are computed,
    starting at position ``start_positions[i]``; ``samples[i]`` says whether a token is sampled
    for it (False only for a prefill chunk that does not finish the prompt)."""

    is_prefill: bool
    requests: list[Request]
    num_scheduled_tokens: list[int]
    start_positions: list[int]
    samples: list[bool]

    @property
    def num_tokens(self) -> int:
        return sum(self.num_scheduled_tokens)

    @property
    def sampling_requests(self) -> list[Request]:
        return [r for r, s in zip(self.requests, self.samples) if s]

    def token_ids(self, index: int) -> list[int]:
        """Input token ids of ``requests[index]`` for this step."""
        request = self.requests[index]
        start, n = self.start_positions[index], self.num_scheduled_tokens[index]
        if self.is_prefill:
            return request.prompt_token_ids[start : start + n]
        return [request.all_token_ids[start]]


class Scheduler:
    """``max_model_len``: prompt + output tokens per request."""

    def __init__(
        self,
        config: SchedulerConfig,
        *,
        max_model_len: int,
        eos_token_ids: Iterable[int] = (),
        detokenize: Detokenize | None = None,
        lookup_prefix: Callable[[Request], int] | None = None,
        stage_pic: Callable[[Request], None] | None = None,
    ) -> None:
        _check_positive_int("max_model_len", max_model_len)
        self.config = config
        # Automatic prefix caching (the engine's): called once for a request that is not
        # prefilled whole, when it is first scheduled, it returns how many of its prompt tokens
        # are cached already (less than all of them); its prefill starts there.
        self.lookup_prefix = lookup_prefix
        # Staged PIC prefill (the engine's): called once for a PIC request when it is first
        # scheduled, it may set ``request.pic_stages`` (a prefill spread over several steps).
        self.stage_pic = stage_pic
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.detokenize = detokenize
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._last_step_prefilled = False

    # ---- admission -------------------------------------------------------------------------
    def check_request(self, request: Request) -> None:
        """Raise ValueError if ``request`` can never be served (nothing is enqueued)."""
        if request.num_prompt_tokens > self.max_model_len:
            raise ValueError(
                f"request {request.request_id}: prompt has {request.num_prompt_tokens} tokens, "
                f"longer than the maximum context length max_model_len={self.max_model_len}"
            )
        if request.sampling_params.stop and self.detokenize is None:
            raise ValueError(
                f"request {request.request_id}: stop strings need a tokenizer, and this engine has none"
            )
        if request.request_id in self._ids():
            raise ValueError(f"request_id {request.request_id!r} is already in use")

    def add(self, request: Request) -> None:
        self.check_request(request)
        if request.status != RequestStatus.WAITING or request.num_computed_tokens:
            raise ValueError(f"request {request.request_id} is not a fresh request: {request!r}")
        self.waiting.append(request)

    def abort(self, request_id: str) -> Request | None:
        """Finish the request with reason "abort"; returns it (None if unknown or finished)."""
        request = self.find(request_id)
        if request is not None:
            (self.waiting if request in self.waiting else self.running).remove(request)
            request.finish(FINISH_ABORT)
        return request

    def find(self, request_id: str) -> Request | None:
        """The unfinished request ``request_id`` (None if unknown or finished)."""
        for queue in (self.waiting, self.running):
            for request in queue:
                if request.request_id == request_id:
                    return request
        return None

    def _ids(self) -> set[str]:
        return {r.request_id for r in self.waiting} | {r.request_id for r in self.running}

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # ---- scheduling ------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch | None:
        """The next step's batch, or None when nothing is left to do."""
        if not (self.running and self._last_step_prefilled):
            batch = self._schedule_prefill()
            if batch is not None:
                self._last_step_prefilled = True
                return batch
        if not self.running:
            return None
        self._last_step_prefilled = False
        now = time.monotonic()
        for request in self.running:
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = now
        return ScheduledBatch(
            is_prefill=False,
            requests=list(self.running),
            num_scheduled_tokens=[1] * len(self.running),
            start_positions=[r.num_tokens - 1 for r in self.running],
            samples=[True] * len(self.running),
        )

    def _schedule_prefill(self, allow_yield: bool = True) -> ScheduledBatch | None:
        budget = self.config.max_num_batched_tokens
        # Requests part-way through a chunked or staged prefill already hold a cache slot.
        holding = len(self.running) + sum(1 for r in self.waiting if r.prefill_started)
        requests, counts, starts, samples = [], [], [], []
        now = time.monotonic()
        # A prompt that needs more than this step takes at most half of the budget while others
        # wait behind it, so a short prompt arriving during a long prefill starts at the next
        # step instead of after the whole long prompt.
        long_share = max(1, self.config.max_num_batched_tokens // 2)
        yielded = False
        for k, request in enumerate(self.waiting):
            if budget == 0:
                break
            if request.waits_for is not None:
                if not (request.waits_for.is_finished or request.waits_for.output_token_ids):
                    continue  # starts once its sibling's prefill has written the checkpoints it reuses
                request.waits_for = None
            if not request.prefill_started:
                if holding >= self.config.max_num_seqs:
                    break  # strict arrival order: a later request never overtakes this one
                holding += 1
                if request.atomic_prefill and self.stage_pic is not None and request.pic_stages is None:
                    self.stage_pic(request)
                if (self.lookup_prefix is not None and not request.atomic_prefill
                        and request.prompt_logprobs is None):  # every prompt token needs its logits
                    cached = self.lookup_prefix(request)
                    if not 0 <= cached < request.num_prompt_tokens:
                        raise ValueError(f"request {request.request_id}: a prefix of {cached} cached tokens for a "
                                         f"prompt of {request.num_prompt_tokens}")
                    request.num_computed_tokens = cached
            remaining = request.num_uncomputed_prompt_tokens
            if request.atomic_prefill:
                # Prefilled whole (the PIC runner plans the prompt at once), after its stages if
                # it has any; charged its expected live tokens (or the stage's). It waits for the
                # next step unless it would run alone. A stage other than the last computes none
                # of the request's own tokens and samples nothing.
                stages = request.pic_stages
                if stages is None:
                    cost = request.pic.prefill_cost
                elif stages.final:
                    cost = stages.own_tokens
                else:  # a stage: half the budget while others wait behind it, as a chunk
                    share = min(budget, long_share) if k + 1 < len(self.waiting) else budget
                    reserve = self._reserve_behind(k, holding)
                    if reserve:
                        # The segmented prompt behind runs whole or not at all: leave it room.
                        # Where not even the stage's first segment fits beside it, the stage
                        # yields the step (at most one in two, so the long prompt still advances).
                        room = budget - reserve
                        if room < stages.lengths[0] and allow_yield and not stages.yielded:
                            stages.yielded = yielded = True
                            continue
                        share = max(1, min(share, room))
                    stages.yielded = False
                    cost = stages.take(share)
                if requests and cost > budget:
                    break
                n = remaining if stages is None or stages.final else 0
                budget -= min(cost, budget)
            else:
                n = min(remaining, budget)
                if n < remaining and k + 1 < len(self.waiting):
                    n = min(n, long_share)
                    reserve = self._reserve_behind(k, holding)
                    if 0 < reserve < budget:  # a chunk leaves the segmented prompt behind it room
                        n = min(n, budget - reserve)
                budget -= n
            requests.append(request)
            counts.append(n)
            starts.append(request.num_computed_tokens)
            samples.append(n == remaining)
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = now
        if not requests:
            # nothing behind a yielding stage could run after all: the stage takes the step
            return self._schedule_prefill(allow_yield=False) if yielded else None
        return ScheduledBatch(True, requests, counts, starts, samples)

    def _reserve_behind(self, k: int, holding: int) -> int:
        """Tokens the request right behind waiting position ``k`` needs this step to run at
        all: the cost of a segmented prompt (prefilled whole, never chunked) that has not started
        and can be admitted now, when it fits one step; 0 otherwise."""
        if k + 1 >= len(self.waiting) or holding >= self.config.max_num_seqs:
            return 0
        behind = self.waiting[k + 1]
        if behind.prefill_started or not behind.atomic_prefill:
            return 0
        cost = behind.pic.prefill_cost
        return cost if cost <= self.config.max_num_batched_tokens else 0

    # ---- after the model ran ---------------------------------------------------------------
    def postprocess(self, batch: ScheduledBatch, sampled_token_ids: list[int],
                    sampled_logprobs: list[dict | None] | None = None) -> list[Request]:
        """Record a step's results. ``sampled_token_ids`` has one id per sampling request, in
        batch order; ``sampled_logprobs`` (optional, same order) the ``{token_id: Logprob}`` of
        each request that asked for log-probabilities (None for the others). Returns the
        requests that received a token (finished ones included, and already removed from the
        running set)."""
        sampling = batch.sampling_requests
        if len(sampled_token_ids) != len(sampling):
            raise ValueError(
                f"sampled_token_ids has {len(sampled_token_ids)} entries for "
                f"{len(sampling)} sampling requests"
            )
        if sampled_logprobs is None:
            sampled_logprobs = [None] * len(sampling)
        elif len(sampled_logprobs) != len(sampling):
            raise ValueError(f"sampled_logprobs has {len(sampled_logprobs)} entries for {len(sampling)} "
                             "sampling requests")
        now = time.monotonic()
        for request, n in zip(batch.requests, batch.num_scheduled_tokens):
            request.num_computed_tokens += n
        updated = []
        sampled = iter(zip(sampled_token_ids, sampled_logprobs))
        for request, samples in zip(batch.requests, batch.samples):
            if not samples or request.is_finished:  # aborted while the step ran
                if samples:
                    next(sampled)
                continue
            if batch.is_prefill:
                self.waiting.remove(request)
                request.status = RequestStatus.RUNNING
                self.running.append(request)
            token_id, logprobs = next(sampled)
            token_id = int(token_id)
            request.output_token_ids.append(token_id)
            if request.output_logprobs is not None:
                request.output_logprobs.append(self.decoded(logprobs or {}))
            request.metrics.generation_tokens += 1
            if request.metrics.first_token_time is None:
                request.metrics.first_token_time = now
            self._check_stop(request, token_id, now)
            updated.append(request)
        self.running = [r for r in self.running if not r.is_finished]
        return updated

    def decoded(self, logprobs: dict) -> dict:
        """``logprobs`` with each token's own text filled in (special tokens included)."""
        if self.detokenize is None:
            return logprobs
        return {t: dataclasses.replace(lp, decoded_token=self.detokenize([t], False)) for t, lp in logprobs.items()}

    def _check_stop(self, request: Request, token_id: int, now: float) -> None:
        params = request.sampling_params
        if request.num_output_tokens < params.min_tokens:
            # nothing but the length ends it yet (its end-of-sequence and stop ids were masked)
            self._update_text(request)
            self._check_length(request, now)
            return
        # A token that ends the request by id is not part of the output text.
        if not params.ignore_eos and token_id in self.eos_token_ids:
            request.finish(FINISH_STOP, None, now)
            self._update_text(request, flush=True, exclude_last=True)
            return
        if token_id in params.stop_token_ids:
            request.finish(FINISH_STOP, token_id, now)
            self._update_text(request, flush=True, exclude_last=True)
            return
        num_new_chars = self._update_text(request)
        if params.stop and num_new_chars and self._check_stop_strings(request, num_new_chars, now):
            return
        self._check_length(request, now)

    def _check_length(self, request: Request, now: float) -> None:
        limit = request.sampling_params.max_tokens
        if (limit is not None and request.num_output_tokens >= limit) or request.num_tokens >= self.max_model_len:
            request.finish(FINISH_LENGTH, None, now)
            self._update_text(request, flush=True)

    def _update_text(self, request: Request, flush: bool = False, exclude_last: bool = False) -> int:
        """Append the text of newly decodable output tokens to ``request.output_text``; returns
        the number of characters added.

        Decodes only a window of the last tokens (vLLM's incremental detokenisation), so a step
        costs O(1) in the output length. Text ending in U+FFFD is held back (an incomplete UTF-8
        sequence of a byte-level token) unless ``flush``. ``exclude_last`` leaves out the last
        token (the stop token that ended the request).
        """
        if self.detokenize is None:
            return 0
        skip = request.sampling_params.skip_special_tokens
        ids = request.output_token_ids[:-1] if exclude_last else request.output_token_ids
        prefix, read = request.detok_prefix_offset, request.detok_read_offset
        prefix_text = self.detokenize(ids[prefix:read], skip)
        new_text = self.detokenize(ids[prefix:], skip)
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not flush):
            return 0
        delta = new_text[len(prefix_text) :]
        request.output_text += delta
        request.detok_prefix_offset, request.detok_read_offset = read, len(ids)
        return len(delta)

    def _check_stop_strings(self, request: Request, num_new_chars: int, now: float) -> bool:
        text = request.output_text
        old_len = len(text) - num_new_chars
        # Only matches overlapping the new characters are new; the earliest one wins.
        best: tuple[int, str] | None = None
        for stop in request.sampling_params.stop:
            index = text.find(stop, max(0, old_len - len(stop) + 1))
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        if best is None:
            return False
        request.finish(FINISH_STOP, best[1], now)
        request.output_text = text[: best[0]]
        return True
