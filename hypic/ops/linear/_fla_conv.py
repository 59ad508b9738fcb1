"""GPU path of :func:`hypic.ops.conv.causal_conv1d` (re-exported by
:mod:`hypic.ops.linear.fla_paths`, where the dispatcher looks it up): hypic's one-launch kernel
(:mod:`hypic.ops.conv_short`) for short runs, fla's chunked Triton kernel for long ones."""

from __future__ import annotations

import os

import torch

from hypic.ops.linear._fla_common import _chunk_indices, _cu


CONV_IMPL_ENV = "HYPIC_CONV_IMPL"
CONV_IMPLS = ("auto", "fla", "short")
# auto: hypic's kernel when the runs average at most this many tokens (a cached request's seams
# and question), fla's chunked kernel for long runs (a cold prefill)
SHORT_CONV_MAX_MEAN_TOKENS = 64


def conv_impl(num_tokens: int, num_seqs: int) -> str:
    """``"fla"`` or ``"short"`` for a conv over ``num_seqs`` runs of ``num_tokens`` in all
    (``HYPIC_CONV_IMPL`` = auto, fla or short; auto by the mean run length)."""
    impl = os.environ.get(CONV_IMPL_ENV, "auto")
    if impl not in CONV_IMPLS:
        raise ValueError(f"{CONV_IMPL_ENV} must be one of {CONV_IMPLS}, got {impl!r}")
    if impl == "auto":
        impl = "short" if num_tokens <= SHORT_CONV_MAX_MEAN_TOKENS * max(num_seqs, 1) else "fla"
    return impl


def causal_conv1d(x, weight, bias=None, *, cu_seqlens, initial_state=None, activation="silu", cu_seqlens_cpu=None,
                  output_final_state=True):
    """Varlen causal depthwise conv: :func:`hypic.ops.conv_short.short_conv` for short runs, else
    ``fla.modules.causal_conv1d.causal_conv1d_fwd`` (both: fp32 accumulation, output in x's dtype,
    SiLU fused). Same contract as the reference."""
    if conv_impl(x.shape[0], cu_seqlens.numel() - 1) == "short":
        from hypic.ops.conv_short import short_conv

        return short_conv(x, weight, bias, cu_seqlens=cu_seqlens, initial_state=initial_state, activation=activation,
                          output_final_state=output_final_state)
    from fla.modules.causal_conv1d import causal_conv1d_fwd

    from hypic.ops.conv import conv_final_state

    hist = weight.shape[1] - 1
    cu = _cu(cu_seqlens, x.device)
    # fla's state is [N, D, W] with column j the input j - W steps back: a width-W conv never reads
    # column 0, so hypic's [N, D, W-1] state is that with one zero column in front.
    init = None if initial_state is None else torch.nn.functional.pad(initial_state, (1, 0)).contiguous()
    y, _ = causal_conv1d_fwd(
        x.unsqueeze(0), weight.contiguous(), bias, None, initial_state=init, output_final_state=False,
        activation=activation, cu_seqlens=cu, chunk_indices=_chunk_indices(cu, cu_seqlens_cpu),
    )
    return y[0], conv_final_state(x, initial_state, cu, hist) if output_final_state else None
