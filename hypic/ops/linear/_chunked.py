"""Chunked CPU reference for every family (the recurrence of ``naive.py``, 64 tokens at a time).

Tokens of each sequence are cut into chunks of ``CHUNK_SIZE`` (the last one padded with identity
tokens: k = v = 0, g = 0, beta = 0). All intra-chunk work is batched over every chunk of every
sequence and every head; only the state hand-off between consecutive chunks of a sequence is a
Python loop (over chunk position, batched over sequences).

Maths for one chunk and one head, tokens t = 1..C, cumulative log gate ``b_t`` (scalar or per
channel), ``Gamma_t = Diag(exp b_t)``, incoming state ``S0``. Writing the delta update as
``S_t = D_t S_{t-1} + k_t w_t^T`` with ``w_t = beta_t (v_t - k_t^T D_t S_{t-1})``:

    (I + M) W = diag(beta) (V - Kt S0),  M_ts = beta_t k_t^T Gamma_t Gamma_s^-1 k_s  (s < t)
    =>  W = U - Wk S0   with  U = (I+M)^-1 diag(beta) V,  Wk = (I+M)^-1 diag(beta) Kt
    S_C = Gamma_C S0 + Kh^T W,             Kh_s = Gamma_C Gamma_s^-1 k_s
    o   = scale (Qt S0 + P W),             P_ts = q_t^T Gamma_t Gamma_s^-1 k_s  (s <= t)

with ``Kt_t = Gamma_t k_t`` and ``Qt_t = Gamma_t q_t`` (the UT/WY transform). Without the delta
rule, ``W = V`` and ``Wk = 0``. Every exponent above is a difference ``b_t - b_s`` with s <= t, so
nothing overflows; per-channel gates need a ``[C, C, K]`` decay tensor, built in groups of chunks
to bound memory.

Carrying ``[S | T]`` with initial state ``[0 | I]`` and zero values in the T columns gives the dense
transition of each sequence exactly (the identity trick, in fp32/fp64).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

CHUNK_SIZE = 64
MIN_CHUNK_SIZE = 8  # the shortest chunk a group of short spans runs in
# Sub-chunk length for per-channel gates: off-diagonal blocks factor through a reference row.
SUB_CHUNK = 16
# Upper bound on elements of a per-channel decay tensor built at once.
_MAX_DECAY_ELEMENTS = 1 << 24


class ChunkLayout:
    """Where every chunk's tokens live in the packed tensor, and the chunk-to-chunk schedule.

    Sequences are ranked by length (longest first) and chunks are ordered position-major, so the
    chunks of step j form the contiguous slice ``step_slices[j]`` and belong to the sequences of
    rank ``0 .. n_j - 1``: the hand-off loop works on views, never on gathers.
    """

    def __init__(self, bounds: List[int], chunk_size: int, device: torch.device) -> None:
        lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
        order = sorted(range(len(lengths)), key=lambda n: -lengths[n])  # stable
        self.rank_to_seq = torch.tensor(order, dtype=torch.long, device=device)
        num_chunks_of = [-(-lengths[n] // chunk_size) for n in order]
        starts, ends = [], []
        self.step_slices: List[Tuple[int, int]] = []  # (first chunk, number of sequences)
        max_pos = num_chunks_of[0] if num_chunks_of else 0
        for j in range(max_pos):
            first = len(starts)
            for rank, n in enumerate(order):
                if num_chunks_of[rank] <= j:
                    break
                starts.append(bounds[n] + j * chunk_size)
                ends.append(bounds[n + 1])
            self.step_slices.append((first, len(starts) - first))
        self.num_chunks = len(starts)
        self.chunk_size = chunk_size
        offsets = torch.arange(chunk_size, device=device)
        index = torch.tensor(starts, dtype=torch.long, device=device).reshape(-1, 1) + offsets
        self.valid = index < torch.tensor(ends, dtype=torch.long, device=device).reshape(-1, 1)
        self.token_index = torch.where(self.valid, index, torch.zeros_like(index))

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, HV, D]`` -> contiguous ``[NC, HV, C, D]`` with zeros in padding slots."""
        flat = x.index_select(0, self.token_index.flatten())
        flat = flat.reshape(self.num_chunks, self.chunk_size, *x.shape[1:])
        flat = flat * self.valid.reshape(self.num_chunks, self.chunk_size, 1, 1).to(x.dtype)
        return flat.permute(0, 2, 1, 3).contiguous()

    def scatter(self, y: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """``y [NC, HV, C, D]`` -> packed ``[T, HV, D]``."""
        flat = y.permute(0, 2, 1, 3).reshape(self.num_chunks * self.chunk_size, y.shape[1], y.shape[3])
        keep = self.valid.flatten()
        out = y.new_empty(num_tokens, y.shape[1], y.shape[3])
        out[self.token_index.flatten()[keep]] = flat[keep]
        return out


def unit_lower_inverse(lower: torch.Tensor) -> torch.Tensor:
    """Inverse of unit lower-triangular ``[..., C, C]`` (C a power of two) by block doubling:
    ``inv([[A, 0], [B, D]]) = [[A^-1, 0], [-D^-1 B A^-1, D^-1]]``, all diagonal blocks of one
    size at once (batched LAPACK triangular solves are far slower on CPU for many small blocks)."""
    size = lower.shape[-1]
    batch = lower.shape[:-2]
    flat = lower.reshape(-1, size, size)
    count = flat.shape[0]
    # Inverses of the diagonal blocks of the current size: [B, size / half, half, half].
    blocks = torch.ones(count, size, 1, 1, dtype=lower.dtype, device=lower.device)
    half = 1
    while half < size:
        pairs = size // (2 * half)
        # Lower-left coupling block of each 2h x 2h diagonal block (a view of ``lower``).
        diag = torch.diagonal(flat.view(count, pairs, 2 * half, pairs, 2 * half), dim1=1, dim2=3)
        coupling = diag[:, half:, :half, :].permute(0, 3, 1, 2)  # [B, pairs, h, h]
        a_inv, d_inv = blocks[:, 0::2], blocks[:, 1::2]
        off = -torch.matmul(torch.matmul(d_inv, coupling), a_inv)
        top = torch.cat([a_inv, torch.zeros_like(a_inv)], dim=-1)
        bottom = torch.cat([off, d_inv], dim=-1)
        blocks = torch.cat([top, bottom], dim=-2)
        half *= 2
    return blocks.reshape(*batch, size, size)


def _causal_mask(size: int, device: torch.device) -> torch.Tensor:
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def _channel_grams(lhs: List[torch.Tensor], k: torch.Tensor, b: torch.Tensor) -> List[torch.Tensor]:
    """Per-channel decays: ``G_ts = sum_c L_tc k_sc exp(b_tc - b_sc)`` for s <= t, else 0.

    Sub-chunks of ``SUB_CHUNK`` rows: a row block i and all columns before it factor through the
    reference row r = 16 i - 1 (``exp(b_t - b_r) exp(b_r - b_s)``, both exponents <= 0), one
    matmul per block; the diagonal blocks use an explicit ``[16, 16, K]`` decay tensor.
    """
    num_chunks, hv, c, kd = k.shape
    sub = min(SUB_CHUNK, c)
    nsub = c // sub
    ref_idx = torch.clamp(torch.arange(nsub, device=k.device) * sub - 1, min=0)
    col_mask = torch.arange(c, device=k.device)[None, :] >= (torch.arange(nsub, device=k.device) * sub)[:, None]
    diag_mask = ~_causal_mask(sub, k.device)
    outs = [k.new_empty(num_chunks, hv, c, c) for _ in lhs]
    per_chunk = hv * max(nsub * c * kd, nsub * sub * sub * kd)
    group = max(1, _MAX_DECAY_ELEMENTS // max(1, per_chunk))
    for lo in range(0, num_chunks, group):
        hi = min(num_chunks, lo + group)
        bg, kg = b[lo:hi], k[lo:hi]
        n = hi - lo
        b_ref = bg[:, :, ref_idx, None, :]  # [n, HV, nsub, 1, K]
        # Columns of block i: k_s exp(b_r - b_s) for s < 16 i, zero elsewhere.
        col = (b_ref - bg[:, :, None, :, :]).masked_fill_(col_mask[:, :, None], float("-inf"))
        col = col.exp_().mul_(kg[:, :, None, :, :])  # [n, HV, nsub, C, K]
        b_rows = bg.view(n, hv, nsub, sub, kd)
        row_scale = torch.exp(b_rows - b_ref)  # [n, HV, nsub, sub, K]
        within = (b_rows[:, :, :, :, None, :] - b_rows[:, :, :, None, :, :]).masked_fill_(
            diag_mask[:, :, None], float("-inf")
        )
        within = within.exp_().mul_(kg.view(n, hv, nsub, 1, sub, kd))  # [n, HV, nsub, t, s, K]
        for out, x in zip(outs, lhs):
            rows = x[lo:hi].view(n, hv, nsub, sub, kd)
            g = torch.matmul(rows * row_scale, col.transpose(-1, -2))  # [n, HV, nsub, sub, C]
            diag = torch.einsum("nhbtsc,nhbtc->nhbts", within, rows)
            g_blocks = g.view(n, hv, nsub, sub, nsub, sub)
            idx = torch.arange(nsub, device=k.device)
            g_blocks[:, :, idx, :, idx, :] += diag.permute(2, 0, 1, 3, 4)
            out[lo:hi] = g.view(n, hv, c, c)
    return outs


def _decayed_grams(
    lhs: List[torch.Tensor], k: torch.Tensor, b: Optional[torch.Tensor]
) -> List[torch.Tensor]:
    """For each ``L`` in lhs: ``G_ts = L_t^T Gamma_t Gamma_s^-1 k_s`` for s <= t, else 0.

    L, k ``[NC, HV, C, K]``; b cumulative log gate ``[NC, HV, C, 1]`` (scalar), ``[NC, HV, C, K]``
    (per channel) or None.
    """
    if b is not None and b.shape[-1] != 1:
        return _channel_grams(lhs, k, b)
    causal = _causal_mask(k.shape[-2], k.device)
    if b is None:
        decay = causal.to(k.dtype)
    else:
        diff = b[..., :, 0, None] - b[..., None, :, 0]
        decay = torch.exp(diff.masked_fill(~causal, float("-inf")))
    k_t = k.transpose(-1, -2)
    return [torch.matmul(x, k_t) * decay for x in lhs]


def chunk_size_for(num_tokens: int) -> int:
    """The chunk length a span of ``num_tokens`` runs in: its length rounded up to a power of two
    (at least :data:`MIN_CHUNK_SIZE`), :data:`CHUNK_SIZE` for spans longer than half of it."""
    if num_tokens > CHUNK_SIZE // 2:
        return CHUNK_SIZE
    size = MIN_CHUNK_SIZE
    while size < num_tokens:
        size *= 2
    return size


def chunked_recurrence(
    q: Optional[torch.Tensor],
    k: torch.Tensor,
    v: torch.Tensor,
    log_gate: Optional[torch.Tensor],
    beta: Optional[torch.Tensor],
    bounds: List[int],
    initial_state: Optional[torch.Tensor],
    scale: float,
    with_transition: bool = False,
    chunk_size: Optional[int] = None,
    with_zero_start: bool = False,
) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
    """:func:`fixed_chunk_recurrence` with ``chunk_size``, or (None) with the spans grouped by
    :func:`chunk_size_for` their length, each group in its own chunk length: every span is padded
    to a whole chunk, so hundreds of short spans (a PIC forward's seams and small segments) in
    64-token chunks cost several times their tokens; in chunks of their own size, about their
    tokens (benchmarks/results/small_segments/)."""
    if chunk_size is not None:
        return fixed_chunk_recurrence(q, k, v, log_gate, beta, bounds, initial_state, scale, with_transition,
                                      chunk_size, with_zero_start)
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    groups: dict = {}
    for i, n in enumerate(lengths):
        groups.setdefault(chunk_size_for(n), []).append(i)
    if len(groups) <= 1:
        size = next(iter(groups), CHUNK_SIZE)
        return fixed_chunk_recurrence(q, k, v, log_gate, beta, bounds, initial_state, scale, with_transition,
                                      size, with_zero_start)
    device = k.device
    out = None if q is None else v.new_empty(v.shape)
    final = None
    for size, seqs in groups.items():
        sub_bounds = [0]
        for i in seqs:
            sub_bounds.append(sub_bounds[-1] + lengths[i])
        # the group's token rows in one gather index (each span's offset from its packed start),
        # built on the host and copied once: repeat_interleave on a device would sync for its size
        shifts = torch.tensor([bounds[i] - sub_bounds[j] for j, i in enumerate(seqs)])
        counts = torch.tensor([lengths[i] for i in seqs])
        rows = (torch.arange(sub_bounds[-1]) + torch.repeat_interleave(shifts, counts)).to(device)
        pick = lambda t: None if t is None else t.index_select(0, rows)  # noqa: E731
        index = torch.tensor(seqs, dtype=torch.long, device=device)
        init = None if initial_state is None else initial_state.index_select(0, index)
        o, state = fixed_chunk_recurrence(pick(q), pick(k), pick(v), pick(log_gate), pick(beta), sub_bounds, init,
                                          scale, with_transition, size, with_zero_start)
        if final is None:
            final = state.new_empty((len(lengths),) + tuple(state.shape[1:]))
        final.index_copy_(0, index, state)
        if out is not None:
            out.index_copy_(0, rows, o)
    return out, final


def fixed_chunk_recurrence(
    q: Optional[torch.Tensor],
    k: torch.Tensor,
    v: torch.Tensor,
    log_gate: Optional[torch.Tensor],
    beta: Optional[torch.Tensor],
    bounds: List[int],
    initial_state: Optional[torch.Tensor],
    scale: float,
    with_transition: bool = False,
    chunk_size: int = CHUNK_SIZE,
    with_zero_start: bool = False,
) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
    """Run the recurrence of ``naive.recurrence_step`` over packed sequences, chunk-parallel.

    q (or None: no outputs), k ``[T, HV, K]``; v ``[T, HV, V]``; log_gate ``[T, HV]``,
    ``[T, HV, K]`` or None; beta ``[T, HV]`` or None (no delta rule); all in the compute dtype.
    initial_state ``[N, HV, K, V]`` or None (zeros). With ``with_transition`` the returned state
    is ``[N, HV, K, V + K]`` = ``[S_final | T]`` (T the product of all transitions), starting from
    ``[initial | I]``. With ``with_zero_start`` a second V-wide block that starts from zero is
    carried right after the first (``[S_final | S(C|0) | T]``), so one pass also yields the
    zero-start states of a run that has an initial state. Returns ``(o [T, HV, V] or None, state)``.
    """
    num_seqs = len(bounds) - 1
    num_tokens, hv, kd = k.shape
    vd = v.shape[-1]
    dtype, device = k.dtype, k.device
    if initial_state is None:
        state = k.new_zeros(num_seqs, hv, kd, vd)
    else:
        state = initial_state.to(dtype)
    if with_zero_start:
        state = torch.cat([state, torch.zeros_like(state)], dim=-1)
    if with_transition:
        eye = torch.eye(kd, dtype=dtype, device=device).expand(num_seqs, hv, kd, kd)
        state = torch.cat([state, eye], dim=-1)

    layout = ChunkLayout(bounds, chunk_size, device)
    if layout.num_chunks == 0:
        out = None if q is None else v.new_zeros(v.shape)
        return out, state.clone()
    # Work in rank order (longest sequence first); undone at the end.
    state = state.index_select(0, layout.rank_to_seq)

    kc = layout.gather(k)
    vc = layout.gather(v)
    qc = None if q is None else layout.gather(q)
    b = None
    if log_gate is not None:
        gate = log_gate if log_gate.dim() == 3 else log_gate[:, :, None]
        b = layout.gather(gate).cumsum(dim=-2)  # [NC, HV, C, 1 or K]
    betac = None if beta is None else layout.gather(beta[:, :, None])  # [NC, HV, C, 1]

    lhs = [kc] if beta is not None else []
    if qc is not None:
        lhs.append(qc)
    grams = _decayed_grams(lhs, kc, b) if lhs else []

    if b is None:
        k_tilde, q_tilde, k_hat = kc, qc, kc
        end_decay = None
    else:
        b_last = b[:, :, -1:, :]
        k_tilde = kc * torch.exp(b)
        q_tilde = None if qc is None else qc * torch.exp(b)
        k_hat = kc * torch.exp(b_last - b)
        end_decay = torch.exp(b_last).transpose(-1, -2).contiguous()  # [NC, HV, 1 or K, 1]

    if beta is not None:
        # UT transform: (I + M)^-1 applied to beta [V | K~] in one product.
        a_inv = unit_lower_inverse(grams[0].tril(-1) * betac + torch.eye(chunk_size, dtype=dtype, device=device))
        solved = torch.matmul(a_inv, betac * torch.cat([vc, k_tilde], dim=-1))
        u, w_k = solved[..., :vd], solved[..., vd:].contiguous()
    else:
        u, w_k = vc, None

    k_hat_t = k_hat.transpose(-1, -2).contiguous()  # [NC, HV, K, C]
    kh_u = torch.matmul(k_hat_t, u)  # [NC, HV, K, V]
    if qc is not None:
        # o = scale (Qt S0 + P W) = scale ((Qt - P Wk) S0 + P U): only S0 is sequential, so the
        # loop records each chunk's incoming state and the outputs are one batched product after.
        p = grams[-1]
        q_eff = q_tilde if w_k is None else q_tilde - torch.matmul(p, w_k)
        p_u = torch.matmul(p, u)
        incoming = state.new_empty(layout.num_chunks, hv, kd, vd)

    for first, count in layout.step_slices:
        chunks = slice(first, first + count)
        s0 = state[:count]
        if qc is not None:
            incoming[chunks] = s0[..., :vd]
        s_new = s0.clone() if end_decay is None else end_decay[chunks] * s0
        if w_k is not None:
            s_new -= torch.matmul(k_hat_t[chunks], torch.matmul(w_k[chunks], s0))
        s_new[..., :vd] += kh_u[chunks]
        if with_zero_start:
            s_new[..., vd : 2 * vd] += kh_u[chunks]
        state[:count] = s_new

    final = torch.empty_like(state).index_copy_(0, layout.rank_to_seq, state)
    out = None
    if qc is not None:
        out = layout.scatter(scale * (torch.matmul(q_eff, incoming) + p_u), num_tokens)
    return out, final


def segment_sums(x: torch.Tensor, bounds: List[int]) -> torch.Tensor:
    """Sum ``x [T, ...]`` over each span of ``bounds``; empty spans give 0."""
    num_seqs = len(bounds) - 1
    lengths = torch.tensor([b - a for a, b in zip(bounds[:-1], bounds[1:])], device=x.device)
    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs, device=x.device), lengths)
    return x.new_zeros(num_seqs, *x.shape[1:]).index_add_(0, seq_of_token, x)
