"""Tests of hypic/graphs/cuda_graphs.py: replays of token-wise blocks equal their eager runs."""

import json
import os

import pytest
import torch

from hypic.engine.context import ForwardContext
from hypic.graphs.cuda_graphs import TokenGraphs, make_token_graphs, pick_bucket

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_buckets():
    assert pick_bucket((8, 16, 64), 1) == 8
    assert pick_bucket((8, 16, 64), 16) == 16
    assert pick_bucket((8, 16, 64), 17) == 64
    assert pick_bucket((8, 16, 64), 65) is None
    assert make_token_graphs(torch.device("cpu")) is None
    with pytest.raises(ValueError, match="CUDA device"):
        TokenGraphs(torch.device("cpu"))


def test_context_runs_the_block_eagerly_without_graphs():
    class Ctx(ForwardContext):
        short_conv = linear_attention = lightning_attention = attention = select_logits_rows = None

    block = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    assert torch.equal(Ctx().token_wise(block, x), block(x))


def _moe_block(dtype):
    from hypic.models.loader import build_dummy_model

    with open(os.path.join(REPO, "hypic", "models", "configs", "qwen3_5_35b_a3b.json")) as f:
        cfg = json.load(f)
    text = cfg["text_config"]
    text.update(num_hidden_layers=4, layer_types=text["layer_types"][:4], hidden_size=256, num_experts=32,
                moe_intermediate_size=64, shared_expert_intermediate_size=64, vocab_size=512)
    _, model = build_dummy_model(cfg, dtype=dtype, device="cuda", seed=0)
    return model.model.layers[0].mlp


@pytest.mark.cuda
@torch.inference_mode()
def test_replays_equal_eager_for_every_size_and_padding():
    block = _moe_block(torch.bfloat16)
    graphs = TokenGraphs(torch.device("cuda"), buckets=(16, 64))
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n in (16, 5, 64, 33, 5):  # repeats reuse the captured graphs; stale padding rows differ
        x = torch.randn(n, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
        got = graphs.run(block, x)
        want = block(x)
        assert got.shape == want.shape
        assert torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-3), n
    assert graphs.num_captures == 2 and graphs.failed(block) is None
    big = torch.randn(65, 256, device="cuda", dtype=torch.bfloat16, generator=gen)  # over every bucket: eager
    assert torch.equal(graphs.run(block, big), block(big))


@pytest.mark.cuda
@torch.inference_mode()
def test_a_block_that_cannot_be_captured_runs_eagerly():
    class Syncing(torch.nn.Module):
        def forward(self, x):
            return x * float(x.abs().max())  # a host read: not capturable

    graphs = TokenGraphs(torch.device("cuda"), buckets=(16,))
    block = Syncing()
    x = torch.randn(7, 8, device="cuda")
    assert torch.equal(graphs.run(block, x), block(x))
    assert graphs.failed(block) is not None and graphs.num_captures == 0
    assert torch.equal(graphs.run(block, x), block(x))  # still served, eagerly
    # the failed capture left the default generator usable: random ops on the device still draw
    assert torch.randn(4, device="cuda").isfinite().all()


@pytest.mark.cuda
@torch.inference_mode()
def test_multi_input_phases_of_every_layer_share_inputs_and_match_eager():
    from tests.runner.pic_helpers import tiny_model

    spec, model = tiny_model(seed=1)
    model = model.cuda()
    graphs = TokenGraphs(torch.device("cuda"), buckets=(32,))
    gen = torch.Generator(device="cuda").manual_seed(2)
    for n in (20, 7):
        for layer in model.model.layers:
            x = torch.randn(n, spec.hidden_size, device="cuda", generator=gen)
            if layer.layer_type == "linear_attention":
                outs = graphs.run(layer.linear_in, x)
                want = layer.linear_in(x)
                o = torch.randn(n, spec.linear_num_value_heads, spec.linear_value_head_dim, device="cuda",
                                generator=gen)
                outs += (graphs.run(layer.linear_out, o, want[1], x),)
                want += (layer.linear_out(o, want[1], x),)
            else:
                cos, sin = (torch.randn(n, spec.rotary_dim, device="cuda", generator=gen) for _ in range(2))
                outs, want = graphs.run(layer.attention_in, x, cos, sin), layer.attention_in(x, cos, sin)
            assert len(outs) == len(want)
            for got, ref in zip(outs, want):
                assert got.shape == ref.shape and torch.allclose(got, ref, rtol=1e-4, atol=1e-5)
    # one set of static inputs per phase function and shape, shared by the layers
    assert len(graphs._inputs) == 3 and graphs.num_captures == 6


@pytest.mark.cuda
@torch.inference_mode()
def test_a_phase_whose_outputs_are_not_rows_runs_eagerly():
    graphs = TokenGraphs(torch.device("cuda"), buckets=(16,))

    def total(x):
        return x.sum(0)  # not row-wise: its output has no token rows

    x = torch.randn(5, 3, device="cuda")
    assert torch.equal(graphs.run(total, x), total(x))
    assert "one row per token" in graphs.failed(total)


@pytest.mark.cuda
@torch.inference_mode()
def test_start_up_capture_covers_buckets_and_graphs_die_with_their_layers():
    import gc

    from hypic.runner.pic_runner import PicRunner
    from tests.runner.pic_helpers import tiny_model

    spec, model = tiny_model(seed=2)
    model = model.cuda()
    runner = PicRunner(model, spec, None, torch.device("cuda"), torch.float32)
    graphs = runner.graphs
    before = len(graphs._graphs)
    runner.capture_graphs(max_tokens=64)
    sizes = [b for b in graphs.buckets if b <= 64]
    # per bucket: linear_in, gates and linear_out of each linear layer, attention_in and
    # attention_out of each attention layer
    phases = 3 * len(spec.linear_layer_ids) + 2 * len(spec.full_attention_layer_ids)
    assert not graphs.failures(), graphs.failures()
    assert len(graphs._graphs) - before == phases * len(sizes)
    assert PicRunner(model, spec, None, torch.device("cuda"), torch.float32).graphs is graphs  # shared
    eager = PicRunner(model, spec, None, torch.device("cuda"), torch.float32, enforce_eager=True)
    assert eager.graphs is None and eager.capture_graphs(max_tokens=64) == 0
    runner.capture_graphs(max_tokens=64)  # nothing new
    assert len(graphs._graphs) - before == phases * len(sizes)
    del runner, eager, model  # every runner holds the model: all of them must go for it to die
    gc.collect()
    assert len(graphs._graphs) == before  # the freed layers' graphs are dropped


@pytest.mark.cuda
@torch.inference_mode()
def test_replay_outputs_are_views_valid_until_the_next_replay_of_the_phase():
    """The contract callers rely on: no copy out of the graph, and the next replay of the same
    phase (any input) rewrites the previous outputs, while another phase's replay does not."""
    block = _moe_block(torch.bfloat16)
    other = _moe_block(torch.bfloat16)  # a different layer object, same phase function and shapes
    graphs = TokenGraphs(torch.device("cuda"), buckets=(16,))
    gen = torch.Generator(device="cuda").manual_seed(3)
    x, y = (torch.randn(9, 256, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    first = graphs.run(block.forward, x)
    kept = first.clone()
    assert first.shape[0] == 9
    second = graphs.run(other.forward, y)  # the same phase (method) of another layer: same buffer
    assert second.data_ptr() == first.data_ptr()
    assert not torch.equal(first, kept) and torch.equal(first, second)
    assert torch.allclose(kept.float(), block(x).float(), rtol=2e-2, atol=2e-3)


@pytest.mark.cuda
@torch.inference_mode()
def test_recorded_glue_runs_compiled_and_matches_eager():
    """A captured phase records the compiled glue (hypic.ops.fused.recording_graph): a norm and
    the MoE block's combine, SwiGLU and gates, each compiled (not fallen back to its eager math)
    and the replays close to the eager phase (padding rows reach the experts, so the MoE's tiles
    may differ from the eager call's: close, not equal). The routing runs as the fused kernels of
    hypic.ops.moe_route, no compiled glue."""
    from hypic.ops import fused, norms

    block = _moe_block(torch.bfloat16)
    weight = torch.randn(256, device="cuda", dtype=torch.bfloat16) * 0.1

    def phase(x):
        return block(norms.rms_norm_zero_centered(x, weight, 1e-6))

    gen = torch.Generator(device="cuda").manual_seed(3)
    graphs = TokenGraphs(torch.device("cuda"), buckets=(32,))
    for n in (32, 11):
        x = torch.randn(n, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
        got, want = graphs.run(phase, x), phase(x)
        assert graphs.failed(phase) is None
        assert torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-3), n
    for math in (norms.rms_norm_zero_centered_math, fused.swiglu_math, fused.add_sigmoid_gated_math):
        assert fused._COMPILED.get(math) not in (None, math), math.__name__


class _Scale(torch.nn.Module):
    def forward(self, x):
        return x * 2, x + 1


class _Mix(torch.nn.Module):
    def forward(self, u, w, x):
        return u * w + x


@pytest.mark.cuda
@torch.inference_mode()
def test_a_phase_reads_an_earlier_phases_output_in_place():
    """Phase B captured over phase A's replay outputs reads A's output buffers in place (no copy
    before its replays); any other input is copied into them, and every flow, in any order,
    equals the eager phases."""
    graphs = TokenGraphs(torch.device("cuda"), buckets=(16,))
    a, b = _Scale(), _Mix()
    gen = torch.Generator(device="cuda").manual_seed(5)

    def fresh(n):
        return torch.randn(n, 8, device="cuda", generator=gen)

    for n in (16, 9, 12):
        x = fresh(n)
        u, w = graphs.run(a, x)
        got = graphs.run(b, u, w, x)
        assert torch.equal(got, x * 2 * (x + 1) + x), n
        # B over other inputs (copied into the adopted buffers), then the chained flow again
        p, q = fresh(n), fresh(n)
        assert torch.equal(graphs.run(b, p, q, x), p * q + x), n
        u, w = graphs.run(a, x)
        assert torch.equal(graphs.run(b, u, w, x), x * 2 * (x + 1) + x), n
    entry_a = next(e for k, e in graphs._graphs.items() if k[0] == id(a))
    entry_b = next(e for k, e in graphs._graphs.items() if k[0] == id(b))
    adopted = [s.data_ptr() == o.data_ptr() for s, o in zip(entry_b.inputs[:2], entry_a.output)]
    assert adopted == [True, True]
    assert entry_b.inputs[2].data_ptr() not in {o.data_ptr() for o in entry_a.output}  # x: its own copy


def test_column_blocks_of_one_tensor_are_copied_as_one_span():
    """The fused projections' column blocks (views of one GEMM output) form one group, copied out
    as one span and returned as the same views; narrow slices of a wide tensor, overlapping views,
    other dtypes and fresh tensors are copied alone (CPU: the buffers and copies, no graph)."""
    from hypic.graphs.cuda_graphs import _layout, _output_groups, _OutputBuffers

    y = torch.randn(6, 20)
    mixed, z, b, a, _pad = y.split([8, 6, 2, 2, 2], dim=-1)
    z = z.view(6, 3, 2)
    fresh = torch.randn(6, 4)
    outs = (fresh, mixed, z, b, a)
    groups = _output_groups(outs)
    assert groups == ((0,), (1, 2, 3, 4))
    buffers = _OutputBuffers(outs, groups)
    assert len(buffers.buffers) == 2 and buffers.buffers[1].numel() == 6 * 20 - 2  # the span, not the tail
    assert buffers.outputs[0].is_contiguous()
    for got, want in zip(buffers.outputs[1:], outs[1:]):
        assert got.stride() == want.stride() and got.shape == want.shape
    # a second result of the same layout (as the capture's) lands in the same views
    y2 = torch.randn(6, 20)
    m2, z2, b2, a2, _ = y2.split([8, 6, 2, 2, 2], dim=-1)
    result = (torch.randn(6, 4), m2, z2.view(6, 3, 2), b2, a2)
    assert _layout(result, groups) == _layout(outs, groups)
    for o in buffers.outputs:
        o.fill_(float("nan"))
    buffers.copy_from(result)
    for got, want in zip(buffers.outputs, result):
        assert torch.equal(got, want)
    # rows of the views are the replay's rows (what _rows slices)
    assert torch.equal(buffers.outputs[2][:4], z2.view(6, 3, 2)[:4])
    # sparse: two narrow slices of a wide tensor; overlapping views; mixed dtypes
    wide = torch.randn(6, 100)
    assert _output_groups((wide[:, :2], wide[:, 50:52])) == ((0,), (1,))
    assert _output_groups((y[:, :10], y[:, 5:15])) == ((0,), (1,))
    assert _output_groups((y[:, :10], y.view(torch.int32)[:, 10:])) == ((0,), (1,))
    assert _output_groups((y, y.t())) == ((0,), (1,))


@pytest.mark.cuda
@torch.inference_mode()
def test_fused_projection_phase_replays_equal_eager():
    """A phase returning a fused GEMM's column blocks (as the GDN input projections do) replays
    equal to eager, grouped (one copy per replay), and a later phase adopts a grouped view."""

    class Project(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(24, 8, device="cuda"))

        def forward(self, x):
            mixed, z, b, _pad = torch.nn.functional.linear(x, self.weight).split([12, 8, 2, 2], dim=-1)
            return mixed, z.view(x.shape[0], 2, 4), b

    class Use(torch.nn.Module):
        def forward(self, z, b):
            return z.sum(-1) * b

    graphs = TokenGraphs(torch.device("cuda"), buckets=(16,))
    p, u = Project(), Use()
    gen = torch.Generator(device="cuda").manual_seed(1)
    for n in (16, 7, 11):
        x = torch.randn(n, 8, device="cuda", generator=gen)
        mixed, z, b = graphs.run(p, x)
        want = p(x)
        for got, exp in zip((mixed, z, b), want):
            torch.testing.assert_close(got, exp, rtol=0, atol=0)
        torch.testing.assert_close(graphs.run(u, z, b), u(want[1], want[2]), rtol=0, atol=0)
    entry = next(e for k, e in graphs._graphs.items() if k[0] == id(p))
    same_base = len({o.untyped_storage().data_ptr() for o in entry.output}) == 1
    assert same_base
    entry_u = next(e for k, e in graphs._graphs.items() if k[0] == id(u))
    assert entry_u.inputs[0].data_ptr() == entry.output[1].data_ptr()  # z read in place
