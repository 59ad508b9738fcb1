"""Store keys for segment entries and prefix-cache checkpoints.

A key's ``digest`` is a hash (sha256 by default; injectable so tests can force collisions) of

    kind | model id | dtype | tenant salt | body start (the seam setting, resolved) | token ids

The seam enters as the resolved body start ``w_eff`` (the entry stores the body ``[w_eff, L)``),
so two seam settings that give the same body share entries and those that do not never mix.
A digest match alone is never trusted: :class:`StoreKey` equality also compares the full key
material (namespace and token ids), so a colliding digest is a miss, not a wrong hit. Python's
dict then chains colliding keys for free; the store counts the collisions it sees.

Prefix keys (the automatic prefix cache, :mod:`hypic.pic.prefix`) chain: the key of a checkpoint
after tokens ``[a, p)`` hashes its parent's digest (the checkpoint at ``a``, or the namespace's
root) and those tokens, and its material is ``(parent key, tokens, parent digest)``. Equality
walks both chains (a parent compared by identity first: a request that found a chain in the store
builds on the stored key objects, so a hit compares one block of tokens, not the whole prefix),
so two different prefixes never share a key, whatever the hash function.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

HashFn = Callable[[bytes], bytes]

KIND_SEGMENT = "segment"
KIND_PREFIX = "prefix"
# a request's own running cache as the prefix of its next prefill chunk (never stored)
KIND_RESUME = "resume"


def sha256_digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _field(b: bytes) -> bytes:
    # Length-prefixed so that no two different field lists serialise to the same bytes.
    return struct.pack("<Q", len(b)) + b


def _token_bytes(token_ids: Sequence[int]) -> bytes:
    return np.asarray(token_ids, dtype="<i8").tobytes()


def _int_tuple(token_ids: Sequence[int]) -> Tuple[int, ...]:
    """``tuple(int(t) for t in token_ids)`` without the Python loop in the common cases: a 32k-token
    prompt's segments are keyed on every request, and that loop cost ~5 ms per pass there. A
    tuple of plain ints (what prompts hold) is returned as is; other integer sequences go through
    numpy."""
    if type(token_ids) is tuple and token_ids and set(map(type, token_ids)) == {int}:
        return token_ids
    if isinstance(token_ids, (tuple, list)) and token_ids:
        arr = np.asarray(token_ids)
        if arr.ndim == 1 and arr.dtype.kind in "iu":
            return tuple(arr.tolist())
    return tuple(int(t) for t in token_ids)


@dataclass(frozen=True)
class KeyNamespace:
    """What besides the tokens decides an entry's content: model, dtype, tenant."""

    model_id: str
    dtype: str
    tenant_salt: Optional[str] = None

    def __post_init__(self):
        if not isinstance(self.model_id, str) or not self.model_id:
            raise ValueError("model_id: must be a non-empty string")
        if not isinstance(self.dtype, str) or not self.dtype:
            raise ValueError("dtype: must be a non-empty string (e.g. 'float32', 'bfloat16')")
        if self.tenant_salt is not None and not isinstance(self.tenant_salt, str):
            raise ValueError("tenant_salt: must be a string or None")

    def with_salt(self, tenant_salt: Optional[str]) -> "KeyNamespace":
        return KeyNamespace(self.model_id, self.dtype, tenant_salt)

    def encode(self) -> bytes:
        salt = b"\x00" if self.tenant_salt is None else b"\x01" + self.tenant_salt.encode()
        return _field(self.model_id.encode()) + _field(self.dtype.encode()) + _field(salt)


@dataclass(frozen=True, eq=False)
class StoreKey:
    """Key of one store entry. Hash = digest; equality = digest and full material."""

    digest: bytes
    kind: str
    namespace: KeyNamespace
    body_start: int
    # Segment (and resume): the token ids. Prefix: (parent key or None, tokens, parent digest).
    material: tuple = field(repr=False)

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other) -> bool:
        if not isinstance(other, StoreKey):
            return NotImplemented
        a, b = self, other
        while True:  # a loop, not recursion: a 128k-token prefix chain is hundreds of keys deep
            if a is b:
                return True
            if a is None or b is None:
                return False
            if (a.digest != b.digest or a.kind != b.kind or a.body_start != b.body_start
                    or a.namespace != b.namespace):
                return False
            if a.kind != KIND_PREFIX:
                return a.material == b.material
            if a.material[1] != b.material[1] or a.material[2] != b.material[2]:
                return False
            a, b = a.material[0], b.material[0]

    @property
    def token_ids(self) -> Tuple[int, ...]:
        """Segment: its tokens. Prefix checkpoint: the tokens since its parent."""
        return self.material[1] if self.kind == KIND_PREFIX else self.material

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def parent(self) -> Optional["StoreKey"]:
        """Prefix checkpoint: the checkpoint it continues (None at the root); else None."""
        return self.material[0] if self.kind == KIND_PREFIX else None

    @property
    def parent_digest(self) -> Optional[bytes]:
        """Prefix checkpoint: its parent's digest (the namespace's root digest at the root)."""
        return self.material[2] if self.kind == KIND_PREFIX else None

    @property
    def position(self) -> int:
        """Prefix checkpoint: how many prompt tokens it covers (its chain's tokens)."""
        total, key = 0, self
        while key is not None:
            total += len(key.token_ids)
            key = key.parent
        return total

    def prefix_token_ids(self) -> Tuple[int, ...]:
        """Prefix checkpoint: every token of its chain, root first."""
        parts, key = [], self
        while key is not None:
            parts.append(key.token_ids)
            key = key.parent
        return tuple(t for part in reversed(parts) for t in part)

    @property
    def short(self) -> str:
        return self.digest[:8].hex()


MEMO_SEGMENT_KEYS = 8192  # segment keys a Keyer remembers (most recently used)
PROBE_SAMPLE_TOKENS = 16  # about how many tokens, evenly spread (and the last), a memo probe hashes


def _remember(memo: OrderedDict, slot: tuple, value) -> None:
    """``memo[slot] = value`` as its most recently used (a slot taken over moves to the end too),
    the least recently used dropped past :data:`MEMO_SEGMENT_KEYS`."""
    memo[slot] = value
    memo.move_to_end(slot)
    if len(memo) > MEMO_SEGMENT_KEYS:
        memo.popitem(last=False)


@dataclass(frozen=True)
class Keyer:
    """Builds keys; ``hash_fn`` maps bytes to a digest (default sha256).

    Segment keys are remembered by their token tuple (bounded, most recently used first): PIC
    exists because segments recur, and rehashing a 32k-token prompt's 64 segments cost ~2.5 ms of
    host time per request on the H200's host, before any kernel ran (a tuple lookup is ~50x
    cheaper than serialising and hashing the tokens)."""

    namespace: KeyNamespace
    hash_fn: HashFn = sha256_digest
    _memo: "OrderedDict[tuple, StoreKey]" = field(default_factory=OrderedDict, init=False, repr=False,
                                                  compare=False)
    # in front of _memo: (length, hash of a sample of the tokens, body start, salt) ->
    # (the key's _memo key, the key); see segment_key
    _probe: "OrderedDict[tuple, Tuple[tuple, StoreKey]]" = field(default_factory=OrderedDict, init=False,
                                                                 repr=False, compare=False)

    def __post_init__(self):
        if not isinstance(self.namespace, KeyNamespace):
            raise ValueError(f"namespace: expected KeyNamespace, got {type(self.namespace).__name__}")
        if not callable(self.hash_fn):
            raise ValueError("hash_fn: must be callable bytes -> bytes")

    def _digest(self, data: bytes) -> bytes:
        d = self.hash_fn(data)
        if not isinstance(d, (bytes, bytearray)) or len(d) == 0:
            raise ValueError("hash_fn: must return non-empty bytes")
        return bytes(d)

    def segment_key(
        self, token_ids: Sequence[int], body_start: int, *, tenant_salt: Optional[str] = None
    ) -> StoreKey:
        # Only exact tuples and ints are looked up: a tuple equals another of equal ints (numpy
        # ints included), so a hit is the key those tokens would get anyway. The memo is keyed by
        # the tuple's hash, taken once: Python does not cache a tuple's hash, and the lookup and
        # the move to the end each hashed a 512-token segment again (~2.5 us each). A hit counts
        # only if its tokens equal these, so two tuples of one hash just take turns in the slot.
        if not (type(token_ids) is tuple and type(body_start) is int
                and (tenant_salt is None or type(tenant_salt) is str)):
            return self._segment_key(token_ids, body_start, tenant_salt)
        # First a probe by a sample of the tokens: a hit then reads them once (the comparison)
        # instead of twice (their hash, then the comparison): ~1.5 us less per 512-token segment.
        # Tuples that share a sample (a document with a few tokens changed) take turns in its
        # slot and find their keys in the memo behind it, as without the probe.
        try:
            step = max(1, len(token_ids) // PROBE_SAMPLE_TOKENS)
            probe = (len(token_ids), hash(token_ids[::step] + token_ids[-1:]), body_start, tenant_salt)
        except TypeError:  # an unhashable item: no memo (the key below says what is wrong)
            return self._segment_key(token_ids, body_start, tenant_salt)
        held = self._probe.get(probe)
        if held is not None and (held[1].material is token_ids or held[1].material == token_ids):
            memo_key, key = held
            self._probe.move_to_end(probe)
            if self._memo.get(memo_key) is key:
                self._memo.move_to_end(memo_key)
            else:  # dropped from the memo, or its slot taken over there
                _remember(self._memo, memo_key, key)
            return key
        try:
            memo_key = (hash(token_ids), body_start, tenant_salt)
        except TypeError:
            return self._segment_key(token_ids, body_start, tenant_salt)
        key = self._memo.get(memo_key)
        if key is None or not (key.material is token_ids or key.material == token_ids):
            key = self._segment_key(token_ids, body_start, tenant_salt)
        _remember(self._memo, memo_key, key)
        _remember(self._probe, probe, (memo_key, key))
        return key

    def segment_keys(self, segments: Sequence[Sequence[int]], body_starts: Sequence[int], *,
                     tenant_salt: Optional[str] = None) -> Tuple[Optional[StoreKey], ...]:
        """``segment_key(seg, body_start)`` of each segment, None where ``body_start`` is its
        length (no body): a prompt's keys in one call. The probe hit (a segment keyed before,
        the common case) is inlined, the same look-ups and LRU moves as :meth:`segment_key`'s,
        without its call and checks per segment (~0.3 us each, 64 per 32k-token prompt);
        everything else goes through :meth:`segment_key`."""
        probes, memo = self._probe, self._memo
        fast = tenant_salt is None or type(tenant_salt) is str
        keys: List[Optional[StoreKey]] = []
        for seg, body_start in zip(segments, body_starts):
            num = len(seg)
            if body_start == num:
                keys.append(None)
                continue
            if fast and type(seg) is tuple and type(body_start) is int and num:
                step = max(1, num // PROBE_SAMPLE_TOKENS)
                try:
                    probe = (num, hash(seg[::step] + seg[-1:]), body_start, tenant_salt)
                except TypeError:
                    probe = None
                held = None if probe is None else probes.get(probe)
                if held is not None and (held[1].material is seg or held[1].material == seg):
                    memo_key, key = held
                    probes.move_to_end(probe)
                    if memo.get(memo_key) is key:
                        memo.move_to_end(memo_key)
                    else:  # dropped from the memo, or its slot taken over there
                        _remember(memo, memo_key, key)
                    keys.append(key)
                    continue
            keys.append(self.segment_key(seg, body_start, tenant_salt=tenant_salt))
        return tuple(keys)

    def _segment_key(self, token_ids: Sequence[int], body_start: int, tenant_salt: Optional[str]) -> StoreKey:
        tokens = _int_tuple(token_ids)
        if not tokens:
            raise ValueError("token_ids: a segment key needs at least one token")
        if isinstance(body_start, bool) or not isinstance(body_start, int):
            raise ValueError(f"body_start: expected int, got {type(body_start).__name__}")
        if not 0 <= body_start <= len(tokens):
            raise ValueError(f"body_start: {body_start} outside [0, {len(tokens)}]")
        ns = self.namespace if tenant_salt is None else self.namespace.with_salt(tenant_salt)
        data = (
            _field(KIND_SEGMENT.encode())
            + ns.encode()
            + _field(struct.pack("<q", body_start))
            + _field(_token_bytes(tokens))
        )
        return StoreKey(self._digest(data), KIND_SEGMENT, ns, body_start, tokens)

    def prefix_root(self, *, tenant_salt: Optional[str] = None) -> bytes:
        """The digest every prefix chain of this namespace (and tenant) starts from."""
        ns = self.namespace if tenant_salt is None else self.namespace.with_salt(tenant_salt)
        return self._digest(_field(KIND_PREFIX.encode()) + ns.encode() + _field(b"root"))

    def prefix_key(self, parent: Optional[StoreKey], token_ids: Sequence[int], *,
                   tenant_salt: Optional[str] = None, root: Optional[bytes] = None) -> StoreKey:
        """Key of the prefix checkpoint after ``token_ids`` following ``parent`` (None: the
        prompt's first tokens). ``root``: :meth:`prefix_root` of the tenant, when the caller has
        it (it is one hash)."""
        tokens = _int_tuple(token_ids)
        if not tokens:
            raise ValueError("token_ids: a prefix key needs at least one token")
        ns = self.namespace if tenant_salt is None else self.namespace.with_salt(tenant_salt)
        if parent is None:
            parent_digest = self.prefix_root(tenant_salt=tenant_salt) if root is None else root
        else:
            if not isinstance(parent, StoreKey) or parent.kind != KIND_PREFIX:
                raise ValueError(f"parent: expected a prefix key or None, got {parent!r}")
            if parent.namespace != ns:
                raise ValueError("parent: a prefix key of another namespace or tenant")
            parent_digest = parent.digest
        data = _field(KIND_PREFIX.encode()) + ns.encode() + _field(parent_digest) + _field(_token_bytes(tokens))
        return StoreKey(self._digest(data), KIND_PREFIX, ns, 0, (parent, tokens, parent_digest))

    def prefix_chain(self, token_ids: Sequence[int], block_tokens: int, *,
                     tenant_salt: Optional[str] = None) -> Tuple[StoreKey, ...]:
        """Keys of the checkpoints after every whole block of ``block_tokens`` tokens of
        ``token_ids``, then (when they do not end on a block) after all of them."""
        tokens = _int_tuple(token_ids)
        if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
            raise ValueError(f"block_tokens: expected int >= 1, got {block_tokens!r}")
        root = self.prefix_root(tenant_salt=tenant_salt)
        keys: List[StoreKey] = []
        parent = None
        for a in range(0, len(tokens) - len(tokens) % block_tokens, block_tokens):
            parent = self.prefix_key(parent, tokens[a:a + block_tokens], tenant_salt=tenant_salt, root=root)
            keys.append(parent)
        tail = len(tokens) % block_tokens
        if tail:
            keys.append(self.prefix_key(parent, tokens[len(tokens) - tail:], tenant_salt=tenant_salt, root=root))
        return tuple(keys)


def resume_key(namespace: KeyNamespace, token_ids: Sequence[int]) -> StoreKey:
    """The key of a request's own running cache used as the prefix of its next prefill chunk:
    never stored nor looked up (its digest is empty), it names the tokens the cache holds."""
    return StoreKey(b"", KIND_RESUME, namespace, 0, _int_tuple(token_ids))
