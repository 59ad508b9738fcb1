"""The ForwardContext interface and its plain implementation (full recompute and decode).

Model code never touches a cache: every layer calls the context it is handed (docs/contracts.md,
"hypic.models <-> hypic.engine"). :class:`PlainContext` is the context of ordinary serving: a batch
of sequences, each with an explicit :class:`SequenceCache` (per linear layer: recurrent state
``[HV, K, V]`` + conv state ``[D, W-1]``, both fp32; per full-attention layer: K/V of every
position so far), each contributing one span of live tokens that continues from its cache. Final
states and new K/V are written back into the caches as each layer runs, so after
``model(ids, ctx.positions, ctx)`` the caches hold the state after the spans.

Prefill, chunked prefill (several spans in turn), and one-token decode of many sequences are all
the same call; spans of length 1 take the recurrent decode kernels.
"""

from __future__ import annotations

import abc
from typing import List, Optional, Sequence, Tuple, Union

import torch

from hypic.graphs.cuda_graphs import TokenGraphs
from hypic.models.config import LINEAR_ATTENTION, ModelSpec
from hypic.ops.attention import varlen_attention
from hypic.ops.conv import causal_conv1d, causal_conv1d_update
from hypic.ops.linear.gated_delta import gated_delta_decode, gated_delta_forward
from hypic.ops.linear.simple_gla import simple_gla_decode, simple_gla_forward


class ForwardContext(abc.ABC):
    """What model layers call; runners implement it (plain here, PIC plans in hypic.runner)."""

    @abc.abstractmethod
    def short_conv(
        self, layer_idx: int, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]
    ) -> torch.Tensor:
        """Causal depthwise conv + SiLU of live tokens ``x [T, D]`` (weight ``[D, W]``) -> ``[T, D]``."""

    @abc.abstractmethod
    def linear_attention(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
    ) -> torch.Tensor:
        """Gated delta rule over live tokens (q, k L2-normalised ``[T, H, K]``) -> ``[T, HV, V]``."""

    @abc.abstractmethod
    def lightning_attention(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
        scale: float, key_rotary=None,
    ) -> torch.Tensor:
        """Linear attention with a constant per-head decay over live tokens (lightning: Ring-linear,
        MiniMax): ``S_t = exp(log_decay) S_{t-1} + k_t v_t^T``, ``o_t = scale * q_t^T S_t``. q, k, v
        ``[T, H, D]``, ``log_decay [H]`` fp32 (<= 0) -> ``[T, H, D]``. ``key_rotary``: the
        RotaryEmbedding the keys carry (applied at their positions by the model), or None: a
        runner re-rotates reused states of such a layer."""

    @abc.abstractmethod
    def attention(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, rotary
    ) -> torch.Tensor:
        """Causal GQA of live queries over cached + live keys -> ``[T, Hq, D]``. q, k already carry
        RoPE at their positions; ``rotary`` lets a runner re-rotate reused cached K."""

    @abc.abstractmethod
    def select_logits_rows(self, hidden: torch.Tensor) -> torch.Tensor:
        """Rows of ``hidden [T, H]`` whose logits are needed."""

    def rope_cos_sin(self, rotary, positions: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """RoPE ``cos, sin [T, rotary_dim]`` in ``dtype`` of the live tokens at ``positions``
        (``rotary.cos_sin``): what the model rotates q and k by. A runner may return the values
        an earlier forward computed for the same positions (they are only read)."""
        cos, sin = rotary.cos_sin(positions)
        return cos.to(dtype), sin.to(dtype)

    # Set by the runner that owns the forward: replays of token-wise phases (CUDA graphs).
    graphs: Optional["TokenGraphs"] = None

    def token_wise(self, fn, *tensors: torch.Tensor):
        """``fn(*tensors)`` for a row-wise phase of a layer (row t of every output depends on row t
        of the inputs only; every tensor has the T live tokens as its first dim): run as is, or
        replayed from a captured CUDA graph when the runner keeps them
        (:mod:`hypic.graphs.cuda_graphs`). A replay's outputs are views of buffers that the
        next replay of the same phase (in any layer) rewrites: consume them, or copy what is kept,
        before then."""
        return fn(*tensors) if self.graphs is None else self.graphs.run(fn, *tensors)


# ---- per-sequence caches ------------------------------------------------------------------------


class LinearLayerCache:
    """The linear-attention state of one sequence in one linear layer, and the short conv's
    state before it (None for a family without a conv)."""

    def __init__(self, recurrent_state: torch.Tensor, conv_state: Optional[torch.Tensor]) -> None:
        if recurrent_state.dim() != 3 or (conv_state is not None and conv_state.dim() != 2):
            raise ValueError("recurrent_state must be [HV, K, V] and conv_state [D, W-1] or None")
        self.recurrent_state = recurrent_state
        self.conv_state = conv_state
        self.num_tokens = 0

    def clone(self) -> "LinearLayerCache":
        conv = None if self.conv_state is None else self.conv_state.clone()
        out = LinearLayerCache(self.recurrent_state.clone(), conv)
        out.num_tokens = self.num_tokens
        return out

    @property
    def nbytes(self) -> int:
        return self.recurrent_state.nbytes + (0 if self.conv_state is None else self.conv_state.nbytes)


class AttentionLayerCache:
    """K (with RoPE applied at its position), V and the absolute positions of one sequence's tokens
    in one full-attention layer; grows by doubling so decode appends are amortised O(1)."""

    def __init__(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self._keys = torch.empty(0, num_kv_heads, head_dim, dtype=dtype, device=device)
        self._values = torch.empty(0, num_kv_heads, head_dim, dtype=dtype, device=device)
        self._positions = torch.empty(0, dtype=torch.long, device=device)
        self.length = 0

    @property
    def keys(self) -> torch.Tensor:
        return self._keys[: self.length]

    @property
    def values(self) -> torch.Tensor:
        return self._values[: self.length]

    @property
    def positions(self) -> torch.Tensor:
        return self._positions[: self.length]

    @property
    def num_tokens(self) -> int:
        return self.length

    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        n = keys.shape[0]
        if keys.shape[1:] != self._keys.shape[1:] or values.shape != keys.shape:
            raise ValueError(
                f"keys/values must be [n, {self._keys.shape[1]}, {self._keys.shape[2]}], got "
                f"{tuple(keys.shape)} / {tuple(values.shape)}"
            )
        if keys.dtype != self._keys.dtype:
            raise ValueError(f"keys dtype {keys.dtype} != cache dtype {self._keys.dtype}")
        need = self.length + n
        if need > self._keys.shape[0]:
            capacity = max(need, 2 * self._keys.shape[0], 16)
            self._keys = _grow(self._keys, capacity, self.length)
            self._values = _grow(self._values, capacity, self.length)
            self._positions = _grow(self._positions, capacity, self.length)
        self._keys[self.length : need] = keys
        self._values[self.length : need] = values
        self._positions[self.length : need] = positions
        self.length = need

    @classmethod
    def adopt(cls, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> "AttentionLayerCache":
        """A cache holding ``keys``, ``values`` and ``positions`` themselves, not copies: a prefill
        whose K/V record belongs to one sequence hands it over instead of copying tens of MB per
        layer before its first token. Its capacity is its length, so the first decode append
        grows it into a buffer of its own (the given tensors are never written)."""
        if keys.dim() != 3 or values.shape != keys.shape or values.dtype != keys.dtype:
            raise ValueError(f"keys/values must be matching [n, heads, head_dim] tensors, got "
                             f"{tuple(keys.shape)} {keys.dtype} / {tuple(values.shape)} {values.dtype}")
        if positions.shape != keys.shape[:1]:
            raise ValueError(f"positions must be [{keys.shape[0]}], got {tuple(positions.shape)}")
        out = cls.__new__(cls)
        out._keys, out._values, out._positions = keys, values, positions
        out.length = keys.shape[0]
        return out

    def clone(self) -> "AttentionLayerCache":
        out = AttentionLayerCache.__new__(AttentionLayerCache)
        out._keys, out._values, out._positions = self.keys.clone(), self.values.clone(), self.positions.clone()
        out.length = self.length
        return out

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes + self.positions.nbytes


def _grow(buf: torch.Tensor, capacity: int, used: int) -> torch.Tensor:
    new = buf.new_empty((capacity,) + tuple(buf.shape[1:]))
    new[:used] = buf[:used]
    return new


LayerCache = Union[LinearLayerCache, AttentionLayerCache]


class SequenceCache:
    """All per-layer state of one sequence (index = layer index)."""

    def __init__(self, layers: List[LayerCache]) -> None:
        self.layers = layers

    @classmethod
    def allocate(cls, spec: ModelSpec, device: Union[str, torch.device], dtype: torch.dtype = torch.float32) -> "SequenceCache":
        """Empty cache (zero states, no K/V). ``dtype`` is the model's activation dtype (K/V);
        recurrent and conv states are fp32 (fp64 for an fp64 model); no conv state where the
        family has no conv (``spec.conv_kernel_size == 0``)."""
        device = torch.device(device)
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        layers: List[LayerCache] = []
        for kind in spec.layer_types:
            if kind == LINEAR_ATTENTION:
                layers.append(
                    LinearLayerCache(
                        torch.zeros(
                            spec.linear_num_value_heads, spec.linear_key_head_dim, spec.linear_value_head_dim,
                            dtype=state_dtype, device=device,
                        ),
                        torch.zeros(spec.conv_dim, spec.conv_kernel_size - 1, dtype=state_dtype, device=device)
                        if spec.conv_kernel_size else None,
                    )
                )
            else:
                layers.append(AttentionLayerCache(spec.num_key_value_heads, spec.head_dim, dtype, device))
        return cls(layers)

    @property
    def num_tokens(self) -> int:
        """Tokens consumed so far (= next default position)."""
        return self.layers[0].num_tokens if self.layers else 0

    def clone(self) -> "SequenceCache":
        return SequenceCache([layer.clone() for layer in self.layers])

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)


# ---- the plain context ----------------------------------------------------------------------------


class PlainContext(ForwardContext):
    """One forward over N sequences, each contributing ``num_tokens_per_seq[i] >= 1`` live tokens
    packed in order.

    ``positions``: absolute positions ``[T]``; default continues each cache
    (``cache.num_tokens + arange(n)``). ``logits_rows``: ``"last"`` (last token of each span,
    default), ``"all"``, or a LongTensor of row indices into the packed tokens.
    Call ``model(input_ids, ctx.positions, ctx)``.
    """

    def __init__(
        self,
        spec: ModelSpec,
        caches: Sequence[SequenceCache],
        num_tokens_per_seq: Sequence[int],
        positions: Optional[torch.Tensor] = None,
        logits_rows: Union[str, torch.Tensor] = "last",
    ) -> None:
        caches = list(caches)
        counts = [int(n) for n in num_tokens_per_seq]
        if not caches:
            raise ValueError("caches must hold at least one SequenceCache")
        if len(counts) != len(caches):
            raise ValueError(f"num_tokens_per_seq has {len(counts)} entries for {len(caches)} caches")
        if any(n < 1 for n in counts):
            raise ValueError(f"num_tokens_per_seq entries must be >= 1, got {counts}")
        for i, cache in enumerate(caches):
            if len(cache.layers) != spec.num_layers:
                raise ValueError(f"caches[{i}] has {len(cache.layers)} layers, spec has {spec.num_layers}")
        if len({id(c) for c in caches}) != len(caches):
            raise ValueError("a SequenceCache appears twice in one batch")
        self.spec = spec
        self.caches = caches
        self.num_tokens_per_seq = counts
        device = _cache_device(caches[0])
        self.device = device
        # The host copy spares the fla kernels a device-to-host read of the lengths.
        self.cu_seqlens_cpu = torch.tensor([0] + counts, dtype=torch.long).cumsum(0)
        self.cu_seqlens = self.cu_seqlens_cpu.to(device)
        total = sum(counts)
        index_causal_default = positions is None
        if positions is None:
            positions = torch.cat(
                [torch.arange(c.num_tokens, c.num_tokens + n, dtype=torch.long) for c, n in zip(caches, counts)]
            ).to(device)
        else:
            if positions.shape != (total,) or positions.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"positions must be an integer tensor of shape [{total}], got {tuple(positions.shape)}")
            positions = positions.to(device=device, dtype=torch.long)
            for i, (a, b) in enumerate(zip(self.cu_seqlens[:-1].tolist(), self.cu_seqlens[1:].tolist())):
                if b - a > 1 and not bool((positions[a + 1 : b] > positions[a : b - 1]).all()):
                    raise ValueError(f"positions of sequence {i} must be strictly increasing")
        self.positions = positions
        # Default positions continue each cache, whose keys are positions 0..m-1 in order: then
        # causal by position equals causal by index (the attention ops' flash path).
        self.index_causal = index_causal_default
        self._cu_host = [0]
        for n in counts:
            self._cu_host.append(self._cu_host[-1] + n)
        self.is_decode = all(n == 1 for n in counts)
        # (key lengths, cu_seqlens_k, key positions) of the attention layers: identical for every
        # full-attention layer of this forward, so built once (one host-to-device copy per
        # forward instead of one per layer).
        self._key_layout: Optional[Tuple[List[int], torch.Tensor, torch.Tensor, List[int]]] = None
        if isinstance(logits_rows, str):
            if logits_rows == "last":
                self.logits_rows: Optional[torch.Tensor] = self.cu_seqlens[1:] - 1
            elif logits_rows == "all":
                self.logits_rows = None
            else:
                raise ValueError(f"logits_rows must be 'last', 'all' or a LongTensor, got {logits_rows!r}")
        else:
            if logits_rows.dim() != 1 or logits_rows.dtype not in (torch.int32, torch.int64):
                raise ValueError("logits_rows tensor must be a 1-D integer tensor")
            if logits_rows.numel() and (int(logits_rows.min()) < 0 or int(logits_rows.max()) >= total):
                raise ValueError(f"logits_rows must index rows in [0, {total})")
            self.logits_rows = logits_rows.to(device=device, dtype=torch.long)

    # -- linear layers --
    def _linear_caches(self, layer_idx: int) -> List[LinearLayerCache]:
        layers = [c.layers[layer_idx] for c in self.caches]
        if not isinstance(layers[0], LinearLayerCache):
            raise ValueError(f"layer {layer_idx} is not a linear-attention layer")
        return layers  # type: ignore[return-value]

    def short_conv(self, layer_idx, x, weight, bias):
        layers = self._linear_caches(layer_idx)
        states = torch.stack([layer.conv_state for layer in layers]).to(x.dtype)
        if self.is_decode:
            y, new_states = causal_conv1d_update(x, states, weight, bias, activation="silu")
        else:
            y, new_states = causal_conv1d(
                x, weight, bias, cu_seqlens=self.cu_seqlens, initial_state=states, activation="silu",
                cu_seqlens_cpu=self.cu_seqlens_cpu,
            )
        for layer, state in zip(layers, new_states):
            layer.conv_state = state.to(layer.conv_state.dtype)
        return y

    def linear_attention(self, layer_idx, q, k, v, g, beta):
        layers = self._linear_caches(layer_idx)
        states = torch.stack([layer.recurrent_state for layer in layers])
        if self.is_decode:
            o, final = gated_delta_decode(q, k, v, g, beta, states)
        else:
            o, final = gated_delta_forward(q, k, v, g, beta, cu_seqlens=self.cu_seqlens, initial_state=states,
                                           cu_seqlens_cpu=self.cu_seqlens_cpu)
        for layer, state, n in zip(layers, final, self.num_tokens_per_seq):
            layer.recurrent_state = state.to(layer.recurrent_state.dtype)
            layer.num_tokens += n
        return o

    def lightning_attention(self, layer_idx, q, k, v, log_decay, scale, key_rotary=None):
        # The plain context continues each cache where its keys were rotated: nothing to move.
        layers = self._linear_caches(layer_idx)
        states = torch.stack([layer.recurrent_state for layer in layers])
        if self.is_decode:
            o, final = simple_gla_decode(q, k, v, None, states, g_gamma=log_decay, scale=scale)
        else:
            o, final = simple_gla_forward(q, k, v, g_gamma=log_decay, cu_seqlens=self.cu_seqlens,
                                          initial_state=states, scale=scale, cu_seqlens_cpu=self.cu_seqlens_cpu)
        for layer, state, n in zip(layers, final, self.num_tokens_per_seq):
            layer.recurrent_state = state.to(layer.recurrent_state.dtype)
            layer.num_tokens += n
        return o

    # -- full-attention layers --
    def attention(self, layer_idx, q, k, v, scale, rotary):
        # The plain context keeps K at the positions it was computed at, so ``rotary`` is unused.
        layers = [c.layers[layer_idx] for c in self.caches]
        if not isinstance(layers[0], AttentionLayerCache):
            raise ValueError(f"layer {layer_idx} is not a full-attention layer")
        cu = self._cu_host
        for i, layer in enumerate(layers):
            layer.append(k[cu[i] : cu[i + 1]], v[cu[i] : cu[i + 1]], self.positions[cu[i] : cu[i + 1]])
        if len(layers) == 1:
            keys, values = layers[0].keys, layers[0].values
        else:
            keys = torch.cat([layer.keys for layer in layers])
            values = torch.cat([layer.values for layer in layers])
        lengths = [layer.length for layer in layers]
        if self._key_layout is None or self._key_layout[0] != lengths:
            pos_k = layers[0].positions if len(layers) == 1 else torch.cat([layer.positions for layer in layers])
            cu_k_host = [0]
            for n in lengths:
                cu_k_host.append(cu_k_host[-1] + n)
            cu_k = torch.tensor(cu_k_host, dtype=torch.long).to(q.device)
            self._key_layout = (lengths, cu_k, pos_k, cu_k_host)
        _, cu_k, pos_k, cu_k_host = self._key_layout
        return varlen_attention(
            q, keys, values,
            cu_seqlens_q=self.cu_seqlens, cu_seqlens_k=cu_k,
            positions_q=self.positions, positions_k=pos_k, scale=scale,
            index_causal=self.index_causal, max_seqlen_q=max(self.num_tokens_per_seq),
            max_seqlen_k=max(lengths), layout_key=self,
            cu_seqlens_q_host=self._cu_host, cu_seqlens_k_host=cu_k_host,
        )

    def select_logits_rows(self, hidden):
        if self.logits_rows is None:
            return hidden
        return hidden.index_select(0, self.logits_rows)


def _cache_device(cache: SequenceCache) -> torch.device:
    layer = cache.layers[0]
    if isinstance(layer, LinearLayerCache):
        return layer.recurrent_state.device
    return layer.keys.device
