"""Request plans: a prompt becomes ordered spans with absolute positions and live token ranges.

Span kinds (architecture.md section 2):

| kind   | live range (relative)  | reused                                  |
| ------ | ---------------------- | --------------------------------------- |
| HIT    | ``[0, w_eff)`` (seam)  | the body ``[w_eff, L)`` from the entry  |
| MISS   | ``[0, L)``             | nothing; the body may be written        |
| QUERY  | ``[0, L)``             | nothing, never cached                   |

Before them, the **prefix**: the longest chain of prefix-cache checkpoints the store holds for the
prompt's tokens (:mod:`hypic.pic.prefix`; every mode but ``full_recompute`` when the caller passes
``prefix_block_tokens``). Spans cover only what follows it: a segment it ends inside becomes a
MISS span of the segment's remaining tokens (``offset``: where they start in the segment), which
writes nothing; the query likewise. The plan lists the checkpoints the request writes
(``checkpoints``): the spine's block boundaries and the prompt's last position but one (every
mode), and in ``prefix_cache`` mode each segment's end, all within the exact region (up to the
first reused body).

Rules
* The **first** segment's window is recomputed too. For a segment at position 0 whose entry was
  made at position 0 (standalone, or the same first segment earlier) the seam then runs from the
  zero state exactly as in the cached run, so the HIT is exact.
* A segment whose window covers it (``w_eff == L``) has no body: it is planned as MISS with
  ``writes_entry=False`` and never touches the store.
* **Repeated segments in one request** (same document twice): the store is consulted once per
  distinct key. If the entry exists, every occurrence is a HIT on that one handle. If it does not:
  with the ``inline`` policy **every occurrence is a MISS** (computed live with its true prefix,
  so an all-MISS request stays exactly equal to full recompute) and only the first occurrence
  writes the entry (``writes_entry``); with the ``standalone`` policy the segment is prefilled once
  at position 0 and every occurrence is a HIT on that fresh entry (``entry_source="standalone"``).
* A segment shorter than the policy's ``segment_min_tokens`` is never cached: it is planned as a
  MISS that writes nothing (like a segment its seam covers), so it runs live with its neighbours.
* ``prefix_cache``: every segment after the prefix is MISS, none writes a segment entry; the
  checkpoints carry its caching. ``full_recompute`` makes every segment a MISS without store
  access.

A :class:`RequestPlan` holds store handles for everything it reuses, so nothing it planned on can
be evicted; release it (``with plan:`` or ``plan.release()``) when the request's prefill is done.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from enum import Enum
from operator import attrgetter
from typing import Any, List, Optional, Sequence, Tuple

from hypic.pic.frozen import frozen_constructor
from hypic.pic.keys import Keyer, StoreKey
from hypic.pic.modes import COLD_CANONICAL, COLD_STANDALONE, RequestPolicy
from hypic.pic.prefix import CheckpointWrite, match_prefix, plan_checkpoints
from hypic.pic.segments import SegmentedPrompt
from hypic.pic.store import SegmentHandle, SegmentStore


class SpanKind(str, Enum):
    HIT = "hit"
    MISS = "miss"
    QUERY = "query"


ENTRY_FROM_STORE = "store"
ENTRY_FROM_STANDALONE = "standalone"


@dataclass(frozen=True)
class Span:
    """One segment (or the query) of a request. Ranges are relative to the span's start."""

    kind: SpanKind
    segment_index: int  # -1 for the query
    start: int  # absolute position of the span's first token
    num_tokens: int
    live_end: int  # live tokens are [0, live_end); w_eff for HIT, num_tokens otherwise
    body_start: int  # body = [body_start, num_tokens): reused (HIT) or stored (MISS writer)
    key: Optional[StoreKey] = None  # segment key (segment-store modes)
    entry_index: int = -1  # index into RequestPlan.handles (HIT from store); else -1
    entry_source: Optional[str] = None  # HIT: "store" or "standalone"
    writes_entry: bool = False  # MISS: this occurrence's body goes to the store
    offset: int = 0  # index of the span's first token in its segment (or the query)

    @property
    def live_num_tokens(self) -> int:
        return self.live_end

    @property
    def body_num_tokens(self) -> int:
        return self.num_tokens - self.body_start

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


_make_span = frozen_constructor(Span)  # Span(...) with every field given, ~0.7 us less (hypic.pic.frozen)


@dataclass(eq=False)
class RequestPlan:
    """A request's spans plus the store handles it holds while it runs.

    ``prefix_handles``: the prefix-cache checkpoints it resumes from (root first; their K/V cover
    its first ``prefix_tokens`` tokens, the last one's states are where its spans start);
    ``checkpoints``: those it writes."""

    prompt: SegmentedPrompt
    policy: RequestPolicy
    spans: Tuple[Span, ...]
    handles: Tuple[SegmentHandle, ...]
    request_id: Any = None
    prefix_handles: Tuple[SegmentHandle, ...] = ()
    prefix_tokens: int = 0
    checkpoints: Tuple[CheckpointWrite, ...] = ()

    def __post_init__(self):
        self._released = False

    # -- reporting -------------------------------------------------------------------------
    @property
    def prompt_tokens(self) -> int:
        return self.prompt.num_tokens

    @property
    def cached_tokens(self) -> int:
        """Tokens reused from segment entries that were already stored (segment hits)."""
        return sum(
            s.body_num_tokens for s in self.spans
            if s.kind is SpanKind.HIT and s.entry_source == ENTRY_FROM_STORE
        )

    @property
    def prefix_hit_tokens(self) -> int:
        """Tokens reused from prefix-cache checkpoints."""
        return self.prefix_tokens

    @property
    def live_tokens(self) -> int:
        """Tokens computed in the request's own (main) pass."""
        return sum(s.live_num_tokens for s in self.spans)

    @property
    def standalone_segments(self) -> Tuple[int, ...]:
        """Segment indices (first occurrences) prefilled alone at position 0: before the main pass
        under the ``standalone`` cold policy, after it (their canonical entries) under ``canonical``."""
        canonical = self.policy.cold_policy == COLD_CANONICAL and self.policy.mode.uses_segment_store
        seen, out = set(), []
        for s in self.spans:
            alone = s.entry_source == ENTRY_FROM_STANDALONE or (canonical and s.kind is SpanKind.MISS and s.writes_entry)
            if alone and s.key not in seen:
                seen.add(s.key)
                out.append(s.segment_index)
        return tuple(out)

    @property
    def standalone_tokens(self) -> int:
        return sum(len(self.prompt.segments[i]) for i in self.standalone_segments)

    @property
    def resume_handle(self) -> Optional[SegmentHandle]:
        """The prefix checkpoint whose states the request resumes from (None without a prefix)."""
        return self.prefix_handles[-1] if self.prefix_handles else None

    def release_prefix(self) -> None:
        """Drop the holds on the prefix checkpoints (a chunked prefill does once its first chunk
        has copied their K/V into the request's own cache); idempotent."""
        for h in self.prefix_handles:
            h.release()

    # -- lifetime --------------------------------------------------------------------------
    def release(self) -> None:
        if not self._released:
            self._released = True
            for h in self.handles:
                h.release()
            self.release_prefix()

    @property
    def released(self) -> bool:
        return self._released

    def __enter__(self) -> "RequestPlan":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _check_context(prompt: SegmentedPrompt, max_model_len: Optional[int]) -> None:
    if max_model_len is None:
        return
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len <= 0:
        raise ValueError(f"max_model_len: expected int > 0, got {max_model_len!r}")
    if prompt.num_tokens > max_model_len:
        raise ValueError(
            f"prompt has {prompt.num_tokens} tokens, more than the context length {max_model_len}"
        )


def plan_request(
    prompt: SegmentedPrompt,
    policy: RequestPolicy,
    *,
    store: Optional[SegmentStore] = None,
    keyer: Optional[Keyer] = None,
    max_model_len: Optional[int] = None,
    tenant_salt: Optional[str] = None,
    request_id: Any = None,
    segment_keys: Optional[Sequence[Optional[StoreKey]]] = None,
    prefix_block_tokens: Optional[int] = None,
) -> RequestPlan:
    """Plan one request, acquiring store handles for what it reuses.

    ``segment_keys``: what :func:`segment_keys` returned for this prompt, policy, keyer and
    tenant, when the caller already keyed it (an engine does, to charge the scheduler): keying
    hashes every token, so a 64-segment prompt is not keyed twice. Only their number is checked:
    keys made under another seam or tenant are the caller's error. ``prefix_block_tokens``: the
    prefix cache's spine spacing (:mod:`hypic.pic.prefix`), None without a prefix cache (it is
    never used in ``full_recompute`` mode, and ``prefix_cache`` mode needs it).

    Raises ValueError (before acquiring anything) on bad input, so an engine can reject this
    request and keep serving others.
    """
    if not isinstance(prompt, SegmentedPrompt):
        raise ValueError(f"prompt: expected SegmentedPrompt, got {type(prompt).__name__}")
    if not isinstance(policy, RequestPolicy):
        raise ValueError(f"policy: expected RequestPolicy, got {type(policy).__name__}")
    _check_context(prompt, max_model_len)
    mode = policy.mode
    if mode.uses_prefix_checkpoints and prefix_block_tokens is None:
        raise ValueError(f"mode {mode.name!r} needs the prefix cache (prefix_block_tokens)")
    use_prefix = prefix_block_tokens is not None and mode.name != "full_recompute"
    if (mode.uses_segment_store or use_prefix) and (store is None or keyer is None):
        raise ValueError(f"mode {mode.name!r} needs a store and a keyer")
    starts = prompt.segment_starts
    if mode.uses_segment_store:
        windows = _seam_windows(prompt, policy)
        if segment_keys is None:
            segment_keys = _segment_keys(prompt, windows, keyer, tenant_salt)
        elif len(segment_keys) != len(prompt.segments):
            raise ValueError(f"segment_keys: {len(segment_keys)} keys for {len(prompt.segments)} segments")
    handles: List[SegmentHandle] = []
    prefix_handles: List[SegmentHandle] = []
    try:
        tokens = prompt.token_ids
        num_tokens = len(tokens)
        prefix = 0
        if use_prefix:
            prefix_handles, prefix = match_prefix(store, keyer, tokens, block_tokens=prefix_block_tokens,
                                                  limit=num_tokens - 1, tenant_salt=tenant_salt)
        # the first segment not wholly inside the prefix
        first = bisect_right(starts, prefix) - 1
        spans: List[Span] = []
        if first < len(prompt.segments) and prefix > starts[first]:
            # the prefix ends inside it: its remaining tokens run live and write nothing
            seg_len = len(prompt.segments[first])
            rest = starts[first] + seg_len - prefix
            spans.append(Span(SpanKind.MISS, first, prefix, rest, rest, rest, offset=prefix - starts[first]))
            first += 1
        if mode.uses_segment_store:
            spans += _plan_segments(prompt, policy, windows, starts, store, segment_keys, handles, first)
        else:
            spans += [Span(SpanKind.MISS, i, starts[i], len(s), len(s), len(s))
                      for i, s in enumerate(prompt.segments) if i >= first]
        q = len(prompt.query)
        skip = max(0, prefix - starts[-1])
        spans.append(Span(SpanKind.QUERY, -1, starts[-1] + skip, q - skip, q - skip, q - skip, offset=skip))
        checkpoints: Tuple[CheckpointWrite, ...] = ()
        if use_prefix:
            exact_end = num_tokens - 1
            for s in spans:
                if s.kind is SpanKind.HIT:
                    exact_end = min(exact_end, s.start + s.body_start)
                    break
            leaves = [exact_end] if exact_end == num_tokens - 1 else []
            if mode.uses_prefix_checkpoints:
                leaves += starts[1:]
            checkpoints = plan_checkpoints(keyer, tokens, block_tokens=prefix_block_tokens,
                                           found=[h.key for h in prefix_handles], start=prefix, end=exact_end,
                                           leaves=leaves, tenant_salt=tenant_salt)
    except BaseException:
        for h in handles + list(prefix_handles):
            h.release()
        raise
    return RequestPlan(prompt, policy, tuple(spans), tuple(handles), request_id, tuple(prefix_handles), prefix,
                       checkpoints)


def segment_keys(
    prompt: SegmentedPrompt, policy: RequestPolicy, keyer: Keyer, tenant_salt: Optional[str] = None
) -> Tuple[Optional[StoreKey], ...]:
    """Store key of each segment's body under ``policy``'s seam (None where the seam covers the
    segment: no body to reuse), for :func:`plan_request` and for an engine's scheduler charge."""
    if not isinstance(prompt, SegmentedPrompt):
        raise ValueError(f"prompt: expected SegmentedPrompt, got {type(prompt).__name__}")
    return _segment_keys(prompt, _seam_windows(prompt, policy), keyer, tenant_salt)


def _seam_windows(prompt: SegmentedPrompt, policy: RequestPolicy) -> List[int]:
    """``w_eff`` of each segment, computed once per distinct length (segments mostly share one;
    the keys and the spans both need them), the rest by C-level maps."""
    lengths = list(map(len, prompt.segments))
    by_length = {num: policy.live_tokens(num) for num in dict.fromkeys(lengths)}
    return list(map(by_length.__getitem__, lengths))


def _segment_keys(prompt, windows, keyer, tenant_salt) -> Tuple[Optional[StoreKey], ...]:
    return keyer.segment_keys(prompt.segments, windows, tenant_salt=tenant_salt)


# Besides an index into the plan's handles (a store hit), what a key's first occurrence in a
# request found: a miss whose segment is prefilled standalone, or one that runs live (inline) and
# writes the entry, then (its later occurrences) one that runs live unwritten.
_PENDING = -1
_COLD = -2
_MISSED = -3


def _plan_segments(prompt, policy, windows, starts, store, keys, handles, first: int = 0) -> List[Span]:
    """Spans of segments ``first..`` (those before lie in the prefix)."""
    segments = prompt.segments[first:]
    windows, starts, keys = windows[first:], starts[first:], keys[first:]
    outcomes = _segment_outcomes(segments, windows, store, keys, handles, policy.cold_policy == COLD_STANDALONE)
    make = _make_span
    hit, miss = SpanKind.HIT, SpanKind.MISS
    spans: List[Span] = []
    for i, (seg, w, start, key, outcome) in enumerate(zip(segments, windows, starts, keys, outcomes), first):
        num = len(seg)
        if w == num:  # the seam covers the segment (or it is too short to cache): live, nothing stored
            spans.append(make(miss, i, start, num, num, num, None, -1, None, False, 0))
        elif outcome >= 0:
            spans.append(make(hit, i, start, num, w, w, key, outcome, ENTRY_FROM_STORE, False, 0))
        elif outcome == _PENDING:
            spans.append(make(hit, i, start, num, w, w, key, -1, ENTRY_FROM_STANDALONE, False, 0))
        elif outcome == _COLD:  # the first occurrence of a cold segment (inline): live, written
            spans.append(make(miss, i, start, num, num, w, key, -1, None, True, 0))
        else:  # a repeated cold segment under the inline policy: live again, not written again
            spans.append(make(miss, i, start, num, num, w, key, -1, None, False, 0))
    return spans


_DIGEST = attrgetter("digest")


def _segment_outcomes(segments, windows, store, keys, handles, standalone: bool) -> list:
    """Per segment, what its key found (None where the seam covers it): a handle index (appended
    to ``handles``), _PENDING, _COLD (its first occurrence) or _MISSED (a later one). Every
    distinct key with a body is acquired in order of first occurrence by one store call (as one
    acquire per key would, in the same order)."""
    body = [i for i, (w, seg) in enumerate(zip(windows, segments)) if w != len(seg)]
    body_keys = [keys[i] for i in body]
    outcomes: list = [None] * len(segments)
    if len(set(map(_DIGEST, body_keys))) == len(body_keys):
        # no key twice (equal keys have one digest): no look-up by key (its hash is a Python call)
        for i, handle in zip(body, store.acquire_many(body_keys)):
            if handle is not None:
                outcomes[i] = len(handles)
                handles.append(handle)
            else:
                outcomes[i] = _PENDING if standalone else _COLD
        return outcomes
    found = dict.fromkeys(body_keys)  # key -> outcome of its next occurrence
    for key, handle in zip(list(found), store.acquire_many(list(found))):
        if handle is not None:
            found[key] = len(handles)
            handles.append(handle)
        else:
            found[key] = _PENDING if standalone else _COLD
    for i, key in zip(body, body_keys):
        outcomes[i] = outcome = found[key]
        if outcome == _COLD:
            found[key] = _MISSED
    return outcomes
