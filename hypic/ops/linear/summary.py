"""Structured affine summaries ``(T, S)`` of token spans and their algebra.

For a span C and one value head, with the state laid out ``[K, V]`` and per-token transitions
``A_t`` acting on K, the summary is ``T_C = A_L ... A_1`` and ``S_C = S(C | 0)``; any incoming
state ``S`` leaves C as ``T_C S + S_C``. ``T`` keeps its structure (scalar per head, diagonal,
dense K x K) so that storing and applying it costs only what the family needs.

All functions are batched over spans and heads (the scans along chains of spans are
:mod:`hypic.ops.linear.scan`). Tensors are fp32 (fp64 when built from fp64
inputs, which the exactness tests use).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch

from .checks import STATE_DTYPES, check_same_device, check_tensor, concrete_device


def _check_state_field(name: str, state: object) -> torch.Tensor:
    return check_tensor(name, state, (None, None, None, None), STATE_DTYPES)


class _SummaryOps:
    """Shared helpers; subclasses are frozen dataclasses with fields (transition-ish, state)."""

    state: torch.Tensor

    @property
    def num_spans(self) -> int:
        return self.state.shape[0]

    @property
    def num_heads(self) -> int:
        return self.state.shape[1]

    @property
    def key_dim(self) -> int:
        return self.state.shape[2]

    @property
    def value_dim(self) -> int:
        return self.state.shape[3]

    @property
    def dtype(self) -> torch.dtype:
        return self.state.dtype

    @property
    def device(self) -> torch.device:
        return self.state.device

    def _t(self) -> torch.Tensor:
        raise NotImplementedError

    def _rebuild(self, t: torch.Tensor, state: torch.Tensor):
        """A summary of this one's class and storage form from (stored T, S)."""
        return type(self)(t, state)

    @property
    def nbytes(self) -> int:
        """Exact bytes held by the two tensors (T in its structured form, plus S)."""
        t = self._t()
        return t.numel() * t.element_size() + self.state.numel() * self.state.element_size()

    def index(self, idx: torch.Tensor):
        if not isinstance(idx, torch.Tensor) or idx.dtype not in (torch.int64, torch.int32) or idx.dim() != 1:
            raise ValueError("idx must be a 1-D LongTensor of span indices")
        idx = idx.to(self.state.device)
        return self._rebuild(self._t().index_select(0, idx), self.state.index_select(0, idx))

    def parts(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The two tensors in constructor order: (T as stored, or log decays, ``state``); a
        packed dense T is its packed storage (see :class:`DenseSummary`)."""
        return self._t(), self.state

    def to(self, device: Union[str, torch.device]):
        return self._rebuild(self._t().to(device), self.state.to(device))

    def cloned(self):
        """A copy that owns its memory (e.g. of a CUDA graph's output buffers)."""
        return self._rebuild(self._t().clone(), self.state.clone())

    @classmethod
    def cat(cls, summaries: Sequence["_SummaryOps"]):
        if len(summaries) == 0:
            raise ValueError("summaries must be a non-empty sequence")
        for i, s in enumerate(summaries):
            if type(s) is not cls:
                raise ValueError(f"summaries[{i}] is {type(s).__name__}, expected {cls.__name__}")
        packed = {getattr(s, "t_packed", False) for s in summaries}
        if packed == {True}:  # all packed: their storage concatenates as it is
            return summaries[0]._rebuild(torch.cat([s._t() for s in summaries], 0),
                                         torch.cat([s.state for s in summaries], 0))
        if packed == {True, False}:  # one storage form for the result: T's values
            return cls(torch.cat([s.transition for s in summaries], 0), torch.cat([s.state for s in summaries], 0))
        return cls(torch.cat([s._t() for s in summaries], 0), torch.cat([s.state for s in summaries], 0))


@dataclass(frozen=True, eq=False)
class ScalarSummary(_SummaryOps):
    """T = exp(log_decay) * I per head. log_decay ``[N, HV]``; state ``[N, HV, K, V]``."""

    log_decay: torch.Tensor
    state: torch.Tensor

    def __post_init__(self) -> None:
        _check_state_field("state", self.state)
        n, hv = self.state.shape[:2]
        check_tensor("log_decay", self.log_decay, (n, hv), (self.state.dtype,))
        check_same_device(log_decay=self.log_decay, state=self.state)

    def _t(self) -> torch.Tensor:
        return self.log_decay


@dataclass(frozen=True, eq=False)
class DiagonalSummary(_SummaryOps):
    """T = Diag(exp(log_decay)). log_decay ``[N, HV, K]``; state ``[N, HV, K, V]``."""

    log_decay: torch.Tensor
    state: torch.Tensor

    def __post_init__(self) -> None:
        _check_state_field("state", self.state)
        n, hv, k = self.state.shape[:3]
        check_tensor("log_decay", self.log_decay, (n, hv, k), (self.state.dtype,))
        check_same_device(log_decay=self.log_decay, state=self.state)

    def _t(self) -> torch.Tensor:
        return self.log_decay


@dataclass(frozen=True, eq=False, init=False)
class DenseSummary(_SummaryOps):
    """Dense T. transition ``[N, HV, K, K]``; state ``[N, HV, K, V]``.

    ``t_storage`` is T as stored. With ``t_packed`` (fp32 only) each head's ``K * K`` fp32 words
    hold T pre-split for the GPU walk's bf16x3 products: ``K * K`` bf16 high parts then ``K * K``
    bf16 low parts (:mod:`hypic.ops.linear.t_planes`), so a walk reading it in place skips the
    split. :attr:`transition` is always T's fp32 (or fp64) values (``hi + lo`` when packed, a new
    tensor): nothing reading T as a matrix sees the packed words. Only the GPU scan reads the
    packed storage, through :func:`summary_addresses` and the items' ``t_packed``."""

    t_storage: torch.Tensor
    state: torch.Tensor
    t_packed: bool

    def __init__(self, transition: torch.Tensor, state: torch.Tensor, t_packed: bool = False) -> None:
        # a hand-written __init__: callers pass T as ``transition`` (positionally or by name),
        # which is the stored tensor itself unless ``t_packed``
        object.__setattr__(self, "t_storage", transition)
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "t_packed", t_packed)
        self.__post_init__()

    def __post_init__(self) -> None:
        _check_state_field("state", self.state)
        if not isinstance(self.t_packed, bool):
            raise ValueError(f"t_packed must be a bool, got {self.t_packed!r}")
        n, hv, k = self.state.shape[:3]
        check_tensor("transition", self.t_storage, (n, hv, k, k), (self.state.dtype,))
        if self.t_packed and self.state.dtype != torch.float32:
            raise ValueError(f"a packed T (bf16 hi/lo planes) needs fp32 storage, got {self.state.dtype}")
        check_same_device(transition=self.t_storage, state=self.state)

    @property
    def transition(self) -> torch.Tensor:
        """T's values ``[N, HV, K, K]`` in the summary's dtype (unpacked when ``t_packed``)."""
        if self.t_packed:
            from .t_planes import unpack_planes

            return unpack_planes(self.t_storage)
        return self.t_storage

    def _t(self) -> torch.Tensor:
        return self.t_storage

    def _rebuild(self, t: torch.Tensor, state: torch.Tensor) -> "DenseSummary":
        return DenseSummary(t, state, self.t_packed)

    def unpacked(self) -> "DenseSummary":
        """This summary with T stored as plain values (itself when it is)."""
        return DenseSummary(self.transition, self.state) if self.t_packed else self

    def payload_fields(self) -> dict:
        """Constructor arguments, by name, for rebuilding it as a payload (moved, saved and
        loaded: :mod:`hypic.pic.payload`, :mod:`hypic.pic.persist`): the stored T as it is with
        its flag, so a packed T travels bit for bit and never as fp32 values (its fields are not
        its constructor's arguments: ``dataclasses.replace`` cannot rebuild it)."""
        return {"transition": self.t_storage, "state": self.state, "t_packed": self.t_packed}


Summary = Union[ScalarSummary, DiagonalSummary, DenseSummary]
SUMMARY_TYPES = (ScalarSummary, DiagonalSummary, DenseSummary)


def _check_summary(name: str, summary: object) -> Summary:
    if not isinstance(summary, SUMMARY_TYPES):
        raise ValueError(f"{name} must be a Scalar/Diagonal/DenseSummary, got {type(summary).__name__}")
    return summary


def _apply_t(summary: Summary, state: torch.Tensor) -> torch.Tensor:
    """T @ state on the K axis, T kept structured. state ``[N, HV, K, X]``."""
    if isinstance(summary, ScalarSummary):
        return torch.exp(summary.log_decay)[:, :, None, None] * state
    if isinstance(summary, DiagonalSummary):
        return torch.exp(summary.log_decay)[:, :, :, None] * state
    return torch.matmul(summary.transition, state)


def apply_summary(summary: Summary, state: torch.Tensor) -> torch.Tensor:
    """State leaving each span: ``T @ state + S`` for state ``[N, HV, K, V]`` (one per span)."""
    _check_summary("summary", summary)
    check_tensor("state", state, tuple(summary.state.shape), STATE_DTYPES)
    check_same_device(summary=summary.state, state=state)
    state = state.to(summary.dtype)
    return _apply_t(summary, state) + summary.state


def compose(later: Summary, earlier: Summary) -> Summary:
    """Summary of ``earlier`` followed by ``later``: ``(T2 T1, T2 S1 + S2)``, same class."""
    _check_summary("later", later)
    _check_summary("earlier", earlier)
    if type(later) is not type(earlier):
        raise ValueError(
            f"cannot compose {type(later).__name__} (later) with {type(earlier).__name__} (earlier)"
        )
    if later.state.shape != earlier.state.shape or later.dtype != earlier.dtype:
        raise ValueError(
            f"later has state {tuple(later.state.shape)} {later.dtype}, earlier has "
            f"{tuple(earlier.state.shape)} {earlier.dtype}; they must match"
        )
    check_same_device(later=later.state, earlier=earlier.state)
    state = _apply_t(later, earlier.state) + later.state
    if isinstance(later, DenseSummary):
        return DenseSummary(torch.matmul(later.transition, earlier.transition), state)
    return type(later)(later.log_decay + earlier.log_decay, state)


def identity_summary(like: Summary, n: int) -> Summary:
    """``n`` identity summaries (T = I, S = 0) with ``like``'s class, heads, dims, dtype, device."""
    _check_summary("like", like)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    hv, k, v = like.state.shape[1:]
    opts = dict(dtype=like.dtype, device=like.device)
    state = torch.zeros(n, hv, k, v, **opts)
    if isinstance(like, DenseSummary):
        eye = torch.eye(k, **opts).expand(n, hv, k, k).contiguous()
        return DenseSummary(eye, state)
    return type(like)(torch.zeros(like.log_decay.shape[1:], **opts).expand(n, *like.log_decay.shape[1:]).contiguous(), state)


@dataclass(frozen=True, eq=False)
class SummaryTable:
    """Summaries of single spans kept where they live (cached bodies in store entries), read by
    a scan in place instead of being concatenated first.

    ``items``: a sequence (not copied) of one-span summaries of one structure and state shape;
    only the first is looked at unless the table is stacked. ``addresses``: optional
    ``[2, N']`` int64 (N' >= N; columns past N unused, so a caller may pad rows for alignment)
    on the items' device, the data pointers of each item's stored T (or log decays) and S, all
    items of one storage form (:attr:`t_packed`); whoever
    builds it promises that every item is contiguous fp32 on that device (see
    :func:`summary_addresses`), and the GPU scan then reads the items through it. Without it (or
    on CPU) the items are concatenated."""

    items: Sequence[Summary]
    addresses: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        items = self.items
        if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
            raise ValueError(f"items must be a sequence of summaries, got {type(items).__name__}")
        if not items:
            raise ValueError("a SummaryTable needs at least one item")
        _check_summary("items[0]", items[0])
        if self.addresses is not None:
            check_tensor("addresses", self.addresses, (2, None), (torch.int64,))
            if self.addresses.shape[1] < len(items):
                raise ValueError(f"addresses has {self.addresses.shape[1]} columns for {len(items)} items")

    @property
    def num_spans(self) -> int:
        return len(self.items)

    @property
    def state_shape(self) -> Tuple[int, ...]:
        return tuple(self.items[0].state.shape[1:])

    @property
    def dtype(self) -> torch.dtype:
        return self.items[0].dtype

    @property
    def t_packed(self) -> bool:
        """Whether the items' dense T are stored as bf16 hi/lo planes (:class:`DenseSummary`);
        like the rest, the first item's word for all (the address tables of
        :mod:`hypic.runner.entry_tables` never mix the two forms)."""
        return bool(getattr(self.items[0], "t_packed", False))

    def stacked(self) -> Summary:
        return type(self.items[0]).cat(self.items)


def summary_addresses(summary: Summary, device: torch.device) -> Optional[Tuple[int, int]]:
    """``(T, S)`` data pointers of a one-span summary a GPU scan can read in place: contiguous
    fp32 tensors on ``device``, 64-byte aligned (every whole allocation is); None when it cannot
    (then it is copied). T's is its storage: a reader must also take the summary's ``t_packed``
    (a packed T's words are bf16 planes, :class:`DenseSummary`)."""
    _check_summary("summary", summary)
    device = concrete_device(device)
    parts = summary.parts()
    if summary.num_spans != 1 or any(
            t.device != device or t.dtype != torch.float32 or not t.is_contiguous() or t.data_ptr() % 64
            for t in parts):
        return None
    return parts[0].data_ptr(), parts[1].data_ptr()


def check_summary_targets(table: "SummaryTable", num_spans: int, num_heads: int, key_dim: int,
                          value_dim: Optional[int], device: torch.device, need_addresses: bool = False) -> None:
    """Check ``table`` as where ``num_spans`` dense zero-start summaries are to be written (e.g. the
    store entries of a forward's writes): a :class:`SummaryTable` of that many one-span
    :class:`DenseSummary` items, T ``[1, HV, K, K]`` and S ``[1, HV, K, V]`` fp32 on ``device``
    (``value_dim`` None: any V). Only the first item is looked at, as :class:`SummaryTable`
    promises; ``need_addresses``: a kernel writes through its address table, which must then be
    on ``device``."""
    if not isinstance(table, SummaryTable):
        raise ValueError(f"summary targets must be a SummaryTable, got {type(table).__name__}")
    if table.num_spans != num_spans:
        raise ValueError(f"summary targets hold {table.num_spans} items for {num_spans} spans")
    first = table.items[0]
    if not isinstance(first, DenseSummary):
        raise ValueError(f"summary targets must be DenseSummary items, got {type(first).__name__}")
    if first.t_packed:  # kernels write (and read back) fp32 T there; packing comes after
        raise ValueError("summary targets must hold T as plain fp32 values, not packed planes")
    device = concrete_device(device)
    value_dim = first.state.shape[-1] if value_dim is None else value_dim
    for name, t, shape in (("transition", first.transition, (1, num_heads, key_dim, key_dim)),
                           ("state", first.state, (1, num_heads, key_dim, value_dim))):
        if tuple(t.shape) != shape or t.dtype != torch.float32 or concrete_device(t.device) != device:
            raise ValueError(f"summary targets' {name} must be {shape} float32 on {device}, got "
                             f"{tuple(t.shape)} {t.dtype} on {t.device}")
    if need_addresses and (table.addresses is None or concrete_device(table.addresses.device) != device):
        raise ValueError(f"writing summary targets in place needs their address table on {device}")


def write_summaries_into(table: "SummaryTable", summary: DenseSummary) -> None:
    """Row i of ``summary`` into ``table.items[i]`` (one multi-tensor copy per part, converting the
    dtype): how a path that forms the summaries itself fills targets a kernel would write in
    place."""
    if summary.num_spans != table.num_spans:
        raise ValueError(f"{summary.num_spans} summaries for {table.num_spans} targets")
    items = list(table.items)
    if any(item.t_packed for item in items):  # .transition of a packed item is a fresh tensor
        raise ValueError("cannot write summaries into targets whose T is packed")
    torch._foreach_copy_([item.transition for item in items], list(summary.transition.unsqueeze(1).unbind(0)))
    torch._foreach_copy_([item.state for item in items], list(summary.state.unsqueeze(1).unbind(0)))


def select_spans(summary: Summary, spans) -> Summary:
    """The summaries of ``spans`` (None: all; a host ``(a, b)``: views of spans a..b-1; an index
    tensor: a gathered copy, in its order), of ``summary``'s class and storage form."""
    if spans is None:
        return summary
    if isinstance(spans, tuple):
        a, b = spans
        t, state = summary.parts()
        return summary._rebuild(t[a:b], state[a:b])
    return summary.index(spans.to(torch.int64))


__all__: List[str] = [
    "ScalarSummary",
    "DiagonalSummary",
    "DenseSummary",
    "Summary",
    "SUMMARY_TYPES",
    "SummaryTable",
    "summary_addresses",
    "check_summary_targets",
    "write_summaries_into",
    "select_spans",
    "apply_summary",
    "compose",
    "identity_summary",
]
