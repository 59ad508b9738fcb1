"""Factored summaries of short spans of the delta-rule families (Gated DeltaNet).

A span C of L tokens that fits one chunk has, per value head (``hypic.ops.linear._chunked``'s
WY/UT form, cumulative log gate ``b``, ``Gamma_t = exp(b_t)``):

    T_C = Gamma_L I - P^T Q        P_s = Gamma_L / Gamma_s k_s              (P: [L, K])
    S_C = P^T R                    Q = (I + M)^-1 diag(beta) Gamma k        (Q: [L, K])
                                   R = (I + M)^-1 diag(beta) V              (R: [L, V])

with ``M_ts = beta_t k_t^T Gamma_t Gamma_s^-1 k_s`` for s < t. So T is the identity plus a
correction of rank at most L, and S has rank at most L: storing ``(Gamma_L, P, Q, R)`` costs
``L (2K + V) + 1`` numbers per head against ``K (K + V)`` dense, fewer whenever
``L (2K + V) < K (K + V)`` (:func:`low_rank_is_smaller`: below 42 tokens at K = V = 64, 85 at
K = V = 128). Applying it to a state never forms T:

    T S + S_C = Gamma_L S + P^T (R - Q S)                (two [L, K] x [K, V]-sized products)

:func:`apply_low_rank` does that; :meth:`LowRankSummary.dense` forms the dense summary for code
that reads dense T (the GPU chain walk reads bodies as dense T: a forward materialises them when
it reads them, the store keeps the factors). :func:`scan_chain_mixed` is the reference chain scan
over live spans' dense summaries and bodies of either form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch

from ._chunked import CHUNK_SIZE, MIN_CHUNK_SIZE, ChunkLayout, _decayed_grams, unit_lower_inverse
from .checks import STATE_DTYPES, check_same_device, check_tensor, cu_seqlens_to_list
from .summary import DenseSummary, _apply_t


def low_rank_is_smaller(num_tokens: int, key_dim: int, value_dim: int) -> bool:
    """Whether a span of ``num_tokens`` stores fewer numbers factored than dense (and fits the
    one chunk the factors are formed in)."""
    return 0 < num_tokens <= CHUNK_SIZE and num_tokens * (2 * key_dim + value_dim) + 1 < key_dim * (key_dim + value_dim)


@dataclass(frozen=True, eq=False)
class LowRankSummary:
    """``T = exp(log_decay) I - keys^T weights``, ``S = keys^T values`` per span and head:
    log_decay ``[N, HV]``, keys and weights ``[N, HV, L, K]``, values ``[N, HV, L, V]`` (one rank
    L for the N spans: a store entry holds one span)."""

    log_decay: torch.Tensor
    keys: torch.Tensor
    weights: torch.Tensor
    values: torch.Tensor

    def __post_init__(self) -> None:
        check_tensor("keys", self.keys, (None, None, None, None), STATE_DTYPES)
        n, hv, rank, k = self.keys.shape
        check_tensor("weights", self.weights, (n, hv, rank, k), (self.keys.dtype,))
        check_tensor("values", self.values, (n, hv, rank, None), (self.keys.dtype,))
        check_tensor("log_decay", self.log_decay, (n, hv), (self.keys.dtype,))
        check_same_device(log_decay=self.log_decay, keys=self.keys, weights=self.weights, values=self.values)

    @property
    def num_spans(self) -> int:
        return self.keys.shape[0]

    @property
    def num_heads(self) -> int:
        return self.keys.shape[1]

    @property
    def rank(self) -> int:
        return self.keys.shape[2]

    @property
    def key_dim(self) -> int:
        return self.keys.shape[3]

    @property
    def value_dim(self) -> int:
        return self.values.shape[3]

    @property
    def dtype(self) -> torch.dtype:
        return self.keys.dtype

    @property
    def device(self) -> torch.device:
        return self.keys.device

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.log_decay, self.keys, self.weights, self.values))

    def to(self, device) -> "LowRankSummary":
        return LowRankSummary(self.log_decay.to(device), self.keys.to(device), self.weights.to(device),
                              self.values.to(device))

    @property
    def transition(self) -> torch.Tensor:
        """Dense T ``[N, HV, K, K]`` (formed on every read)."""
        eye = torch.eye(self.key_dim, dtype=self.dtype, device=self.device)
        return (torch.exp(self.log_decay)[:, :, None, None] * eye
                - torch.matmul(self.keys.transpose(-1, -2), self.weights))

    @property
    def state(self) -> torch.Tensor:
        """Dense S ``[N, HV, K, V]`` (formed on every read)."""
        return torch.matmul(self.keys.transpose(-1, -2), self.values)

    def dense(self) -> DenseSummary:
        return DenseSummary(self.transition, self.state)


def apply_low_rank(summary: LowRankSummary, state: torch.Tensor) -> torch.Tensor:
    """``T state + S`` for state ``[N, HV, K, V]`` (one per span), T never formed."""
    check_tensor("state", state, (summary.num_spans, summary.num_heads, summary.key_dim, summary.value_dim),
                 STATE_DTYPES)
    state = state.to(summary.dtype)
    correction = summary.values - torch.matmul(summary.weights, state)  # [N, HV, L, V]
    return torch.exp(summary.log_decay)[:, :, None, None] * state + torch.matmul(
        summary.keys.transpose(-1, -2), correction)


def gated_delta_low_rank_summarize(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
                                   cu_seqlens: torch.Tensor) -> List[LowRankSummary]:
    """The factored summary of every span of ``cu_seqlens`` (each at most one chunk, at least one
    token): q-free inputs of the gated delta rule, k ``[T, H, K]`` (L2-normalised), v ``[T, HV, V]``,
    g and beta ``[T, HV]``; one single-span summary per span, of its own rank, in fp32 (fp64 for
    fp64 inputs). All spans are formed in one batched pass, padded to the longest."""
    num_tokens, _, key_dim = k.shape
    hv = v.shape[1]
    bounds = cu_seqlens_to_list(cu_seqlens, num_tokens)
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    if not lengths:
        return []
    if min(lengths) < 1 or max(lengths) > CHUNK_SIZE:
        raise ValueError(f"every span must hold 1 to {CHUNK_SIZE} tokens, got lengths {sorted(set(lengths))}")
    dtype = torch.float64 if torch.float64 in (k.dtype, v.dtype) else torch.float32
    size = MIN_CHUNK_SIZE
    while size < max(lengths):
        size *= 2
    layout = ChunkLayout(bounds, size, k.device)  # one chunk per span, in rank (length) order
    ratio = hv // k.shape[1]
    kx = (k if ratio == 1 else k.repeat_interleave(ratio, dim=1)).to(dtype)
    kc, vc = layout.gather(kx), layout.gather(v.to(dtype))  # [NC, HV, C, *], zero padding
    b = layout.gather(g.to(dtype)[:, :, None]).cumsum(dim=-2)  # [NC, HV, C, 1]
    betac = layout.gather(beta.to(dtype)[:, :, None])
    gram = _decayed_grams([kc], kc, b)[0]
    eye = torch.eye(size, dtype=dtype, device=k.device)
    a_inv = unit_lower_inverse(gram.tril(-1) * betac + eye)
    solved = torch.matmul(a_inv, betac * torch.cat([vc, kc * torch.exp(b)], dim=-1))
    values, weights = solved[..., : v.shape[-1]], solved[..., v.shape[-1]:]
    # b at each span's last token (padding adds zero gates: b_C = b_L)
    b_last = b[:, :, -1:, :]
    keys = kc * torch.exp(b_last - b)
    log_decay = b_last[:, :, 0, 0]  # [NC, HV]
    out: List[Optional[LowRankSummary]] = [None] * len(lengths)
    for chunk, seq in enumerate(layout.rank_to_seq.tolist()):
        n = lengths[seq]
        out[seq] = LowRankSummary(log_decay[chunk:chunk + 1].contiguous(), keys[chunk:chunk + 1, :, :n].contiguous(),
                                  weights[chunk:chunk + 1, :, :n].contiguous(),
                                  values[chunk:chunk + 1, :, :n].contiguous())
    return out  # type: ignore[return-value]


Body = Union[DenseSummary, LowRankSummary]


def scan_chain_mixed(live: DenseSummary, bodies: Sequence[Body], source: torch.Tensor, cu_chains: torch.Tensor,
                     initial_states: Optional[torch.Tensor] = None, *, record_rows: Optional[torch.Tensor] = None,
                     num_records: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`~hypic.ops.linear.scan.scan_chain_from` (the reference: any device) over one-span
    bodies of either form, the factored ones applied as they are (:func:`apply_low_rank`):
    ``(incoming, final)``; element i is ``live[source[i]]`` when ``source[i] >= 0``, else
    ``bodies[-source[i] - 1]``. The loop runs over chain depth; each step applies the live spans,
    the dense bodies and the factored bodies (padded to the step's largest rank) of every chain
    at that depth, each group batched."""
    hv, kd, vd = live.state.shape[1:]
    src = source.tolist()
    bounds = cu_seqlens_to_list(cu_chains, len(src), name="cu_chains")
    num_chains = len(bounds) - 1
    device, dtype = live.device, live.dtype
    current = (torch.zeros(num_chains, hv, kd, vd, dtype=dtype, device=device) if initial_states is None
               else initial_states.to(device=device, dtype=dtype).clone())
    incoming = live.state.new_empty(len(src), hv, kd, vd)
    depth = max([b - a for a, b in zip(bounds[:-1], bounds[1:])], default=0)
    for d in range(depth):
        chains = [c for c in range(num_chains) if bounds[c + 1] - bounds[c] > d]
        elements = [bounds[c] + d for c in chains]
        chain_index = torch.tensor(chains, dtype=torch.long, device=device)
        entering = current.index_select(0, chain_index)
        incoming.index_copy_(0, torch.tensor(elements, dtype=torch.long, device=device), entering)
        leaving = entering.clone()
        groups = {"live": [], "dense": [], "low": []}
        for j, e in enumerate(elements):
            s = src[e]
            if s >= 0:
                groups["live"].append((j, s))
            else:
                body = bodies[-s - 1]
                groups["low" if isinstance(body, LowRankSummary) else "dense"].append((j, body))
        if groups["live"]:
            rows = torch.tensor([j for j, _ in groups["live"]], dtype=torch.long, device=device)
            step = live.index(torch.tensor([s for _, s in groups["live"]], dtype=torch.long, device=device))
            leaving.index_copy_(0, rows, _apply_t(step, entering.index_select(0, rows)) + step.state)
        if groups["dense"]:
            rows = torch.tensor([j for j, _ in groups["dense"]], dtype=torch.long, device=device)
            step = DenseSummary(torch.cat([b.transition.to(device, dtype) for _, b in groups["dense"]]),
                                torch.cat([b.state.to(device, dtype) for _, b in groups["dense"]]))
            leaving.index_copy_(0, rows, _apply_t(step, entering.index_select(0, rows)) + step.state)
        if groups["low"]:
            rows = torch.tensor([j for j, _ in groups["low"]], dtype=torch.long, device=device)
            step = _stack_padded([b for _, b in groups["low"]], device, dtype)
            leaving.index_copy_(0, rows, apply_low_rank(step, entering.index_select(0, rows)))
        current.index_copy_(0, chain_index, leaving)
    if record_rows is not None:
        out = incoming.new_zeros(num_records + 1, hv, kd, vd)
        rows = torch.where(record_rows >= 0, record_rows, torch.full_like(record_rows, num_records))
        out.index_copy_(0, rows.to(device), incoming)
        incoming = out[:num_records]
    return incoming, current


def _stack_padded(items: Sequence[LowRankSummary], device, dtype) -> LowRankSummary:
    """One-span factored summaries as one, ranks padded with zero rows (which change nothing)."""
    rank = max(s.rank for s in items)

    def pad(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device, dtype)
        return t if t.shape[2] == rank else torch.nn.functional.pad(t, (0, 0, 0, rank - t.shape[2]))

    return LowRankSummary(torch.cat([s.log_decay.to(device, dtype) for s in items]),
                          torch.cat([pad(s.keys) for s in items]), torch.cat([pad(s.weights) for s in items]),
                          torch.cat([pad(s.values) for s in items]))


__all__ = ["LowRankSummary", "apply_low_rank", "gated_delta_low_rank_summarize", "low_rank_is_smaller",
           "scan_chain_mixed"]
