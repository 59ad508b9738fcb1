"""The pieces a request's layout is made of before they become elements (hypic/runner/layout.py):
live runs with the writes at their ends, cut to a chunk of a chunked prefill, cut at the prefix
cache's checkpoints and merged where nothing needs their bounds; and a chunk's prefix, the
request's own cache so far.

A piece is a :class:`~hypic.runner.layout.BodyElement` or a live run ``[tokens, start, writes,
in_body]`` (``in_body``: a part of a written segment's body, whose summary must cover that body
alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

from hypic.engine.context import SequenceCache
from hypic.models.config import LINEAR_ATTENTION, ModelSpec
from hypic.pic.keys import KeyNamespace, resume_key
from hypic.pic.payload import AttentionLayerCache, LinearStateCheckpoint, SegmentEntry
from hypic.pic.prefix import CheckpointWrite
from hypic.runner.layout import WRITE_CHECKPOINT, BodyElement, Write


@dataclass(frozen=True)
class ChunkWindow:
    """One chunk of a chunked prefill (:meth:`PicRunner.prefill`): the prompt's tokens
    ``[start, end)``, continuing ``resume`` (the request's cache after ``start`` tokens, as a
    :func:`resume_entry`; None at the first chunk)."""

    start: int
    end: int
    resume: Optional[SegmentEntry] = None

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"a chunk needs 0 <= start < end, got [{self.start}, {self.end})")
        if self.resume is not None and self.resume.num_tokens != self.start:
            raise ValueError(f"a chunk from {self.start} resumes a cache of {self.resume.num_tokens} tokens")


def resume_entry(cache: SequenceCache, spec: ModelSpec, namespace: KeyNamespace,
                 token_ids: Sequence[int]) -> SegmentEntry:
    """A request's own cache after ``token_ids`` as the prefix of its next chunk: per linear
    layer its states (a checkpoint's form), per full-attention layer its K/V; never stored."""
    if cache.num_tokens != len(token_ids):
        raise ValueError(f"the cache holds {cache.num_tokens} tokens, not {len(token_ids)}")
    linear, attention = {}, {}
    for i, (kind, layer) in enumerate(zip(spec.layer_types, cache.layers)):
        if kind == LINEAR_ATTENTION:
            linear[i] = LinearStateCheckpoint(layer.recurrent_state, layer.conv_state)
        else:
            attention[i] = AttentionLayerCache(layer.keys, layer.values)
    return SegmentEntry(resume_key(namespace, token_ids), linear=linear, attention=attention)


def clip_pieces(pieces: List[object], start: int, end: int) -> List[object]:
    """The live runs of ``pieces`` (no bodies: a chunked prefill's plan is its query) cut to the
    positions ``[start, end)``."""
    out = []
    for p in pieces:
        if isinstance(p, BodyElement):
            raise ValueError("a chunked prefill's plan holds no cached bodies")
        tokens, at, writes, in_body = p
        a, b = max(start, at), min(end, at + len(tokens))
        if a < b:
            if writes and b != at + len(tokens):
                raise ValueError("a chunk cannot end inside a written span")
            out.append([tokens[a - at: b - at], a, writes if b == at + len(tokens) else (), in_body])
    return out


def split_at_checkpoints(pieces: List[object], checkpoints: Sequence[CheckpointWrite]) -> List[object]:
    """Live runs cut at every checkpoint's position, each checkpoint's write on the run ending
    there (after a segment write ending at the same place, if any)."""
    at = {c.position: Write(WRITE_CHECKPOINT, c.key, c.kv_start, c.kv_start) for c in checkpoints}
    if not at:
        return pieces
    out: List[object] = []
    for p in pieces:
        if isinstance(p, BodyElement):
            out.append(p)
            continue
        tokens, start, writes, in_body = p
        end = start + len(tokens)
        cuts = sorted(q for q in at if start < q <= end)
        a = start
        for q in cuts:
            run_writes = (writes if q == end else ()) + (at[q],)
            out.append([tokens[a - start: q - start], a, run_writes, in_body])
            a = q
        if a < end:
            out.append([tokens[a - start:], a, writes, in_body])
    return out


def merge_live(pieces: List[object]) -> List[object]:
    """Consecutive live runs as one where the first records nothing and the second is no part
    of a written segment's body (whose summary covers that body alone): tiny segments below the
    caching threshold, a miss and the next seam, ... run as one span."""
    out: List[object] = []
    for p in pieces:
        prev = out[-1] if out else None
        if (prev is not None and not isinstance(p, BodyElement) and not isinstance(prev, BodyElement)
                and not prev[2] and not p[3]):
            out[-1] = [prev[0] + p[0], prev[1], p[2], False]
        else:
            out.append(p)
    return out


__all__ = ["ChunkWindow", "clip_pieces", "merge_live", "resume_entry", "split_at_checkpoints"]
