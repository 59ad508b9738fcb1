"""GPU paths of the scalar / diagonal families (GLA, simple GLA / RetNet / lightning, Mamba2) on
fla-core's Triton kernels: their T is closed-form (a sum of log gates per span), so a summary is
fla's forward from a zero state plus that decay. Re-exported by :mod:`hypic.ops.linear.fla_paths`
(names and signatures match the references, which call them)."""

from __future__ import annotations

import torch

from hypic.ops.linear._fla_common import _b1, _check_fla_inputs, _cu, _state_or_none
from hypic.ops.linear.summary import DiagonalSummary, ScalarSummary


def _expand_heads(x: torch.Tensor, num_value_heads: int) -> torch.Tensor:
    """GVA ``[T, H, K] -> [T, HV, K]``: value head j reads key head j // (HV // H)."""
    ratio = num_value_heads // x.shape[1]
    return x if ratio == 1 else x.repeat_interleave(ratio, dim=1)


def _segment_log_decay(g: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """Sum of log gates over each span ``[N, ...]`` (fp64 cumsum: no cancellation at 32k tokens)."""
    csum = torch.cumsum(g.double(), dim=0)
    csum = torch.cat([csum.new_zeros((1,) + tuple(csum.shape[1:])), csum], dim=0)
    return (csum.index_select(0, cu[1:]) - csum.index_select(0, cu[:-1])).float()


def _gla_call(q, k, v, g, cu, initial_state, scale):
    from fla.ops.gla import chunk_gla

    hv = v.shape[1]
    o, final = chunk_gla(
        _b1(_expand_heads(q, hv)), _b1(_expand_heads(k, hv)), _b1(v), _b1(g.float()), scale=scale,
        initial_state=_state_or_none(initial_state), output_final_state=True, cu_seqlens=cu,
    )
    return o[0].to(v.dtype), final


def gla_forward(q, k, v, g, *, cu_seqlens, initial_state=None, scale=None):
    """Varlen GLA via fla's ``chunk_gla`` (heads expanded for GVA)."""
    _check_fla_inputs("gla_forward", 0, q, k, v, g)
    with torch.no_grad():
        return _gla_call(q, k, v, g, _cu(cu_seqlens, k.device), initial_state, scale)


def gla_summarize(k, v, g, *, cu_seqlens):
    """S from the chunk kernel with zero start (q = k, output discarded); T = exp(sum g)."""
    _check_fla_inputs("gla_summarize", 0, k, v, g)
    cu = _cu(cu_seqlens, k.device)
    with torch.no_grad():
        _, zero_start = _gla_call(k, k, v, g, cu, None, 1.0)
    return DiagonalSummary(log_decay=_segment_log_decay(g, cu), state=zero_start)


def gla_decode(q, k, v, g, state, *, scale=None):
    _check_fla_inputs("gla_decode", 0, q, k, v, g, state)
    from fla.ops.gla import fused_recurrent_gla

    hv = v.shape[1]
    with torch.no_grad():
        o, new_state = fused_recurrent_gla(
            _expand_heads(q, hv).unsqueeze(1), _expand_heads(k, hv).unsqueeze(1), v.unsqueeze(1),
            gk=g.float().unsqueeze(1), scale=scale,
            initial_state=state.to(torch.float32).contiguous(), output_final_state=True,
        )
    return o[:, 0].to(v.dtype), new_state


def _simple_gla_call(q, k, v, g, g_gamma, cu, initial_state, scale, cu_cpu=None):
    """fla's ``chunk_simple_gla`` over packed spans; ``cu_cpu`` (the host copy of ``cu``) lets fla
    build its chunk table without reading ``cu`` back from the device."""
    from fla.ops.simple_gla import chunk_simple_gla

    hv = v.shape[1]
    o, final = chunk_simple_gla(
        _b1(_expand_heads(q, hv)), _b1(_expand_heads(k, hv)), _b1(v),
        g=None if g is None else _b1(g.float()),
        g_gamma=None if g_gamma is None else g_gamma.float().contiguous(),
        scale=scale, initial_state=_state_or_none(initial_state), output_final_state=True,
        cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
    )
    return o[0].to(v.dtype), final


def _scalar_log_decay(g, g_gamma, cu):
    if g is not None:
        return _segment_log_decay(g, cu)
    lengths = (cu[1:] - cu[:-1]).to(torch.float64)
    return (lengths[:, None] * g_gamma.double()[None, :]).float()


def simple_gla_forward(q, k, v, g=None, *, g_gamma=None, cu_seqlens, initial_state=None, scale=None,
                       cu_seqlens_cpu=None):
    """Varlen simple GLA / RetNet / lightning via fla's ``chunk_simple_gla``."""
    _check_fla_inputs("simple_gla_forward", 0, q, k, v, g, g_gamma)
    with torch.no_grad():
        return _simple_gla_call(q, k, v, g, g_gamma, _cu(cu_seqlens, k.device), initial_state, scale, cu_seqlens_cpu)


def simple_gla_summarize(k, v, g=None, *, g_gamma=None, cu_seqlens, cu_seqlens_cpu=None):
    """S from the chunk kernel with zero start (q = k, output discarded); T = the summed log decay
    per head, never a matrix."""
    _check_fla_inputs("simple_gla_summarize", 0, k, v, g, g_gamma)
    cu = _cu(cu_seqlens, k.device)
    with torch.no_grad():
        _, zero_start = _simple_gla_call(k, k, v, g, g_gamma, cu, None, 1.0, cu_seqlens_cpu)
    return ScalarSummary(log_decay=_scalar_log_decay(g, g_gamma, cu), state=zero_start)


def _simple_gla_step(q, k, v, g, state, scale):
    """One token, all sequences: exact fp32 torch (a decode step is a handful of tiny ops)."""
    hv = v.shape[1]
    qf, kf = _expand_heads(q, hv).float(), _expand_heads(k, hv).float()
    new_state = torch.exp(g.float())[:, :, None, None] * state.float() \
        + kf[:, :, :, None] * v.float()[:, :, None, :]
    o = scale * torch.einsum("nhk,nhkv->nhv", qf, new_state)
    return o, new_state


def simple_gla_decode(q, k, v, g, state, *, g_gamma=None, scale=None):
    scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
    gate = g if g is not None else g_gamma[None, :].expand(v.shape[0], v.shape[1])
    o, new_state = _simple_gla_step(q, k, v, gate, state, scale)
    return o.to(v.dtype), new_state


def _mamba2_mapped(C, B, x, dt, A):
    """SSD as simple GLA: q = C, k = B (groups expanded), v = x * dt, g = dt * A, scale 1."""
    hv = x.shape[1]
    q = None if C is None else _expand_heads(C, hv)
    k = _expand_heads(B, hv)
    v = (x.float() * dt.float()[:, :, None]).to(x.dtype)
    g = dt.float() * A.float()[None, :]
    return q, k, v, g


def _mamba2_skip(y, x, D):
    return y if D is None else y.float() + D.float()[None, :, None] * x.float()


def mamba2_forward(C, B, x, dt, A, D=None, *, cu_seqlens, initial_state=None):
    _check_fla_inputs("mamba2_forward", 0, C, B, x, dt, A)
    q, k, v, g = _mamba2_mapped(C, B, x, dt, A)
    with torch.no_grad():
        y, final = _simple_gla_call(q, k, v, g, None, _cu(cu_seqlens, x.device), initial_state, 1.0)
    return _mamba2_skip(y, x, D).to(x.dtype), final


def mamba2_summarize(B, x, dt, A, *, cu_seqlens):
    _check_fla_inputs("mamba2_summarize", 0, B, x, dt, A)
    _, k, v, g = _mamba2_mapped(None, B, x, dt, A)
    cu = _cu(cu_seqlens, x.device)
    with torch.no_grad():
        _, zero_start = _simple_gla_call(k, k, v, g, None, cu, None, 1.0)
    return ScalarSummary(log_decay=_segment_log_decay(g, cu), state=zero_start)


def mamba2_decode(C, B, x, dt, A, state, D=None):
    q, k, _, g = _mamba2_mapped(C, B, x, dt, A)
    v = x.float() * dt.float()[:, :, None]  # fp32: no bf16 rounding of x * dt in a decode step
    y, new_state = _simple_gla_step(q, k, v, g, state, 1.0)
    return _mamba2_skip(y, x, D).to(x.dtype), new_state
