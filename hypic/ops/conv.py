"""Short causal depthwise convolution (kernel W, usually 4) with explicit state in and out.

Used in front of the Gated DeltaNet, KDA and Mamba2 mixers. The state of a sequence is the last
``W - 1`` **inputs** before the span (zeros = cold start), so a cached segment can start from the
true tail of whatever precedes it (conv warm-up) and can store its own tail. Spans shorter than
``W - 1`` carry part of the incoming state into their final state.

Maths per channel d: ``y_t = act(bias_d + sum_{w < W} weight[d, w] * x_{t - (W - 1) + w})`` where
``x`` before the span start reads from the state.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from hypic.ops.conv_short import conv_tails as conv_tails_triton
from hypic.ops.conv_short import short_conv
from hypic.ops.linear.checks import (
    FLOAT_DTYPES,
    check_cu_seqlens,
    check_same_device,
    check_cu_seqlens_cpu,
    check_tensor,
    compute_dtype,
    cu_seqlens_to_list,
)
from hypic.ops.linear.fla_paths import fla_causal_conv1d

ACTIVATIONS = ("silu", None)
# the one-launch kernel of hypic.ops.conv_short when the runs average at most this many tokens (a
# cached request's seams and question), fla's chunked kernel for longer runs (a cold prefill)
SHORT_CONV_MAX_MEAN_TOKENS = 64


def _check_common(x_dim: int, weight: object, bias: object, activation: object) -> int:
    check_tensor("weight", weight, (x_dim, None), FLOAT_DTYPES)
    width = weight.shape[1]
    if width < 1:
        raise ValueError(f"weight must have kernel width >= 1, got {width}")
    if bias is not None:
        check_tensor("bias", bias, (x_dim,), FLOAT_DTYPES)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
    return width


def _activate(y: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    return torch.nn.functional.silu(y) if activation == "silu" else y


def conv_kernel(x: torch.Tensor, num_seqs: int) -> Optional[str]:
    """The GPU kernel that takes a conv of ``x`` over ``num_seqs`` runs, chosen on the input:
    None (the reference) off CUDA or in float64; ``"short"`` (:func:`hypic.ops.conv_short.short_conv`)
    when the runs average at most ``SHORT_CONV_MAX_MEAN_TOKENS`` tokens, else ``"fla"`` (fla's
    chunked kernel, :func:`hypic.ops.linear.fla_paths.fla_causal_conv1d`)."""
    if not x.is_cuda or x.dtype == torch.float64:
        return None
    return "short" if x.shape[0] <= SHORT_CONV_MAX_MEAN_TOKENS * max(num_seqs, 1) else "fla"


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    cu_seqlens: torch.Tensor,
    initial_state: Optional[torch.Tensor] = None,
    activation: Optional[str] = "silu",
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
    output_final_state: bool = True,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Varlen causal depthwise conv.

    x ``[T, D]``; weight ``[D, W]``; bias ``[D]`` or None; cu_seqlens ``[N+1]``; initial_state
    ``[N, D, W-1]`` in x's dtype or None (zeros). Returns ``(y [T, D] in x.dtype,
    final_state [N, D, W-1] in x.dtype)``: the last W-1 inputs of ``initial_state ++ span``.
    ``cu_seqlens_cpu``: optional host copy of ``cu_seqlens`` (spares the GPU path a sync).
    ``output_final_state=False`` returns None in its place (a caller that records its own tails
    saves the gathers).
    """
    check_tensor("x", x, (None, None), FLOAT_DTYPES)
    num_tokens, dim = x.shape
    width = _check_common(dim, weight, bias, activation)
    check_cu_seqlens(cu_seqlens, num_tokens)
    check_cu_seqlens_cpu(cu_seqlens_cpu, cu_seqlens, num_tokens)
    num_seqs = cu_seqlens.numel() - 1
    if initial_state is not None:
        check_tensor("initial_state", initial_state, (num_seqs, dim, width - 1), (x.dtype,))
    check_same_device(x=x, weight=weight, bias=bias, initial_state=initial_state)
    hist = width - 1
    kernel = conv_kernel(x, num_seqs)
    if kernel is not None:
        if kernel == "short":
            y = short_conv(x, weight, bias, cu_seqlens=cu_seqlens, initial_state=initial_state, activation=activation)
        else:
            y = fla_causal_conv1d(x, weight, bias, cu_seqlens=cu_seqlens, initial_state=initial_state,
                                  activation=activation, cu_seqlens_cpu=cu_seqlens_cpu)
        return y, conv_final_state(x, initial_state, cu_seqlens, hist) if output_final_state else None

    if initial_state is None:
        initial_state = x.new_zeros(num_seqs, dim, hist)
    if x.device.type == "cpu":  # value checks read cu_seqlens on the host: free on CPU only
        cu_seqlens_to_list(cu_seqlens, num_tokens)
    dtype = compute_dtype(x, weight)
    # One source buffer: the packed tokens, then every sequence's W-1 state inputs. Each tap and
    # each tail row is a gather from it, with indices computed on the device (no loop per
    # sequence, no host sync): a token at local index i reading j steps back takes token t - j
    # when i >= j, else state column W-1 + (i - j) of its own sequence.
    src = torch.cat([x, initial_state.transpose(1, 2).reshape(num_seqs * hist, dim)])
    cu_dev = cu_seqlens.to(x.device)
    token_src = _conv_tap_index(cu_dev, num_tokens, num_seqs, hist)
    src_c = src.to(dtype)
    w_c = weight.to(dtype)
    y = x.new_zeros(num_tokens, dim, dtype=dtype)
    for w in range(width):  # tap w reads the input W-1-w steps back
        y += w_c[:, w] * src_c.index_select(0, token_src[hist - w])
    if bias is not None:
        y += bias.to(dtype)
    y = _activate(y, activation).to(x.dtype)
    if not output_final_state:
        return y, None
    tail_src = _conv_tail_index(cu_dev, num_tokens, num_seqs, hist)
    final_state = src.index_select(0, tail_src).reshape(num_seqs, hist, dim).transpose(1, 2).contiguous()
    return y, final_state


SMALL_CAT_BYTES = 32 << 20  # below this, gather_rows_of_cat concatenates first


def gather_rows_of_cat(x: torch.Tensor, extra: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``torch.cat([x, extra]).index_select(0, index)`` without materialising the concatenation
    (at a 32k-token prefill ``x`` is 0.5 GB per layer; the index selects a few rows): one gather
    from each source and a select. No host sync."""
    if x.shape[0] == 0:
        return extra.index_select(0, index)
    if extra.shape[0] == 0:
        return x.index_select(0, index)
    if x.numel() * x.element_size() <= SMALL_CAT_BYTES:
        # a cached request's few live tokens (9 MiB at the all-hit 32k shape): copying the whole
        # concatenation takes a few microseconds, two launches instead of the seven below
        return torch.cat([x, extra]).index_select(0, index)
    num_x = x.shape[0]
    in_x = (index < num_x).unsqueeze(-1)
    from_x = x.index_select(0, index.clamp(max=num_x - 1))
    from_extra = extra.index_select(0, (index - num_x).clamp(min=0))
    return torch.where(in_x, from_x, from_extra)


def conv_tails(x: torch.Tensor, init: torch.Tensor, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The conv tails a layer records: ``out[n, :, j]`` is row ``index[n * G + j]`` of
    ``cat(x, init's rows)``, init's row ``m * G + j`` being ``init[m, :, j]``; ``[N, D, G]``
    contiguous in ``dtype``. x ``[T, D]`` (a strided column block is fine), init ``[N0, D, G]``,
    index int64 on x's device with ``N * G`` entries in range (not checked on the device).

    On CUDA one Triton launch (:func:`hypic.ops.conv_short.conv_tails`): at a cached request's
    shape the concatenation of a strided x alone took 17.6 us a layer on the H200, and the
    all-hit 32k request 54.51 ms p50 against 55.27 with the reference's tails
    (benchmarks/results/README.md). Elsewhere :func:`conv_tails_reference`."""
    if x.dim() != 2 or init.dim() != 3 or init.shape[1] != x.shape[1] or init.shape[2] < 1:
        raise ValueError(f"x must be [T, D] and init [N, D, G >= 1], got {tuple(x.shape)} and {tuple(init.shape)}")
    if index.dim() != 1 or index.numel() % init.shape[2] or index.device != x.device or init.device != x.device:
        raise ValueError("index must be 1-D, a multiple of G long, on x's device (as init)")
    if x.is_cuda:
        return conv_tails_triton(x, init, index.long(), dtype)
    return conv_tails_reference(x, init, index, dtype)


def conv_tails_reference(x: torch.Tensor, init: torch.Tensor, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """:func:`conv_tails` in PyTorch (operands checked by the caller): the states' rows, a
    concatenation, a select, a transpose and a cast."""
    width_1 = init.shape[2]
    rows = gather_rows_of_cat(x, init.transpose(1, 2).reshape(-1, x.shape[1]), index)
    return rows.view(-1, width_1, x.shape[1]).transpose(1, 2).to(dtype).contiguous()


def conv_final_state(x: torch.Tensor, initial_state: Optional[torch.Tensor], cu_seqlens: torch.Tensor,
                     hist: int) -> torch.Tensor:
    """The last ``hist`` inputs of ``initial_state ++ span`` per sequence: ``[N, D, hist]`` in x's
    dtype (what :func:`causal_conv1d` returns as the final state)."""
    num_tokens, dim = x.shape
    num_seqs = cu_seqlens.numel() - 1
    if initial_state is None:
        initial_state = x.new_zeros(num_seqs, dim, hist)
    if hist == 0:
        return x.new_zeros(num_seqs, dim, 0)
    tail_src = _conv_tail_index(cu_seqlens.to(x.device), num_tokens, num_seqs, hist)
    return conv_tails_reference(x, initial_state, tail_src, torch.promote_types(x.dtype, initial_state.dtype))


def _conv_tail_index(cu_seqlens: torch.Tensor, num_tokens: int, num_seqs: int, hist: int) -> torch.Tensor:
    """Rows of ``cat(x [T], states [N*(W-1)])`` holding each sequence's last W-1 inputs (state
    included), ``[N * (W-1)]``."""
    cu = cu_seqlens.long()
    device = cu.device
    k = (cu[1:] - cu[:-1])[:, None] - hist + torch.arange(hist, device=device)[None]  # [N, W-1] span index
    seq_ids = torch.arange(num_seqs, device=device)[:, None]
    return torch.where(k >= 0, cu[:-1, None] + k, num_tokens + seq_ids * hist + hist + k).reshape(-1)


def _conv_tap_index(cu_seqlens: torch.Tensor, num_tokens: int, num_seqs: int, hist: int) -> torch.Tensor:
    """Rows of ``cat(x [T], states [N*(W-1)])``: ``[j, t]`` is the input j steps before token t
    (j = 0..W-1)."""
    cu = cu_seqlens.long()
    device = cu.device
    lengths = cu[1:] - cu[:-1]
    seq = torch.repeat_interleave(torch.arange(num_seqs, device=device), lengths, output_size=num_tokens)
    token = torch.arange(num_tokens, device=device)
    local = token - cu[:-1].index_select(0, seq) if num_tokens else token
    back = torch.arange(hist + 1, device=device)[:, None]  # [W, 1]
    state_row = num_tokens + seq[None] * hist + hist + (local[None] - back)
    return torch.where(local[None] >= back, token[None] - back, state_row)


def causal_conv1d_update(
    x: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = "silu",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: x ``[N, D]``, state ``[N, D, W-1]`` (x's dtype).

    Returns ``(y [N, D], new_state [N, D, W-1])``; the input state is not modified."""
    check_tensor("x", x, (None, None), FLOAT_DTYPES)
    num_seqs, dim = x.shape
    width = _check_common(dim, weight, bias, activation)
    check_tensor("state", state, (num_seqs, dim, width - 1), (x.dtype,))
    check_same_device(x=x, state=state, weight=weight, bias=bias)
    window = torch.cat([state, x[:, :, None]], dim=-1)  # [N, D, W]
    dtype = compute_dtype(x, weight)
    y = (window.to(dtype) * weight.to(dtype)[None]).sum(-1)
    if bias is not None:
        y = y + bias.to(dtype)
    y = _activate(y, activation).to(x.dtype)
    return y, window[:, :, 1:].contiguous()
