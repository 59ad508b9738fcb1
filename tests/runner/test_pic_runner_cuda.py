"""The PIC runner on CUDA (fla kernels, the address-table scan, CUDA graphs of the MLPs) against
the same requests on CPU (torch references): a cached request's logits agree, with and without
graphs."""

import pytest
import torch

from hypic.runner.pic_runner import PicRunner
from hypic.pic.keys import Keyer, KeyNamespace
from hypic.pic.modes import PICConfig
from hypic.pic.plan import plan_request
from hypic.pic.segments import SegmentedPrompt
from hypic.pic.store import SegmentStore
from tests.runner.pic_helpers import DEEP_LAYER_TYPES, random_segment, tiny_model

pytestmark = pytest.mark.cuda

# Bound on graph replays against the eager run, relative to the state's scale. Graphs replay the
# row-wise phases' compiled glue (norms, the GDN gates) where the eager run takes the eager ops:
# fp32 results a few ulps apart, which the gates' decays sum over the sequence. Measured: on an
# H200, layer 0's conv inputs 1.5e-7 apart (relative to their scale), its recurrent state 6.9e-5,
# layer 2's 2.9e-4; on an H100, 3.9e-4 (kept layout graphs), 3.4e-4 (a written entry's summary)
# and 1.9e-3 (an entry's summary written by a request with missed segments). The bound is one
# bf16 rounding (2^-8) of the largest entry: the bf16 activations between the layers turn those
# fp32 differences into whole bf16 ulps. A graph replaying stale or wrong rows would be off by O(1).
GRAPH_STATE_RTOL = 2.0 ** -8


class Harness:
    def __init__(self, model, spec, device):
        self.device = torch.device(device)
        self.store = SegmentStore(None, 0, device=self.device)
        self.keyer = Keyer(KeyNamespace("cuda-test", "float32"))
        self.runner = PicRunner(model, spec, self.store, self.device, torch.float32)

    def run(self, segments, query):
        policy = PICConfig(mode="hypic", seam=4, cold_policy="inline", segment_min_tokens=0).resolve()
        plan = plan_request(SegmentedPrompt(tuple(map(tuple, segments)), tuple(query)), policy, store=self.store,
                            keyer=self.keyer)
        with plan:
            return plan, self.runner.prefill([plan])[0]


def test_cached_request_on_cuda_matches_cpu_with_and_without_graphs():
    spec, cpu_model = tiny_model(seed=3, layer_types=DEEP_LAYER_TYPES)
    _, gpu_model = tiny_model(seed=3, layer_types=DEEP_LAYER_TYPES)
    gpu_model = gpu_model.cuda()
    segs = [random_segment(40 + 8 * i, seed=10 + i) for i in range(5)]
    query = random_segment(12, seed=99)
    cpu, gpu = Harness(cpu_model, spec, "cpu"), Harness(gpu_model, spec, "cuda")
    for h in (cpu, gpu):
        h.run(list(reversed(segs)), query)  # cold: caches every segment
    plan, want = cpu.run(segs, query)
    assert plan.cached_tokens > 0
    assert gpu.runner.graphs is not None
    _, with_graphs = gpu.run(segs, query)
    assert gpu.runner.graphs.num_captures > 0
    assert not gpu.runner.graphs.failures(), gpu.runner.graphs.failures()
    # the linear layers' cores: layer 1 eager, layer 2 captured, the rest replayed
    replays = gpu.runner._replays
    assert replays is not None and not replays.failures(), replays and replays.failures()
    assert replays.num_captures == 2 and replays.num_replays > 0
    graphs, gpu.runner.graphs = gpu.runner.graphs, None
    _, eager = gpu.run(segs, query)
    gpu.runner.graphs = graphs
    # the decode caches the replayed layers recorded (cloned out of the graphs' buffers)
    diffs = []
    for i, (layer_a, layer_b) in enumerate(zip(with_graphs.cache.layers, eager.cache.layers)):
        for name in ("recurrent_state", "conv_state"):
            if hasattr(layer_a, name):
                x, y = getattr(layer_a, name).float(), getattr(layer_b, name).float()
                diffs.append((i, name, float((x - y).abs().max()), float(y.abs().max())))
    print("graphs vs eager, worst relative state diff:", max(d / scale for _, _, d, scale in diffs))
    assert all(d <= GRAPH_STATE_RTOL * scale + 1e-6 for _, _, d, scale in diffs), diffs
    a, b, ref = with_graphs.logits.float().cpu(), eager.logits.float().cpu(), want.logits.float()
    assert (a - b).abs().max() <= 1e-3 * ref.abs().max()
    assert (a - ref).norm() / ref.norm() < 1e-2
    assert a.argmax() == ref.argmax()


def test_requests_of_one_layout_signature_replay_the_kept_graphs_on_cuda():
    # A later all-hit request of the same pool in another order (once the signature was seen
    # twice) builds its tables into the kept layout's buffer and replays every linear layer's
    # cores, the first two included. Between requests, freed device memory is overwritten: a
    # table a kept graph reads that had been freed (the derived tables live as long as the
    # capturing layout) would show here.
    spec, model = tiny_model(seed=3, layer_types=DEEP_LAYER_TYPES)
    model = model.cuda()
    segs = [random_segment(40 + 8 * i, seed=10 + i) for i in range(5)]
    gpu = Harness(model, spec, "cuda")
    gpu.run(list(reversed(segs)), random_segment(12, seed=98))  # cold: caches every segment
    orders = [[0, 1, 2, 3, 4], [4, 2, 0, 3, 1], [1, 3, 4, 0, 2]]
    num_linear = sum(t == "linear_attention" for t in spec.layer_types)
    graphs = gpu.runner.graphs
    eager = []
    gpu.runner.graphs = None
    for i, order in enumerate(orders):
        eager.append(gpu.run([segs[j] for j in order], random_segment(12, seed=100 + i))[1])
    gpu.runner.graphs = graphs
    gpu.run([segs[j] for j in orders[0]], random_segment(12, seed=99))  # the signature seen once: not kept
    assert len(gpu.runner.layout_graphs) == 0
    got = []
    for i, order in enumerate(orders):
        got.append(gpu.run([segs[j] for j in order], random_segment(12, seed=100 + i))[1])
        if i == 0:
            replays = gpu.runner._replays
            assert replays is not None and replays.num_captures == 2, replays and replays.failures()
            done = replays.num_replays
        else:
            assert gpu.runner._replays is replays and replays.num_captures == 2
            assert replays.num_replays == done + 2 * num_linear * i  # conv and chain, every layer
        import gc

        gc.collect()
        junk = [torch.full((n,), -7, dtype=torch.long, device="cuda") for n in range(1, 3000, 3)]
        del junk
    assert gpu.runner.layout_graphs.num_reused == 2
    for a_out, b_out in zip(got, eager):
        a, b = a_out.logits.float().cpu(), b_out.logits.float().cpu()
        assert (a - b).abs().max() <= 1e-3 * b.abs().max()
        for layer_a, layer_b in zip(a_out.cache.layers, b_out.cache.layers):
            for name in ("recurrent_state", "conv_state"):
                if hasattr(layer_a, name):
                    x, y = getattr(layer_a, name).float(), getattr(layer_b, name).float()
                    assert (x - y).abs().max() <= GRAPH_STATE_RTOL * y.abs().max() + 1e-6, name


def test_cached_request_with_missed_segments_replays_graphs_of_its_own_on_cuda():
    # A cached request with missed segments (a RAG request) writes their entries. Its cores
    # replay graphs of its own (never kept across forwards), and the written
    # summaries are formed from the missed spans' rows alone. Logits, decode caches and the new
    # entries match the same request run eagerly in a twin harness.
    spec, model = tiny_model(seed=3, layer_types=DEEP_LAYER_TYPES)
    model = model.cuda()
    old = [random_segment(40 + 8 * i, seed=10 + i) for i in range(5)]
    new = [random_segment(100, seed=50), random_segment(56, seed=51)]  # over and under a chunk
    prompt = [old[0], new[0], old[1], old[2], new[1], old[3], old[4]]
    query = random_segment(12, seed=99)
    outs, stores = [], []
    for graphs_on in (True, False):
        h = Harness(model, spec, "cuda")
        h.run(list(reversed(old)), random_segment(12, seed=98))  # cold: caches the old segments
        before = set(h.store.device_lru_order())
        if not graphs_on:
            h.runner.graphs = None
        plan, out = h.run(prompt, query)
        assert plan.cached_tokens > 0
        if graphs_on:
            replays = h.runner._replays
            assert replays is not None and not replays.failures(), replays and replays.failures()
            assert replays.num_captures == 2 and replays.num_replays > 0
            assert len(h.runner.layout_graphs) == 0
        outs.append(out)
        stores.append((h.store, sorted(set(h.store.device_lru_order()) - before, key=repr)))
    (store_a, keys_a), (store_b, keys_b) = stores
    assert len(keys_a) == 2 and keys_a == keys_b
    for key in keys_a:
        with store_a.acquire(key) as ha, store_b.acquire(key) as hb:
            for layer, lin in ha.entry.linear.items():
                for x, y in zip(lin.summary.parts() + (lin.conv_tail,),
                                hb.entry.linear[layer].summary.parts() + (hb.entry.linear[layer].conv_tail,)):
                    assert (x - y).abs().max() <= GRAPH_STATE_RTOL * y.abs().max() + 1e-6, layer
    a, b = outs[0].logits.float().cpu(), outs[1].logits.float().cpu()
    assert (a - b).abs().max() <= 1e-3 * b.abs().max()
    for layer_a, layer_b in zip(outs[0].cache.layers, outs[1].cache.layers):
        for name in ("recurrent_state", "conv_state"):
            if hasattr(layer_a, name):
                x, y = getattr(layer_a, name).float(), getattr(layer_b, name).float()
                assert (x - y).abs().max() <= GRAPH_STATE_RTOL * y.abs().max() + 1e-6, name


def _plan(h, segments, query, mode="hypic", block=None):
    policy = PICConfig(mode=mode, seam=4, cold_policy="inline", segment_min_tokens=0).resolve()
    return plan_request(SegmentedPrompt(tuple(map(tuple, segments)), tuple(query)), policy, store=h.store,
                        keyer=h.keyer, prefix_block_tokens=block)


def test_prefix_checkpoints_and_cold_writes_in_one_forward_on_cuda():
    """A cold forward writing segment entries and prefix-cache checkpoints (the walk records
    every element's state for the segments' S and hands the checkpoints theirs), a segment body
    cut by a checkpoint (its parts composed), then the same prompt again from the checkpoints:
    CUDA against the CPU reference."""
    spec, cpu_model = tiny_model(seed=4, layer_types=DEEP_LAYER_TYPES)
    _, gpu_model = tiny_model(seed=4, layer_types=DEEP_LAYER_TYPES)
    gpu_model = gpu_model.cuda()
    segs = [random_segment(n, seed=20 + n) for n in (70, 45, 90)]
    query = random_segment(12, seed=98)
    out = {}
    for name, h in (("cpu", Harness(cpu_model, spec, "cpu")), ("cuda", Harness(gpu_model, spec, "cuda"))):
        with _plan(h, segs, query, block=64) as plan:
            assert [c.position for c in plan.checkpoints] == [64, 128, 192, 216]  # 64 is inside segment 0's body
            cold = h.runner.prefill([plan])[0]
        with _plan(h, segs, query, block=64) as plan:
            assert plan.prefix_tokens == 216
            again = h.runner.prefill([plan])[0]
        entries = {e.key: e for e in h.store.snapshot()}
        out[name] = (cold.logits.float().cpu(), again.logits.float().cpu(), entries)
    (c_cold, c_again, c_entries), (g_cold, g_again, g_entries) = out["cpu"], out["cuda"]
    assert c_entries.keys() == g_entries.keys() and len(c_entries) == 3 + 4
    for key, want in c_entries.items():
        got = g_entries[key]
        for layer, cache in want.linear.items():
            w = cache.summary.state if hasattr(cache, "summary") else cache.state
            g = got.linear[layer].summary.state if hasattr(cache, "summary") else got.linear[layer].state
            # fla's chunk kernels run fp32 dots in TF32: 1.02e-3 of the scale measured on an H100
            assert (g.float().cpu() - w).abs().max() <= 2e-3 * (w.abs().max() + 1e-3), (key.kind, layer)
    for got, want in ((g_cold, c_cold), (g_again, c_again)):
        assert (got - want).norm() / want.norm() < 1e-2 and got.argmax() == want.argmax()


def test_factored_bodies_are_read_as_dense_t_on_cuda():
    """Short bodies are stored factored on CUDA too, and a later forward forms their dense T for
    the walk: the same logits as bodies stored dense."""
    from hypic.ops.linear.low_rank import LowRankSummary

    spec, model = tiny_model(seed=5, layer_types=DEEP_LAYER_TYPES)
    model = model.cuda()
    segs = [random_segment(n, seed=40 + n) for n in (9, 11, 30, 12)]  # bodies 5, 7, 26, 8 at seam 4
    query = random_segment(6, seed=97)
    factored, dense = Harness(model, spec, "cuda"), Harness(model, spec, "cuda")
    dense.runner._factored = lambda num_tokens: False
    logits = []
    for h in (factored, dense):
        h.run(segs, query)
        logits.append(h.run(segs[::-1], query)[1].logits.float().cpu())
    kinds = {type(c.summary) for e in factored.store.snapshot() for c in e.linear.values()}
    assert LowRankSummary in kinds
    assert (logits[0] - logits[1]).norm() / logits[1].norm() < 1e-3
