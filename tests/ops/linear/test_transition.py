"""Tests of :mod:`hypic.ops.linear.transition`: a span's T from its WY factors.

CPU (float64): the reference is the chain walk's reference with ``u = 0`` started from the
identity, span by span; its checks. Kernel: against the reference under the Triton interpreter
(gated or not, spans out of order, a span shorter than a chunk, an empty one) and on CUDA,
where it is also set against fla's ``V = 0`` summary launch and the float64 T of the raw
recurrence.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from hypic.ops.linear.transition import (
    span_ids,
    wy_transitions,
    wy_transitions_beside,
    wy_transitions_reference,
)
from hypic.ops.linear.triton_scan import scan_chain_wy_reference
from tests.interpreter import interpreted_error
from tests.ops.linear.test_chain_forward import rel

PROBLEM = textwrap.dedent("""
    import torch

    def wy_problem(lengths, h=2, hv=4, kd=32, dtype=torch.float64, seed=0, chunk=64):
        '''Random keys and WY factors, and chunk-local cumulative log2 gates, of spans of the given
        lengths (what the WY step hands the state pass).'''
        gen = torch.Generator().manual_seed(seed)
        n = sum(lengths)
        k = torch.nn.functional.normalize(torch.randn(n, h, kd, generator=gen, dtype=torch.float64), dim=-1)
        w = torch.randn(n, hv, kd, generator=gen, dtype=torch.float64) * 0.3 / kd ** 0.5
        step = -torch.rand(n, hv, generator=gen, dtype=torch.float64) * 0.05
        g = torch.empty(n, hv, dtype=torch.float64)
        t = 0
        for length in lengths:
            for c0 in range(0, length, chunk):
                c1 = min(c0 + chunk, length)
                g[t + c0:t + c1] = step[t + c0:t + c1].cumsum(0)
            t += length
        cu = torch.tensor([0] + list(lengths)).cumsum(0)
        return k.to(dtype), w.to(dtype), g, cu
""")
exec(PROBLEM)  # noqa: S102 - the same problem as the interpreted scripts below

LENGTHS = [8, 504, 3, 130, 64, 0, 65]


@pytest.mark.parametrize("gated", [True, False])
def test_reference_is_the_walk_from_the_identity_with_no_values(gated):
    k, w, g, cu = wy_problem(LENGTHS)  # noqa: F821 - defined by PROBLEM
    g = g if gated else None
    spans = torch.tensor([6, 1, 3, 5])
    trans = wy_transitions_reference(k, w, g, cu, spans)
    assert trans.shape == (4, 4, 32, 32) and trans.dtype == torch.float64
    hv, kd = w.shape[1], w.shape[2]
    for n, s in enumerate(spans.tolist()):
        a, b = int(cu[s]), int(cu[s + 1])
        eye = torch.eye(kd, dtype=torch.float64).expand(1, hv, kd, kd).contiguous()
        one = torch.tensor([0, b - a])
        _, _, final = scan_chain_wy_reference(k[a:b], w[a:b], torch.zeros(b - a, hv, kd, dtype=torch.float64),
                                              None if g is None else g[a:b], one, max(1, -(-(b - a) // 64)),
                                              torch.tensor([0, 1]), initial_states=eye)
        assert rel(trans[n], final[0]) < 1e-12
    # an empty span is the identity; a run of spans is those rows
    assert torch.equal(trans[3], torch.eye(kd, dtype=torch.float64).expand(hv, kd, kd))
    assert torch.equal(wy_transitions_reference(k, w, g, cu, (1, 4)),
                       wy_transitions_reference(k, w, g, cu, torch.tensor([1, 2, 3])))
    # off CUDA (and not interpreted) the op is the reference, beside or not
    assert torch.equal(wy_transitions(k, w, g, cu, spans), trans)
    beside = wy_transitions_beside(k, w, g, cu, spans)
    assert torch.equal(beside.launch().result(), trans)


def test_checks():
    k, w, g, cu = wy_problem([5, 7])  # noqa: F821
    with pytest.raises(ValueError, match="within the 2 spans"):
        span_ids((1, 3), 2, "cpu")
    with pytest.raises(ValueError, match="1-d index tensor"):
        span_ids(torch.tensor([[0]]), 2, "cpu")
    with pytest.raises(ValueError, match=r"lie in \[0, 2\)"):
        span_ids(torch.tensor([0, 2]), 2, "cpu")
    with pytest.raises(ValueError, match="k must be"):
        wy_transitions_reference(k[:5], w, g, cu, (0, 2))
    with pytest.raises(ValueError, match="multiple of"):
        wy_transitions_reference(k, w[:, :3], g[:, :3], cu, (0, 2))
    with pytest.raises(ValueError, match="g must be"):
        wy_transitions_reference(k, w, g[:, :1], cu, (0, 2))


KERNEL_CASE = PROBLEM + textwrap.dedent("""
    from hypic.ops.linear.transition import wy_transitions, wy_transitions_reference

    def kernel_case(device, gated=True, kd=32, lengths=(8, 504, 3, 130, 64, 0, 65), spans=(6, 1, 3, 5, 2),
                    dtype=torch.bfloat16):
        k, w, g, cu = wy_problem(list(lengths), kd=kd, dtype=dtype)
        g = g.float() if gated else None
        spans = torch.tensor(spans)
        ref = wy_transitions_reference(k, w, g, cu, spans)  # the bf16 factors, exactly, in float64
        d = lambda x: None if x is None else x.to(device)  # noqa: E731
        out = wy_transitions(d(k), d(w), d(g), d(cu), d(spans))
        assert out.dtype == torch.float32 and out.shape == ref.shape and torch.isfinite(out).all()
        return float((out.double().cpu() - ref).norm() / ref.norm())
""")


@pytest.mark.parametrize("gated", [True, False])
def test_kernel_matches_reference_under_interpreter(gated):
    # bf16x3 keeps 16 significant bits of T per product (2.5e-6 gated, 1.6e-5 ungated measured)
    assert interpreted_error(KERNEL_CASE + f"print(kernel_case('cpu', {gated}))\n") < 1e-4


def test_kernel_with_fp32_factors_under_interpreter():
    # fp32 WY factors (an fp32 model): both products split both operands
    script = KERNEL_CASE + "print(kernel_case('cpu', True, dtype=torch.float32))\n"
    assert interpreted_error(script) < 1e-4


@pytest.mark.cuda
@pytest.mark.parametrize("kd", [128, 64])
def test_kernel_matches_reference_on_cuda(kd):
    namespace: dict = {}
    exec(KERNEL_CASE, namespace)  # noqa: S102 - the same case as the interpreter test
    assert namespace["kernel_case"]("cuda", kd=kd) < 1e-4


@pytest.mark.cuda
def test_against_fla_and_the_raw_recurrence_on_cuda():
    """From the same WY factors (fla's, bf16): T against fla's ``V = 0`` summary launch and
    against the float64 T of the raw gated delta rule, at the 35B-A3B head shape."""
    from hypic.ops.linear import gated_delta
    from hypic.ops.linear._fla_summaries import _cp_summaries
    from hypic.ops.linear._fla_wy import _wy_prepare
    from tests.ops.linear.test_chain_forward import chain_problem

    pieces = [[("live", 8), ("live", 504), ("live", 8), ("live", 200), ("live", 64)]]
    _, _, live, cu_live, _, _, _, _ = chain_problem(pieces, list(range(5)), h=2, hv=4, kd=128, vd=128)
    exact = gated_delta.gated_delta_summarize(live["k"], live["v"], live["g"], live["beta"], cu_seqlens=cu_live)
    dev = {key: x.to("cuda", torch.bfloat16 if key != "g" else torch.float32) for key, x in live.items()}
    cu_d = cu_live.to("cuda")
    cu, _, k4, gc, w, u = _wy_prepare(dev["k"], dev["v"], dev["g"], dev["beta"], cu_d, cu_live)
    spans = torch.tensor([1, 3], device="cuda")
    own = wy_transitions(k4[0], w[0], gc[0], cu, spans)
    _, fla_t = _cp_summaries(k4, w, u, gc, None, cu, cu.numel() - 1, transition_only=True)
    truth = exact.transition.index_select(0, spans.cpu())
    assert rel(fla_t.index_select(0, spans).cpu(), truth) < 2e-2
    assert rel(own.cpu(), truth) < 2e-2
    # from the same bf16 factors the two agree far closer than either is to the truth
    assert rel(own, fla_t.index_select(0, spans)) < 1e-2


@pytest.mark.cuda
def test_side_stream_launch_on_cuda():
    """T set up, then work queued on the current stream (as the chain walk is), then T launched on
    the side stream from the mark before that work and more work queued: once ``result()`` has
    joined the streams it equals the in-line launch."""
    k, w, g, cu = wy_problem([512] * 16, h=16, hv=32, kd=128, dtype=torch.bfloat16)  # noqa: F821
    d = lambda x: x.to("cuda")  # noqa: E731
    k, w, g, cu = d(k), d(w), d(g.float()), d(cu)
    spans = torch.arange(1, 16, 2, device="cuda")
    inline = wy_transitions_beside(k, w, g, cu, spans, overlap=False).launch().result()
    beside = wy_transitions_beside(k, w, g, cu, spans, overlap=True)
    with pytest.raises(RuntimeError, match="before launch"):
        beside.result()
    beside.join()  # nothing launched yet: a no-op (what an error path calls)
    busy = torch.randn(4096, 4096, device="cuda")
    for _ in range(4):  # work queued on the current stream meanwhile
        busy = busy @ busy / 64.0
    beside.launch()
    busy = busy @ busy
    assert torch.equal(beside.result(), inline)
