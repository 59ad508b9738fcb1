"""Tests of hypic.ops.linear.short_span: the closed-form summaries of one-chunk spans.

CPU: the WY factors are built here in float64 from their definition (what fla's intra-chunk step
returns), and the closed form must equal the reference summaries of ``gated_delta`` / ``delta``.
CUDA: the fla path (WY from fla's kernels) against the float64 reference, for a request whose
spans all fit in a chunk (the closed form) and one with a long span (fla's summary kernel).
"""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
import torch.nn.functional as F

from hypic.ops.linear import delta, gated_delta
from hypic.ops.linear.short_span import (
    short_span_rows,
    short_span_rows_host,
    short_span_state_pass,
    short_span_summary,
)
from tests.interpreter import interpreted_error

H, HV, K, V = 2, 4, 16, 8


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def inputs(lengths, seed=0, dtype=torch.float64, gated=True):
    gen = torch.Generator().manual_seed(seed)
    t = sum(lengths)
    x = dict(k=F.normalize(torch.randn(t, H, K, generator=gen), dim=-1).to(dtype),
             v=torch.randn(t, HV, V, generator=gen).to(dtype),
             beta=torch.sigmoid(torch.randn(t, HV, generator=gen)).to(dtype))
    x["g"] = F.logsigmoid(torch.randn(t, HV, generator=gen) + 2.0).to(dtype) if gated else None
    cu = torch.tensor([0] + lengths).cumsum(0)
    return x, cu


def wy_factors(k, v, g, beta, cu):
    """float64 WY factors of every one-chunk span, by definition: with G the within-span cumsum
    of g, A = strict_lower(beta_i exp(G_i - G_j) k_i.k_j), w = (I + A)^-1 diag(beta exp(G)) K,
    u = (I + A)^-1 diag(beta) V; gc = G in log2 units."""
    t = k.shape[0]
    ratio = HV // H
    w = torch.zeros(t, HV, K, dtype=torch.float64)
    u = torch.zeros(t, HV, V, dtype=torch.float64)
    gc = torch.zeros(t, HV, dtype=torch.float64)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if e == s:
            continue
        for h in range(HV):
            kh = k[s:e, h // ratio].double()
            b = beta[s:e, h].double()
            big_g = g[s:e, h].double().cumsum(0) if g is not None else torch.zeros(e - s, dtype=torch.float64)
            a = (b[:, None] * torch.exp(big_g[:, None] - big_g[None, :]) * (kh @ kh.T)).tril(-1)
            inv = torch.linalg.inv(torch.eye(e - s, dtype=torch.float64) + a)
            w[s:e, h] = inv @ ((b * torch.exp(big_g))[:, None] * kh)
            u[s:e, h] = inv @ (b[:, None] * v[s:e, h].double())
            gc[s:e, h] = big_g / math.log(2.0)
    return w, u, gc


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("lengths", [[8, 0, 1, 64, 8], [64], [3, 3, 3], [8, 20, 8, 64, 0]])
def test_closed_form_equals_reference_summaries(gated, lengths):
    x, cu = inputs(lengths, seed=len(lengths), gated=gated)
    w, u, gc = wy_factors(x["k"], x["v"], x["g"], x["beta"], cu)
    table = short_span_rows(cu, cu, 64)
    assert table is not None
    state, trans = short_span_summary(x["k"], w, u, gc if gated else None, table)
    if gated:
        ref = gated_delta.gated_delta_summarize(x["k"], x["v"], x["g"], x["beta"], cu_seqlens=cu)
    else:
        ref = delta.delta_summarize(x["k"], x["v"], x["beta"], cu_seqlens=cu)
    assert trans.dtype == torch.float32 and state.dtype == torch.float32
    assert rel(trans, ref.transition) < 1e-5 and rel(state, ref.state) < 1e-5
    # an empty span is the identity step
    for i, n in enumerate(lengths):
        if n == 0:
            assert torch.equal(trans[i], torch.eye(K).expand(HV, K, K))
            assert torch.count_nonzero(state[i]) == 0
    _, t_only = short_span_summary(x["k"], w, u, gc if gated else None, table, transition_only=True)
    assert torch.equal(t_only, trans)


def test_rows_only_when_every_span_fits_in_a_chunk():
    assert short_span_rows_host(torch.tensor([0, 8, 73]), 64) is None  # a 65-token span
    assert short_span_rows_host(torch.tensor([0]), 64) is None  # no span at all
    # spans of 3, 0, 2 and 20 tokens: widths 8, 8, 8 and 32
    num_spans, classes, chunk_spans = short_span_rows_host(torch.tensor([0, 3, 3, 5, 25]), 64)
    assert num_spans == 4 and chunk_spans.tolist() == [0, 2, 3] and len(classes) == 2
    span_range, ids, rows, valid, last, nonempty, slots, token_rows = classes[0]
    assert span_range == (0, 3) and ids.tolist() == [0, 1, 2]
    assert rows.tolist() == [[0, 1, 2] + [0] * 5, [0] * 8, [3, 4] + [3] * 6]
    assert valid.sum(1).tolist() == [3, 0, 2]
    assert last.tolist() == [2, 0, 4] and nonempty.tolist() == [True, False, True]
    assert slots.tolist() == [0, 1, 2, 16, 17] and token_rows.tolist() == [0, 1, 2, 3, 4]
    assert classes[1][0] == (3, 4) and classes[1][2].shape == (1, 32)
    # members of a class that are not a contiguous range of spans
    _, classes, _ = short_span_rows_host(torch.tensor([0, 8, 28, 36]), 64)
    assert classes[0][0] is None and classes[0][1].tolist() == [0, 2]
    cu = torch.tensor([0, 8, 16])
    cu_cpu = cu.clone()
    assert short_span_rows(cu, cu_cpu, 64) is short_span_rows(cu, cu_cpu, 64)  # cached by identity
    assert short_span_rows(cu, None, 64) is None  # never reads the device cu back
    light = short_span_rows(cu, cu_cpu, 64, classes=False)  # for the Triton kernels: no class tables
    assert light.classes is None and light is not short_span_rows(cu, cu_cpu, 64)
    with pytest.raises(ValueError, match="classes=True"):
        short_span_summary(torch.zeros(16, 1, 16), torch.zeros(16, 1, 16), torch.zeros(16, 1, 8), None, light)


@pytest.mark.parametrize("lengths", [[8, 0, 5, 64, 1, 30, 8], [8, 8, 64]])
def test_state_pass_is_u_minus_w_h0_per_span(lengths):
    gen = torch.Generator().manual_seed(7)
    t, n = sum(lengths), len(lengths)
    w = torch.randn(t, HV, K, generator=gen).bfloat16()
    u = torch.randn(t, HV, V, generator=gen).bfloat16()
    h0 = torch.randn(n, HV, K, V, generator=gen)
    cu = torch.tensor([0] + lengths).cumsum(0)
    v_new, h = short_span_state_pass(w, u, h0, short_span_rows(cu, cu, 64))
    assert v_new.dtype == torch.bfloat16 and h.dtype == torch.bfloat16
    h0_b = h0.bfloat16().double()
    expect = torch.empty(t, HV, V, dtype=torch.float64)
    for i, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        expect[s:e] = u[s:e].double() - torch.einsum("thk,hkv->thv", w[s:e].double(), h0_b[i])
    assert rel(v_new, expect) < 1e-2
    assert torch.equal(h, h0.bfloat16()[[i for i, n_ in enumerate(lengths) if n_ > 0]])


@pytest.mark.cuda
@pytest.mark.parametrize("lengths", [[8, 8, 0, 64, 1, 8], [8, 700, 8]])
def test_fla_path_against_reference(lengths):
    from hypic.ops.linear import fla_paths

    dev = torch.device("cuda")
    x, cu = inputs(lengths, seed=3, dtype=torch.float32)
    bf = {n: (t.to(torch.bfloat16) if n in ("k", "v", "beta") else t).to(dev) for n, t in x.items()}
    q = bf["k"].flip(0).contiguous()
    s = fla_paths.gated_delta_summarize(bf["k"], bf["v"], bf["g"], bf["beta"], cu_seqlens=cu.to(dev),
                                        cu_seqlens_cpu=cu)
    ref = gated_delta.gated_delta_summarize(*(bf[n].cpu().double() for n in ("k", "v", "g", "beta")), cu_seqlens=cu)
    # per span, so that a failure names the span (and with it the tile and stream it ran in)
    per_span = [(n_, rel(s.transition[i].cpu(), ref.transition[i]), rel(s.state[i].cpu(), ref.state[i]))
                for i, n_ in enumerate(lengths) if n_ > 0]
    assert rel(s.transition.cpu(), ref.transition) < 2e-2 and rel(s.state.cpu(), ref.state) < 2e-2, per_span

    def initial_states_from(summary):
        return summary.state.roll(1, dims=0) * 0.5 + 0.1

    o_ref, f_ref = gated_delta.gated_delta_forward(
        q.cpu().double(), *(bf[n].cpu().double() for n in ("k", "v", "g", "beta")), cu_seqlens=cu,
        initial_state=initial_states_from(ref).double())
    cu_dev = cu.to(dev)
    outs = {}
    for with_final in (True, False):  # False: the closed-form state pass when all spans are short
        o, f, s2 = fla_paths.gated_delta_summarize_then_forward(
            q, bf["k"], bf["v"], bf["g"], bf["beta"], cu_seqlens=cu_dev, initial_states_from=initial_states_from,
            cu_seqlens_cpu=cu, output_final_state=with_final)
        assert rel(s2.transition.cpu(), ref.transition) < 2e-2
        assert rel(o.cpu(), o_ref) < 5e-2
        assert (f is None) != with_final
        if with_final:
            assert rel(f.cpu(), f_ref) < 5e-2
        outs[with_final] = o.float()
    assert rel(outs[False], outs[True]) < 1e-2  # the two state passes agree


def test_reference_summarize_then_forward_can_skip_the_final_state():
    x, cu = inputs([8, 5], seed=11)
    q = x["k"].flip(0)
    args = (q, x["k"], x["v"], x["g"], x["beta"])
    o1, f1, s1 = gated_delta.gated_delta_summarize_then_forward(*args, cu_seqlens=cu,
                                                                initial_states_from=lambda s: s.state * 0.5)
    o2, f2, s2 = gated_delta.gated_delta_summarize_then_forward(*args, cu_seqlens=cu,
                                                                initial_states_from=lambda s: s.state * 0.5,
                                                                output_final_state=False)
    assert f2 is None and f1 is not None and torch.equal(o1, o2)


KERNEL_CASE = textwrap.dedent("""
    import torch
    from hypic.ops.linear.short_span import (short_span_rows, short_span_state_pass, short_span_state_pass_triton,
                                             short_span_summary, short_span_summary_triton)

    def case(dtype, device, gated=True, lengths=(8, 0, 1, 64, 8, 20), h=2, hv=4, kd=32, vd=24):
        gen = torch.Generator().manual_seed(5)
        t = sum(lengths)
        cu_cpu = torch.tensor((0,) + tuple(lengths)).cumsum(0)
        cu = cu_cpu.to(device)
        k = torch.nn.functional.normalize(torch.randn(t, h, kd, generator=gen), dim=-1).to(dtype).to(device)
        w = (torch.randn(t, hv, kd, generator=gen) * 0.3).to(dtype).to(device)
        u = torch.randn(t, hv, vd, generator=gen).to(dtype).to(device)
        gc = (-torch.rand(t, hv, generator=gen).cumsum(0) * 0.1).to(device) if gated else None
        h0 = torch.randn(len(lengths), hv, kd, vd, generator=gen).to(device)
        table = short_span_rows(cu, cu_cpu, 64)
        rel = lambda a, b: float((a.double() - b.double()).norm() / b.double().norm())  # noqa: E731
        s_ref, t_ref = short_span_summary(k, w, u, gc, table)
        s_fast, t_fast = short_span_summary_triton(k, w, u, gc, cu, table, 64)
        _, t_only = short_span_summary_triton(k, w, u, gc, cu, table, 64, transition_only=True)
        v_ref, h_ref = short_span_state_pass(w, u, h0, table)
        v_fast, h_fast = short_span_state_pass_triton(w, u, h0, cu, table, 64)
        assert h_fast.dtype == w.dtype and v_fast.dtype == u.dtype and torch.equal(t_only, t_fast)
        return max(rel(t_fast, t_ref), rel(s_fast, s_ref), rel(v_fast, v_ref), rel(h_fast, h_ref))
""")


@pytest.mark.parametrize("gated", [True, False])
def test_triton_kernels_match_torch_under_interpreter(gated):
    assert interpreted_error(KERNEL_CASE + f"print(case(torch.float16, 'cpu', gated={gated}))\n") < 2e-3


@pytest.mark.cuda
@pytest.mark.parametrize("gated", [True, False])
def test_triton_kernels_match_torch_on_cuda(gated):
    namespace: dict = {}
    exec(KERNEL_CASE, namespace)  # noqa: S102 - the same case as the interpreter test
    assert namespace["case"](torch.bfloat16, "cuda", gated=gated, kd=128, vd=128) < 1e-2
