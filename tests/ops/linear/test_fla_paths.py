"""Tests of hypic.ops.linear.fla_paths / triton_scan.

CPU part (runs everywhere): the pure-torch pieces (closed-form log decays, head expansion, torch
decode steps) against the reference, the choice of path on the inputs (CPU and float64 tensors
take the reference), that importing the module and running the references on CPU need neither
fla nor Triton, and the Triton scan under the interpreter. CUDA part (``pytest -m cuda``): every
family's fla path against the float64 CPU reference, the shared forward+summaries path, and the
Triton scan.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from hypic.envs import triton_interpret
from hypic.ops.linear import _fla_scalar, delta, fla_paths, gated_delta, gla, kda, mamba2, simple_gla
from hypic.ops.linear._family import expand_heads
from hypic.ops.linear.scan import scan_chain, scan_chain_from
from hypic.ops.linear.summary import DenseSummary, DiagonalSummary, ScalarSummary, SummaryTable, summary_addresses
from tests.interpreter import interpreted_error

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
    denom = b64.norm().item()
    return (a64 - b64).norm().item() / (denom if denom > 0 else 1.0)


def cu_of(lengths, device="cpu") -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.long, device=device)


def random_summary(kind: str, num_spans: int, hv: int, kd: int, vd: int, dtype, gen) -> object:
    state = torch.randn(num_spans, hv, kd, vd, generator=gen, dtype=torch.float64).to(dtype)
    if kind == "dense":
        t = torch.randn(num_spans, hv, kd, kd, generator=gen, dtype=torch.float64) / kd ** 0.5
        return DenseSummary(t.to(dtype), state)
    if kind == "diagonal":
        return DiagonalSummary((-torch.rand(num_spans, hv, kd, generator=gen, dtype=torch.float64)).to(dtype), state)
    return ScalarSummary((-torch.rand(num_spans, hv, generator=gen, dtype=torch.float64)).to(dtype), state)


# ------------------------------------------------------------------------------------------
# CPU: pure-torch logic
# ------------------------------------------------------------------------------------------

def test_import_needs_neither_fla_nor_triton():
    code = "import sys, hypic.ops.linear.fla_paths, hypic.ops.linear.triton_scan; " \
           "print('fla' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_cpu_run_imports_neither_fla_nor_triton():
    code = (
        "import sys, torch\n"
        "from hypic.ops.linear.gated_delta import gated_delta_forward, gated_delta_summarize\n"
        "from hypic.ops.conv import causal_conv1d\n"
        "q = torch.nn.functional.normalize(torch.randn(5, 1, 4), dim=-1)\n"
        "g, b = -torch.rand(5, 1), torch.rand(5, 1)\n"
        "cu = torch.tensor([0, 5])\n"
        "gated_delta_forward(q, q, torch.randn(5, 1, 3), g, b, cu_seqlens=cu)\n"
        "gated_delta_summarize(q, torch.randn(5, 1, 3), g, b, cu_seqlens=cu)\n"
        "causal_conv1d(torch.randn(5, 2), torch.randn(2, 4), cu_seqlens=cu)\n"
        "bad = [m for m in ('fla', 'triton') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)


def test_cpu_and_float64_inputs_take_the_reference():
    """The fast paths are chosen on the tensors' device and dtype, never on the machine: CPU
    tensors take the reference, on a GPU machine too (float64 ones: the CUDA test below)."""
    x = torch.zeros(4, 1, 8)
    assert not fla_paths.fla_takes(x, None, x, key_dim=8)
    assert not fla_paths.fla_takes(None, None)
    assert not fla_paths.fla_chain_takes(x, x, x, x, x)


@pytest.mark.cuda
def test_cuda_inputs_take_the_fast_paths_the_kernels_take():
    x = torch.zeros(4, 1, 16)
    c = x.cuda()
    assert fla_paths.fla_takes(c, None, c, key_dim=16) and fla_paths.fla_chain_takes(c, c, c, c, c)
    assert not fla_paths.fla_takes(c, x, key_dim=16)  # one CPU tensor among them
    assert not fla_paths.fla_takes(c, c.double(), key_dim=16)
    assert not fla_paths.fla_takes(c, key_dim=512)
    assert not fla_paths.fla_chain_takes(c, torch.zeros(4, 1, 12).cuda(), c, c, c)  # K = 12: not a power of two


def test_segment_log_decay_matches_reference_summaries():
    gen = torch.Generator().manual_seed(1)
    lengths = [5, 0, 9, 1]
    t = sum(lengths)
    cu = cu_of(lengths)
    g = -torch.rand(t, 4, 3, generator=gen)
    k = torch.randn(t, 2, 3, generator=gen)
    v = torch.randn(t, 4, 2, generator=gen)
    ref = gla.gla_summarize(k.double(), v.double(), g.double(), cu_seqlens=cu)
    got = _fla_scalar._segment_log_decay(g, cu)
    assert got.dtype == torch.float32 and got.shape == ref.log_decay.shape
    assert rel(got, ref.log_decay) < 1e-6
    gamma = -torch.rand(4, generator=gen)
    ref_s = simple_gla.simple_gla_summarize(k.double(), v.double(), g_gamma=gamma.double(), cu_seqlens=cu)
    assert rel(_fla_scalar._scalar_log_decay(None, gamma, cu), ref_s.log_decay) < 1e-6


def test_expand_heads_matches_reference_gva():
    x = torch.randn(5, 2, 3)
    assert torch.equal(_fla_scalar._expand_heads(x, 6), expand_heads(x, 6))
    assert _fla_scalar._expand_heads(x, 2) is x


def test_torch_decode_steps_match_reference():
    gen = torch.Generator().manual_seed(2)
    n, h, hv, kd, vd = 3, 2, 4, 5, 3
    q, k = torch.randn(n, h, kd, generator=gen), torch.randn(n, h, kd, generator=gen)
    v = torch.randn(n, hv, vd, generator=gen)
    g = -torch.rand(n, hv, generator=gen)
    state = torch.randn(n, hv, kd, vd, generator=gen)
    o, s = fla_paths.simple_gla_decode(q, k, v, g, state, scale=0.7)
    o_ref, s_ref = simple_gla.simple_gla_decode(q.double(), k.double(), v.double(), g.double(), state.double(), scale=0.7)
    assert rel(o, o_ref) < 1e-5 and rel(s, s_ref) < 1e-5
    gamma = -torch.rand(hv, generator=gen)
    o, s = fla_paths.simple_gla_decode(q, k, v, None, state, g_gamma=gamma)
    o_ref, s_ref = simple_gla.simple_gla_decode(q.double(), k.double(), v.double(), None, state.double(), g_gamma=gamma.double())
    assert rel(o, o_ref) < 1e-5 and rel(s, s_ref) < 1e-5
    c, b = torch.randn(n, 2, kd, generator=gen), torch.randn(n, 2, kd, generator=gen)
    x = torch.randn(n, hv, vd, generator=gen)
    dt = F.softplus(torch.randn(n, hv, generator=gen))
    a, d = -torch.rand(hv, generator=gen) - 0.1, torch.randn(hv, generator=gen)
    y, s = fla_paths.mamba2_decode(c, b, x, dt, a, state, d)
    y_ref, s_ref = mamba2.mamba2_decode(c.double(), b.double(), x.double(), dt.double(), a.double(), state.double(), d.double())
    assert y.dtype == x.dtype
    assert rel(y, y_ref) < 1e-5 and rel(s, s_ref) < 1e-5


def test_host_chunk_table_lists_every_chunk_in_order():
    from hypic.ops.linear._fla_common import _chunk_indices, chunk_table_host

    lengths = [70, 1, 0, 130, 64, 65]
    cu = cu_of(lengths)
    want = [(i, j) for i, n in enumerate(lengths) for j in range(-(-n // 64))]
    table = chunk_table_host(cu, 64)
    assert table.dtype == torch.long and table.tolist() == [list(r) for r in want]
    assert chunk_table_host(cu_of([0, 0]), 64).shape == (0, 2)
    # cached by the identity of (cu, cu_cpu): the same tensors give the same table object
    dev_cu = cu.clone()
    first = _chunk_indices(dev_cu, cu)
    assert _chunk_indices(dev_cu, cu) is first and torch.equal(first, table)
    assert _chunk_indices(dev_cu.clone(), cu) is not first


def test_fla_inputs_must_be_cuda():
    x = torch.zeros(4, 1, 8)
    if triton_interpret():
        pytest.skip("the Triton interpreter accepts CPU tensors")
    with pytest.raises(ValueError, match="CUDA"):
        fla_paths._check_fla_inputs("gated_delta_forward", 8, x)
    with pytest.raises(ValueError, match="key dim"):
        fla_paths._check_fla_inputs("gated_delta_forward", 512)


def test_triton_scan_kernel_under_interpreter():
    """The Triton scan kernel itself, on CPU through TRITON_INTERPRET=1 (needs Triton installed)."""
    script = textwrap.dedent("""
        import torch
        from hypic.ops.linear.scan import scan_chain
        from hypic.ops.linear.summary import DenseSummary, DiagonalSummary, ScalarSummary, SummaryTable, summary_addresses
        from hypic.ops.linear.triton_scan import scan_chain_triton
        torch.manual_seed(0)
        m, hv, kd, vd = 6, 2, 20, 24
        cu = torch.tensor([0, 2, 2, 6])
        s = torch.randn(m, hv, kd, vd)
        init = torch.randn(3, hv, kd, vd)
        worst = 0.0
        for summ in (DenseSummary(torch.randn(m, hv, kd, kd) / kd ** 0.5, s),
                     DiagonalSummary(-torch.rand(m, hv, kd), s), ScalarSummary(-torch.rand(m, hv), s)):
            for ini in (None, init):
                a, b = scan_chain_triton(summ, cu, ini)
                ra, rb = scan_chain(summ, cu, ini)
                worst = max(worst, ((a - ra).norm() / ra.norm()).item(), ((b - rb).norm() / rb.norm()).item())
            # the chain drawn from two sets of summaries through a source table
            first, second = summ.index(torch.tensor([4, 0, 2])), summ.index(torch.tensor([5, 1, 3]))
            source = torch.tensor([1, -2, 2, -3, 0, -1])  # = spans 0..5 of summ
            a, b = scan_chain_triton(first, cu, init, second=second, source=source)
            ra, rb = scan_chain(summ, cu, init)
            worst = max(worst, ((a - ra).norm() / ra.norm()).item(), ((b - rb).norm() / rb.norm()).item())
            # ... with the second set as separate one-span tensors read through their addresses,
            # and only some incoming states kept, in the rows asked for
            items = tuple(type(summ)(*(t.clone() for t in second.index(torch.tensor([j])).parts())) for j in range(3))
            addresses = torch.tensor([summary_addresses(it, torch.device("cpu")) for it in items]).T.contiguous()
            record = torch.tensor([0, -1, 2, 1, -1, 3])
            a, b = scan_chain_triton(first, cu, init, second=SummaryTable(items, addresses),
                                     source=source, record_rows=record, num_records=4)
            want = ra[torch.tensor([0, 3, 2, 5])]
            worst = max(worst, ((a - want).norm() / want.norm()).item(), ((b - rb).norm() / rb.norm()).item())
        print(worst)
    """)
    assert interpreted_error(script) < 1e-4  # the dense products in bf16x3 (the next test)


def test_triton_scan_bf16x3_under_interpreter():
    """bf16x3 dense products: both operands split into bf16 high and low parts. One bf16 pass
    would leave ~2^-9 (2e-3) per product; the split must bring a 6-step chain near 2^-16."""
    script = textwrap.dedent("""
        import torch
        from hypic.ops.linear.scan import scan_chain
        from hypic.ops.linear.summary import DenseSummary
        from hypic.ops.linear.triton_scan import scan_chain_triton
        torch.manual_seed(0)
        m, hv, kd, vd = 6, 2, 32, 24
        cu = torch.tensor([0, 2, 2, 6])
        summ = DenseSummary(torch.randn(m, hv, kd, kd) / kd ** 0.5, torch.randn(m, hv, kd, vd))
        init = torch.randn(3, hv, kd, vd)
        a, b = scan_chain_triton(summ, cu, init)
        ra, rb = scan_chain(DenseSummary(summ.transition.double(), summ.state.double()), cu, init.double())
        print(max(((a.double() - ra).norm() / ra.norm()).item(), ((b.double() - rb).norm() / rb.norm()).item()))
    """)
    assert interpreted_error(script) < 1e-4


# ------------------------------------------------------------------------------------------
# CUDA: fla paths against the float64 CPU reference
# ------------------------------------------------------------------------------------------

H, HV, K, V = 2, 4, 64, 32
LENGTHS = [70, 1, 0, 130, 64]
FAMILIES = ["gated_delta", "delta", "kda", "gla", "simple_gla", "mamba2"]
MODULES = {"gated_delta": gated_delta, "delta": delta, "kda": kda, "gla": gla,
           "simple_gla": simple_gla, "mamba2": mamba2}


def family_inputs(family, dtype, device, seed=0, lengths=LENGTHS):
    gen = torch.Generator().manual_seed(seed)
    t = sum(lengths)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    bias = torch.linspace(2.0, 6.0, HV)
    if family == "mamba2":
        return dict(C=rnd(t, 2, K).to(dtype).to(device), B=rnd(t, 2, K).to(dtype).to(device),
                    x=rnd(t, HV, V).to(dtype).to(device), dt=F.softplus(rnd(t, HV) - 2).to(device),
                    A=(-torch.exp(torch.linspace(-2, 1, HV))).to(device), D=rnd(HV).to(device))
    x = dict(q=F.normalize(rnd(t, H, K), dim=-1).to(dtype).to(device),
             k=F.normalize(rnd(t, H, K), dim=-1).to(dtype).to(device),
             v=rnd(t, HV, V).to(dtype).to(device))
    if family in ("gated_delta", "simple_gla"):
        x["g"] = F.logsigmoid(rnd(t, HV) + bias).to(device)
    if family in ("kda", "gla"):
        x["g"] = F.logsigmoid(rnd(t, HV, K) + bias[:, None]).to(device)
    if family in ("gated_delta", "delta", "kda"):
        x["beta"] = torch.sigmoid(rnd(t, HV)).to(dtype).to(device)
    return x


def gates(family, x):
    return tuple(x[name] for name in ("g", "beta") if name in x)


def fwd(mod, family, x, cu, init):
    if family == "mamba2":
        return mod.mamba2_forward(x["C"], x["B"], x["x"], x["dt"], x["A"], x["D"], cu_seqlens=cu, initial_state=init)
    return getattr(mod, f"{family}_forward")(x["q"], x["k"], x["v"], *gates(family, x), cu_seqlens=cu, initial_state=init)


def summ(mod, family, x, cu):
    if family == "mamba2":
        return mod.mamba2_summarize(x["B"], x["x"], x["dt"], x["A"], cu_seqlens=cu)
    return getattr(mod, f"{family}_summarize")(x["k"], x["v"], *gates(family, x), cu_seqlens=cu)


def trans(s):
    return s.transition if isinstance(s, DenseSummary) else s.log_decay


TOL = {torch.bfloat16: 5e-2, torch.float32: 1e-2}


# bf16 for every family (the serving dtype); fp32 inputs for GDN only (each dtype compiles its own
# kernels, and the GPU run has a tight time budget)
CASES = [(family, torch.bfloat16) for family in FAMILIES] + [("gated_delta", torch.float32)]


@pytest.mark.cuda
@pytest.mark.parametrize("family,dtype", CASES)
def test_fast_path_matches_reference(family, dtype):
    dev = torch.device("cuda")
    x = family_inputs(family, dtype, dev)
    x64 = {k_: v_.cpu().double() for k_, v_ in x.items()}
    cu = cu_of(LENGTHS, dev)
    init = torch.randn(len(LENGTHS), HV, K, V, device=dev)
    o, f = fwd(fla_paths, family, x, cu, init)
    o_ref, f_ref = fwd(MODULES[family], family, x64, cu.cpu(), init.cpu().double())
    assert o.dtype == (x["x"] if family == "mamba2" else x["v"]).dtype and f.dtype == torch.float32
    assert rel(o, o_ref) < TOL[dtype] and rel(f, f_ref) < TOL[dtype]
    s = summ(fla_paths, family, x, cu)
    s_ref = summ(MODULES[family], family, x64, cu.cpu())
    assert type(s) is type(s_ref) and s.state.dtype == torch.float32
    assert rel(s.state, s_ref.state) < TOL[dtype] and rel(trans(s), trans(s_ref)) < TOL[dtype]
    # composing the summaries over one chain equals a straight run of all tokens
    one = torch.tensor([0, sum(LENGTHS)], device=dev)
    _, straight = fwd(MODULES[family], family, x64, one.cpu(), init[:1].cpu().double())
    _, composed = scan_chain(s, torch.tensor([0, len(LENGTHS)], device=dev), init[:1])
    assert rel(composed, straight) < TOL[dtype]


@pytest.mark.cuda
@pytest.mark.parametrize("family", ["gated_delta", "delta", "kda"])
@pytest.mark.parametrize("with_init", [False, True])
def test_forward_and_summarize_equals_separate_calls(family, with_init):
    dev = torch.device("cuda")
    x = family_inputs(family, torch.bfloat16, dev, seed=1)
    cu = cu_of(LENGTHS, dev)
    init = torch.randn(len(LENGTHS), HV, K, V, device=dev) if with_init else None
    combined = getattr(fla_paths, f"{family}_forward_and_summarize")
    o, f, s = combined(x["q"], x["k"], x["v"], *gates(family, x), cu_seqlens=cu, initial_state=init)
    o_sep, f_sep = fwd(fla_paths, family, x, cu, init)
    s_sep = summ(fla_paths, family, x, cu)
    assert rel(o, o_sep) < 1e-2 and rel(f, f_sep) < 1e-2
    assert rel(s.state, s_sep.state) < 1e-3 and rel(s.transition, s_sep.transition) < 1e-3


@pytest.mark.cuda
@pytest.mark.parametrize("family", FAMILIES)
def test_decode_matches_reference(family):
    dev = torch.device("cuda")
    x = family_inputs(family, torch.bfloat16, dev, seed=2, lengths=[3])
    x64 = {k_: v_.cpu().double() for k_, v_ in x.items()}
    state = torch.randn(3, HV, K, V, device=dev)
    mod = MODULES[family]
    if family == "mamba2":
        args = lambda d: (d["C"], d["B"], d["x"], d["dt"], d["A"])  # noqa: E731
        y, s = fla_paths.mamba2_decode(*args(x), state, x["D"])
        y_ref, s_ref = mod.mamba2_decode(*args(x64), state.cpu().double(), x64["D"])
    else:
        y, s = getattr(fla_paths, f"{family}_decode")(x["q"], x["k"], x["v"], *gates(family, x), state)
        y_ref, s_ref = getattr(mod, f"{family}_decode")(x64["q"], x64["k"], x64["v"], *gates(family, x64), state.cpu().double())
    assert rel(y, y_ref) < 1e-2 and rel(s, s_ref) < 1e-3


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["dense", "diagonal", "scalar"])
def test_triton_scan_matches_reference_scan(kind):
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(4)
    s64 = random_summary(kind, 9, 4, 128, 64, torch.float64, gen)
    s32 = type(s64)(trans(s64).float().to(dev), s64.state.float().to(dev))
    cu = torch.tensor([0, 4, 4, 9])
    init = torch.randn(3, 4, 128, 64, generator=gen, dtype=torch.float64)
    inc_ref, fin_ref = scan_chain(s64, cu, init)
    inc, fin = scan_chain(s32, cu.to(dev), init.float().to(dev))
    assert rel(inc, inc_ref) < 1e-5 and rel(fin, fin_ref) < 1e-5
    # the same chain read from two sets of summaries through a source table
    first_ids, second_ids = [6, 0, 2, 8], [5, 1, 3, 4, 7]
    source = torch.tensor([1, -2, 2, -3, -4, -1, 0, -5, 3], device=dev)
    first, second = s32.index(torch.tensor(first_ids, device=dev)), s32.index(torch.tensor(second_ids, device=dev))
    inc2, fin2 = scan_chain_from(first, second, source, cu.to(dev), init.float().to(dev))
    assert rel(inc2, inc_ref) < 1e-5 and rel(fin2, fin_ref) < 1e-5
    # the second set as separate tensors read in place, only some incoming states kept
    items = tuple(type(s32)(*(t.clone() for t in second.index(torch.tensor([j], device=dev)).parts()))
                  for j in range(len(second_ids)))
    addresses = torch.tensor([summary_addresses(it, dev) for it in items], device=dev).T.contiguous()
    record = torch.tensor([0, -1, 1, -1, 2, 3, -1, -1, 4], device=dev)
    inc3, fin3 = scan_chain_from(first, SummaryTable(items, addresses), source, cu.to(dev),
                                 init.float().to(dev), record_rows=record, num_records=5)
    want = inc_ref[torch.tensor([0, 2, 4, 5, 8])]
    assert rel(inc3, want) < 1e-5 and rel(fin3, fin_ref) < 1e-5


@pytest.mark.cuda
def test_host_chunk_table_equals_fla_table():
    from fla.ops.utils.index import prepare_chunk_indices

    from hypic.ops.linear._fla_common import _chunk_indices

    cu = cu_of(LENGTHS + [1000, 3], "cuda")
    ours = _chunk_indices(cu, cu.cpu())
    assert ours.is_cuda and torch.equal(ours, prepare_chunk_indices(cu, 64))


@pytest.mark.cuda
def test_summarize_then_forward_equals_separate_calls():
    dev = torch.device("cuda")
    x = family_inputs("gated_delta", torch.bfloat16, dev, seed=2)
    cu = cu_of(LENGTHS, dev)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])

    def initial_states_from(summary):
        return summary.state.roll(1, dims=0) * 0.5 + 0.1

    o, f, s = fla_paths.gated_delta_summarize_then_forward(*args, cu_seqlens=cu,
                                                           initial_states_from=initial_states_from)
    s_sep = fla_paths.gated_delta_summarize(*args[1:], cu_seqlens=cu)
    o_sep, f_sep = fla_paths.gated_delta_forward(*args, cu_seqlens=cu, initial_state=initial_states_from(s_sep))
    assert rel(s.state, s_sep.state) < 1e-5 and rel(s.transition, s_sep.transition) < 1e-5
    assert rel(o, o_sep) < 1e-5 and rel(f, f_sep) < 1e-5
    # and against the float64 CPU reference
    x64 = [t.cpu().double() for t in args]
    o_ref, f_ref, s_ref = gated_delta.gated_delta_summarize_then_forward(
        *x64, cu_seqlens=cu.cpu(), initial_states_from=initial_states_from)
    assert rel(o, o_ref) < TOL[torch.bfloat16] and rel(f, f_ref) < TOL[torch.bfloat16]
    assert rel(s.transition, s_ref.transition) < TOL[torch.bfloat16]


@pytest.mark.cuda
def test_public_functions_dispatch_to_fla_paths():
    dev = torch.device("cuda")
    x = family_inputs("gated_delta", torch.bfloat16, dev, seed=5)
    cu = cu_of(LENGTHS, dev)
    o1, f1 = gated_delta.gated_delta_forward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens=cu)
    o2, f2 = fla_paths.gated_delta_forward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens=cu)
    assert torch.equal(o1, o2) and torch.equal(f1, f2)


@pytest.mark.cuda
@pytest.mark.parametrize("impl", ["fla", "short"])
@pytest.mark.parametrize("with_init", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_conv1d_fla_matches_reference(with_init, dtype, impl, monkeypatch):
    """The CUDA paths of hypic.ops.conv.causal_conv1d (fla's Triton conv, hypic.ops.conv_short)
    against the reference on CPU: output and final state, spans shorter than W-1 included,
    NaN-poisoned caches around. ``impl``: the kernel :func:`hypic.ops.conv.conv_kernel` would
    pick for short runs or for long ones, forced here for these runs."""
    from hypic.ops import conv

    gen = torch.Generator().manual_seed(3 + with_init)
    lengths = [1, 2, 70, 3, 129, 64]
    cu = cu_of(lengths)
    num_tokens, dim, width = sum(lengths), 96, 4
    x = torch.randn(num_tokens, dim, generator=gen).to(dtype)
    weight = torch.randn(dim, width, generator=gen).to(dtype)
    init = torch.randn(len(lengths), dim, width - 1, generator=gen).to(dtype) if with_init else None
    y_ref, f_ref = conv.causal_conv1d(x, weight, None, cu_seqlens=cu, initial_state=init, activation="silu")
    monkeypatch.setattr(conv, "conv_kernel", lambda x, num_seqs: impl if x.is_cuda else None)
    dev = torch.device("cuda")
    torch.empty(4 * num_tokens * dim, device=dev).fill_(float("nan"))  # poison the allocator's cache
    y, f = conv.causal_conv1d(x.to(dev), weight.to(dev), None, cu_seqlens=cu.to(dev),
                              initial_state=None if init is None else init.to(dev), activation="silu",
                              cu_seqlens_cpu=cu)
    assert y.dtype == dtype and f.dtype == dtype and torch.isfinite(y).all()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel(y, y_ref) < tol and rel(f, f_ref) == 0.0
