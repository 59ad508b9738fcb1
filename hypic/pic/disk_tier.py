"""The segment store's persistent tier: one safetensors file per entry in a directory.

Layout of ``segment_cache_dir``:

* ``store.json``: what wrote the directory: the format version and the writing engine's
  fingerprint (model, dtype: :func:`store_fingerprint`). An engine whose fingerprint differs
  refuses the directory with a ValueError naming the differing fields, before reading any entry.
* ``<digest hex>.safetensors``: one entry (:func:`hypic.pic.persist.encode_entries`' manifest in
  the metadata, its tensors in the body) and the sha256 of the manifest and every tensor's bytes
  (``hypic.checksum``). A file whose header cannot be read, whose checksum or fingerprint does not
  match, or whose key is not the one looked up is skipped with a warning and deleted: a truncated
  or corrupted file never fails a request, it is a miss.

Entries are written through (every entry the store inserts is queued for the disk) by one
background thread, so a request never waits for a file; :meth:`DiskTier.flush` waits for the
queue (the engine flushes at shutdown and at interpreter exit). The tier keeps an index of its
files (digest -> size, kind, and for prefix checkpoints the parent digest and own tokens, read
from each file's header when the directory is opened), least recently used first, and deletes
the least recently used files when their bytes pass ``budget_bytes``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import queue
import threading
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from hypic.pic.keys import KIND_PREFIX, StoreKey
from hypic.pic.payload import SegmentEntry
from hypic.pic.persist import decode_entries, encode_entries

DIR_FORMAT_VERSION = 1
STORE_FILE = "store.json"
ENTRY_SUFFIX = ".safetensors"
_MANIFEST = "hypic.entry"
_CHECKSUM = "hypic.checksum"
_FINGERPRINT = "hypic.fingerprint"


class CorruptEntryError(ValueError):
    """An entry file that cannot be trusted (truncated, checksum or key mismatch)."""


def fingerprint_digest(fingerprint: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(fingerprint), sort_keys=True).encode()).hexdigest()


def _checksum(manifest: str, tensors: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.sha256(manifest.encode())
    for name in sorted(tensors):
        t = tensors[name]
        h.update(name.encode())
        h.update(str(t.dtype).encode() + str(tuple(t.shape)).encode())
        if t.numel():
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def write_entry_file(entry: SegmentEntry, path: str, fingerprint: str) -> int:
    """Write ``entry`` to ``path`` (through a temporary file, renamed: a crash leaves no half file
    under the final name). Returns the file's size in bytes."""
    manifest, tensors = encode_entries([entry])
    text = json.dumps(manifest[0])
    tmp = f"{path}.tmp{threading.get_ident()}"
    save_file(tensors, tmp, metadata={_MANIFEST: text, _CHECKSUM: _checksum(text, tensors),
                                      _FINGERPRINT: fingerprint})
    os.replace(tmp, path)
    return os.path.getsize(path)


@dataclass(frozen=True)
class DiskRecord:
    path: str
    num_bytes: int
    kind: str
    parent_digest: Optional[bytes]  # prefix checkpoints
    token_ids: Optional[Tuple[int, ...]]  # prefix checkpoints: the tokens since the parent


def read_entry_header(path: str, fingerprint: str) -> DiskRecord:
    """What the index keeps of an entry file, from its header alone; CorruptEntryError when the
    header cannot be read or is another engine's."""
    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
        manifest = json.loads(meta[_MANIFEST])
    except Exception as exc:  # noqa: BLE001 - any unreadable header is a corrupt file
        raise CorruptEntryError(f"{path}: unreadable entry header ({type(exc).__name__}: {exc})") from None
    if meta.get(_FINGERPRINT) != fingerprint:
        raise CorruptEntryError(f"{path}: written by another model or configuration")
    key = manifest["key"]
    parent, tokens = None, None
    if key["kind"] == KIND_PREFIX:
        lengths = key["chain_lengths"]
        digests = [key["root_digest"]] + key["chain_digests"]
        parent = bytes.fromhex(digests[-2])
        tokens = tuple(int(t) for t in key["material"][len(key["material"]) - lengths[-1]:])
    return DiskRecord(path, os.path.getsize(path), key["kind"], parent, tokens)


def read_entry_file(path: str, fingerprint: str, expect: StoreKey, device) -> SegmentEntry:
    """The entry of ``path``, checked: its checksum, its fingerprint, and its key equal to
    ``expect`` (whose object it then carries, so that a prefix chain found in memory and on disk
    is one chain of key objects). CorruptEntryError on any mismatch."""
    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(path)
        text = meta[_MANIFEST]
    except Exception as exc:  # noqa: BLE001 - truncated, not safetensors, ...
        raise CorruptEntryError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    if meta.get(_FINGERPRINT) != fingerprint:
        raise CorruptEntryError(f"{path}: written by another model or configuration")
    if meta.get(_CHECKSUM) != _checksum(text, tensors):
        raise CorruptEntryError(f"{path}: checksum mismatch")
    try:
        manifest = json.loads(text)
        entry = decode_entries([manifest], tensors)[0]
    except Exception as exc:  # noqa: BLE001
        raise CorruptEntryError(f"{path}: undecodable entry ({type(exc).__name__}: {exc})") from None
    if entry.key != expect:
        raise CorruptEntryError(f"{path}: holds another key than {expect.short}")
    return SegmentEntry(expect, linear=entry.linear, attention=entry.attention,
                        origin_position=entry.origin_position, metadata=entry.metadata)


def open_directory(directory: str, fingerprint: Mapping[str, str]) -> None:
    """Create ``directory`` for this engine, or check that this engine wrote it: ValueError
    naming the differing fields otherwise (nothing is read from it then)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, STORE_FILE)
    want = {"format": DIR_FORMAT_VERSION, **dict(fingerprint)}
    if not os.path.exists(path):
        if any(name.endswith(ENTRY_SUFFIX) for name in os.listdir(directory)):
            raise ValueError(f"segment_cache_dir {directory!r} holds entry files but no {STORE_FILE}: "
                             "not a directory this engine wrote; use an empty directory")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(want, f, indent=1, sort_keys=True)
        os.replace(path + ".tmp", path)
        return
    try:
        with open(path, encoding="utf-8") as f:
            have = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"segment_cache_dir {directory!r}: unreadable {STORE_FILE} ({exc})") from None
    if not isinstance(have, dict):
        raise ValueError(f"segment_cache_dir {directory!r}: {STORE_FILE} is not a JSON object")
    differ = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    if differ:
        details = "; ".join(f"{k}: the directory has {have.get(k)!r}, this engine {want.get(k)!r}" for k in differ)
        raise ValueError(f"segment_cache_dir {directory!r} was written by another model, dtype or configuration "
                         f"({details}); use another directory or empty this one")


class DiskTier:
    """Entry files under one directory, with a byte budget (least recently used deleted)."""

    def __init__(self, directory: str, budget_bytes: int, fingerprint: Mapping[str, str]) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"budget_bytes: expected int >= 0, got {budget_bytes!r}")
        self.directory = os.fspath(directory)
        self.budget_bytes = budget_bytes
        open_directory(self.directory, fingerprint)
        self.fingerprint = fingerprint_digest(fingerprint)
        self._lock = threading.RLock()
        self._index: "OrderedDict[bytes, DiskRecord]" = OrderedDict()  # least recently used first
        self._children: Dict[bytes, Dict[bytes, Tuple[int, ...]]] = {}  # parent digest -> digest -> tokens
        self._bytes = 0
        self.counts: Dict[str, int] = dict.fromkeys(("hits", "writes", "corrupt", "deletions"), 0)
        self._scan()
        self._queue: "queue.Queue[Optional[SegmentEntry]]" = queue.Queue()
        self._thread = threading.Thread(target=_writer_loop, args=(weakref.ref(self), self._queue),
                                        name="hypic-disk-tier", daemon=True)
        self._thread.start()
        self._closed = False
        # a process that never calls close() still gets its queued entries written
        atexit.register(_flush_at_exit, weakref.ref(self))

    # ---- index ---------------------------------------------------------------------------
    def _scan(self) -> None:
        files = []
        for name in os.listdir(self.directory):
            if not name.endswith(ENTRY_SUFFIX):
                if ".tmp" in name:  # a write cut short by a crash
                    _remove(os.path.join(self.directory, name))
                continue
            path = os.path.join(self.directory, name)
            try:
                digest = bytes.fromhex(name[: -len(ENTRY_SUFFIX)])
                files.append((os.path.getmtime(path), digest, path))
            except (ValueError, OSError):
                continue
        for _, digest, path in sorted(files):
            try:
                record = read_entry_header(path, self.fingerprint)
            except CorruptEntryError as exc:
                self._discard_file(path, str(exc))
                continue
            self._add(digest, record)
        self._enforce_budget()

    def _add(self, digest: bytes, record: DiskRecord) -> None:
        old = self._index.pop(digest, None)
        if old is not None:
            self._bytes -= old.num_bytes
        self._index[digest] = record
        self._bytes += record.num_bytes
        if record.kind == KIND_PREFIX:
            self._children.setdefault(record.parent_digest, {})[digest] = record.token_ids

    def _drop(self, digest: bytes) -> Optional[DiskRecord]:
        record = self._index.pop(digest, None)
        if record is None:
            return None
        self._bytes -= record.num_bytes
        if record.kind == KIND_PREFIX:
            kids = self._children.get(record.parent_digest)
            if kids is not None:
                kids.pop(digest, None)
                if not kids:
                    del self._children[record.parent_digest]
        return record

    def _discard_file(self, path: str, why: str) -> None:
        warnings.warn(f"segment store: skipping entry file {path}: {why}", RuntimeWarning, stacklevel=3)
        self.counts["corrupt"] += 1
        _remove(path)

    def _enforce_budget(self) -> None:
        while self._bytes > self.budget_bytes and self._index:
            digest = next(iter(self._index))
            record = self._drop(digest)
            _remove(record.path)
            self.counts["deletions"] += 1

    # ---- queries -------------------------------------------------------------------------
    def __contains__(self, digest: bytes) -> bool:
        with self._lock:
            return digest in self._index

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    @property
    def num_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def children(self, parent_digest: bytes) -> List[Tuple[bytes, Tuple[int, ...]]]:
        """Prefix checkpoints on disk whose parent is ``parent_digest``: (digest, own tokens)."""
        with self._lock:
            return list(self._children.get(parent_digest, {}).items())

    def get(self, key: StoreKey, device) -> Optional[SegmentEntry]:
        """The entry of ``key`` read from disk onto ``device`` (the file becomes the most recently
        used), or None: absent, or its file is corrupt (warned, deleted)."""
        with self._lock:
            record = self._index.get(key.digest)
            if record is None:
                return None
            self._index.move_to_end(key.digest)
        try:
            entry = read_entry_file(record.path, self.fingerprint, key, device)
        except CorruptEntryError as exc:
            with self._lock:
                if self._index.get(key.digest) is record:
                    self._drop(key.digest)
            self._discard_file(record.path, str(exc))
            return None
        except OSError as exc:  # deleted under us (budget, another process): a miss
            with self._lock:
                if self._index.get(key.digest) is record:
                    self._drop(key.digest)
            warnings.warn(f"segment store: entry file {record.path} unreadable: {exc}", RuntimeWarning, stacklevel=2)
            return None
        with self._lock:
            self.counts["hits"] += 1
        return entry

    # ---- writes --------------------------------------------------------------------------
    def put(self, entry: SegmentEntry) -> None:
        """Queue ``entry`` to be written (nothing happens when its file exists)."""
        if self._closed or not entry.key.digest:
            return
        with self._lock:
            if entry.key.digest in self._index:
                self._index.move_to_end(entry.key.digest)
                return
        self._queue.put(entry)

    def _write(self, entry: SegmentEntry) -> None:
        digest = entry.key.digest
        with self._lock:
            if digest in self._index:
                return
        path = os.path.join(self.directory, digest.hex() + ENTRY_SUFFIX)
        if entry.nbytes > self.budget_bytes:
            return
        try:
            write_entry_file(entry, path, self.fingerprint)
            record = read_entry_header(path, self.fingerprint)
        except (OSError, ValueError) as exc:
            warnings.warn(f"segment store: could not write {path}: {exc}", RuntimeWarning, stacklevel=2)
            return
        with self._lock:
            self._add(digest, record)
            self.counts["writes"] += 1
            self._enforce_budget()

    def flush(self) -> None:
        """Wait until every queued entry is written."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued, then stop the writer; idempotent."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._queue.put(None)
        self._thread.join()

    def clear(self) -> int:
        """Delete every entry file (the directory's ``store.json`` stays); returns how many."""
        self.flush()
        with self._lock:
            digests = list(self._index)
            for digest in digests:
                _remove(self._drop(digest).path)
            return len(digests)


def _writer_loop(tier_ref, q: "queue.Queue") -> None:
    while True:
        entry = q.get()
        try:
            if entry is None:
                return
            tier = tier_ref()
            if tier is not None:
                tier._write(entry)
            del tier
        finally:
            q.task_done()


def _flush_at_exit(tier_ref) -> None:
    tier = tier_ref()
    if tier is not None and not tier._closed:
        tier.flush()


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


__all__ = ["CorruptEntryError", "DiskRecord", "DiskTier", "fingerprint_digest", "open_directory",
           "read_entry_file", "read_entry_header", "write_entry_file"]
