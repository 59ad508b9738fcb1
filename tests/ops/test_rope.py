"""Tests for hypic/ops/rope.py (partial rotate-half RoPE and summary re-rotation)."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from hypic.ops.linear.gated_delta import gated_delta_summarize
from hypic.ops.linear.gla import gla_summarize
from hypic.ops.linear.simple_gla import simple_gla_summarize
from hypic.ops.linear.summary import DiagonalSummary, ScalarSummary
from hypic.ops.rope import RotaryEmbedding, apply_rotary, rotate_summary_keys

pytestmark = pytest.mark.usefixtures("single_thread_torch")

HEAD_DIM, ROTARY_DIM, HV, V = 8, 4, 2, 3


def cu(lengths):
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.long)


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_matches_transformers_qwen3_next_partial_rope():
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    config = pytest.importorskip("transformers").Qwen3NextConfig(
        head_dim=16, num_attention_heads=2, num_key_value_heads=1, hidden_size=32,
        rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.25, "rope_type": "default"},
    )
    hf_rope = modeling.Qwen3NextRotaryEmbedding(config)
    positions = torch.tensor([0, 3, 17, 4095])
    x = torch.randn(1, 4, 2, 16)
    cos_hf, sin_hf = hf_rope(x, positions[None])
    q_hf, _ = modeling.apply_rotary_pos_emb(x.transpose(1, 2), x.transpose(1, 2), cos_hf, sin_hf)
    rope = RotaryEmbedding(head_dim=16, rotary_dim=4, theta=10000.0)
    cos, sin = rope.cos_sin(positions)
    assert torch.equal(cos, cos_hf[0]) and torch.equal(sin, sin_hf[0])
    assert torch.equal(apply_rotary(x[0], cos, sin), q_hf.transpose(1, 2)[0])


def test_rotation_is_orthogonal_partial_and_additive():
    rope = RotaryEmbedding(HEAD_DIM, ROTARY_DIM, theta=100.0)
    x = torch.randn(5, 3, HEAD_DIM, dtype=torch.float64)
    p = torch.tensor([0, 1, 7, 50, 1000])
    y = apply_rotary(x, *rope.cos_sin(p, dtype=torch.float64))
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-12)
    assert torch.equal(y[..., ROTARY_DIM:], x[..., ROTARY_DIM:])
    assert torch.equal(y[0], x[0])
    z = apply_rotary(y, *rope.cos_sin(torch.full_like(p, 9), dtype=torch.float64))
    assert torch.allclose(z, apply_rotary(x, *rope.cos_sin(p + 9, dtype=torch.float64)), atol=1e-12)


def _rotated_keys(rope, k, lengths, offsets):
    """Keys of each span rotated at positions offset_n + 0 .. L_n - 1."""
    positions = torch.cat([torch.arange(n) + int(o) for n, o in zip(lengths, offsets)])
    cos, sin = rope.cos_sin(positions, dtype=torch.float64)
    return apply_rotary(k, cos, sin)


def _inputs(lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    k = F.normalize(torch.randn(total, HV, HEAD_DIM, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(total, HV, V, generator=gen, dtype=torch.float64)
    g = -0.05 * torch.rand(total, HV, generator=gen, dtype=torch.float64)
    beta = torch.sigmoid(torch.randn(total, HV, generator=gen, dtype=torch.float64))
    return k, v, g, beta


def _pair_constant_channel_gate(g, rotary_dim):
    """Per-channel gate equal within each rotated pair (i, i + rotary_dim/2)."""
    half = rotary_dim // 2
    extra = HEAD_DIM - rotary_dim
    free = g[..., None] * torch.linspace(0.5, 1.5, half + extra, dtype=g.dtype)
    return torch.cat([free[..., :half], free[..., :half], free[..., half:]], dim=-1)


SUMMARIZERS = {
    "dense (gated delta)": lambda k, v, g, beta, c: gated_delta_summarize(k, v, g, beta, cu_seqlens=c),
    "scalar (simple gla)": lambda k, v, g, beta, c: simple_gla_summarize(k, v, g, cu_seqlens=c),
    "diagonal (gla)": lambda k, v, g, beta, c: gla_summarize(
        k, v, _pair_constant_channel_gate(g, ROTARY_DIM), cu_seqlens=c
    ),
}


@pytest.mark.parametrize("name", list(SUMMARIZERS))
def test_summary_rerotation_is_exact(name):
    summarize = SUMMARIZERS[name]
    rope = RotaryEmbedding(HEAD_DIM, ROTARY_DIM, theta=50.0)
    lengths, offsets = [70, 5, 1, 130], torch.tensor([0, 3, 999, 4321])
    k, v, g, beta = _inputs(lengths, seed=1)
    at_zero = summarize(_rotated_keys(rope, k, lengths, [0] * len(lengths)), v, g, beta, cu(lengths))
    moved = rotate_summary_keys(at_zero, offsets, rope)
    direct = summarize(_rotated_keys(rope, k, lengths, offsets.tolist()), v, g, beta, cu(lengths))
    assert type(moved) is type(direct)
    assert rel_err(moved.state, direct.state) < 1e-10
    t_moved, t_direct = moved._t(), direct._t()
    assert (t_moved - t_direct).abs().max().item() < 1e-10 * max(1.0, t_direct.abs().max().item())


def test_diagonal_summary_not_constant_within_pairs_is_rejected():
    rope = RotaryEmbedding(HEAD_DIM, ROTARY_DIM)
    log_decay = -torch.rand(1, HV, HEAD_DIM, dtype=torch.float64)
    s = DiagonalSummary(log_decay, torch.zeros(1, HV, HEAD_DIM, V, dtype=torch.float64))
    with pytest.raises(ValueError):
        rotate_summary_keys(s, torch.tensor([3]), rope)


def test_scalar_summary_keeps_its_decay():
    rope = RotaryEmbedding(HEAD_DIM, ROTARY_DIM)
    s = ScalarSummary(-torch.rand(2, HV), torch.randn(2, HV, HEAD_DIM, V))
    moved = rotate_summary_keys(s, torch.tensor([0, 5]), rope)
    assert torch.equal(moved.log_decay, s.log_decay)
    assert torch.equal(moved.state[0], s.state[0])


def test_bad_arguments_raise_value_error():
    rope = RotaryEmbedding(HEAD_DIM, ROTARY_DIM)
    cos, sin = rope.cos_sin(torch.arange(3))
    s = ScalarSummary(torch.zeros(2, HV), torch.zeros(2, HV, HEAD_DIM, V))
    bad_calls = [
        lambda: RotaryEmbedding(8, 3),
        lambda: RotaryEmbedding(8, 10),
        lambda: RotaryEmbedding(8, 4, theta=0.0),
        lambda: rope.cos_sin(torch.arange(3.0)),
        lambda: rope.cos_sin(torch.arange(6).reshape(2, 3)),
        lambda: apply_rotary(torch.randn(3, HEAD_DIM), cos, sin),
        lambda: apply_rotary(torch.randn(4, 1, HEAD_DIM), cos, sin),
        lambda: apply_rotary(torch.randn(3, 1, HEAD_DIM), cos, sin[:, :2]),
        lambda: rotate_summary_keys(s, torch.tensor([1]), rope),
        lambda: rotate_summary_keys(s, torch.tensor([1, 2]), RotaryEmbedding(16, 4)),
        lambda: rotate_summary_keys(s.state, torch.tensor([1, 2]), rope),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()
