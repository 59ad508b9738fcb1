"""The segment store: two tiers (device, host), exact byte accounting, LRU, refcounted handles.

Semantics
* ``acquire(key)`` returns a :class:`SegmentHandle` on a hit (the entry is then on the device
  tier and pinned there until the handle is released) or ``None`` on a miss. A host-tier hit is
  **promoted** (copied to the device; ``non_blocking`` when the host copy is pinned, which is
  stream-ordered before any later kernel on the current stream).
* A key whose digest matches a stored key but whose material (tokens, namespace, seam) differs is
  a miss; it is counted in ``collisions``. Colliding keys can both be stored (dict chaining).
* ``insert(entry)`` stores an entry as most recently used. A duplicate key keeps the existing
  entry (the new payload is discarded; ``duplicate_inserts`` counts it).
* Device budget: after every insert / promotion / release, least recently used **unheld**
  entries are evicted until the device bytes fit. An entry held by a request is never evicted,
  moved or mutated; if held entries alone exceed the budget, the device tier stays over budget
  until they are released (the budget is a cap on what the store keeps, not a reason to fail
  running requests).
* Host tier: evicted entries **spill** there (copied, pinned when CUDA is available) if they fit
  in ``host_budget_bytes``, dropping least recently used host entries to make room; otherwise they
  are dropped. ``host_budget_bytes=0`` disables the tier.
* Disk tier (optional, :class:`~hypic.pic.disk_tier.DiskTier`): every inserted entry is also
  written to a directory (in the background), which survives the process; a key missing from
  both memory tiers is looked up there, and a hit is read back onto the device (``disk_hits``).
* Prefix checkpoints (:data:`~hypic.pic.keys.KIND_PREFIX` keys) share the tiers, the budgets and
  the LRU order with segment entries. The store also indexes them by parent (and first token), so
  that :meth:`SegmentStore.acquire_prefix_child` finds the longest stored checkpoint continuing a
  given one with a prefix of given tokens (a prompt that extends an earlier one: the next turn of
  a chat), in any tier.
* One re-entrant lock guards all state; copies between tiers happen under it (correct first: a
  handle never observes a half-moved entry).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from hypic.pic.disk_tier import DiskTier
from hypic.pic.keys import KIND_PREFIX, KeyNamespace, StoreKey
from hypic.pic.payload import SegmentEntry, compact_payload, move_payload

TIER_DEVICE = "device"
TIER_HOST = "host"
# the counters of a look-up by whether its key is a prefix checkpoint's
_HITS = {False: "hits", True: "prefix_hits"}
_MISSES = {False: "misses", True: "prefix_misses"}


@dataclass(frozen=True)
class StoreStats:
    hits: int  # segment look-ups that found an entry
    misses: int
    prefix_hits: int  # prefix-checkpoint look-ups (a request's spine blocks and leaf) that found one
    prefix_misses: int
    collisions: int
    insertions: int
    duplicate_inserts: int
    evictions: int  # entries removed from the device tier (spilled or dropped)
    spills: int  # evictions that landed in the host tier
    promotions: int  # host-tier hits copied back to the device
    drops: int  # entries gone from the store entirely (no host room, or host LRU)
    device_bytes: int
    host_bytes: int
    device_entries: int
    host_entries: int
    held_entries: int
    device_body_tokens: int  # cached (reused) tokens represented on the device tier
    host_body_tokens: int
    device_budget_bytes: Optional[int]
    host_budget_bytes: int
    prefix_entries: int = 0  # prefix checkpoints among the entries of both memory tiers
    prefix_bytes: int = 0
    disk_hits: int = 0  # look-ups answered from the disk tier
    disk_writes: int = 0
    disk_corrupt: int = 0  # entry files skipped (truncated, checksum, another engine's)
    disk_bytes: int = 0
    disk_entries: int = 0
    disk_budget_bytes: Optional[int] = None

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    @property
    def bytes_per_cached_token(self) -> float:
        n = self.device_body_tokens + self.host_body_tokens
        return (self.device_bytes + self.host_bytes) / n if n else 0.0


class _Slot:
    __slots__ = ("entry", "tier", "refcount", "nbytes")

    def __init__(self, entry: SegmentEntry, tier: str, nbytes: int):
        self.entry = entry
        self.tier = tier
        self.refcount = 0
        self.nbytes = nbytes


class SegmentHandle:
    """A running request's hold on one device-resident entry. Release it (or use ``with``)."""

    __slots__ = ("_store", "_slot", "_released")

    def __init__(self, store: "SegmentStore", slot: _Slot):
        self._store = store
        self._slot = slot
        self._released = False

    @property
    def entry(self) -> SegmentEntry:
        if self._released:
            raise RuntimeError("SegmentHandle: entry accessed after release()")
        return self._slot.entry

    @property
    def key(self) -> StoreKey:
        return self._slot.entry.key

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Drop the hold. Idempotent: a second call does nothing."""
        if not self._released:
            self._released = True
            self._store._release_slot(self._slot)

    def __enter__(self) -> "SegmentHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"SegmentHandle({self._slot.entry.key.short}, {state})"


class SegmentStore:
    """Device + host tiers of :class:`SegmentEntry`, LRU within each tier."""

    def __init__(
        self,
        device_budget_bytes: Optional[int],
        host_budget_bytes: int = 0,
        *,
        device: Union[str, torch.device] = "cpu",
        pin_host_memory: Optional[bool] = None,
        disk: Optional[DiskTier] = None,
    ):
        if device_budget_bytes is not None and (
            isinstance(device_budget_bytes, bool)
            or not isinstance(device_budget_bytes, int)
            or device_budget_bytes < 0
        ):
            raise ValueError(f"device_budget_bytes: expected int >= 0 or None, got {device_budget_bytes!r}")
        if isinstance(host_budget_bytes, bool) or not isinstance(host_budget_bytes, int) \
                or host_budget_bytes < 0:
            raise ValueError(f"host_budget_bytes: expected int >= 0, got {host_budget_bytes!r}")
        self.device = torch.device(device)
        self.device_budget_bytes = device_budget_bytes
        self.host_budget_bytes = host_budget_bytes
        if pin_host_memory is None:
            pin_host_memory = torch.cuda.is_available()
        self.pin_host_memory = bool(pin_host_memory)
        self._lock = threading.RLock()
        self._device: "OrderedDict[StoreKey, _Slot]" = OrderedDict()  # first = least recently used
        self._host: "OrderedDict[StoreKey, _Slot]" = OrderedDict()
        self._digests: Counter = Counter()  # digest -> number of stored keys with it
        self._device_bytes = 0
        self._host_bytes = 0
        self._counts: Dict[str, int] = dict.fromkeys(
            ("hits", "misses", "prefix_hits", "prefix_misses", "collisions", "insertions", "duplicate_inserts",
             "evictions", "spills", "promotions", "drops"), 0)
        if disk is not None and not isinstance(disk, DiskTier):
            raise ValueError(f"disk: expected a DiskTier or None, got {type(disk).__name__}")
        self.disk = disk
        # prefix checkpoints of both memory tiers: parent digest -> first token -> {key: None}
        self._children: Dict[bytes, Dict[int, Dict[StoreKey, None]]] = {}

    # ---- queries -------------------------------------------------------------------------

    def tier_of(self, key: StoreKey) -> Optional[str]:
        """Where ``key`` is stored (no stats, no LRU update); None if absent."""
        with self._lock:
            if key in self._device:
                return TIER_DEVICE
            if key in self._host:
                return TIER_HOST
            return None

    def __contains__(self, key: StoreKey) -> bool:
        return self.tier_of(key) is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._device) + len(self._host)

    def device_lru_order(self):
        """Device-tier keys, least recently used first (for inspection and tests)."""
        with self._lock:
            return list(self._device)

    def host_lru_order(self):
        with self._lock:
            return list(self._host)

    def snapshot(self):
        """All stored entries (host tier first, then device; least recently used first).
        Entries are immutable, so the caller may read them (e.g. to persist) without the lock."""
        with self._lock:
            return [s.entry for s in self._host.values()] + [s.entry for s in self._device.values()]

    def stats(self) -> StoreStats:
        with self._lock:
            slots = [*self._device.values(), *self._host.values()]
            prefix = [sl for sl in slots if sl.entry.key.kind == KIND_PREFIX]
            disk = self.disk
            return StoreStats(
                **self._counts,
                device_bytes=self._device_bytes,
                host_bytes=self._host_bytes,
                device_entries=len(self._device),
                host_entries=len(self._host),
                held_entries=sum(1 for s in self._device.values() if s.refcount > 0),
                device_body_tokens=sum(s.entry.num_body_tokens for s in self._device.values()),
                host_body_tokens=sum(s.entry.num_body_tokens for s in self._host.values()),
                device_budget_bytes=self.device_budget_bytes,
                host_budget_bytes=self.host_budget_bytes,
                prefix_entries=len(prefix),
                prefix_bytes=sum(sl.nbytes for sl in prefix),
                disk_hits=0 if disk is None else disk.counts["hits"],
                disk_writes=0 if disk is None else disk.counts["writes"],
                disk_corrupt=0 if disk is None else disk.counts["corrupt"],
                disk_bytes=0 if disk is None else disk.num_bytes,
                disk_entries=0 if disk is None else len(disk),
                disk_budget_bytes=None if disk is None else disk.budget_bytes,
            )

    def check_consistency(self) -> None:
        """Recount bytes and tiers from the entries; raise AssertionError on any mismatch."""
        with self._lock:
            for tier, table, total in ((TIER_DEVICE, self._device, self._device_bytes),
                                       (TIER_HOST, self._host, self._host_bytes)):
                recount = 0
                for key, slot in table.items():
                    assert slot.entry.key is key or slot.entry.key == key, "key mismatch"
                    assert slot.tier == tier, f"{key.short}: tier {slot.tier} in the {tier} table"
                    assert slot.nbytes == slot.entry.nbytes, f"{key.short}: stale byte count"
                    if tier == TIER_HOST:
                        assert slot.refcount == 0, f"{key.short}: held entry on the host tier"
                    recount += slot.nbytes
                assert recount == total, f"{tier}: counted {total} bytes, entries hold {recount}"
            assert not set(self._device) & set(self._host), "key on both tiers"
            assert self._host_bytes <= self.host_budget_bytes, "host tier over budget"
            if self.device_budget_bytes is not None:
                unheld = sum(s.nbytes for s in self._device.values() if s.refcount == 0)
                assert unheld == 0 or self._device_bytes <= self.device_budget_bytes, \
                    "device over budget while holding evictable entries"

    # ---- acquire / insert / release -------------------------------------------------------

    def acquire(self, key: StoreKey) -> Optional[SegmentHandle]:
        """Hold the entry for ``key`` (promoting it from the host tier); None on a miss."""
        if not isinstance(key, StoreKey):
            raise ValueError(f"key: expected StoreKey, got {type(key).__name__}")
        with self._lock:
            slot = self._device.get(key)
            if slot is None:
                slot = self._host.get(key)
                if slot is not None:
                    self._promote(slot)
                elif self.disk is not None:
                    slot = self._from_disk(key)
            if slot is None:
                self._counts[_MISSES[key.kind == KIND_PREFIX]] += 1
                if self._digests[key.digest] > 0:
                    self._counts["collisions"] += 1
                return None
            self._counts[_HITS[key.kind == KIND_PREFIX]] += 1
            handle = self._hold(slot)
            self._enforce_device_budget()  # a promotion may have pushed the device over budget
            return handle

    def acquire_many(self, keys: Sequence[StoreKey]) -> List[Optional[SegmentHandle]]:
        """``[self.acquire(key) for key in keys]`` (the same holds, counts, promotions and budget
        passes, in that order), under one hold of the lock: a 64-segment request's planning
        acquired each key alone, ~0.3 us of lock, checks and call per key. Keys are checked
        before anything is acquired; if an acquisition fails, those made are released."""
        for key in keys:
            if not isinstance(key, StoreKey):
                raise ValueError(f"key: expected StoreKey, got {type(key).__name__}")
        out: List[Optional[SegmentHandle]] = []
        with self._lock:
            device, counts, budget = self._device, self._counts, self.device_budget_bytes
            try:
                for key in keys:
                    slot = device.get(key)
                    if slot is None:
                        slot = self._host.get(key)
                        if slot is not None:
                            self._promote(slot)
                        elif self.disk is not None:
                            slot = self._from_disk(key)
                    if slot is None:
                        counts[_MISSES[key.kind == KIND_PREFIX]] += 1
                        if self._digests[key.digest] > 0:
                            counts["collisions"] += 1
                        out.append(None)
                        continue
                    counts[_HITS[key.kind == KIND_PREFIX]] += 1
                    # _hold and _enforce_device_budget inlined: a device hit within the budget is
                    # then a refcount, an LRU move and a handle
                    assert slot.tier == TIER_DEVICE
                    handle = SegmentHandle(self, slot)  # before the hold: a failure leaves none
                    slot.refcount += 1
                    out.append(handle)
                    device.move_to_end(key)
                    if budget is not None and self._device_bytes > budget:  # a promotion may have pushed it over
                        self._enforce_device_budget()
            except BaseException:
                for h in out:
                    if h is not None:
                        h.release()
                raise
        return out

    def insert(self, entry: SegmentEntry, *, acquire: bool = False, compact: bool = True) -> Optional[SegmentHandle]:
        """Store ``entry`` (moved to the device, compacted). Returns a handle if ``acquire``.

        ``compact=False``: the caller made every tensor of ``entry`` for it alone, exact-size, on
        the store's device (the runner's fresh copies), so the per-tensor move-and-compact walk
        is skipped (a cold 64-segment prefill inserts ~7,000 tensors)."""
        if not isinstance(entry, SegmentEntry):
            raise ValueError(f"entry: expected SegmentEntry, got {type(entry).__name__}")
        key = entry.key
        with self._lock:
            existing = self._device.get(key)
            if existing is None and key in self._host:
                existing = self._host[key]
            if existing is not None:
                self._counts["duplicate_inserts"] += 1
                if not acquire:
                    return None
                if existing.tier == TIER_HOST:
                    self._promote(existing)
                handle = self._hold(existing)
                self._enforce_device_budget()
                return handle
            if self._digests[key.digest] > 0:
                self._counts["collisions"] += 1
            # Move to the device tier without an extra copy when already there, then compact so
            # that bytes are exactly the tensors' bytes.
            if compact:
                stored = entry.map_payload(
                    lambda o: compact_payload(move_payload(o, self.device, copy=False))
                )
            else:
                stored = entry
            slot = self._add_device_slot(stored)
            self._counts["insertions"] += 1
            if self.disk is not None:
                self.disk.put(stored)
            handle = self._hold(slot) if acquire else None
            self._enforce_device_budget()
            return handle

    def acquire_prefix_child(self, parent: Optional[StoreKey], parent_digest: bytes, namespace: KeyNamespace,
                             tokens: Tuple[int, ...]) -> Optional[SegmentHandle]:
        """Hold the stored prefix checkpoint (any tier) of ``namespace`` that continues ``parent``
        (its digest ``parent_digest``; at the root None and the namespace's root digest) with the
        longest prefix of ``tokens``, or None. One look-up in the counts (a hit or a miss)."""
        if not tokens:
            return None
        with self._lock:
            best: Optional[StoreKey] = None
            for key in self._children.get(parent_digest, {}).get(tokens[0], ()):
                n = key.num_tokens
                if ((best is None or n > best.num_tokens) and n <= len(tokens) and key.namespace == namespace
                        and tokens[:n] == key.token_ids and key.parent == parent):
                    best = key
            if self.disk is not None:
                for digest, own in self.disk.children(parent_digest):
                    n = len(own)
                    if (best is None or n > best.num_tokens) and n <= len(tokens) and tokens[:n] == own:
                        best = StoreKey(digest, KIND_PREFIX, namespace, 0, (parent, own, parent_digest))
            if best is None:
                self._counts["prefix_misses"] += 1
                return None
            return self.acquire(best)

    def touch(self, keys: Sequence[StoreKey]) -> None:
        """Make ``keys`` (those stored in a memory tier) the most recently used, in the order
        given: a request's prefix chain is touched leaf first, so that LRU eviction takes a
        chain's last checkpoints before the earlier ones that every later one depends on."""
        with self._lock:
            for key in keys:
                if key in self._device:
                    self._device.move_to_end(key)
                elif key in self._host:
                    self._host.move_to_end(key)

    def flush(self) -> None:
        """Wait until every entry queued for the disk tier is written (nothing without one)."""
        if self.disk is not None:
            self.disk.flush()

    def close(self) -> None:
        """Write what is queued for the disk tier and stop its writer; idempotent."""
        if self.disk is not None:
            self.disk.close()

    def discard(self, key: StoreKey) -> bool:
        """Drop ``key``'s entry (either tier) when no request holds it, e.g. because its
        document changed. Returns whether it was dropped; a held entry stays (ValueError)."""
        if not isinstance(key, StoreKey):
            raise ValueError(f"key: expected StoreKey, got {type(key).__name__}")
        with self._lock:
            slot = self._device.get(key)
            if slot is not None:
                if slot.refcount > 0:
                    raise ValueError(f"cannot discard {key!r}: {slot.refcount} request(s) hold it")
                del self._device[key]
                self._device_bytes -= slot.nbytes
            else:
                slot = self._host.pop(key, None)
                if slot is None:
                    return False
                self._host_bytes -= slot.nbytes
            self._forget(key)
            return True

    def clear(self) -> int:
        """Drop every entry no request holds (both memory tiers) and the disk tier's files (the
        server's flush). Returns how many entries and files were dropped."""
        with self._lock:
            n = 0
            for key in [k for k, s in self._device.items() if s.refcount == 0]:
                slot = self._device.pop(key)
                self._device_bytes -= slot.nbytes
                self._forget(key)
                n += 1
            for key in list(self._host):
                slot = self._host.pop(key)
                self._host_bytes -= slot.nbytes
                self._forget(key)
                n += 1
            if self.disk is not None:
                n += self.disk.clear()
            return n

    # ---- internals (lock held) -----------------------------------------------------------

    def _hold(self, slot: _Slot) -> SegmentHandle:
        assert slot.tier == TIER_DEVICE
        slot.refcount += 1
        self._device.move_to_end(slot.entry.key)
        return SegmentHandle(self, slot)

    def _release_slot(self, slot: _Slot) -> None:
        with self._lock:
            if slot.refcount <= 0:
                raise RuntimeError("SegmentStore: release of an entry that is not held")
            slot.refcount -= 1
            if slot.refcount == 0:
                self._enforce_device_budget()

    def _forget(self, key: StoreKey) -> None:
        self._digests[key.digest] -= 1
        if self._digests[key.digest] == 0:
            del self._digests[key.digest]
        if key.kind == KIND_PREFIX:
            by_token = self._children.get(key.parent_digest)
            if by_token is not None:
                keys = by_token.get(key.token_ids[0])
                if keys is not None:
                    keys.pop(key, None)
                    if not keys:
                        del by_token[key.token_ids[0]]
                if not by_token:
                    del self._children[key.parent_digest]

    def _add_device_slot(self, entry: SegmentEntry) -> _Slot:
        key = entry.key
        slot = _Slot(entry, TIER_DEVICE, entry.nbytes)
        self._device[key] = slot
        self._device_bytes += slot.nbytes
        self._digests[key.digest] += 1
        if key.kind == KIND_PREFIX:
            by_token = self._children.setdefault(key.parent_digest, {})
            by_token.setdefault(key.token_ids[0], {})[key] = None
        return slot

    def _from_disk(self, key: StoreKey) -> Optional[_Slot]:
        """``key``'s entry read from the disk tier into the device tier (a promotion), or None."""
        entry = self.disk.get(key, self.device)
        if entry is None:
            return None
        entry = entry.map_payload(lambda o: compact_payload(move_payload(o, self.device, copy=False)))
        self._counts["promotions"] += 1
        return self._add_device_slot(entry)

    def _promote(self, slot: _Slot) -> None:
        key = slot.entry.key
        del self._host[key]
        self._host_bytes -= slot.nbytes
        non_blocking = self.pin_host_memory and self.device.type == "cuda"
        slot.entry = slot.entry.map_payload(
            lambda o: move_payload(o, self.device, non_blocking=non_blocking)
        )
        slot.tier = TIER_DEVICE
        self._device[key] = slot
        self._device_bytes += slot.nbytes
        self._counts["promotions"] += 1

    def _enforce_device_budget(self) -> None:
        if self.device_budget_bytes is None or self._device_bytes <= self.device_budget_bytes:
            return
        for key in list(self._device):  # least recently used first
            if self._device_bytes <= self.device_budget_bytes:
                break
            slot = self._device[key]
            if slot.refcount > 0:
                continue
            del self._device[key]
            self._device_bytes -= slot.nbytes
            self._counts["evictions"] += 1
            self._spill(slot)

    def _spill(self, slot: _Slot) -> None:
        key = slot.entry.key
        if slot.nbytes > self.host_budget_bytes:
            self._counts["drops"] += 1
            self._forget(key)
            return
        while self._host_bytes + slot.nbytes > self.host_budget_bytes:
            _, old = self._host.popitem(last=False)
            self._host_bytes -= old.nbytes
            self._counts["drops"] += 1
            self._forget(old.entry.key)
        # Blocking copy: the host copy must be complete before the device memory is reused.
        slot.entry = slot.entry.map_payload(
            lambda o: move_payload(o, "cpu", pin_memory=self.pin_host_memory)
        )
        slot.tier = TIER_HOST
        self._host[key] = slot
        self._host_bytes += slot.nbytes
        self._counts["spills"] += 1
