"""What ``hypic bench deviation`` records: per-token activations of a forward, and splicing them.

:class:`ActivationRecorder` hooks a Qwen3-Next / Qwen3.5-family model (``model.model`` a
:class:`~hypic.models.layers.DecoderStack` whose full-attention layers hold ``self_attn`` with
``q_norm``, ``k_norm``, ``v_proj`` and ``o_proj``) and keeps, for every forward it sees, per live
token (rows in packed order, with their absolute positions):

* after every decoder layer: the residual stream (``hidden``);
* per full-attention layer: q and K after their norms and before RoPE (``q``, ``k``: RoPE is a
  function of the position only, and PIC re-rotates cached K exactly, so pre-RoPE K is what a
  spliced key is made of), V (``v``) and the attention block's output before the residual
  (``attn``, ``o_proj``'s output);
* the stack's final output before the final norm (``final``).

:func:`splice` assembles, for a request served from cached entries, the activations that serving
actually combines at each position: the live rows of the request's own forward (seam windows and
the query), and for each reused body the rows of the forward that wrote its entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from hypic.engine.context import PlainContext, SequenceCache
from hypic.models.config import LINEAR_ATTENTION

ATTENTION_FIELDS = ("q", "k", "v", "attn")


@dataclass
class Activations:
    """One forward's rows: ``positions [T]``; ``hidden[layer] [T, H]``; ``q/k/v/attn[layer]`` for the
    full-attention layers (``q [T, Hq, D]``, ``k [T, Hkv, D]``, ``v [T, Hkv*D]``, ``attn [T, H]``);
    ``final [T, H]`` (before the final norm)."""

    positions: torch.Tensor
    hidden: Dict[int, torch.Tensor] = field(default_factory=dict)
    q: Dict[int, torch.Tensor] = field(default_factory=dict)
    k: Dict[int, torch.Tensor] = field(default_factory=dict)
    v: Dict[int, torch.Tensor] = field(default_factory=dict)
    attn: Dict[int, torch.Tensor] = field(default_factory=dict)
    final: Optional[torch.Tensor] = None

    def rows(self, index: torch.Tensor) -> "Activations":
        """The rows ``index`` (a LongTensor) of every field."""
        def pick(d):
            return {i: t.index_select(0, index) for i, t in d.items()}
        return Activations(self.positions.index_select(0, index), pick(self.hidden), pick(self.q), pick(self.k),
                           pick(self.v), pick(self.attn),
                           None if self.final is None else self.final.index_select(0, index))

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])


class ActivationRecorder:
    """Forward hooks on ``model`` that append one :class:`Activations` per forward to
    :attr:`forwards` while :attr:`enabled`; :meth:`close` removes them."""

    def __init__(self, model: torch.nn.Module, layer_types: Sequence[str]) -> None:
        stack = getattr(model, "model", None)
        if stack is None or not hasattr(stack, "layers"):
            raise ValueError("model: expected a CausalLM whose .model is a decoder stack with .layers")
        self.attention_layers = [i for i, t in enumerate(layer_types) if t != LINEAR_ATTENTION]
        self.enabled = False
        self.forwards: List[Activations] = []
        self._handles = [stack.register_forward_pre_hook(self._start), stack.register_forward_hook(self._final)]
        for i, layer in enumerate(stack.layers):
            self._handles.append(layer.register_forward_hook(self._store("hidden", i)))
        for i in self.attention_layers:
            attn = getattr(stack.layers[i], "self_attn", None)
            missing = [n for n in ("q_norm", "k_norm", "v_proj", "o_proj") if not hasattr(attn, n)]
            if attn is None or missing:
                raise ValueError(f"layer {i}: full-attention layer without self_attn.{missing or 'self_attn'} "
                                 "(the deviation bench reads Qwen3-Next / Qwen3.5-family attention)")
            for name, module in (("q", attn.q_norm), ("k", attn.k_norm), ("v", attn.v_proj), ("attn", attn.o_proj)):
                self._handles.append(module.register_forward_hook(self._store(name, i)))

    def _start(self, module, args) -> None:
        if self.enabled:
            self.forwards.append(Activations(args[1].detach().clone()))

    def _store(self, name: str, layer: int):
        def hook(module, args, output) -> None:
            if self.enabled:
                getattr(self.forwards[-1], name)[layer] = output.detach().float().clone()
        return hook

    def _final(self, module, args, output) -> None:
        if self.enabled:
            self.forwards[-1].final = output.detach().float().clone()

    def take(self) -> List[Activations]:
        """The forwards recorded since the last call."""
        out, self.forwards = self.forwards, []
        return out

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


@torch.inference_mode()
def plain_forward(model: torch.nn.Module, spec, recorder: ActivationRecorder, token_ids: Sequence[int],
                  device: torch.device, dtype: torch.dtype) -> Activations:
    """Every token of ``token_ids`` from position 0 in one forward with no cache (full recompute)."""
    cache = SequenceCache.allocate(spec, device, dtype)
    ctx = PlainContext(spec, [cache], [len(token_ids)])
    recorder.enabled = True
    try:
        model(torch.tensor(list(token_ids), dtype=torch.long, device=device), ctx.positions, ctx)
    finally:
        recorder.enabled = False
    (forward,) = recorder.take()
    return forward


def by_position(forward: Activations) -> Dict[int, int]:
    """Absolute position -> row of ``forward``."""
    return {int(p): row for row, p in enumerate(forward.positions.tolist())}


def splice(live: Activations, bodies: Sequence[Optional[Activations]], segment_starts: Sequence[int],
           segment_lengths: Sequence[int], num_tokens: int) -> Activations:
    """The activations a cached request is made of, one row per prompt position ``0 .. num_tokens-1``.

    ``live``: the request's own forward (rows at their absolute positions: seam windows, the query,
    anything else it computed). ``bodies[i]``: segment i's rows in the forward that wrote its entry,
    one per offset ``0 .. L-1`` (None: the segment must be wholly live). A position the live forward
    computed takes the live row; any other takes its segment's writer row at the same offset."""
    index = by_position(live)
    live_positions = sorted(p for p in index if 0 <= p < num_tokens)
    sources = [(live, live_positions, [index[p] for p in live_positions])]
    covered = set(live_positions)
    for start, length, body in zip(segment_starts, segment_lengths, bodies):
        offsets = [o for o in range(length) if start + o not in index]
        if not offsets:
            continue
        if body is None:
            raise ValueError(f"segment at {start}: positions {offsets[:4]} were neither live nor cached")
        sources.append((body, [start + o for o in offsets], offsets))
        covered.update(start + o for o in offsets)
    if len(covered) != num_tokens:
        missing = sorted(set(range(num_tokens)) - covered)
        raise ValueError(f"positions {missing[:4]} were neither live nor cached")
    out = Activations(torch.arange(num_tokens))
    for name in ("hidden",) + ATTENTION_FIELDS:
        for layer, tensor in getattr(live, name).items():
            dest = tensor.new_empty((num_tokens,) + tuple(tensor.shape[1:]))
            for source, positions, rows in sources:
                picked = getattr(source, name)[layer].index_select(0, torch.tensor(rows))
                dest.index_copy_(0, torch.tensor(positions), picked)
            getattr(out, name)[layer] = dest
    out.final = live.final.new_empty((num_tokens, live.final.shape[1]))
    for source, positions, rows in sources:
        out.final.index_copy_(0, torch.tensor(positions), source.final.index_select(0, torch.tensor(rows)))
    return out
