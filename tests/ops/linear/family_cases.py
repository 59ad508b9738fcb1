"""Shared test harness: one adapter per family (random realistic inputs, and the family's forward,
summarize, decode and per-token naive recurrence behind one interface), plus the checks that every
family must pass. Each tests/ops/linear/test_<family>.py runs these checks on its adapter.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from hypic.ops.linear import delta, gated_delta, gla, kda, mamba2, simple_gla
from hypic.ops.linear._family import expand_heads
from hypic.ops.linear.naive import naive_recurrence
from hypic.ops.linear.scan import scan_chain
from hypic.ops.linear.summary import apply_summary, compose, identity_summary

# Tiny shapes keep the suite fast; H < HV exercises GVA.
H, HV, K, V = 2, 4, 8, 6

Inputs = Dict[str, torch.Tensor]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative Frobenius error (0 when both are zero)."""
    got, want = got.double(), want.double()
    denom = want.norm().item()
    diff = (got - want).norm().item()
    return diff if denom == 0 else diff / denom


def tol(dtype: torch.dtype) -> float:
    return 1e-10 if dtype == torch.float64 else 1e-5


def cu(lengths: List[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.long)


def realistic_log_decay(gen: torch.Generator, shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``-exp(A_log) * softplus(a + dt_bias)`` with A_log ~ U(log 1, log 16): per-token decays
    mostly in 0.9 .. 0.999 (the Qwen3.5 GDN gate recipe)."""
    heads = shape[1]
    a_log = torch.empty(heads, dtype=dtype).uniform_(math.log(1.0), math.log(16.0), generator=gen)
    a = torch.randn(shape, generator=gen, dtype=dtype)
    a_log = a_log.reshape(1, heads, *([1] * (len(shape) - 2)))
    return -torch.exp(a_log) * F.softplus(a - 6.0)


def unit_keys(gen: torch.Generator, shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return F.normalize(torch.randn(shape, generator=gen, dtype=torch.float64), dim=-1).to(dtype)


@dataclass(frozen=True)
class Family:
    """Adapter: token tensors in ``Inputs`` all have the token axis first; ``const`` do not."""

    name: str
    make: Callable[[int, int, torch.dtype], Tuple[Inputs, Inputs]]
    forward: Callable[..., Tuple[torch.Tensor, torch.Tensor]]
    summarize: Callable[..., object]
    decode: Callable[..., Tuple[torch.Tensor, torch.Tensor]]
    naive: Callable[..., Tuple[torch.Tensor, torch.Tensor]]
    state_shape: Tuple[int, int, int]
    forward_and_summarize: Callable[..., Tuple[torch.Tensor, torch.Tensor, object]]
    decays_or_deltas: bool = True


def _bounds(cu_seqlens: torch.Tensor) -> List[int]:
    return [int(x) for x in cu_seqlens.tolist()]


# ----------------------------------------------------------------------------- GDN / DeltaNet / KDA
def _make_delta_family(gate: str):
    def make(num_tokens: int, seed: int, dtype: torch.dtype) -> Tuple[Inputs, Inputs]:
        gen = torch.Generator().manual_seed(seed)
        tok = {
            "q": unit_keys(gen, (num_tokens, H, K), dtype),
            "k": unit_keys(gen, (num_tokens, H, K), dtype),
            "v": torch.randn(num_tokens, HV, V, generator=gen, dtype=dtype),
            "beta": torch.sigmoid(torch.randn(num_tokens, HV, generator=gen, dtype=dtype)),
        }
        gate_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        if gate == "scalar":
            tok["g"] = realistic_log_decay(gen, (num_tokens, HV), gate_dtype)
        elif gate == "channel":
            tok["g"] = realistic_log_decay(gen, (num_tokens, HV, K), gate_dtype)
        return tok, {}

    return make


def _naive_generic(tok: Inputs, cu_seqlens, initial_state, gate_key: Optional[str], delta_rule: bool, scale=None):
    dtype = torch.float64 if tok["v"].dtype == torch.float64 else torch.float32
    scale = K ** -0.5 if scale is None else scale
    return naive_recurrence(
        expand_heads(tok["q"], HV).to(dtype),
        expand_heads(tok["k"], HV).to(dtype),
        tok["v"].to(dtype),
        None if gate_key is None else tok[gate_key].to(dtype),
        tok["beta"].to(dtype) if delta_rule else None,
        _bounds(cu_seqlens),
        initial_state.to(dtype),
        scale,
    )


GATED_DELTA = Family(
    name="gated_delta",
    make=_make_delta_family("scalar"),
    forward=lambda t, c, cu_seqlens, initial_state: gated_delta.gated_delta_forward(
        t["q"], t["k"], t["v"], t["g"], t["beta"], cu_seqlens=cu_seqlens, initial_state=initial_state
    ),
    summarize=lambda t, c, cu_seqlens: gated_delta.gated_delta_summarize(
        t["k"], t["v"], t["g"], t["beta"], cu_seqlens=cu_seqlens
    ),
    decode=lambda t, c, state: gated_delta.gated_delta_decode(t["q"], t["k"], t["v"], t["g"], t["beta"], state),
    naive=lambda t, c, cu_seqlens, initial_state: _naive_generic(t, cu_seqlens, initial_state, "g", True),
    forward_and_summarize=lambda t, c, cu_seqlens, initial_state: gated_delta.gated_delta_forward_and_summarize(
        t["q"], t["k"], t["v"], t["g"], t["beta"], cu_seqlens=cu_seqlens, initial_state=initial_state
    ),
    state_shape=(HV, K, V),
)

DELTA = Family(
    name="delta",
    make=_make_delta_family("none"),
    forward=lambda t, c, cu_seqlens, initial_state: delta.delta_forward(
        t["q"], t["k"], t["v"], t["beta"], cu_seqlens=cu_seqlens, initial_state=initial_state
    ),
    summarize=lambda t, c, cu_seqlens: delta.delta_summarize(t["k"], t["v"], t["beta"], cu_seqlens=cu_seqlens),
    decode=lambda t, c, state: delta.delta_decode(t["q"], t["k"], t["v"], t["beta"], state),
    naive=lambda t, c, cu_seqlens, initial_state: _naive_generic(t, cu_seqlens, initial_state, None, True),
    forward_and_summarize=lambda t, c, cu_seqlens, initial_state: delta.delta_forward_and_summarize(
        t["q"], t["k"], t["v"], t["beta"], cu_seqlens=cu_seqlens, initial_state=initial_state
    ),
    state_shape=(HV, K, V),
)

KDA = Family(
    name="kda",
    make=_make_delta_family("channel"),
    forward=lambda t, c, cu_seqlens, initial_state: kda.kda_forward(
        t["q"], t["k"], t["v"], t["g"], t["beta"], cu_seqlens=cu_seqlens, initial_state=initial_state
    ),
    summarize=lambda t, c, cu_seqlens: kda.kda_summarize(t["k"], t["v"], t["g"], t["beta"], cu_seqlens=cu_seqlens),
    decode=lambda t, c, state: kda.kda_decode(t["q"], t["k"], t["v"], t["g"], t["beta"], state),
    naive=lambda t, c, cu_seqlens, initial_state: _naive_generic(t, cu_seqlens, initial_state, "g", True),
    forward_and_summarize=lambda t, c, cu_seqlens, initial_state: kda.kda_forward_and_summarize(
        t["q"], t["k"], t["v"], t["g"], t["beta"], cu_seqlens=cu_seqlens, initial_state=initial_state
    ),
    state_shape=(HV, K, V),
)


# ----------------------------------------------------------------------------- GLA / simple GLA
def _make_gla(num_tokens: int, seed: int, dtype: torch.dtype) -> Tuple[Inputs, Inputs]:
    tok, _ = _make_delta_family("channel")(num_tokens, seed, dtype)
    del tok["beta"]
    return tok, {}


GLA = Family(
    name="gla",
    make=_make_gla,
    forward=lambda t, c, cu_seqlens, initial_state: gla.gla_forward(
        t["q"], t["k"], t["v"], t["g"], cu_seqlens=cu_seqlens, initial_state=initial_state
    ),
    summarize=lambda t, c, cu_seqlens: gla.gla_summarize(t["k"], t["v"], t["g"], cu_seqlens=cu_seqlens),
    decode=lambda t, c, state: gla.gla_decode(t["q"], t["k"], t["v"], t["g"], state),
    naive=lambda t, c, cu_seqlens, initial_state: _naive_generic(t, cu_seqlens, initial_state, "g", False),
    forward_and_summarize=lambda t, c, cu_seqlens, initial_state: gla.gla_forward_and_summarize(
        t["q"], t["k"], t["v"], t["g"], cu_seqlens=cu_seqlens, initial_state=initial_state
    ),
    state_shape=(HV, K, V),
)


def _make_simple_gla(num_tokens: int, seed: int, dtype: torch.dtype) -> Tuple[Inputs, Inputs]:
    tok, _ = _make_delta_family("scalar")(num_tokens, seed, dtype)
    del tok["beta"]
    return tok, {}


SIMPLE_GLA = Family(
    name="simple_gla",
    make=_make_simple_gla,
    forward=lambda t, c, cu_seqlens, initial_state: simple_gla.simple_gla_forward(
        t["q"], t["k"], t["v"], t["g"], cu_seqlens=cu_seqlens, initial_state=initial_state
    ),
    summarize=lambda t, c, cu_seqlens: simple_gla.simple_gla_summarize(t["k"], t["v"], t["g"], cu_seqlens=cu_seqlens),
    decode=lambda t, c, state: simple_gla.simple_gla_decode(t["q"], t["k"], t["v"], t["g"], state),
    naive=lambda t, c, cu_seqlens, initial_state: _naive_generic(t, cu_seqlens, initial_state, "g", False),
    forward_and_summarize=lambda t, c, cu_seqlens, initial_state: simple_gla.simple_gla_forward_and_summarize(
        t["q"], t["k"], t["v"], t["g"], cu_seqlens=cu_seqlens, initial_state=initial_state
    ),
    state_shape=(HV, K, V),
)


def retnet_gamma(num_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """RetNet's constant per-head log decay ``log(1 - 2^(-5-h))``."""
    heads = torch.arange(num_heads, dtype=torch.float64)
    return torch.log1p(-torch.pow(2.0, -5.0 - heads)).to(dtype)


def _make_retnet(num_tokens: int, seed: int, dtype: torch.dtype) -> Tuple[Inputs, Inputs]:
    tok, _ = _make_simple_gla(num_tokens, seed, dtype)
    del tok["g"]
    gate_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    return tok, {"g_gamma": retnet_gamma(HV, gate_dtype)}


def _naive_retnet(t, c, cu_seqlens, initial_state):
    tok = dict(t)
    tok["g"] = c["g_gamma"][None, :].expand(t["v"].shape[0], HV)
    return _naive_generic(tok, cu_seqlens, initial_state, "g", False)


RETNET = Family(
    name="retnet",
    make=_make_retnet,
    forward=lambda t, c, cu_seqlens, initial_state: simple_gla.simple_gla_forward(
        t["q"], t["k"], t["v"], g_gamma=c["g_gamma"], cu_seqlens=cu_seqlens, initial_state=initial_state
    ),
    summarize=lambda t, c, cu_seqlens: simple_gla.simple_gla_summarize(
        t["k"], t["v"], g_gamma=c["g_gamma"], cu_seqlens=cu_seqlens
    ),
    decode=lambda t, c, state: simple_gla.simple_gla_decode(t["q"], t["k"], t["v"], None, state, g_gamma=c["g_gamma"]),
    naive=_naive_retnet,
    forward_and_summarize=lambda t, c, cu_seqlens, initial_state: simple_gla.simple_gla_forward_and_summarize(
        t["q"], t["k"], t["v"], g_gamma=c["g_gamma"], cu_seqlens=cu_seqlens, initial_state=initial_state
    ),
    state_shape=(HV, K, V),
)


def _make_linear(num_tokens: int, seed: int, dtype: torch.dtype) -> Tuple[Inputs, Inputs]:
    tok, c = _make_retnet(num_tokens, seed, dtype)
    return tok, {"g_gamma": torch.zeros_like(c["g_gamma"])}


# Plain undecayed linear attention: simple GLA with g_gamma = 0. T = I, so naive addition is right.
LINEAR = Family(
    name="linear",
    make=_make_linear,
    forward=RETNET.forward,
    summarize=RETNET.summarize,
    decode=RETNET.decode,
    naive=_naive_retnet,
    forward_and_summarize=RETNET.forward_and_summarize,
    state_shape=(HV, K, V),
    decays_or_deltas=False,
)


# ----------------------------------------------------------------------------- Mamba2
G_GROUPS, DSTATE, HEADDIM = 1, 8, 6


def _make_mamba2(num_tokens: int, seed: int, dtype: torch.dtype) -> Tuple[Inputs, Inputs]:
    gen = torch.Generator().manual_seed(seed)
    gate_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    tok = {
        "C": torch.randn(num_tokens, G_GROUPS, DSTATE, generator=gen, dtype=dtype) * 0.3,
        "B": torch.randn(num_tokens, G_GROUPS, DSTATE, generator=gen, dtype=dtype) * 0.3,
        "x": torch.randn(num_tokens, HV, HEADDIM, generator=gen, dtype=dtype),
        # dt = softplus(dt_raw + dt_bias), dt_bias = -5: with A in [-16, -1], decays mostly 0.9 .. 0.999
        "dt": F.softplus(torch.randn(num_tokens, HV, generator=gen, dtype=gate_dtype) - 5.0),
    }
    a_log = torch.empty(HV, dtype=gate_dtype).uniform_(math.log(1.0), math.log(16.0), generator=gen)
    const = {"A": -torch.exp(a_log), "D": torch.randn(HV, generator=gen, dtype=dtype)}
    return tok, const


def _naive_mamba2(t, c, cu_seqlens, initial_state):
    dtype = torch.float64 if t["x"].dtype == torch.float64 else torch.float32
    dt = t["dt"].to(dtype)
    y, final = naive_recurrence(
        expand_heads(t["C"], HV).to(dtype),
        expand_heads(t["B"], HV).to(dtype),
        t["x"].to(dtype) * dt[:, :, None],
        dt * c["A"].to(dtype)[None, :],
        None,
        _bounds(cu_seqlens),
        initial_state.to(dtype),
        1.0,
    )
    return y + c["D"].to(dtype)[None, :, None] * t["x"].to(dtype), final


MAMBA2 = Family(
    name="mamba2",
    make=_make_mamba2,
    forward=lambda t, c, cu_seqlens, initial_state: mamba2.mamba2_forward(
        t["C"], t["B"], t["x"], t["dt"], c["A"], c["D"], cu_seqlens=cu_seqlens, initial_state=initial_state
    ),
    summarize=lambda t, c, cu_seqlens: mamba2.mamba2_summarize(t["B"], t["x"], t["dt"], c["A"], cu_seqlens=cu_seqlens),
    decode=lambda t, c, state: mamba2.mamba2_decode(t["C"], t["B"], t["x"], t["dt"], c["A"], state, c["D"]),
    naive=_naive_mamba2,
    forward_and_summarize=lambda t, c, cu_seqlens, initial_state: mamba2.mamba2_forward_and_summarize(
        t["C"], t["B"], t["x"], t["dt"], c["A"], c["D"], cu_seqlens=cu_seqlens, initial_state=initial_state
    ),
    state_shape=(HV, DSTATE, HEADDIM),
)


# ----------------------------------------------------------------------------- checks
# Random segmentations: 1-12 segments of 1-300 tokens, short ones (below the conv width) favoured.
SEGMENT_LENGTHS = st.one_of(st.integers(1, 4), st.integers(1, 300))
SEGMENTATIONS = st.lists(SEGMENT_LENGTHS, min_size=1, max_size=12)

def _state_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def random_state(family: Family, num: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randn(num, *family.state_shape, generator=gen, dtype=_state_dtype(dtype))


def check_composition(family: Family, lengths: List[int], seed: int, dtype: torch.dtype) -> None:
    """Composed summaries (pairwise compose and scan_chain) equal a straight run, and each segment
    started from its composed incoming state reproduces the straight run's outputs."""
    total = sum(lengths)
    tok, const = family.make(total, seed, dtype)
    h0 = random_state(family, 1, seed, dtype)
    out_full, state_full = family.forward(tok, const, cu([total]), h0)
    seg_cu = cu(lengths)
    summaries = family.summarize(tok, const, seg_cu)
    assert summaries.num_spans == len(lengths)
    assert summaries.dtype == _state_dtype(dtype)

    acc = identity_summary(summaries, 1)
    for i in range(len(lengths)):
        acc = compose(summaries.index(torch.tensor([i])), acc)
    assert rel_err(apply_summary(acc, h0), state_full) < tol(dtype)

    incoming, final = scan_chain(summaries, torch.tensor([0, len(lengths)]), h0)
    assert rel_err(final, state_full) < tol(dtype)

    out_seg, state_seg = family.forward(tok, const, seg_cu, incoming)
    assert rel_err(out_seg, out_full) < tol(dtype)
    assert rel_err(state_seg[-1:], state_full) < tol(dtype)
    if len(lengths) > 1:
        assert rel_err(state_seg[:-1], incoming[1:]) < tol(dtype)


def check_matches_naive(family: Family, lengths: List[int], seed: int) -> None:
    """Chunked forward equals the per-token recurrence (fp64), varlen with initial states."""
    dtype = torch.float64
    tok, const = family.make(sum(lengths), seed, dtype)
    h0 = random_state(family, len(lengths), seed, dtype)
    cu_seqlens = cu(lengths)
    out, final = family.forward(tok, const, cu_seqlens, h0)
    out_ref, final_ref = family.naive(tok, const, cu_seqlens, h0)
    assert out.dtype == dtype and final.shape == final_ref.shape
    assert rel_err(out, out_ref) < 1e-12
    assert rel_err(final, final_ref) < 1e-12


def check_decode(family: Family, num_seqs: int, steps: int, seed: int, dtype: torch.dtype) -> None:
    """Decode steps (one token per sequence) reproduce a varlen forward over the same tokens."""
    total = num_seqs * steps
    tok, const = family.make(total, seed, dtype)
    h0 = random_state(family, num_seqs, seed, dtype)
    # Sequence n owns tokens n*steps .. (n+1)*steps - 1.
    out_fwd, final_fwd = family.forward(tok, const, cu([steps] * num_seqs), h0)
    state = h0
    outs = []
    for t in range(steps):
        rows = torch.arange(num_seqs) * steps + t
        step_tok = {name: x.index_select(0, rows) for name, x in tok.items()}
        out, state = family.decode(step_tok, const, state)
        outs.append(out)
    out_dec = torch.stack(outs, 1).reshape(total, *outs[0].shape[1:])
    assert out_dec.dtype == out_fwd.dtype
    assert rel_err(out_dec, out_fwd) < tol(dtype)
    assert rel_err(state, final_fwd) < tol(dtype)


def naive_addition_error(family: Family, seed: int, prefix: int = 256, segment: int = 256) -> float:
    """Relative state error of adding zero-start states (dropping T) instead of composing."""
    dtype = torch.float64
    tok, const = family.make(prefix + segment, seed, dtype)
    _, state_full = family.forward(tok, const, cu([prefix + segment]), None)
    summaries = family.summarize(tok, const, cu([prefix, segment]))
    naive = summaries.state[0:1] + summaries.state[1:2]
    composed = apply_summary(summaries.index(torch.tensor([1])), summaries.state[0:1])
    assert rel_err(composed, state_full) < 1e-10  # composition itself is right
    return rel_err(naive, state_full)


def check_forward_and_summarize(family: Family, lengths: List[int], seed: int, with_initial: bool) -> None:
    """The fused call equals separate forward and summarize calls (summaries start from zero)."""
    dtype = torch.float64
    tok, const = family.make(sum(lengths), seed, dtype)
    h0 = random_state(family, len(lengths), seed, dtype) if with_initial else None
    cu_seqlens = cu(lengths)
    out, final, summary = family.forward_and_summarize(tok, const, cu_seqlens, h0)
    out_ref, final_ref = family.forward(tok, const, cu_seqlens, h0)
    summary_ref = family.summarize(tok, const, cu_seqlens)
    assert type(summary) is type(summary_ref)
    assert rel_err(out, out_ref) < 1e-12 and rel_err(final, final_ref) < 1e-12
    assert rel_err(summary.state, summary_ref.state) < 1e-12
    assert rel_err(summary._t(), summary_ref._t()) < 1e-12
