"""A span's transition operator T_C from its WY factors, for the spans a forward writes.

A delta-rule span C maps an entering state h to ``T_C h + S(C|0)``. Chunk by chunk (fla's WY
form, chunk-local log2 gates ``g``), ``T_C`` is the left product of the chunks'
``gamma I - Kd^T W`` with ``gamma = exp2(g_last)`` and ``Kd = diag(exp2(g_last - g)) K``: the
state pass with ``u = 0``, started from the identity. When a forward already yields S (a zero
start, or :mod:`hypic.ops.linear.state_summary` on a cold prefill), T is all that is left.

:func:`wy_transitions` is one Triton launch over (column block, head, span) for the requested
spans only, written in their order (no gather afterwards); it replaces fla's summary kernel
launched with ``V = 0``, which composes every span of the forward (seams and questions too) and
builds each chunk's full ``[K, K]`` factor before a TF32 product. Here T's columns take ``W T`` and ``K^T (.)`` with T split into bf16 halves (2 MMAs a
product, W and K exact in bf16): fp32-accurate products, where fla's TF32 rounds T to 10 bits.
:func:`wy_transitions_reference` is the plain torch form beside it.

Measured on the H200 (``benchmarks/cold_write_h200.py``: one layer of a cold 32k
request, 64 written bodies of 504 tokens, 32 heads): 0.43 ms against fla's launch 0.61 and its
gather 0.07; T 4.1e-6 from a float64 walk of the same WY factors against fla's 5.4e-3. Queued
on a side stream beside the chain walk (:func:`wy_transitions_beside`), the layer's write op
took 3.37-3.43 ms against 3.49-3.51 with T in line (benchmarks/results/README.md).
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from hypic.envs import triton_interpret
from hypic.ops.linear.summary import check_summary_targets

CHUNK_TOKENS = 64  # fla's chunk size: the WY factors are chunk-local
_KERNEL = None
_SIDE_STREAMS: dict = {}

Spans = Union[torch.Tensor, Tuple[int, int]]


def span_ids(spans: Spans, num_spans: int, device) -> torch.Tensor:
    """``spans`` (an index tensor, or a host ``(a, b)`` for spans ``a .. b-1``) as an int64 index
    tensor on ``device`` (no host sync)."""
    if isinstance(spans, tuple):
        a, b = spans
        if not 0 <= a <= b <= num_spans:
            raise ValueError(f"spans {a}..{b} must lie within the {num_spans} spans")
        return torch.arange(a, b, dtype=torch.int64, device=device)
    if spans.dim() != 1:
        raise ValueError(f"spans must be a 1-d index tensor, got shape {tuple(spans.shape)}")
    if not spans.is_cuda and spans.numel() and not (0 <= int(spans.min()) and int(spans.max()) < num_spans):
        # (a device tensor is not read back: that would synchronise the host with the device)
        raise ValueError(f"span indices must lie in [0, {num_spans}), got {spans.tolist()}")
    return spans.to(device=device, dtype=torch.int64)


def _check(k, w, g, cu_spans) -> None:
    if k.dim() != 3 or w.dim() != 3 or k.shape[0] != w.shape[0] or k.shape[2] != w.shape[2]:
        raise ValueError(f"k must be [T, H, K] and w [T, HV, K] alike, got {tuple(k.shape)} and {tuple(w.shape)}")
    if w.shape[1] % k.shape[1]:
        raise ValueError(f"w's {w.shape[1]} heads must be a multiple of k's {k.shape[1]}")
    if g is not None and tuple(g.shape) != tuple(w.shape[:2]):
        raise ValueError(f"g must be [T, HV] = {tuple(w.shape[:2])}, got {tuple(g.shape)}")
    if cu_spans.dim() != 1 or cu_spans.numel() < 1:
        raise ValueError(f"cu_spans must be a 1-d bounds tensor, got shape {tuple(cu_spans.shape)}")


def wy_transitions_reference(k: torch.Tensor, w: torch.Tensor, g: Optional[torch.Tensor], cu_spans: torch.Tensor,
                             spans: Spans, chunk_size: int = CHUNK_TOKENS) -> torch.Tensor:
    """T ``[NW, HV, K, K]`` of the given spans by plain loops, in float64 on the CPU (for tests)."""
    _check(k, w, g, cu_spans)
    f64 = lambda x: None if x is None else x.detach().to("cpu", torch.float64)  # noqa: E731
    k, w, g = f64(k), f64(w), f64(g)
    bounds = [int(x) for x in cu_spans.tolist()]
    ids = span_ids(spans, len(bounds) - 1, "cpu").tolist()
    num_heads, key_dim = w.shape[1], w.shape[2]
    key_heads = torch.arange(num_heads) // (num_heads // k.shape[1])
    out = torch.zeros(len(ids), num_heads, key_dim, key_dim, dtype=torch.float64)
    for n, s in enumerate(ids):
        t = torch.eye(key_dim, dtype=torch.float64).expand(num_heads, key_dim, key_dim).clone()
        for t0 in range(bounds[s], bounds[s + 1], chunk_size):
            t1 = min(t0 + chunk_size, bounds[s + 1])
            kk = k[t0:t1][:, key_heads]  # [BT, HV, K]
            x = torch.einsum("thk,hkc->thc", w[t0:t1], t)
            if g is not None:
                g_last = g[t1 - 1]
                x = x * torch.exp2(g_last[None, :] - g[t0:t1])[..., None]
                t = torch.exp2(g_last)[:, None, None] * t
            t = t - torch.einsum("thk,thc->hkc", kk, x)
        out[n] = t
    return out


def wy_transitions(k: torch.Tensor, w: torch.Tensor, g: Optional[torch.Tensor], cu_spans: torch.Tensor,
                   spans: Spans) -> torch.Tensor:
    """:func:`wy_transitions_reference` as one Triton launch on CUDA (and under the interpreter),
    fp32 out; its products in bf16x3, as the chain walk's. Elsewhere the reference, in the
    inputs' dtype."""
    return wy_transitions_beside(k, w, g, cu_spans, spans, overlap=False).launch().result()


class BesideTransitions:
    """T of some spans formed beside other work (:func:`wy_transitions_beside`). Everything the
    launch reads or writes is allocated when this is made, on the current stream, whose position
    is then marked; :meth:`launch` queues the kernel, on a side stream after that mark (so the
    work queued in between, e.g. the chain walk, runs alongside it) or in line; :meth:`result`
    makes the current stream wait for it and returns T. Call :meth:`result` before anything
    reads T and before the inputs may be freed (the current stream must not reuse their memory
    while the side stream works on it)."""

    def __init__(self, out: torch.Tensor, args=None, overlap: bool = False, written_into=None) -> None:
        self._out = out
        self._args = args  # None: ``out`` is already T
        self._side = None
        self._mark = None
        # the SummaryTable whose items' T the launch writes (then result() is None), or None
        self.written_into = written_into
        if args is not None and overlap:
            self._side = _side_stream(out.device)
            self._mark = torch.cuda.Event()
            self._mark.record(torch.cuda.current_stream(out.device))

    def launch(self) -> "BesideTransitions":
        if self._args is not None:
            if self._side is None:
                _launch(*self._args)
            else:
                self._side.wait_event(self._mark)
                with torch.cuda.stream(self._side):
                    _launch(*self._args)
            self._args = None
        return self

    def join(self) -> None:
        """Make the current stream wait for the launch, if one is on the side stream (safe in any
        state: an error path calls it so that no freed input is still being read)."""
        if self._args is None and self._side is not None:
            torch.cuda.current_stream(self._out.device).wait_stream(self._side)
            self._side = None

    def result(self) -> Optional[torch.Tensor]:
        """T ``[NW, HV, K, K]``, or None when it was written into :attr:`written_into`'s items."""
        if self._args is not None:
            raise RuntimeError("BesideTransitions.result() before launch()")
        self.join()
        return None if self.written_into is not None else self._out


def wy_transitions_beside(k: torch.Tensor, w: torch.Tensor, g: Optional[torch.Tensor], cu_spans: torch.Tensor,
                          spans: Spans, overlap: bool = True, into=None) -> BesideTransitions:
    """:func:`wy_transitions` to be launched by the returned object's ``launch()``, on CUDA on a
    side stream from the current stream's position now (``overlap``; in line without it or
    inside a CUDA graph capture), so work queued on the current stream before ``launch()`` runs
    beside it: T's programs fill the SMs the chain walk leaves idle (it runs ~64 programs on the
    H200's 132). Off CUDA T is formed now.

    ``into``: a :class:`~hypic.ops.linear.summary.SummaryTable` of one-span dense summaries, one
    per requested span, e.g. the store entries a forward writes
    (:func:`~hypic.ops.linear.summary.check_summary_targets`). The kernel then writes span i's T
    into ``into.items[i]`` through the table's addresses (``written_into`` is set and
    ``result()`` is None); where the kernel does not run (off CUDA) it is ignored."""
    _check(k, w, g, cu_spans)
    if not (w.is_cuda or triton_interpret()):
        return BesideTransitions(wy_transitions_reference(k, w, g, cu_spans, spans).to(w.dtype))
    ids = span_ids(spans, cu_spans.numel() - 1, w.device).contiguous()
    num_heads, key_dim = w.shape[1], w.shape[2]
    if into is not None:
        check_summary_targets(into, ids.numel(), num_heads, key_dim, None, w.device, need_addresses=True)
        out = into.items[0].transition  # the base the table's addresses are counted from
    else:
        out = torch.empty(ids.numel(), num_heads, key_dim, key_dim, device=w.device, dtype=torch.float32)
    if ids.numel() == 0:
        return BesideTransitions(out, written_into=into)
    cu_spans = cu_spans.to(device=w.device, dtype=torch.int64).contiguous()
    k, w, g = k.contiguous(), w.contiguous(), None if g is None else g.contiguous()
    overlap = overlap and w.is_cuda and not torch.cuda.is_current_stream_capturing()
    table = None if into is None else into.addresses[0].contiguous()
    return BesideTransitions(out, (k, w, g, cu_spans, ids, out, table), overlap, written_into=into)


def _side_stream(device: torch.device):
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    stream = _SIDE_STREAMS.get(index)
    if stream is None:
        stream = _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return stream


def _launch(k, w, g, cu_spans, ids, out, table: Optional[torch.Tensor] = None) -> None:
    import triton

    num_heads, key_dim = w.shape[1], w.shape[2]
    kernel, fixed = _kernel()

    def grid(meta):
        return (triton.cdiv(key_dim, meta["BC"]), num_heads, ids.numel())

    kernel[grid](k, w, g, cu_spans, ids, out, ids if table is None else table, out.data_ptr(), ids.numel(),
                 H=k.shape[1], HV=num_heads, K=key_dim, BK=max(16, triton.next_power_of_2(key_dim)),
                 BT=CHUNK_TOKENS, USE_G=g is not None, INTERPRET=triton_interpret(), OUT_TABLE=table is not None,
                 **fixed)


def _kernel():
    """The kernel, autotuned over the column block, warps and stages on GPU (its output is fully
    rewritten by every launch, so benchmarking runs are harmless); one block under the
    interpreter."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton

    from hypic.ops.linear._transition_kernel import wy_transition_kernel as kernel

    if triton_interpret():
        _KERNEL = (kernel, {"BC": 32})
        return _KERNEL
    configs = [triton.Config({"BC": bc}, num_warps=nw, num_stages=ns)
               for bc, nw, ns in [(32, 2, 2), (32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 8, 2)]]
    _KERNEL = (triton.autotune(configs=configs, key=["H", "HV", "K", "USE_G"])(kernel), {})
    return _KERNEL


__all__ = ["span_ids", "BesideTransitions", "wy_transitions", "wy_transitions_beside", "wy_transitions_reference"]
