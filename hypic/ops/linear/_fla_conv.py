"""fla's chunked causal conv as the GPU path of :func:`hypic.ops.conv.causal_conv1d` for long runs (a
cold prefill; the caller picks it, :func:`hypic.ops.conv.conv_kernel`, and re-exported by
:mod:`hypic.ops.linear.fla_paths`). fla is imported inside the function body."""

from __future__ import annotations

import torch

from hypic.ops.linear._fla_common import _chunk_indices, _cu


def fla_causal_conv1d(x, weight, bias=None, *, cu_seqlens, initial_state=None, activation="silu",
                      cu_seqlens_cpu=None) -> torch.Tensor:
    """The output ``y [T, D]`` (x's dtype, fp32 accumulation, SiLU fused) of the varlen causal
    depthwise conv through ``fla.modules.causal_conv1d.causal_conv1d_fwd`` (inputs validated by
    the caller, which forms the final states)."""
    from fla.modules.causal_conv1d import causal_conv1d_fwd

    cu = _cu(cu_seqlens, x.device)
    # fla's state is [N, D, W] with column j the input j - W steps back: a width-W conv never reads
    # column 0, so hypic's [N, D, W-1] state is that with one zero column in front.
    init = None if initial_state is None else torch.nn.functional.pad(initial_state, (1, 0)).contiguous()
    y, _ = causal_conv1d_fwd(
        x.unsqueeze(0), weight.contiguous(), bias, None, initial_state=init, output_final_state=False,
        activation=activation, cu_seqlens=cu, chunk_indices=_chunk_indices(cu, cu_seqlens_cpu),
    )
    return y[0]
