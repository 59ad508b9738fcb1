"""GPU fast paths for hypic.ops.linear on fla-core 0.6.0 Triton kernels (CUDA tensors only).

The public reference functions (``gated_delta.py``, ``kda.py``, ...) call the function of the
same name here when :func:`fla_takes` (:func:`fla_chain_takes` for the chain walk) says these
kernels take their inputs (CUDA tensors, no float64, head dims the kernels take); signatures
match the references. fla and Triton are imported inside function bodies only (fla-core is an
optional, GPU-only package), so importing this module never needs them.

Layout: hypic packs tokens without a batch dim (q ``[T, H, K]``); fla wants ``[B=1, T, H, K]`` with
``cu_seqlens``. States are ``[N, HV, K, V]`` fp32 (fla's default K-first layout). Gates are natural
log decays (fla's wrappers convert to log2 internally; the private calls below do it explicitly with
``chunk_local_cumsum(..., scale=RCP_LN2)``).

Delta-rule families (GDN, DeltaNet, KDA): the summaries come from fla's context-parallel affine
summary kernel ``chunk_cp_fwd_h`` (``[S(C|0) | T_C]`` per span, T chain in fp32 with the dot precision
of :mod:`_fla_summaries`) after the intra-chunk WY step (``w, u``); spans of at most one chunk take
the closed form of :mod:`short_span` instead. ``*_forward_and_summarize`` shares that WY step between the
varlen forward and the summaries (:mod:`hypic.ops.linear._fla_wy`). fla-core is pinned to 0.6.0:
these are private APIs.

The scalar / diagonal families (GLA, simple GLA, Mamba2: T in closed form) live in
:mod:`hypic.ops.linear._fla_scalar`, the chain walk in :mod:`hypic.ops.linear._fla_chain` (and
for a constant scalar decay in :mod:`hypic.ops.linear._fla_scalar_chain`), fla's causal conv in
:mod:`hypic.ops.linear._fla_conv`; all are re-exported here.
"""

from __future__ import annotations

import torch

from hypic.ops.linear._fla_chain import (
    fla_chain_takes,
    gated_delta_chain_forward,
    gated_delta_chain_forward_and_summarize,
)
from hypic.ops.linear._fla_common import CHUNK_SIZE, _b1, _check_fla_inputs, _chunk_indices, _cu, _local_cumsum
from hypic.ops.linear._fla_common import _state_or_none, fla_takes
from hypic.ops.linear._fla_conv import fla_causal_conv1d
from hypic.ops.linear._fla_scalar_chain import scalar_chain_takes, simple_gla_chain_walk
from hypic.ops.linear._fla_scalar import (
    gla_decode,
    gla_forward,
    gla_summarize,
    mamba2_decode,
    mamba2_forward,
    mamba2_summarize,
    simple_gla_decode,
    simple_gla_forward,
    simple_gla_summarize,
)
from hypic.ops.linear._fla_summaries import _cp_summaries
from hypic.ops.linear._fla_wy import (
    _short_spans,
    _span_output,
    _transitions_beside,
    _wy_prepare,
    _wy_state_and_output,
    _zero_start_summary,
)
from hypic.ops.linear.short_span import short_span_state_pass, short_span_state_pass_triton
from hypic.ops.linear.summary import DenseSummary


# --------------------------------------------------------------------------------------------
# Gated DeltaNet and DeltaNet (shared WY machinery; DeltaNet = no gate)
# --------------------------------------------------------------------------------------------

def _wy_forward(q, k, v, g, beta, cu_seqlens, initial_state, scale, with_summary, cu_cpu=None):
    """Varlen forward (and optionally summaries) of GDN (g given) or DeltaNet (g None)."""
    scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
    cu, ci, k4, gc, w, u = _wy_prepare(k, v, g, beta, cu_seqlens, cu_cpu)
    h0 = _state_or_none(initial_state)
    # zero start: the forward's final states are S(C|0) and only T is left to compute, queued
    # beside the state pass and the output (it needs only the WY factors)
    beside = _transitions_beside(k4, w, u, gc, cu, cu_cpu) if with_summary and h0 is None else None
    o, final = _wy_state_and_output(_b1(q), k4, w, u, gc, h0, cu, ci, scale)
    if beside is not None:
        beside.launch()  # after the state pass and output are queued: they take the SMs first
    o = o[0].to(v.dtype)
    if not with_summary:
        return o, final
    if h0 is not None:
        return o, final, _zero_start_summary(k4, w, u, gc, cu, cu_cpu)
    trans = beside.result()
    return o, final, DenseSummary(transition=trans, state=final.clone())


def _wy_summarize(k, v, g, beta, cu_seqlens, cu_cpu=None):
    cu, _, k4, gc, w, u = _wy_prepare(k, v, g, beta, cu_seqlens, cu_cpu)
    return _zero_start_summary(k4, w, u, gc, cu, cu_cpu)


def gated_delta_forward(q, k, v, g, beta, *, cu_seqlens, initial_state=None, scale=None, cu_seqlens_cpu=None):
    """Varlen GDN forward: the kernels of fla's ``chunk_gated_delta_rule`` (local cumsum, WY intra,
    state pass, output), called directly. Skipping its autograd wrapper (input guard, autocast,
    saving tensors for a backward that never runs) saves host time on every layer. Returns
    (o, final fp32)."""
    _check_fla_inputs("gated_delta_forward", k.shape[-1], q, k, v, g, beta)
    with torch.no_grad():
        return _wy_forward(q, k, v, g, beta, cu_seqlens, initial_state, scale, with_summary=False,
                           cu_cpu=cu_seqlens_cpu)


def gated_delta_summarize_then_forward(q, k, v, g, beta, *, cu_seqlens, initial_states_from, scale=None,
                                       cu_seqlens_cpu=None, output_final_state=True):
    """Zero-start summaries, then the forward from ``initial_states_from(summary)``, sharing the
    WY intra step (local cumsum, ``kkt`` + solve, ``w``/``u``) between the two.

    When every span fits in one chunk (a cached request's seams and question) and the final
    states are not wanted, fla's summary kernel and state pass are replaced by their closed forms
    (:mod:`short_span`); only the output kernel runs."""
    _check_fla_inputs("gated_delta_summarize_then_forward", k.shape[-1], q, k, v, g, beta)
    with torch.no_grad():
        scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
        cu, ci, k4, gc, w, u = _wy_prepare(k, v, g, beta, cu_seqlens, cu_seqlens_cpu)
        summary = _zero_start_summary(k4, w, u, gc, cu, cu_seqlens_cpu)
        h0 = _state_or_none(initial_states_from(summary))
        table, use_triton = (None, False) if output_final_state or h0 is None else \
            _short_spans(k4, u, cu, cu_seqlens_cpu)
        if table is not None:
            if use_triton:
                v_new, h = short_span_state_pass_triton(w[0], u[0], h0, cu, table, CHUNK_SIZE)
            else:
                v_new, h = short_span_state_pass(w[0], u[0], h0, table)
            o = _span_output(q, k4, v_new, h, gc, cu, ci, cu_seqlens_cpu, scale)
            final = None
        else:
            o, final = _wy_state_and_output(_b1(q), k4, w, u, gc, h0, cu, ci, scale)
    return o[0].to(v.dtype), final if output_final_state else None, summary


def gated_delta_forward_and_summarize(q, k, v, g, beta, *, cu_seqlens, initial_state=None, scale=None,
                                      cu_seqlens_cpu=None):
    """Forward + zero-start summaries of the same spans, sharing the intra-chunk WY step.

    Returns (o, final_state, DenseSummary). With ``initial_state=None`` the forward's final states
    are the summaries' S and only T is computed extra.
    """
    _check_fla_inputs("gated_delta_forward_and_summarize", k.shape[-1], q, k, v, g, beta)
    with torch.no_grad():
        return _wy_forward(q, k, v, g, beta, cu_seqlens, initial_state, scale, with_summary=True,
                           cu_cpu=cu_seqlens_cpu)


def gated_delta_summarize(k, v, g, beta, *, cu_seqlens, cu_seqlens_cpu=None):
    """Zero-start summaries (T dense fp32, S fp32) of every span in one launch of each kernel."""
    _check_fla_inputs("gated_delta_summarize", k.shape[-1], k, v, g, beta)
    with torch.no_grad():
        return _wy_summarize(k, v, g, beta, cu_seqlens, cu_cpu=cu_seqlens_cpu)


def gated_delta_decode(q, k, v, g, beta, state, *, scale=None):
    """One token per sequence via fla's fused recurrent kernel (fp32 state math)."""
    _check_fla_inputs("gated_delta_decode", k.shape[-1], q, k, v, g, beta, state)
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    with torch.no_grad():
        o, new_state = fused_recurrent_gated_delta_rule(
            q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), g=g.float().unsqueeze(1),
            beta=beta.unsqueeze(1), scale=scale, initial_state=state.to(torch.float32).contiguous(),
            output_final_state=True,
        )
    return o[:, 0].to(v.dtype), new_state


def delta_forward(q, k, v, beta, *, cu_seqlens, initial_state=None, scale=None):
    """DeltaNet varlen forward: GDN machinery without a gate (works for fp32 and bf16 inputs)."""
    _check_fla_inputs("delta_forward", k.shape[-1], q, k, v, beta)
    with torch.no_grad():
        return _wy_forward(q, k, v, None, beta, cu_seqlens, initial_state, scale, with_summary=False)


def delta_forward_and_summarize(q, k, v, beta, *, cu_seqlens, initial_state=None, scale=None):
    _check_fla_inputs("delta_forward_and_summarize", k.shape[-1], q, k, v, beta)
    with torch.no_grad():
        return _wy_forward(q, k, v, None, beta, cu_seqlens, initial_state, scale, with_summary=True)


def delta_summarize(k, v, beta, *, cu_seqlens):
    _check_fla_inputs("delta_summarize", k.shape[-1], k, v, beta)
    with torch.no_grad():
        return _wy_summarize(k, v, None, beta, cu_seqlens)


def delta_decode(q, k, v, beta, state, *, scale=None):
    _check_fla_inputs("delta_decode", k.shape[-1], q, k, v, beta, state)
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    with torch.no_grad():
        o, new_state = fused_recurrent_gated_delta_rule(
            q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), g=None, beta=beta.unsqueeze(1),
            scale=scale, initial_state=state.to(torch.float32).contiguous(), output_final_state=True,
        )
    return o[:, 0].to(v.dtype), new_state


# --------------------------------------------------------------------------------------------
# KDA (per-channel gate inside the delta rule)
# --------------------------------------------------------------------------------------------

def _kda_intra(q4, k4, v4, gc, beta3, scale, cu, ci):
    from fla.ops.kda.chunk_intra import chunk_kda_fwd_intra

    w, u, _, kg, aqk, _ = chunk_kda_fwd_intra(
        q=q4, k=k4, v=v4, gk=gc, beta=beta3, scale=scale, cu_seqlens=cu,
        chunk_size=CHUNK_SIZE, chunk_indices=ci,
    )
    return w, u, kg, aqk


def _kda_run(q, k, v, g, beta, cu_seqlens, initial_state, scale, with_output, with_summary):
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.gla.chunk import chunk_gla_fwd_o_gk

    scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
    cu = _cu(cu_seqlens, k.device)
    ci = _chunk_indices(cu)
    k4, v4, beta3 = _b1(k), _b1(v), _b1(beta)
    q4 = _b1(q) if q is not None else k4  # summaries only: q does not affect w, u, kg
    gc = _local_cumsum(_b1(g), cu, ci)
    w, u, kg, aqk = _kda_intra(q4, k4, v4, gc, beta3, scale, cu, ci)
    num_spans = cu.numel() - 1
    out = ()
    h0 = _state_or_none(initial_state)
    if with_output:
        h, v_new, final = chunk_gated_delta_rule_fwd_h(
            k=kg, w=w, u=u, gk=gc, initial_state=h0, output_final_state=True,
            cu_seqlens=cu, chunk_indices=ci, chunk_size=CHUNK_SIZE,
        )
        o = chunk_gla_fwd_o_gk(q=q4, v=v_new, g=gc, A=aqk, h=h, scale=scale, cu_seqlens=cu,
                               chunk_size=CHUNK_SIZE, chunk_indices=ci)
        out = (o[0].to(v.dtype), final)
    if with_summary:
        if with_output and h0 is None:
            _, trans = _cp_summaries(kg, w, u, None, gc, cu, num_spans, transition_only=True)
            zero_start = out[1].clone()
        else:
            zero_start, trans = _cp_summaries(kg, w, u, None, gc, cu, num_spans, transition_only=False)
        out = out + (DenseSummary(transition=trans, state=zero_start),)
    return out


def kda_forward(q, k, v, g, beta, *, cu_seqlens, initial_state=None, scale=None):
    """Varlen KDA forward via fla's public ``chunk_kda`` (g ``[T, HV, K]`` log decay)."""
    _check_fla_inputs("kda_forward", k.shape[-1], q, k, v, g, beta)
    from fla.ops.kda import chunk_kda

    cu = _cu(cu_seqlens, k.device)
    with torch.no_grad():
        o, final = chunk_kda(
            _b1(q), _b1(k), _b1(v), _b1(g.float()), _b1(beta), scale=scale,
            initial_state=_state_or_none(initial_state), output_final_state=True, cu_seqlens=cu,
        )
    return o[0].to(v.dtype), final


def kda_forward_and_summarize(q, k, v, g, beta, *, cu_seqlens, initial_state=None, scale=None):
    _check_fla_inputs("kda_forward_and_summarize", k.shape[-1], q, k, v, g, beta)
    with torch.no_grad():
        return _kda_run(q, k, v, g, beta, cu_seqlens, initial_state, scale, True, True)


def kda_summarize(k, v, g, beta, *, cu_seqlens):
    _check_fla_inputs("kda_summarize", k.shape[-1], k, v, g, beta)
    with torch.no_grad():
        return _kda_run(None, k, v, g, beta, cu_seqlens, None, None, False, True)[0]


def kda_decode(q, k, v, g, beta, state, *, scale=None):
    _check_fla_inputs("kda_decode", k.shape[-1], q, k, v, g, beta, state)
    from fla.ops.kda import fused_recurrent_kda

    with torch.no_grad():
        o, new_state = fused_recurrent_kda(
            q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), g.float().unsqueeze(1),
            beta.unsqueeze(1), scale=scale, initial_state=state.to(torch.float32).contiguous(),
            output_final_state=True,
        )
    return o[:, 0].to(v.dtype), new_state


__all__ = [
    "fla_chain_takes", "fla_takes",
    "delta_decode", "delta_forward", "delta_forward_and_summarize", "delta_summarize",
    "fla_causal_conv1d",
    "gated_delta_chain_forward", "gated_delta_chain_forward_and_summarize", "gated_delta_decode",
    "gated_delta_forward", "gated_delta_forward_and_summarize", "gated_delta_summarize",
    "gated_delta_summarize_then_forward",
    "gla_decode", "gla_forward", "gla_summarize",
    "kda_decode", "kda_forward", "kda_forward_and_summarize", "kda_summarize",
    "mamba2_decode", "mamba2_forward", "mamba2_summarize",
    "simple_gla_decode", "simple_gla_forward", "simple_gla_summarize",
]
