"""A generation request and its life cycle (plain Python: no torch needed to build or test one).

States: WAITING (queued, or part-way through a chunked prefill) -> RUNNING (prompt fully
prefilled, decoding one token per step) -> FINISHED. Finish reasons follow vLLM: ``"stop"``
(end-of-sequence token, a stop token id or a stop string) and ``"length"`` (max_tokens or the
context length reached); ``"abort"`` when the caller aborts it.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Tuple

from hypic.engine.sampling_params import SamplingParams

if TYPE_CHECKING:  # annotations only: this module stays importable without torch
    import torch

    from hypic.engine.context import SequenceCache
    from hypic.pic.keys import StoreKey
    from hypic.pic.modes import RequestPolicy
    from hypic.pic.plan import RequestPlan
    from hypic.pic.segments import SegmentedPrompt


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"


@dataclass
class RequestMetrics:
    """Wall-clock timestamps (``time.monotonic()`` seconds) and token counts of one request."""

    arrival_time: float
    prompt_tokens: int
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    generation_tokens: int = 0
    # Segment caching (PIC requests): tokens reused from segment entries, from prefix-cache
    # checkpoints, and tokens computed in the request's own prefill pass.
    cached_tokens: int = 0
    prefix_hit_tokens: int = 0
    live_tokens: int | None = None

    @property
    def ttft(self) -> float | None:
        """Time to first token in seconds (arrival -> first sampled token)."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        if self.finished_time is None:
            return None
        return self.finished_time - self.arrival_time


@dataclass(frozen=True)
class PicState:
    """What a PIC request (a segmented prompt) carries into its plan, built once by the engine
    when it queues the request: the prompt's segments and query, the resolved mode / seam / cold
    policy, the tenant salt of its store keys, the keys of its segments (computed once, for the
    scheduler charge, and reused by the plan; None for a mode without a segment store), and
    ``prefill_cost``: the tokens the scheduler charges its one-step prefill (its live tokens)."""

    prompt: "SegmentedPrompt"
    policy: "RequestPolicy"
    prefill_cost: int
    tenant_salt: Optional[str] = None
    segment_keys: Optional[Tuple[Optional["StoreKey"], ...]] = None


@dataclass
class PicStages:
    """A PIC request prefilled over several steps (the ``standalone`` cold policy, when its cold
    segments exceed a step's token budget): earlier stages prefill groups of its cold segments
    alone at position 0, writing their store entries; the last stage is the request's own forward,
    which then finds them all cached. ``lengths``/``items``: the cold segments still to prefill
    (tokens; what the engine prefills, opaque here); ``own_tokens``: the last stage's tokens. The
    scheduler sizes each stage to the budget it has (:meth:`take`: at least one segment), so a
    stage leaves room to the requests behind it as a chunk of a plain prompt does. ``held``: store
    handles of the entries the stages wrote, kept until the last stage has run so nothing evicts
    them; ``written``: their keys; ``standalone_tokens``: the tokens the stages prefilled.
    ``yielded``: the last prefill step skipped this request's stage so that a segmented prompt
    behind it could run (a stage yields at most one step in two)."""

    lengths: list
    items: list
    own_tokens: int
    done: int = 0
    next_count: int = 0  # segments of the stage the scheduler picked, for the engine
    held: list = field(default_factory=list)
    written: set = field(default_factory=set)
    standalone_tokens: int = 0
    yielded: bool = False

    def __post_init__(self) -> None:
        if len(self.lengths) != len(self.items) or not all(isinstance(n, int) and n > 0 for n in self.lengths):
            raise ValueError(f"a staged prefill needs one positive length per segment, got {self.lengths!r} for "
                             f"{len(self.items)} segments")

    @property
    def final(self) -> bool:
        return not self.lengths

    def take(self, budget_tokens: int) -> int:
        """The next stage within ``budget_tokens`` (the leading segments that fit, at least one):
        records it for the engine and returns its tokens; the last stage's are ``own_tokens``."""
        if self.final:
            return self.own_tokens
        count, total = 1, self.lengths[0]
        while count < len(self.lengths) and total + self.lengths[count] <= budget_tokens:
            total += self.lengths[count]
            count += 1
        self.next_count = count
        return total

    def pop_stage(self) -> list:
        """The items of the stage :meth:`take` picked, removed from the pending ones."""
        if not self.next_count:
            raise ValueError("no stage was picked")
        items = self.items[:self.next_count]
        del self.items[:self.next_count], self.lengths[:self.next_count]
        self.next_count = 0
        self.done += 1
        return items

    def release(self) -> None:
        held, self.held = self.held, []
        for handle in held:
            handle.release()


class Request:
    """One prompt being served. ``num_computed_tokens`` counts tokens whose state is in the cache.

    ``cache`` and ``generator`` are set by the engine: the per-sequence model cache and the
    request's ``torch.Generator``. ``pic``: set for a PIC request, which is prefilled through the
    PIC runner in one forward (:attr:`atomic_prefill`), after ``pic_stages`` where there are any.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        *,
        prompt: str | None = None,
        arrival_time: float | None = None,
        pic: PicState | None = None,
        cache_salt: str | None = None,
    ) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        if not isinstance(prompt_token_ids, (list, tuple)) or not prompt_token_ids:
            raise ValueError(f"request {request_id}: prompt_token_ids must be a non-empty list of ints")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt_token_ids):
            raise ValueError(f"request {request_id}: prompt_token_ids must hold ints >= 0")
        if not isinstance(sampling_params, SamplingParams):
            raise ValueError(
                f"request {request_id}: sampling_params must be SamplingParams, "
                f"got {type(sampling_params).__name__}"
            )
        if pic is not None and not isinstance(pic, PicState):
            raise ValueError(f"request {request_id}: pic must be a PicState or None, got {type(pic).__name__}")
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.output_token_ids: list[int] = []
        # per output token {token_id: Logprob} (the sampled token and the top ones) when
        # sampling_params.logprobs is set; None otherwise
        self.output_logprobs: list[dict] | None = [] if sampling_params.logprobs is not None else None
        # another completion of the same prompt whose first token this one waits for
        # (LLMEngine.add_request's ``start_after``)
        self.waits_for: "Request | None" = None
        # vLLM's shape: None for the first prompt token (nothing before it), then one dict a token
        self.prompt_logprobs: list[dict | None] | None = (
            [None] if sampling_params.prompt_logprobs is not None else None)
        self.output_text = ""
        self.status = RequestStatus.WAITING
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None  # the stop token id or stop string that fired
        self.num_computed_tokens = 0
        now = time.monotonic() if arrival_time is None else arrival_time
        self.metrics = RequestMetrics(arrival_time=now, prompt_tokens=len(self.prompt_token_ids))
        # Incremental detokenisation window (vLLM's prefix/read offsets into output_token_ids):
        # text of [prefix_offset, read_offset) is already in output_text.
        self.detok_prefix_offset = 0
        self.detok_read_offset = 0
        self.cache: Optional["SequenceCache"] = None
        self.generator: Optional["torch.Generator"] = None
        self.pic = pic
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise ValueError(f"request {request_id}: cache_salt must be a string or None, got {type(cache_salt).__name__}")
        # the tenant whose cache entries the request may use and writes (store keys carry it)
        self.cache_salt = cache_salt
        # set by the engine when the prefix cache plans the request's chunked prefill
        # (hypic.pic.plan.RequestPlan: the checkpoints it resumes from and those it writes)
        self.prefix_plan: Optional["RequestPlan"] = None
        # set by the engine when a PIC request's prefill is spread over several steps
        self.pic_stages: Optional[PicStages] = None

    @property
    def atomic_prefill(self) -> bool:
        return self.pic is not None

    @property
    def prefill_started(self) -> bool:
        """Whether a step has computed part of the prompt (or an earlier stage of it)."""
        return self.num_computed_tokens > 0 or (self.pic_stages is not None and self.pic_stages.done > 0)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_uncomputed_prompt_tokens(self) -> int:
        return max(self.num_prompt_tokens - self.num_computed_tokens, 0)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def finish(self, reason: str, stop_reason: int | str | None = None, now: float | None = None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.metrics.finished_time = time.monotonic() if now is None else now

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.value}, prompt={self.num_prompt_tokens}, "
            f"computed={self.num_computed_tokens}, output={self.num_output_tokens})"
        )
