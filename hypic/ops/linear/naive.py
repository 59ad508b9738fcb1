"""Per-token recurrence shared by every family: the definition the chunked code must match.

One step, per value head, on the state ``S [K, V]``::

    S <- D_t S                          D_t = exp(g_t) (scalar) or Diag(exp(g_t)) (per channel)
    S <- S + beta_t k_t (v_t - k_t^T S)^T      (delta rule)   or   S <- S + k_t v_t^T
    o_t = scale * S^T q_t

Gated DeltaNet (alpha (I - beta k k^T)) and KDA ((I - beta k k^T) Diag(alpha)) are both the gate
followed by the delta update, since alpha is a scalar for GDN. Inputs here are already expanded to
HV heads and cast to the compute dtype; the public wrappers validate.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch


def decay_state(state: torch.Tensor, log_gate: Optional[torch.Tensor]) -> torch.Tensor:
    """Apply ``D_t`` to ``state [N, HV, K, X]``; log_gate ``[N, HV]`` (scalar) or ``[N, HV, K]``."""
    if log_gate is None:
        return state
    if log_gate.dim() == 2:
        return torch.exp(log_gate)[:, :, None, None] * state
    return torch.exp(log_gate)[:, :, :, None] * state


def recurrence_step(
    state: torch.Tensor,
    q: Optional[torch.Tensor],
    k: torch.Tensor,
    v: torch.Tensor,
    log_gate: Optional[torch.Tensor],
    beta: Optional[torch.Tensor],
    scale: float,
) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
    """One token for N sequences. state ``[N, HV, K, V]``; q, k ``[N, HV, K]``; v ``[N, HV, V]``."""
    state = decay_state(state, log_gate)
    if beta is None:
        state = state + k[:, :, :, None] * v[:, :, None, :]
    else:
        predicted = torch.einsum("nhk,nhkv->nhv", k, state)
        delta = beta[:, :, None] * (v - predicted)
        state = state + k[:, :, :, None] * delta[:, :, None, :]
    out = None if q is None else scale * torch.einsum("nhk,nhkv->nhv", q, state)
    return out, state


def naive_recurrence(
    q: Optional[torch.Tensor],
    k: torch.Tensor,
    v: torch.Tensor,
    log_gate: Optional[torch.Tensor],
    beta: Optional[torch.Tensor],
    bounds: List[int],
    initial_state: torch.Tensor,
    scale: float,
) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
    """Token-by-token reference over packed sequences (slow; for tests and tiny inputs).

    q, k ``[T, HV, K]``; v ``[T, HV, V]``; log_gate ``[T, HV]`` / ``[T, HV, K]`` / None; beta
    ``[T, HV]`` / None; bounds = cu_seqlens as a list; initial_state ``[N, HV, K, V]``.
    """
    outputs = v.new_zeros(v.shape) if q is not None else None
    finals = []
    for n in range(len(bounds) - 1):
        state = initial_state[n : n + 1]
        for t in range(bounds[n], bounds[n + 1]):
            sl = slice(t, t + 1)
            out, state = recurrence_step(
                state,
                None if q is None else q[sl],
                k[sl],
                v[sl],
                None if log_gate is None else log_gate[sl],
                None if beta is None else beta[sl],
                scale,
            )
            if outputs is not None:
                outputs[t] = out[0]
        finals.append(state)
    final = torch.cat(finals, 0) if finals else initial_state.clone()
    return outputs, final
