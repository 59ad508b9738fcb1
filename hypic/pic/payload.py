"""Store entries and the generic tensor-tree helpers the store uses to move and measure them.

The store never looks inside a payload beyond this: a payload object is a tensor, a dataclass
whose fields are payload objects (the linear summaries in ``hypic.ops.linear.summary`` are frozen
dataclasses of tensors), a tuple/list of payload objects, ``None``, a plain scalar, or any object
with ``nbytes`` and ``to(device)``. Byte counts are exact: tensors are stored compact (a view of a
larger buffer is cloned on insert), so an entry's bytes are the sum of its tensors' bytes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional, Tuple, Union

import torch

from hypic.pic.keys import StoreKey

Device = Union[str, torch.device]


_SCALARS = (bool, int, float, str, torch.dtype, torch.device)


def payload_nbytes(obj: Any) -> int:
    """Exact bytes held by ``obj``'s tensors."""
    if obj is None:
        return 0
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    # An object's own ``nbytes`` (the layer payloads, the summaries) before the generic dataclass
    # walk: the walk costs field reflection per object, thousands per cold prefill. Looked up on
    # the type, so the property runs once (``hasattr`` would evaluate it a first time).
    if getattr(type(obj), "nbytes", None) is not None:
        return int(obj.nbytes)
    if isinstance(obj, _SCALARS):
        return 0
    if isinstance(obj, (tuple, list)):
        return sum(payload_nbytes(o) for o in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(payload_nbytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    raise ValueError(f"payload: cannot measure an object of type {type(obj).__name__}")


def _rebuild(obj: Any, fn, opaque) -> Any:
    """Apply ``fn`` to every tensor leaf of a payload tree, rebuilding containers;
    ``opaque(obj)`` handles objects that are none of tensor / dataclass / tuple / list / scalar."""
    if obj is None or isinstance(obj, _SCALARS):
        return obj
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if hasattr(obj, "payload_fields"):
            # its constructor's arguments are not its fields (a DenseSummary: T as stored, and
            # whether it is packed), so dataclasses.replace cannot rebuild it
            return type(obj)(**{name: _rebuild(value, fn, opaque) for name, value in obj.payload_fields().items()})
        changes = {
            f.name: _rebuild(getattr(obj, f.name), fn, opaque)
            for f in dataclasses.fields(obj)
            if f.init
        }
        return dataclasses.replace(obj, **changes)
    if isinstance(obj, tuple):
        return tuple(_rebuild(o, fn, opaque) for o in obj)
    if isinstance(obj, list):
        return [_rebuild(o, fn, opaque) for o in obj]
    return opaque(obj)


def move_payload(obj: Any, device: Device, *, pin_memory: bool = False, non_blocking: bool = False,
                 copy: bool = True) -> Any:
    """Copy a payload tree to ``device`` (pinned host memory when ``pin_memory``)."""
    dev = torch.device(device)

    def fn(t: torch.Tensor) -> torch.Tensor:
        if pin_memory and dev.type == "cpu":
            out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
            out.copy_(t, non_blocking=non_blocking)
            return out
        return t.to(dev, non_blocking=non_blocking, copy=copy)

    return _rebuild(obj, fn, lambda o: o.to(dev))


def compact_payload(obj: Any) -> Any:
    """Clone tensors that view a larger storage, so byte accounting is exact."""

    def fn(t: torch.Tensor) -> torch.Tensor:
        if not t.is_contiguous() or t.untyped_storage().nbytes() != t.numel() * t.element_size():
            return t.clone(memory_format=torch.contiguous_format)
        return t

    return _rebuild(obj, fn, lambda o: o)


def payload_equal(a: Any, b: Any) -> bool:
    """Bit-identical comparison of two payload trees (used by tests and persistence checks)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        # Compare raw bytes so NaNs and signed zeros count as equal only when identical.
        return torch.equal(a.cpu().contiguous().view(torch.uint8).flatten(),
                           b.cpu().contiguous().view(torch.uint8).flatten())
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        if type(a) is not type(b):
            return False
        return all(payload_equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(payload_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, Mapping):
        return (isinstance(b, Mapping) and set(a) == set(b)
                and all(payload_equal(a[k], b[k]) for k in a))
    return a == b


@dataclass(frozen=True)
class LinearLayerCache:
    """Per linear layer: the body's affine summary (T, S; fp32) and its conv tail.

    ``conv_tail`` is ``[D, W-1]``: the last W-1 conv **inputs** of the segment, which warm up the
    conv of whatever live span follows the body.
    """

    summary: Any
    conv_tail: Optional[torch.Tensor] = None

    @property
    def nbytes(self) -> int:
        return payload_nbytes(self.summary) + payload_nbytes(self.conv_tail)


@dataclass(frozen=True)
class LinearStateCheckpoint:
    """Per linear layer, prefix-cache checkpoint: the running state and conv state at a boundary."""

    state: torch.Tensor
    conv_state: Optional[torch.Tensor] = None

    @property
    def nbytes(self) -> int:
        return payload_nbytes(self.state) + payload_nbytes(self.conv_state)


@dataclass(frozen=True)
class AttentionLayerCache:
    """Per full-attention layer: K/V of the body's tokens, ``[num_tokens, Hkv, D]``."""

    key: torch.Tensor
    value: torch.Tensor

    def __post_init__(self):
        for name in ("key", "value"):
            if not isinstance(getattr(self, name), torch.Tensor):
                raise ValueError(f"{name}: expected a tensor")
        if self.key.shape[0] != self.value.shape[0]:
            raise ValueError(
                f"key/value: token counts differ ({self.key.shape[0]} vs {self.value.shape[0]})"
            )

    @property
    def nbytes(self) -> int:
        return payload_nbytes(self.key) + payload_nbytes(self.value)


def _freeze_layers(layers: Mapping[int, Any], name: str) -> Tuple[Mapping[int, Any], int]:
    """(read-only copy sorted by layer, total bytes); raises on unmeasurable payloads."""
    if not isinstance(layers, Mapping):
        raise ValueError(f"{name}: expected a mapping layer index -> payload, got {type(layers).__name__}")
    out = {}
    total = 0
    for idx, obj in layers.items():
        if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
            raise ValueError(f"{name}: layer indices must be ints >= 0, got {idx!r}")
        total += payload_nbytes(obj)
        out[idx] = obj
    return MappingProxyType(dict(sorted(out.items()))), total


@dataclass(frozen=True, eq=False)
class SegmentEntry:
    """One cached segment body (or one prefix-cache checkpoint).

    ``linear``: layer index -> payload (normally :class:`LinearLayerCache`, or
    :class:`LinearStateCheckpoint` for checkpoints); ``attention``: layer index -> payload
    (normally :class:`AttentionLayerCache`). ``origin_position`` is the absolute position the
    segment started at when its payload was computed (0 for standalone prefill), which tells the
    runner how far cached K must be re-rotated. Immutable: the store swaps whole entries when it
    moves them between tiers.

    ``engine_tables`` (not a field: not compared or shown): device -> what the engine derives
    from the payload's tensors to read them in place (their data pointers,
    hypic/runner/entry_tables.py), made on first use. The tensors are immutable and the entry's
    own, so it stays valid for the entry's life; an entry made from this one (``map_payload``,
    a tier move) starts with an empty one. (Entries cannot be deep-copied or pickled: their
    layer maps are read-only proxies.)
    """

    key: StoreKey
    linear: Mapping[int, Any] = field(default_factory=dict)
    attention: Mapping[int, Any] = field(default_factory=dict)
    origin_position: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.key, StoreKey):
            raise ValueError(f"key: expected StoreKey, got {type(self.key).__name__}")
        lin, lin_bytes = _freeze_layers(self.linear, "linear")
        att, att_bytes = _freeze_layers(self.attention, "attention")
        both = set(lin) & set(att)
        if both:
            raise ValueError(f"layers {sorted(both)} appear in both linear and attention payloads")
        if isinstance(self.origin_position, bool) or not isinstance(self.origin_position, int) \
                or self.origin_position < 0:
            raise ValueError(f"origin_position: expected int >= 0, got {self.origin_position!r}")
        object.__setattr__(self, "linear", lin)
        object.__setattr__(self, "attention", att)
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))
        # Payloads are immutable (frozen dataclasses of tensors the store never resizes): the byte
        # count is taken once here instead of walking every layer on each read.
        object.__setattr__(self, "_nbytes", lin_bytes + att_bytes)
        # The key is immutable too: its token counts, read per body per forward, are taken once.
        object.__setattr__(self, "_num_tokens", self.key.num_tokens)
        object.__setattr__(self, "_num_body_tokens", self._num_tokens - self.key.body_start)
        object.__setattr__(self, "engine_tables", {})

    @property
    def token_ids(self):
        return self.key.token_ids

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def body_start(self) -> int:
        return self.key.body_start

    @property
    def num_body_tokens(self) -> int:
        return self._num_body_tokens

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def map_payload(self, fn) -> "SegmentEntry":
        """A copy with ``fn`` applied to every layer payload (same key and metadata)."""
        return SegmentEntry(
            key=self.key,
            linear={i: fn(o) for i, o in self.linear.items()},
            attention={i: fn(o) for i, o in self.attention.items()},
            origin_position=self.origin_position,
            metadata=self.metadata,
        )
