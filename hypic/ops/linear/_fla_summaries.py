"""fla's context-parallel affine-summary kernel (``chunk_cp_fwd_h``) as the delta-rule fast
paths call it, and the dot precision it composes T with. fla is imported inside function bodies."""

from __future__ import annotations

import torch

from hypic.ops.linear._fla_common import CHUNK_SIZE

_TRANSITION_ONLY_OK = [True]  # cleared if the V = 0 launch ever fails (then S is recomputed too)

# Dot precision of fla's summary kernel when it composes T over chunks (fp32 storage and
# accumulation either way). Not fla's tf32x3: on the H200 at the 35B-A3B shape (64 spans of 512
# tokens, 32 heads) one layer's launch takes 0.86 ms with tf32 against 2.24-2.27 ms with tf32x3,
# and T's error against float64 is 6.3e-3 against 4.0e-3. Both are set by the bf16 WY factors
# the kernel starts from (S, whose dots do not change, is off by 3.0e-3-3.7e-3 in both). The
# cold 32k request went from 795.8 to 747.8 ms (benchmarks/results/README.md).
SUMMARY_DOT_PRECISION = "tf32"
_SUMMARY_PRECISION_SET = [False]


def _configure_summary_precision() -> None:
    """Set fla's module constant before its summary kernel first compiles (Triton reads a
    constexpr global at compile time and refuses a later change)."""
    if _SUMMARY_PRECISION_SET[0]:
        return
    import triton.language as tl

    import fla.ops.cp.chunk_fwd as cp_fwd

    cp_fwd.CP_DOT_PRECISION = tl.constexpr(SUMMARY_DOT_PRECISION)
    _SUMMARY_PRECISION_SET[0] = True


def _cp_summaries(k4, w, u, gc, gk, cu, num_spans: int, transition_only: bool):
    """fla's affine-summary kernel: returns (S [N,HV,K,V] or None, T [N,HV,K,K]) fp32.

    ``transition_only`` launches only the T columns (V = 0 view of u): used when the zero-start
    states are already known (a forward from zero initial states yields them).
    """
    from fla.ops.cp.chunk_fwd import chunk_cp_fwd_h

    _configure_summary_precision()
    key_dim = k4.shape[-1]
    num_heads, value_dim = u.shape[2], u.shape[3]
    if transition_only and _TRANSITION_ONLY_OK[0]:
        # a zero-width view of u makes the kernel's V extent 0: only the T program blocks run
        # and hm is laid out [K, 0 + K]
        hm = torch.empty(num_spans, num_heads, key_dim, key_dim, device=k4.device, dtype=torch.float32)
        try:
            chunk_cp_fwd_h(k=k4, w=w, u=u[..., :0], hm=hm, g=gc, gk=gk, cu_seqlens=cu,
                           chunk_size=CHUNK_SIZE, multi_seqs=True)
            return None, hm
        except Exception:  # noqa: BLE001 - a kernel that rejects V = 0: use the full launch
            _TRANSITION_ONLY_OK[0] = False
    hm = torch.empty(num_spans, num_heads, key_dim, value_dim + key_dim, device=k4.device,
                     dtype=torch.float32)
    chunk_cp_fwd_h(k=k4, w=w, u=u, hm=hm, g=gc, gk=gk, cu_seqlens=cu,
                   chunk_size=CHUNK_SIZE, multi_seqs=True)
    return hm[..., :value_dim].contiguous(), hm[..., value_dim:].contiguous()
