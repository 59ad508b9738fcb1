"""GPU fast paths for hypic.ops.linear on fla-core 0.6.0 Triton kernels (CUDA tensors only).

The public reference functions (``gated_delta.py``, ``kda.py``, ...) look up a function of the same
name here when they see CUDA tensors (``_dispatch.cuda_fast_path``); names and signatures match the
reference exactly. fla and Triton are imported inside function bodies only, so importing this
module never needs them.

Layout: hypic packs tokens without a batch dim (q ``[T, H, K]``); fla wants ``[B=1, T, H, K]`` with
``cu_seqlens``. States are ``[N, HV, K, V]`` fp32 (fla's default K-first layout). Gates are natural
log decays (fla's wrappers convert to log2 internally; the private calls below do it explicitly with
``chunk_local_cumsum(..., scale=RCP_LN2)``).

Delta-rule families (GDN, DeltaNet, KDA): the summaries come from fla's context-parallel affine
summary kernel ``chunk_cp_fwd_h`` (``[S(C|0) | T_C]`` per span, T chain in fp32 with the dot precision
of :mod:`_fla_summaries`) after the intra-chunk WY step (``w, u``); spans of at most one chunk take
the closed form of :mod:`short_span` instead. ``*_forward_and_summarize`` shares that WY step between the
varlen forward and the summaries. fla-core is pinned to 0.6.0: these are private APIs.

The scalar / diagonal families (GLA, simple GLA, Mamba2: T in closed form) live in
:mod:`hypic.ops.linear._fla_scalar`, the chain walk in :mod:`hypic.ops.linear._fla_chain`, the
causal conv in :mod:`hypic.ops.linear._fla_conv`; all are re-exported here.

float64 inputs cannot use fla: they are computed by the CPU reference and moved back. Shared
helpers (layout adapters, chunk tables, that fallback) live in :mod:`hypic.ops.linear._fla_common`.
"""

from __future__ import annotations

import torch

from hypic.ops.linear._fla_common import (
    CHUNK_SIZE,
    _any_fp64,
    _b1,
    _check_fla_inputs,
    _chunk_indices,
    _cu,
    _local_cumsum,
    _on_cpu_reference,
    _reference_forward_and_summarize,
    _state_or_none,
    _summary_classes,
)
from hypic.ops.linear._fla_chain import (  # noqa: F401 (looked up by the dispatcher)
    gated_delta_chain_forward,
    gated_delta_chain_forward_and_summarize,
)
from hypic.ops.linear._fla_conv import causal_conv1d, conv_impl  # noqa: F401 (looked up by the dispatcher)
from hypic.ops.linear._fla_scalar import (  # noqa: F401 (looked up by the dispatcher)
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
from hypic.ops.linear.short_span import (
    short_span_impl,
    short_span_rows,
    short_span_state_pass,
    short_span_state_pass_triton,
    short_span_summary,
    short_span_summary_triton,
    triton_supported,
)
from hypic.ops.linear.short_wy import short_span_output_triton, short_span_wy_triton, short_wy_impl
from hypic.ops.linear.triton_scan import scan_chain_torch, scan_chain_triton


# --------------------------------------------------------------------------------------------
# Gated DeltaNet and DeltaNet (shared WY machinery; DeltaNet = no gate)
# --------------------------------------------------------------------------------------------

def _wy_intra(k4, v4, gc, beta3, cu, ci):
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra

    w, u, _ = chunk_gated_delta_rule_fwd_intra(
        k=k4, v=v4, g=gc, beta=beta3, cu_seqlens=cu, chunk_size=CHUNK_SIZE, chunk_indices=ci
    )
    return w, u


def _wy_state_and_output(q4, k4, w, u, gc, h0, cu, ci, scale):
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.common.chunk_o import chunk_fwd_o

    h, v_new, final = chunk_gated_delta_rule_fwd_h(
        k=k4, w=w, u=u, g=gc, initial_state=h0, output_final_state=True,
        cu_seqlens=cu, chunk_indices=ci, chunk_size=CHUNK_SIZE,
    )
    o = chunk_fwd_o(q=q4, k=k4, v=v_new, h=h, g=gc, scale=scale, cu_seqlens=cu,
                    chunk_size=CHUNK_SIZE, chunk_indices=ci)
    return o, final


def _short_tiles(key_dim, value_dim, cu, cu_cpu):
    """The span table of :mod:`short_wy`'s kernels when every span fits in one chunk, else None
    (also with ``HYPIC_SHORT_WY=fla``, or head dims the kernels do not take)."""
    if short_wy_impl() != "triton" or not triton_supported(key_dim, value_dim, CHUNK_SIZE):
        return None
    return short_span_rows(cu, cu_cpu, CHUNK_SIZE, classes=False)


def _wy_prepare(k, v, g, beta, cu_seqlens, cu_cpu):
    """What the state pass, the output and the summaries share: fla layouts, the chunk table, the
    per-chunk gate cumsum and the WY intra step. Returns ``(cu, ci, k4, gc, w, u)``. When every
    span fits in one chunk (a cached request's seams and question) the cumsum and WY step are
    :mod:`short_wy`'s one launch per tile size instead of fla's four kernels over 64-row chunks."""
    cu = _cu(cu_seqlens, k.device)
    ci = _chunk_indices(cu, cu_cpu)
    k4 = _b1(k)
    tiles = _short_tiles(k.shape[-1], v.shape[-1], cu, cu_cpu)
    if tiles is not None:
        gc, w, u = short_span_wy_triton(k, v, g, beta, cu, tiles)
        return cu, ci, k4, _b1(gc), _b1(w), _b1(u)
    gc = _local_cumsum(_b1(g), cu, ci)
    w, u = _wy_intra(k4, _b1(v), gc, _b1(beta), cu, ci)
    return cu, ci, k4, gc, w, u


def _span_output(q, k4, v_new, h, gc, cu, ci, cu_cpu, scale):
    """``[1, T, HV, V]`` output of spans from the state entering each of their chunks
    (``v_new [T, HV, V]``, ``h [num_chunks, HV, K, V]``): :mod:`short_wy`'s kernel when every
    span fits in one chunk, else fla's output kernel."""
    tiles = _short_tiles(k4.shape[-1], v_new.shape[-1], cu, cu_cpu)
    if tiles is not None:
        return short_span_output_triton(q, k4[0], v_new, h, None if gc is None else gc[0], cu, tiles,
                                        scale).unsqueeze(0)
    from fla.ops.common.chunk_o import chunk_fwd_o

    return chunk_fwd_o(q=_b1(q), k=k4, v=v_new.unsqueeze(0), h=h.unsqueeze(0), g=gc, scale=scale,
                       cu_seqlens=cu, chunk_size=CHUNK_SIZE, chunk_indices=ci)


def _short_spans(k4, u, cu, cu_cpu):
    """``(table, use_triton)`` when every span fits in one chunk and the closed forms of
    :mod:`short_span` apply (``HYPIC_SHORT_SPAN``), else ``(None, False)``."""
    impl = short_span_impl()
    if impl == "fla":
        return None, False
    use_triton = impl == "triton" and triton_supported(k4.shape[-1], u.shape[-1], CHUNK_SIZE)
    return short_span_rows(cu, cu_cpu, CHUNK_SIZE, classes=not use_triton), use_triton


def _delta_summaries(k4, w, u, gc, cu, cu_cpu, transition_only: bool):
    """(S or None, T) of every span from the WY factors: closed form when every span fits in one
    chunk (the seams and questions of a cached request, :mod:`short_span`), fla's summary kernel
    otherwise."""
    table, use_triton = _short_spans(k4, u, cu, cu_cpu)
    if table is not None:
        g = None if gc is None else gc[0]
        if use_triton:
            return short_span_summary_triton(k4[0], w[0], u[0], g, cu, table, CHUNK_SIZE, transition_only)
        return short_span_summary(k4[0], w[0], u[0], g, table, transition_only)
    return _cp_summaries(k4, w, u, gc, None, cu, cu.numel() - 1, transition_only)


def _transitions_beside(k4, w, u, gc, cu, cu_cpu, spans=None, into=None):
    """T of the given spans (an index tensor or a host ``(a, b)``; every span when None), fp32, as
    a :class:`~hypic.ops.linear.transition.BesideTransitions` to ``launch()`` and then read with
    ``result()``: the one-chunk closed form when every span fits in a chunk, else
    :func:`wy_transitions_beside` over those spans alone (on a side stream from now, beside what
    the caller queues before ``launch()``); ``HYPIC_TRANSITION_IMPL=fla``: fla's summary kernel
    with ``V = 0`` over every span, then the rows. ``into``: targets the Triton launch writes T
    into (``written_into`` is then set); the other forms ignore it."""
    from hypic.ops.linear.transition import BesideTransitions, transition_impl, wy_transitions_beside

    num_spans = cu.numel() - 1
    if transition_impl() == "triton" and _short_spans(k4, u, cu, cu_cpu)[0] is None:
        return wy_transitions_beside(k4[0], w[0], None if gc is None else gc[0], cu,
                                     (0, num_spans) if spans is None else spans, into=into)
    _, trans = _delta_summaries(k4, w, u, gc, cu, cu_cpu, transition_only=True)
    if spans is not None:
        if isinstance(spans, tuple):
            trans = trans[spans[0]:spans[1]]  # a run: a view
        else:
            trans = trans.index_select(0, spans.to(device=trans.device, dtype=torch.int64))
    return BesideTransitions(trans)


def _zero_start_summary(k4, w, u, gc, cu, cu_cpu):
    """Dense zero-start summaries (T and S) of every span of a prepared input."""
    zero_start, trans = _delta_summaries(k4, w, u, gc, cu, cu_cpu, transition_only=False)
    return _summary_classes()[0](transition=trans, state=zero_start)


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
    return o, final, _summary_classes()[0](transition=trans, state=final.clone())


def _wy_summarize(k, v, g, beta, cu_seqlens, cu_cpu=None):
    cu, _, k4, gc, w, u = _wy_prepare(k, v, g, beta, cu_seqlens, cu_cpu)
    return _zero_start_summary(k4, w, u, gc, cu, cu_cpu)


def gated_delta_forward(q, k, v, g, beta, *, cu_seqlens, initial_state=None, scale=None, cu_seqlens_cpu=None):
    """Varlen GDN forward: the kernels of fla's ``chunk_gated_delta_rule`` (local cumsum, WY intra,
    state pass, output), called directly. Skipping its autograd wrapper (input guard, autocast,
    saving tensors for a backward that never runs) saves host time on every layer. Returns
    (o, final fp32)."""
    if _any_fp64(q, k, v, g, beta, initial_state):
        return _on_cpu_reference("gated_delta", "gated_delta_forward", (q, k, v, g, beta),
                                 dict(cu_seqlens=cu_seqlens, initial_state=initial_state, scale=scale))
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
    if _any_fp64(q, k, v, g, beta):  # the CPU reference, through the two separate calls
        summary = gated_delta_summarize(k, v, g, beta, cu_seqlens=cu_seqlens)
        o, final = gated_delta_forward(q, k, v, g, beta, cu_seqlens=cu_seqlens,
                                       initial_state=initial_states_from(summary), scale=scale)
        return o, final if output_final_state else None, summary
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
    if _any_fp64(q, k, v, g, beta, initial_state):
        return _reference_forward_and_summarize("gated_delta", q, k, v, (g, beta), cu_seqlens, initial_state, scale)
    _check_fla_inputs("gated_delta_forward_and_summarize", k.shape[-1], q, k, v, g, beta)
    with torch.no_grad():
        return _wy_forward(q, k, v, g, beta, cu_seqlens, initial_state, scale, with_summary=True,
                           cu_cpu=cu_seqlens_cpu)


def gated_delta_summarize(k, v, g, beta, *, cu_seqlens, cu_seqlens_cpu=None):
    """Zero-start summaries (T dense fp32, S fp32) of every span in one launch of each kernel."""
    if _any_fp64(k, v, g, beta):
        return _on_cpu_reference("gated_delta", "gated_delta_summarize", (k, v, g, beta),
                                 dict(cu_seqlens=cu_seqlens))
    _check_fla_inputs("gated_delta_summarize", k.shape[-1], k, v, g, beta)
    with torch.no_grad():
        return _wy_summarize(k, v, g, beta, cu_seqlens, cu_cpu=cu_seqlens_cpu)


def gated_delta_decode(q, k, v, g, beta, state, *, scale=None):
    """One token per sequence via fla's fused recurrent kernel (fp32 state math)."""
    if _any_fp64(q, k, v, g, beta, state):
        return _on_cpu_reference("gated_delta", "gated_delta_decode", (q, k, v, g, beta, state),
                                 dict(scale=scale))
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
    if _any_fp64(q, k, v, beta, initial_state):
        return _on_cpu_reference("delta", "delta_forward", (q, k, v, beta),
                                 dict(cu_seqlens=cu_seqlens, initial_state=initial_state, scale=scale))
    _check_fla_inputs("delta_forward", k.shape[-1], q, k, v, beta)
    with torch.no_grad():
        return _wy_forward(q, k, v, None, beta, cu_seqlens, initial_state, scale, with_summary=False)


def delta_forward_and_summarize(q, k, v, beta, *, cu_seqlens, initial_state=None, scale=None):
    if _any_fp64(q, k, v, beta, initial_state):
        return _reference_forward_and_summarize("delta", q, k, v, (beta,), cu_seqlens, initial_state, scale)
    _check_fla_inputs("delta_forward_and_summarize", k.shape[-1], q, k, v, beta)
    with torch.no_grad():
        return _wy_forward(q, k, v, None, beta, cu_seqlens, initial_state, scale, with_summary=True)


def delta_summarize(k, v, beta, *, cu_seqlens):
    if _any_fp64(k, v, beta):
        return _on_cpu_reference("delta", "delta_summarize", (k, v, beta), dict(cu_seqlens=cu_seqlens))
    _check_fla_inputs("delta_summarize", k.shape[-1], k, v, beta)
    with torch.no_grad():
        return _wy_summarize(k, v, None, beta, cu_seqlens)


def delta_decode(q, k, v, beta, state, *, scale=None):
    if _any_fp64(q, k, v, beta, state):
        return _on_cpu_reference("delta", "delta_decode", (q, k, v, beta, state), dict(scale=scale))
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
        DenseSummary = _summary_classes()[0]
        if with_output and h0 is None:
            _, trans = _cp_summaries(kg, w, u, None, gc, cu, num_spans, transition_only=True)
            zero_start = out[1].clone()
        else:
            zero_start, trans = _cp_summaries(kg, w, u, None, gc, cu, num_spans, transition_only=False)
        out = out + (DenseSummary(transition=trans, state=zero_start),)
    return out


def kda_forward(q, k, v, g, beta, *, cu_seqlens, initial_state=None, scale=None):
    """Varlen KDA forward via fla's public ``chunk_kda`` (g ``[T, HV, K]`` log decay)."""
    if _any_fp64(q, k, v, g, beta, initial_state):
        return _on_cpu_reference("kda", "kda_forward", (q, k, v, g, beta),
                                 dict(cu_seqlens=cu_seqlens, initial_state=initial_state, scale=scale))
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
    if _any_fp64(q, k, v, g, beta, initial_state):
        return _reference_forward_and_summarize("kda", q, k, v, (g, beta), cu_seqlens, initial_state, scale)
    _check_fla_inputs("kda_forward_and_summarize", k.shape[-1], q, k, v, g, beta)
    with torch.no_grad():
        return _kda_run(q, k, v, g, beta, cu_seqlens, initial_state, scale, True, True)


def kda_summarize(k, v, g, beta, *, cu_seqlens):
    if _any_fp64(k, v, g, beta):
        return _on_cpu_reference("kda", "kda_summarize", (k, v, g, beta), dict(cu_seqlens=cu_seqlens))
    _check_fla_inputs("kda_summarize", k.shape[-1], k, v, g, beta)
    with torch.no_grad():
        return _kda_run(None, k, v, g, beta, cu_seqlens, None, None, False, True)[0]


def kda_decode(q, k, v, g, beta, state, *, scale=None):
    if _any_fp64(q, k, v, g, beta, state):
        return _on_cpu_reference("kda", "kda_decode", (q, k, v, g, beta, state), dict(scale=scale))
    _check_fla_inputs("kda_decode", k.shape[-1], q, k, v, g, beta, state)
    from fla.ops.kda import fused_recurrent_kda

    with torch.no_grad():
        o, new_state = fused_recurrent_kda(
            q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), g.float().unsqueeze(1),
            beta.unsqueeze(1), scale=scale, initial_state=state.to(torch.float32).contiguous(),
            output_final_state=True,
        )
    return o[:, 0].to(v.dtype), new_state


# --------------------------------------------------------------------------------------------
# chain scan
# --------------------------------------------------------------------------------------------

def scan_chain(summaries, cu_chains, initial_states=None, *, record_rows=None, num_records=None):
    """Incoming state of every span (or of the recorded ones) and final state of every chain,
    one Triton launch. Falls back to the batched torch formulation for float64 summaries."""
    if summaries.state.dtype == torch.float64 or _any_fp64(initial_states):
        from hypic.ops.linear.summary import _recorded

        incoming, final = scan_chain_torch(summaries, cu_chains, initial_states)
        return _recorded(incoming, record_rows, num_records), final
    return scan_chain_triton(summaries, cu_chains, initial_states, record_rows=record_rows,
                             num_records=num_records)


def scan_chain_from(first, second, source, cu_chains, initial_states=None, *, record_rows=None, num_records=None):
    """:func:`scan_chain` over a chain read from two sets of summaries through ``source``, one
    Triton launch and no gathered copy of the chain (a SummaryTable with addresses is read where
    its items live)."""
    from hypic.ops.linear.summary import gather_chain

    if first.state.dtype == torch.float64 or second.dtype == torch.float64 or _any_fp64(initial_states):
        return scan_chain(gather_chain(first, second, source), cu_chains, initial_states, record_rows=record_rows,
                          num_records=num_records)
    return scan_chain_triton(first, cu_chains, initial_states, second=second, source=source,
                             record_rows=record_rows, num_records=num_records)
