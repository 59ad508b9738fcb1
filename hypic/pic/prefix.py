"""Automatic prefix caching: checkpoints of the exact state at positions of the token stream.

A prompt's tokens (its segments and query, concatenated) are cut into blocks of ``block_tokens``.
A **checkpoint** after position ``p`` is a store entry (:data:`~hypic.pic.keys.KIND_PREFIX` key)
holding per linear layer the recurrent state and conv state after ``p`` tokens, and per
full-attention layer the K/V of the tokens since its parent. Checkpoints form chains:

* the **spine**: one checkpoint at every block boundary, each the child of the one before (its
  K/V: the block's tokens);
* **leaves**: a checkpoint at a position between two block boundaries (the end of a prompt, or
  in ``prefix_cache`` mode the end of a segment), the child of the spine checkpoint before it
  (its K/V: the tokens since that one). A leaf has no children.

A request looks up the longest chain the store holds for its tokens (:func:`match_prefix`): the
spine block by block, then the longest leaf under the last spine checkpoint found whose tokens
start the rest of the prompt (the end of an earlier, shorter prompt: the previous turn of a
chat). It resumes from the state of the last checkpoint found and attends to every checkpoint's
K/V; at least one prompt token is always computed (its logits are sampled). It writes the
checkpoints of its own prompt past what it found, within the **exact region**: the tokens whose
state it computes exactly (everything, unless it reuses a segment body: PIC's approximation
starts there, and a checkpoint must hold what a full recompute would).

Spacing: a checkpoint of the spine costs the linear layers' states whatever the block's length,
and a block's K/V costs its length. :func:`default_block_tokens` spaces the spine so that a
checkpoint costs at most the K/V of its block: a cached prompt then takes at most twice the bytes
of its K/V plus one state (docs/decisions.md has the measurement behind it,
benchmarks/results/prefix_spacing/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

from hypic.pic.keys import Keyer, StoreKey
from hypic.pic.store import SegmentHandle, SegmentStore

# block boundaries fall on multiples of this (the chunk length of the linear-attention kernels)
BLOCK_MULTIPLE_TOKENS = 64


def default_block_tokens(checkpoint_bytes: int, kv_bytes_per_token: int) -> int:
    """The spine spacing of a model: the smallest multiple of :data:`BLOCK_MULTIPLE_TOKENS` tokens
    whose K/V bytes reach one checkpoint's state bytes (a model without full-attention layers,
    whose tokens cost no K/V, gets the multiple itself)."""
    for name, value in (("checkpoint_bytes", checkpoint_bytes), ("kv_bytes_per_token", kv_bytes_per_token)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: expected int >= 0, got {value!r}")
    if kv_bytes_per_token == 0:
        return BLOCK_MULTIPLE_TOKENS
    tokens = -(-checkpoint_bytes // kv_bytes_per_token)
    return max(BLOCK_MULTIPLE_TOKENS, -(-tokens // BLOCK_MULTIPLE_TOKENS) * BLOCK_MULTIPLE_TOKENS)


@dataclass(frozen=True)
class CheckpointWrite:
    """A checkpoint a request writes: the state after ``position`` tokens, the K/V of
    ``[kv_start, position)`` (``kv_start``: its parent's position), under ``key``."""

    position: int
    kv_start: int
    key: StoreKey


def match_prefix(store: SegmentStore, keyer: Keyer, tokens: Tuple[int, ...], *, block_tokens: int, limit: int,
                 tenant_salt: Optional[str] = None) -> Tuple[List[SegmentHandle], int]:
    """Hold the longest stored chain of checkpoints for ``tokens`` that ends at or before
    ``limit``: ``(handles root first, tokens covered)``. The chain is touched leaf first (the
    store's LRU then evicts its end before its start)."""
    _check_block(block_tokens)
    root = keyer.prefix_root(tenant_salt=tenant_salt)
    namespace = keyer.namespace if tenant_salt is None else keyer.namespace.with_salt(tenant_salt)
    handles: List[SegmentHandle] = []
    parent: Optional[StoreKey] = None
    parent_digest, position = root, 0
    try:
        while position + block_tokens <= limit:
            key = keyer.prefix_key(parent, tokens[position:position + block_tokens], tenant_salt=tenant_salt,
                                   root=root)
            handle = store.acquire(key)
            if handle is None:
                break
            handles.append(handle)
            parent = handle.key
            parent_digest, position = parent.digest, position + block_tokens
        if position < limit:
            # a leaf is shorter than a block: no more of the prompt is compared
            rest = tuple(tokens[position:min(limit, position + block_tokens)])
            leaf = store.acquire_prefix_child(parent, parent_digest, namespace, rest)
            if leaf is not None:
                handles.append(leaf)
                position += leaf.key.num_tokens
    except BaseException:
        for h in handles:
            h.release()
        raise
    store.touch([h.key for h in reversed(handles)])
    return handles, position


def plan_checkpoints(keyer: Keyer, tokens: Tuple[int, ...], *, block_tokens: int, found: Sequence[StoreKey],
                     start: int, end: int, leaves: Iterable[int] = (),
                     tenant_salt: Optional[str] = None) -> Tuple[CheckpointWrite, ...]:
    """The checkpoints a request writes past the ``start`` tokens it found (``found``: the keys
    of that chain, root first) up to ``end``: the spine's block boundaries in ``(start, end]``
    and the ``leaves`` positions there (duplicates and block boundaries among them are the
    spine's)."""
    _check_block(block_tokens)
    if not 0 <= start <= len(tokens) or end > len(tokens):
        raise ValueError(f"start {start} / end {end} outside the prompt's {len(tokens)} tokens")
    positions = set(range((start // block_tokens + 1) * block_tokens, end + 1, block_tokens))
    positions.update(q for q in leaves if start < q <= end)
    if not positions:
        return ()
    # spine checkpoints by position: those found, then those written here
    spine = {}
    at = 0
    for key in found:
        at += key.num_tokens
        if at % block_tokens == 0 and key.num_tokens == block_tokens:
            spine[at] = key
    root = keyer.prefix_root(tenant_salt=tenant_salt)
    writes: List[CheckpointWrite] = []
    for q in sorted(positions):
        a = q - block_tokens if q % block_tokens == 0 else q - q % block_tokens
        parent = spine.get(a) if a > 0 else None
        if a > 0 and parent is None:
            raise ValueError(f"no spine checkpoint at {a} below the checkpoint at {q}")
        key = keyer.prefix_key(parent, tokens[a:q], tenant_salt=tenant_salt, root=root)
        if q % block_tokens == 0:
            spine[q] = key
        writes.append(CheckpointWrite(q, a, key))
    return tuple(writes)


def _check_block(block_tokens: int) -> None:
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise ValueError(f"block_tokens: expected int >= 1, got {block_tokens!r}")


__all__ = ["BLOCK_MULTIPLE_TOKENS", "CheckpointWrite", "default_block_tokens", "match_prefix", "plan_checkpoints"]
