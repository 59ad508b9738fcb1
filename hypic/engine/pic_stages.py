"""Staged prefill of segmented prompts: the ``standalone`` cold policy's first pass spread over
steps, so a long cold segmented prompt obeys the per-step token budget as a plain one does.

Under ``standalone`` a cold segment is first prefilled alone at position 0 (its canonical store
entry), then the request runs all-hit: only its seam windows and query are live. When the cold
segments of a request exceed the step budget, :func:`plan_stages` lists them and the scheduler
gives each step's stage the segments that fit its budget (half of it while other requests wait
behind, as for a plain prompt's chunk; a segment longer than that runs alone), one stage a step
(:func:`run_stage`), the request's own forward last. Between stages other
requests prefill and decode: running streams are never frozen for the whole cold prompt. The
entries a stage writes stay acquired by the request until its last stage has run, so nothing
evicts them in between; an abort releases them (:meth:`PicStages.release`).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from hypic.engine.request import PicStages, PicState
from hypic.pic.modes import COLD_STANDALONE
from hypic.pic.plan import ENTRY_FROM_STORE, RequestPlan, SpanKind


def plan_stages(pic: PicState, store, max_num_batched_tokens: int) -> Optional[PicStages]:
    """The stages of a PIC request, or None when it is prefilled in one step as before (not the
    standalone policy, no segment store, or its cold segments and own forward fit one step)."""
    if pic.policy.cold_policy != COLD_STANDALONE or pic.segment_keys is None or store is None:
        return None
    cold: Dict[object, Tuple[Tuple[int, ...], int]] = {}
    own_tokens = len(pic.prompt.query)  # the request's own forward once every segment is cached
    for seg, key in zip(pic.prompt.segments, pic.segment_keys):
        body_start = pic.policy.live_tokens(len(seg))
        own_tokens += body_start if key is not None else len(seg)
        if key is not None and key not in cold and key not in store:
            cold[key] = (tuple(seg), body_start)
    cold_tokens = sum(len(seg) for seg, _ in cold.values())
    if not cold or cold_tokens + own_tokens <= max_num_batched_tokens:
        return None
    items = [(key, seg, body_start) for key, (seg, body_start) in cold.items()]
    return PicStages([len(seg) for _, seg, _ in items], items, own_tokens)


def run_stage(stages: PicStages, runner, store) -> None:
    """Prefill the stage the scheduler picked (cold segments alone at position 0) and keep their
    entries acquired (a segment another request stored meanwhile is acquired instead)."""
    todo: Dict[object, Tuple[Tuple[int, ...], int]] = {}
    for key, seg, body_start in stages.pop_stage():
        handle = store.acquire(key)
        if handle is not None:
            stages.held.append(handle)
        else:
            todo[key] = (seg, body_start)
    handles = runner.prefill_standalone(todo)
    stages.held.extend(handles.values())
    stages.written.update(handles)
    stages.standalone_tokens += sum(len(seg) for seg, _ in todo.values())


def own_cached_tokens(plan: RequestPlan, stages: Optional[PicStages]) -> int:
    """Tokens the request reused from entries it did not write itself: the plan's segment hits
    less those on entries its own stages wrote (computed for it, as a one-step standalone pass's
    are, which the plan does not count)."""
    if stages is None or not stages.written:
        return plan.cached_tokens
    return sum(s.body_num_tokens for s in plan.spans
               if s.kind is SpanKind.HIT and s.entry_source == ENTRY_FROM_STORE and s.key not in stages.written)


__all__ = ["own_cached_tokens", "plan_stages", "run_stage"]
