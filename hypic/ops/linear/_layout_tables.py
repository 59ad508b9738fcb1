"""Device tables derived from a forward's layout tensors, kept as long as those tensors live.

Several ops build small device tables (fla's chunk table, each span's first chunk row, the short
spans' row tables) on the host from a ``cu`` tensor's host copy, and send them with one pinned
copy. Every layer of a forward asks again with the same two tensors, so the answer is kept for
them. It is kept **by the identity of the device ``cu``, for as long as that tensor lives**
(a weak key), not in a most-recent-first list of a few entries: a CUDA graph captured over a
forward reads these tables where they lie, and the engine replays such graphs in later forwards
of the same shape (:mod:`hypic.graphs.layer_graphs`) while it keeps the capturing forward's
layout alive. An entry evicted from a short list would be freed under a graph that still reads
it; an entry tied to the layout dies with it and with no graph reading it.
"""

from __future__ import annotations

from typing import Callable, Hashable, List, Optional, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary


class ByIdentity:
    """A key part equal only to a wrapper of the same object (a tensor's ``==`` is elementwise)."""

    __slots__ = ("obj",)

    def __init__(self, obj) -> None:
        self.obj = obj

    def __eq__(self, other) -> bool:
        return isinstance(other, ByIdentity) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


class LayoutTables:
    """``get(cu, cu_cpu, key, build)``: ``build()``'s answer for the device tensor ``cu`` (by
    identity, weakly), its host copy ``cu_cpu`` (by identity) and ``key`` (by equality), built
    on the first call and kept while ``cu`` lives."""

    def __init__(self) -> None:
        self._by_cu: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def get(self, cu: torch.Tensor, cu_cpu: Optional[torch.Tensor], key: Hashable, build: Callable[[], object]):
        held: Optional[List[Tuple[Optional[torch.Tensor], Hashable, object]]] = self._by_cu.get(cu)
        if held is None:
            held = self._by_cu[cu] = []
        for held_cpu, held_key, answer in held:
            if held_cpu is cu_cpu and held_key == key:
                return answer
        answer = build()
        held.append((cu_cpu, key, answer))
        return answer

    def __len__(self) -> int:
        return len(self._by_cu)


__all__ = ["ByIdentity", "LayoutTables"]
