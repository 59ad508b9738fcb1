"""The one-launch short conv (hypic.ops.conv_short) against the reference in hypic.ops.conv.

CPU: the choice of kernel on the inputs; the Triton kernel through ``TRITON_INTERPRET=1`` in a
subprocess when Triton is installed. CUDA: bf16 at the engine's all-hit shape and with long runs.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from tests.interpreter import interpreted_error

CASE = textwrap.dedent("""
    import torch
    from hypic.ops.conv import causal_conv1d, conv_final_state
    from hypic.ops.conv_short import short_conv

    def case(dtype, device, lengths, dim, width=4, with_state=True, with_bias=True, activation="silu", seed=0):
        gen = torch.Generator().manual_seed(seed)
        cu = torch.tensor([0] + lengths).cumsum(0)
        x = torch.randn(int(cu[-1]), dim, generator=gen).to(dtype)
        weight = torch.randn(dim, width, generator=gen).to(dtype)
        bias = torch.randn(dim, generator=gen).to(dtype) if with_bias else None
        state = torch.randn(len(lengths), dim, width - 1, generator=gen).to(dtype) if with_state else None
        d64 = lambda t: None if t is None else t.double()  # noqa: E731
        ref, ref_final = causal_conv1d(x.double(), weight.double(), d64(bias), cu_seqlens=cu,
                                       initial_state=d64(state), activation=activation)
        dev = lambda t: None if t is None else t.to(device)  # noqa: E731
        y = short_conv(dev(x), dev(weight), dev(bias), cu_seqlens=dev(cu), initial_state=dev(state),
                       activation=activation)
        assert y.dtype == dtype and y.shape == ref.shape and not torch.isnan(y).any()
        final = conv_final_state(dev(x), dev(state), dev(cu), width - 1)  # what causal_conv1d adds to y
        assert torch.equal(final.cpu().double(), ref_final)  # the inputs' own values, moved
        return float((y.cpu().double() - ref).norm() / ref.norm())
""")


class _OnCuda:
    """A stand-in for a CUDA tensor of ``num_tokens`` rows (only what ``conv_kernel`` reads)."""

    is_cuda = True
    dtype = torch.bfloat16

    def __init__(self, num_tokens):
        self.shape = (num_tokens, 8192)


def test_conv_kernel_rule():
    from hypic.ops.conv import conv_kernel

    assert conv_kernel(_OnCuda(576), 65) == "short"  # all-hit 32k: seams and question
    assert conv_kernel(_OnCuda(32832), 65) == "fla"  # cold 32k
    assert conv_kernel(torch.zeros(576, 4), 65) is None  # a CPU tensor: the reference, whatever the machine has
    assert conv_kernel(torch.zeros(4, 4, dtype=torch.float64), 1) is None


def test_short_conv_interpreted():
    script = CASE + textwrap.dedent("""
        worst = 0.0
        # runs shorter than the history, empty runs (first, middle, last), one run over two
        # token tiles, channels not a multiple of the tile; with and without state and bias
        lengths = [0, 1, 2, 8, 0, 40, 3, 0]
        worst = max(worst, case(torch.float32, "cpu", lengths, 136))
        worst = max(worst, case(torch.float32, "cpu", lengths, 40, with_state=False, with_bias=False,
                                activation=None, seed=1))
        worst = max(worst, case(torch.float32, "cpu", [70], 24, width=2, seed=2))
        worst = max(worst, case(torch.float16, "cpu", [5, 9, 17], 64, seed=3))
        # 300 runs: past 256, so the binary search takes 16 steps instead of 8
        worst = max(worst, case(torch.float32, "cpu", [1, 0, 2] * 100, 16, seed=4))
        print(worst)
    """)
    assert interpreted_error(script) < 1e-3


def test_search_steps_cover_the_run_count():
    from hypic.ops.conv_short import search_steps

    assert [search_steps(n) for n in (0, 1, 65, 255, 256, 65535, 65536, 1 << 20)] == [8, 8, 8, 8, 16, 16, 17, 21]
    for n in range(1, 70000, 997):  # the kernel's contract: at least the run count's bit length
        assert n.bit_length() <= search_steps(n)


@pytest.mark.cuda
@pytest.mark.parametrize("lengths", [[8] * 64 + [64], [512] * 8 + [64], [1, 0, 2, 3] * 5, [1, 2] * 150])
def test_short_conv_cuda_bf16(lengths):
    namespace = {}
    exec(CASE, namespace)
    err = namespace["case"](torch.bfloat16, "cuda", lengths, 8192, seed=len(lengths))
    assert err < 1e-2, err


TAILS_CASE = textwrap.dedent("""
    import torch
    from hypic.ops.conv import conv_tails_reference
    from hypic.ops.conv_short import conv_tails as conv_tails_triton

    def tails_case(device, in_dtype, out_dtype, seed=0, groups=7, dim=40, width_1=3, tokens=11, runs=4):
        gen = torch.Generator().manual_seed(seed)
        # x: a strided column block of a wider tensor (the fused projections' output); init: a
        # transposed view (not contiguous); rows from both sources, repeated, in any order
        wide = torch.randn(tokens, dim + 9, generator=gen).to(in_dtype)
        x = wide[:, 3:3 + dim]
        init = torch.randn(runs, width_1, dim, generator=gen).to(out_dtype).transpose(1, 2)
        index = torch.randint(0, tokens + runs * width_1, (groups * width_1,), generator=gen)
        index[:width_1] = torch.arange(tokens, tokens + width_1)  # a whole run's state
        want = torch.empty(groups, dim, width_1, dtype=torch.float64)
        rows = torch.cat([x.double(), init.transpose(1, 2).reshape(-1, dim).double()])
        for n in range(groups):
            for j in range(width_1):
                want[n, :, j] = rows[index[n * width_1 + j]]
        dev = lambda t: t.to(device)  # noqa: E731
        ref = conv_tails_reference(dev(x), dev(init), dev(index), out_dtype)
        got = conv_tails_triton(dev(x), dev(init), dev(index), out_dtype)
        assert got.dtype == out_dtype and got.is_contiguous() and got.shape == (groups, dim, width_1)
        assert torch.equal(got.cpu(), ref.cpu()), (got, ref)
        return float((ref.cpu().double() - want.to(out_dtype).double()).abs().max())
""")


def test_conv_tails_reference_and_checks():
    namespace: dict = {}
    exec(TAILS_CASE.replace("got = conv_tails_triton(", "got = conv_tails_reference("), namespace)  # noqa: S102
    assert namespace["tails_case"]("cpu", torch.float32, torch.float32) == 0.0
    assert namespace["tails_case"]("cpu", torch.bfloat16, torch.float32, seed=1) == 0.0
    from hypic.ops.conv import conv_tails

    x, init = torch.zeros(4, 8), torch.zeros(2, 8, 3)
    index = torch.tensor([0, 4, 9, 3, 2, 1])
    assert torch.equal(conv_tails(x, init, index, torch.float32), namespace["conv_tails_reference"](
        x, init, index, torch.float32))  # CPU tensors: the reference
    with pytest.raises(ValueError, match=r"\[N, D, G >= 1\]"):
        conv_tails(x, torch.zeros(2, 7, 3), torch.zeros(3, dtype=torch.long), torch.float32)
    with pytest.raises(ValueError, match="multiple of G"):
        conv_tails(x, init, torch.zeros(4, dtype=torch.long), torch.float32)


def test_conv_tails_interpreted():
    script = TAILS_CASE + textwrap.dedent("""
        worst = tails_case("cpu", torch.float32, torch.float32)
        worst = max(worst, tails_case("cpu", torch.float16, torch.float32, seed=1, width_1=1, dim=600))
        worst = max(worst, tails_case("cpu", torch.float32, torch.float32, seed=2, width_1=5, groups=1))
        print(worst)
    """)
    assert interpreted_error(script) == 0.0


@pytest.mark.cuda
def test_conv_tails_cuda():
    namespace: dict = {}
    exec(TAILS_CASE, namespace)  # noqa: S102
    assert namespace["tails_case"]("cuda", torch.bfloat16, torch.float32, groups=195, dim=8192) == 0.0
    assert namespace["tails_case"]("cuda", torch.float32, torch.float32, seed=3, width_1=1) == 0.0
