import pytest
import torch
import torch.nn.functional as F

from hypic.ops.norms import (
    add_rms_norm,
    gated_rms_norm,
    group_rms_norm_sigmoid_gated,
    l2_normalize,
    rms_norm,
    rms_norm_zero_centered,
)


def test_zero_centered_rms_norm_formula_and_dtype():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 8, generator=gen, dtype=torch.float64)
    w = torch.randn(8, generator=gen, dtype=torch.float64)
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)
    torch.testing.assert_close(rms_norm_zero_centered(x, w, 1e-6), ref)
    assert rms_norm_zero_centered(x.bfloat16(), w.bfloat16(), 1e-6).dtype == torch.bfloat16


def test_gated_rms_norm_is_norm_then_silu_gate():
    gen = torch.Generator().manual_seed(1)
    x, z = torch.randn(2, 3, 8, generator=gen, dtype=torch.float64), torch.randn(2, 3, 8, generator=gen, dtype=torch.float64)
    w = 1 + torch.randn(8, generator=gen, dtype=torch.float64)
    ref = w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * F.silu(z)
    torch.testing.assert_close(gated_rms_norm(x, z, w, 1e-6), ref)
    with pytest.raises(ValueError, match="gate shape"):
        gated_rms_norm(x, z[:, :2], w, 1e-6)


def test_l2_normalize_unit_norm_and_weight_check():
    x = torch.randn(4, 2, 16, dtype=torch.float64)
    torch.testing.assert_close(l2_normalize(x).norm(dim=-1), torch.ones(4, 2, dtype=torch.float64), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="weight must have shape"):
        rms_norm_zero_centered(x, torch.zeros(3), 1e-6)


def test_add_rms_norm_is_the_residual_add_then_the_norm():
    from hypic.ops.norms import add_rms_norm_zero_centered

    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(7, 32, generator=gen).to(dtype)
        h = torch.randn(7, 32, generator=gen).to(dtype)
        w = (torch.randn(32, generator=gen) * 0.1).to(dtype)
        s, n = add_rms_norm_zero_centered(x, h, w, 1e-6)
        assert torch.equal(s, x + h) and torch.equal(n, rms_norm_zero_centered(x + h, w, 1e-6))
    with pytest.raises(ValueError, match="add_rms_norm_zero_centered"):
        add_rms_norm_zero_centered(x, h[:3], w, 1e-6)


def test_rms_norm_rounds_before_the_weight_as_transformers():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 16, generator=gen, dtype=torch.float64)
    w = 1 + torch.randn(16, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(rms_norm(x, w, 1e-5), w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    # bf16: the normalised value is rounded to bf16, then multiplied by the bf16 weight
    xb, wb = x.bfloat16(), w.bfloat16()
    want = wb * (xb.float() * torch.rsqrt(xb.float().pow(2).mean(-1, keepdim=True) + 1e-5)).bfloat16()
    assert torch.equal(rms_norm(xb, wb, 1e-5), want)
    s, n = add_rms_norm(xb, xb, wb, 1e-5)
    assert torch.equal(s, xb + xb) and torch.equal(n, rms_norm(xb + xb, wb, 1e-5))
    with pytest.raises(ValueError, match="add_rms_norm"):
        add_rms_norm(xb, xb[:2], wb, 1e-5)


def test_group_rms_norm_normalises_each_group_then_gates():
    gen = torch.Generator().manual_seed(3)
    x, z = torch.randn(4, 24, generator=gen, dtype=torch.float64), torch.randn(4, 24, generator=gen, dtype=torch.float64)
    w = 1 + torch.randn(24, generator=gen, dtype=torch.float64)
    got = group_rms_norm_sigmoid_gated(x, z, w, 3, 1e-6)
    for g in range(3):
        part = x[:, 8 * g:8 * (g + 1)]
        want = part / torch.sqrt(part.pow(2).mean(-1, keepdim=True) + 1e-6) * w[8 * g:8 * (g + 1)] \
            * torch.sigmoid(z[:, 8 * g:8 * (g + 1)])
        torch.testing.assert_close(got[:, 8 * g:8 * (g + 1)], want)
    # one group: the RMS over the whole row
    whole = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w * torch.sigmoid(z)
    torch.testing.assert_close(group_rms_norm_sigmoid_gated(x, z, w, 1, 1e-6), whole)
    with pytest.raises(ValueError, match="num_groups must divide 24"):
        group_rms_norm_sigmoid_gated(x, z, w, 5, 1e-6)
    with pytest.raises(ValueError, match="gate shape"):
        group_rms_norm_sigmoid_gated(x, z[:, :8], w, 3, 1e-6)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_eager_variants_match_the_math(device, dtype):
    """Small CUDA inputs run the F.rms_norm variants (fewer launches); they compute the same
    values as the math functions (the reference) up to fp32 rounding."""
    from hypic.ops import norms

    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(37, 4, 128, generator=gen) * 3).to(device, dtype)
    h = torch.randn(37, 4, 128, generator=gen).to(device, dtype)
    gate = torch.randn(37, 4, 128, generator=gen).to(device, dtype)
    w = (torch.randn(128, generator=gen) * 0.1).to(device, dtype)
    eps = 1e-6
    pairs = [
        (norms.rms_norm_zero_centered_eager(x, w, eps), norms.rms_norm_zero_centered_math(x, w, eps)),
        (norms.gated_rms_norm_eager(x, gate, w + 1, eps), norms.gated_rms_norm_math(x, gate, w + 1, eps)),
        (norms.l2_normalize_eager(x, eps), norms.l2_normalize_math(x, eps)),
        (norms.rms_norm_eager(x, w + 1, eps), norms.rms_norm_math(x, w + 1, eps)),
    ]
    s_eager, n_eager = norms._ADD_RMS_NORM_ZERO_CENTERED_EAGER(x, h, w, eps)
    s_math, n_math = norms._ADD_RMS_NORM_ZERO_CENTERED(x, h, w, eps)
    assert torch.equal(s_eager, s_math)
    pairs.append((n_eager, n_math))
    tol = 1e-6 if dtype == torch.float32 else 8e-3  # bf16: a last-bit flip after the fp32 math
    for got, want in pairs:
        assert got.dtype == want.dtype == dtype and got.shape == want.shape
        err = float((got.float() - want.float()).norm() / want.float().norm())
        assert err < tol, err
