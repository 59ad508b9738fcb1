"""Per-forward graphs of the linear layers' cores (hypic.graphs.layer_graphs), on the CPU with a
backend that has a CUDA graph's semantics: a capture records the call on its static inputs, a
replay runs it again on whatever those inputs hold then and writes the results into the
capture's output tensors. The CUDA backend itself is tested in tests/engine/test_pic_runner_cuda.py."""

import pytest
import torch

from hypic.graphs import layer_graphs
from hypic.graphs.layer_graphs import LayerReplays
from hypic.runner.pic_runner import PicRunner
from hypic.pic.keys import Keyer, KeyNamespace
from hypic.pic.modes import PICConfig
from hypic.pic.plan import plan_request
from hypic.pic.segments import SegmentedPrompt
from hypic.pic.store import SegmentStore
from tests.runner.pic_helpers import DEEP_LAYER_TYPES, random_segment, tiny_model


def _flat(out):
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


class RecordingBackend:
    def __init__(self, fail: bool = False):
        self.fail = fail
        self.replayed = 0

    def capture(self, fn, inputs):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        out = fn(*inputs)
        return (fn, inputs, out), out

    def replay(self, graph):
        fn, inputs, out = graph
        for o, n in zip(_flat(out), _flat(fn(*inputs))):
            if o is not None:
                o.copy_(n)
        self.replayed += 1


def core(x, w, bias):
    y = x * w if bias is None else x * w + bias
    return y + 1, y.sum(0)


def test_first_call_eager_second_captured_then_replays_with_the_moved_inputs_copied():
    backend = RecordingBackend()
    replays = LayerReplays(backend)
    x = torch.randn(5, 3)  # the same buffer every call, as a row-wise phase's output
    for i in range(6):
        x.copy_(torch.randn(5, 3))
        w = torch.randn(5, 3)  # a new tensor every call, as a layer's weight
        y, s = replays.run("core", core, x, w, None, stable=(0,))
        want_y, want_s = core(x, w, None)
        torch.testing.assert_close(y, want_y)
        torch.testing.assert_close(s, want_s)
    assert replays.num_captures == 1 and replays.num_replays == 4 and backend.replayed == 4
    slot = replays._slots["core"]
    assert slot.in_place == (True, False, False)
    assert slot.inputs[0] is x and slot.inputs[1] is not w and slot.inputs[2] is None


def test_outputs_are_the_graphs_buffers_rewritten_by_the_next_replay():
    replays = LayerReplays(RecordingBackend())
    x = torch.ones(4, 2)
    for _ in range(3):
        out, _ = replays.run("core", core, x, torch.full((4, 2), 2.0), None)
    kept = out.clone()
    out2, _ = replays.run("core", core, x, torch.full((4, 2), 5.0), None)
    assert out2 is out  # the same buffer: the caller clones what it keeps
    torch.testing.assert_close(kept, torch.full((4, 2), 3.0))
    torch.testing.assert_close(out, torch.full((4, 2), 6.0))


def test_calls_that_do_not_fit_the_capture_run_eagerly():
    replays = LayerReplays(RecordingBackend())
    x = torch.randn(5, 3)
    w = torch.randn(5, 3)
    for _ in range(3):
        replays.run("core", core, x, w, None, stable=(0, 1))
    replays_before = replays.num_replays
    elsewhere = x.clone()  # an input read in place that moved
    y, _ = replays.run("core", core, elsewhere, w, None, stable=(0, 1))
    torch.testing.assert_close(y, core(elsewhere, w, None)[0])
    bias = torch.randn(5, 3)  # None became a tensor
    y, _ = replays.run("core", core, x, w, bias)
    torch.testing.assert_close(y, core(x, w, bias)[0])
    y, _ = replays.run("core", core, x, torch.randn(5, 3).double(), None)  # another dtype
    assert y.dtype == torch.float64
    assert replays.num_replays == replays_before
    replays.run("core", core, x, w, None, stable=(0, 1))  # fits again: replayed
    assert replays.num_replays == replays_before + 1


def test_a_failed_capture_runs_eagerly_and_says_why():
    replays = LayerReplays(RecordingBackend(fail=True))
    x = torch.randn(5, 3)
    for _ in range(4):
        w = torch.randn(5, 3)
        y, _ = replays.run("core", core, x, w, None)
        torch.testing.assert_close(y, core(x, w, None)[0])
    assert replays.num_captures == 0 and replays.num_replays == 0
    assert "capturing" in replays.failures()["core"]


def test_shapes_that_change_between_the_first_two_calls_are_never_captured():
    replays = LayerReplays(RecordingBackend())
    replays.run("core", core, torch.randn(5, 3), torch.randn(5, 3), None)
    for _ in range(3):
        x, w = torch.randn(6, 3), torch.randn(6, 3)
        y, _ = replays.run("core", core, x, w, None)
        torch.testing.assert_close(y, core(x, w, None)[0])
    assert replays.num_captures == 0 and "shapes" in replays.failures()["core"]


def test_a_cached_request_with_replayed_conv_cores_matches_the_eager_forward(monkeypatch):
    # Every linear layer after the second replays the first conv core captured: the result must
    # equal the eager forward's (the core depends on its inputs and the layout alone, and the
    # tails recorded per layer are copies, not the graph's buffer).
    spec, model = tiny_model(seed=5, layer_types=DEEP_LAYER_TYPES)
    store = SegmentStore(None, 0, device="cpu")
    keyer = Keyer(KeyNamespace("replays", "float32"))
    runner = PicRunner(model, spec, store, torch.device("cpu"), torch.float32)
    made = []

    def replays_for(layout):
        if layout.writes or layout.linear_one_run_per_request:
            return None
        made.append(LayerReplays(RecordingBackend()))
        return made[-1]

    segs = [random_segment(24 + 8 * i, seed=i) for i in range(4)]
    query = random_segment(10, seed=50)
    policy = PICConfig(mode="hypic", seam=4, cold_policy="inline", segment_min_tokens=0).resolve()

    def run():
        plan = plan_request(SegmentedPrompt(tuple(map(tuple, segs)), tuple(query)), policy, store=store,
                            keyer=keyer)
        with plan:
            return plan, runner.prefill([plan])[0]

    segs.reverse()
    run()  # cold: caches every segment
    segs.reverse()
    plan, eager = run()
    assert plan.cached_tokens > 0
    monkeypatch.setattr(runner, "_layer_replays", replays_for)
    _, replayed = run()
    assert made and made[-1].num_captures >= 1 and made[-1].num_replays >= 1, made[-1].failures()
    torch.testing.assert_close(replayed.logits, eager.logits)
    for a, b in zip(replayed.cache.layers, eager.cache.layers):
        if hasattr(a, "conv_state"):
            torch.testing.assert_close(a.conv_state, b.conv_state)
            torch.testing.assert_close(a.recurrent_state, b.recurrent_state)


class _Layout:
    def __init__(self, signature, buffer):
        self.index_signature, self.index_device = signature, buffer


def test_layout_graphs_keep_the_last_layouts_by_signature():
    kept = layer_graphs.LayoutGraphs(max_layouts=2)
    made = []

    def make():
        made.append(LayerReplays(RecordingBackend()))
        return made[-1]

    def layout(sig, buffer=None):
        return _Layout(sig, torch.zeros(4, dtype=torch.long) if buffer is None else buffer)

    seen_once = layout("A")
    kept.replays_for(seen_once, make)  # a signature's first forward: remembered, not kept
    assert kept.buffer_for("A") is None and not kept.keeps(seen_once) and len(kept) == 0
    a = layout("A")
    first = kept.replays_for(a, make)  # its second: kept from now on
    assert first is made[-1] and kept.buffer_for("A") is a.index_device and kept.keeps(a)
    again = layout("A", a.index_device)  # a later layout built into the kept buffer
    assert kept.replays_for(again, make) is first and kept.num_reused == 1 and len(made) == 2
    elsewhere = layout("A")  # same signature, its own buffer
    assert not kept.keeps(elsewhere)
    replaced = kept.replays_for(elsewhere, make)
    assert replaced is not first and kept.buffer_for("A") is elsewhere.index_device
    for sig in ("B", "B"):
        kept.replays_for(layout(sig), make)
    kept.replays_for(layout("A", elsewhere.index_device), make)  # A used last: B is the oldest
    for sig in ("C", "C"):
        kept.replays_for(layout(sig), make)
    assert len(kept) == 2 and kept.buffer_for("B") is None and kept.buffer_for("A") is not None
    for i in range(layer_graphs.SEEN_SIGNATURES + 1):  # signatures seen once are forgotten in turn
        kept.replays_for(layout(("D", i)), make)
    kept.replays_for(layout(("D", 0)), make)
    assert kept.buffer_for(("D", 0)) is None
    none_kept = layer_graphs.LayoutGraphs(max_layouts=0)
    assert none_kept.replays_for(a, make) is made[-1]
    assert len(none_kept) == 0 and none_kept.buffer_for("A") is None
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_layouts"):
            layer_graphs.LayoutGraphs(max_layouts=bad)
    assert layer_graphs.LayoutGraphs().max_layouts == layer_graphs.MAX_KEPT_LAYOUTS


def test_a_capture_holds_the_holder_of_its_forward():
    replays = LayerReplays(RecordingBackend())
    x = torch.randn(5, 3)
    for forward in range(3):
        holder = object()
        replays.holder = holder
        for _ in range(2):
            replays.run("core", core, x, torch.randn(5, 3), None, stable=(0,))
        if forward == 0:
            first = holder
    # only the forward that captured is held (later forwards replay what it captured)
    assert replays._held == [first]


def _pool_runner(namespace: str):
    """``(spec, runner, run)``: a CPU PicRunner over a pool of four segments (24-48 tokens) and
    ``run(order, query_seed, num_segs=4)``, one request of the pool's segments in that order."""
    spec, model = tiny_model(seed=5, layer_types=DEEP_LAYER_TYPES)
    store = SegmentStore(None, 0, device="cpu")
    keyer = Keyer(KeyNamespace(namespace, "float32"))
    runner = PicRunner(model, spec, store, torch.device("cpu"), torch.float32)
    segs = [random_segment(24 + 8 * i, seed=i) for i in range(4)]
    policy = PICConfig(mode="hypic", seam=4, cold_policy="inline", segment_min_tokens=0).resolve()

    def run(order, query_seed, num_segs=4):
        prompt = SegmentedPrompt(tuple(tuple(segs[i]) for i in order[:num_segs]),
                                 tuple(random_segment(10, seed=query_seed)))
        plan = plan_request(prompt, policy, store=store, keyer=keyer)
        with plan:
            return runner.prefill([plan])[0]

    return spec, runner, run


def test_all_hit_forwards_of_one_signature_replay_every_layer_from_the_kept_graphs(monkeypatch):
    # Requests of one pool in new orders share a layout signature: the second such forward
    # builds its tables into the first's buffer and replays every linear layer's core, the
    # first included, with results equal to an eager forward's; a request of another shape gets
    # graphs of its own.
    spec, runner, run = _pool_runner("kept")
    orders = [[3, 2, 1, 0], [1, 3, 0, 2], [2, 0, 3, 1], [0, 1, 2, 3]]
    num_linear = sum(t == "linear_attention" for t in spec.layer_types)

    run(orders[0], 50)  # cold: caches every segment
    eager = [run(orders[i], 60 + i) for i in (1, 2)] + [run(orders[3], 70, num_segs=3)]
    monkeypatch.setattr(runner, "_core_graphs_on", lambda: True)
    monkeypatch.setattr(runner, "_replays_backend", RecordingBackend)
    monkeypatch.setattr(runner, "_max_core_graph_tokens", lambda: 1 << 20)
    run(orders[2], 90)  # the signature's first forward: its graphs are not kept
    assert len(runner.layout_graphs) == 0
    first = run(orders[1], 61)  # its second: kept
    replays = runner._replays
    assert replays is not None and replays.num_captures >= 1, replays.failures()
    captures, done = replays.num_captures, replays.num_replays
    second = run(orders[2], 62)
    assert runner._replays is replays and runner.layout_graphs.num_reused == 1
    assert replays.num_captures == captures and replays.num_replays == done + num_linear
    other = run(orders[3], 70, num_segs=3)  # another signature, seen once: not kept
    assert runner._replays is not replays and len(runner.layout_graphs) == 1
    for got, want in zip((first, second, other), eager):
        torch.testing.assert_close(got.logits, want.logits)
        for a, b in zip(got.cache.layers, want.cache.layers):
            if hasattr(a, "conv_state"):
                torch.testing.assert_close(a.conv_state, b.conv_state)
                torch.testing.assert_close(a.recurrent_state, b.recurrent_state)


def test_a_forward_with_writes_replays_graphs_of_its_own_never_kept(monkeypatch):
    # A cached request with missed segments (a RAG request) writes their entries: its cores
    # replay graphs of its own (on the CPU the conv cores), which are never kept across forwards
    # (what they read of the written spans is not in the layout's signature); its logits, caches
    # and new entries equal an eager forward's.
    spec, model = tiny_model(seed=5, layer_types=DEEP_LAYER_TYPES)
    policy = PICConfig(mode="hypic", seam=4, cold_policy="inline", segment_min_tokens=0).resolve()
    old = [random_segment(24 + 8 * i, seed=i) for i in range(4)]
    new = [random_segment(30, seed=40), random_segment(20, seed=41)]
    prompt = SegmentedPrompt(tuple(map(tuple, [old[0], new[0], old[1], old[2], new[1], old[3]])),
                             tuple(random_segment(10, seed=50)))
    results = []
    for graphs_on in (True, False):
        store = SegmentStore(None, 0, device="cpu")
        keyer = Keyer(KeyNamespace("writes", "float32"))
        runner = PicRunner(model, spec, store, torch.device("cpu"), torch.float32)
        cold = plan_request(SegmentedPrompt(tuple(map(tuple, old)), (1, 2, 3)), policy, store=store, keyer=keyer)
        with cold:
            runner.prefill([cold])
        before = set(store.device_lru_order())
        if graphs_on:
            monkeypatch.setattr(runner, "_core_graphs_on", lambda: True)
            monkeypatch.setattr(runner, "_replays_backend", RecordingBackend)
            monkeypatch.setattr(runner, "_max_core_graph_tokens", lambda: 1 << 20)
        plan = plan_request(prompt, policy, store=store, keyer=keyer)
        with plan:
            out = runner.prefill([plan])[0]
        assert plan.cached_tokens > 0
        if graphs_on:
            replays = runner._replays
            assert replays is not None and replays.num_captures >= 1 and replays.num_replays >= 1, \
                replays.failures()
            assert len(runner.layout_graphs) == 0
        added = sorted(set(store.device_lru_order()) - before, key=repr)
        assert len(added) == 2
        entries = []
        for key in added:
            with store.acquire(key) as handle:
                entries.append(handle.entry)
        results.append((out, entries))
    (got, got_entries), (want, want_entries) = results
    torch.testing.assert_close(got.logits, want.logits)
    for a, b in zip(got.cache.layers, want.cache.layers):
        if hasattr(a, "conv_state"):
            torch.testing.assert_close(a.conv_state, b.conv_state)
            torch.testing.assert_close(a.recurrent_state, b.recurrent_state)
    for ea, eb in zip(got_entries, want_entries):
        for layer, lin in ea.linear.items():
            torch.testing.assert_close(lin.conv_tail, eb.linear[layer].conv_tail)
            for x, y in zip(lin.summary.parts(), eb.linear[layer].summary.parts()):
                torch.testing.assert_close(x, y)
        for layer, att in ea.attention.items():
            torch.testing.assert_close(att.key, eb.attention[layer].key)


def test_a_large_forward_on_a_new_layout_runs_its_cores_eagerly(monkeypatch):
    # A forward that writes nothing, on a layout seen for the first time, with at least
    # FRESH_EAGER_LIVE_TOKENS live tokens (GPU-bound on the H200) captures nothing; its
    # signature's second forward (kept) captures.
    from hypic.runner import pic_runner

    _, runner, run = _pool_runner("fresh")

    run([3, 2, 1, 0], 50)  # cold: caches every segment
    eager = [run([2, 0, 3, 1], 61), run([0, 2, 1, 3], 62)]  # no graphs (CPU): no signature seen
    monkeypatch.setattr(runner, "_core_graphs_on", lambda: True)
    monkeypatch.setattr(runner, "_replays_backend", RecordingBackend)
    monkeypatch.setattr(runner, "_max_core_graph_tokens", lambda: 1 << 20)
    monkeypatch.setattr(pic_runner, "FRESH_EAGER_LIVE_TOKENS", 8)  # the tiny forward counts as large
    fresh = run([2, 0, 3, 1], 61)  # a new signature
    assert runner._replays is None
    kept = run([0, 2, 1, 3], 62)  # the same signature again: kept, captured
    assert runner._replays is not None and runner._replays.num_captures >= 1 and len(runner.layout_graphs) == 1
    for got, want in zip((fresh, kept), eager):
        torch.testing.assert_close(got.logits, want.logits)


@pytest.mark.cuda
def test_a_failed_cuda_capture_runs_eagerly_and_leaves_random_ops_usable():
    from hypic.graphs.layer_graphs import CudaGraphBackend

    replays = LayerReplays(CudaGraphBackend(torch.device("cuda"), torch.cuda.graph_pool_handle()))

    def syncing(x):
        return x * float(x.abs().max())  # a host read: not capturable

    x = torch.ones(4, device="cuda")
    for _ in range(3):
        assert torch.equal(replays.run("core", syncing, x), x)
    assert replays.num_captures == 0 and replays.failures()["core"]
    assert torch.randn(4, device="cuda").isfinite().all()


def test_releasing_the_generator_swaps_in_a_clone_and_never_raises(monkeypatch, caplog):
    class FakeGenerator:
        def __init__(self, fail=False):
            self.fail, self.state = fail, "capturing"

        def clone_state(self):
            return "clone"

        def graphsafe_set_state(self, state):
            if self.fail:
                raise RuntimeError("no")
            self.state = state

    gens = [FakeGenerator(), FakeGenerator(fail=True)]
    monkeypatch.setattr(torch.cuda, "default_generators", gens)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    layer_graphs.release_rng_after_failed_capture(torch.device("cuda"))
    assert gens[0].state == "clone"
    layer_graphs.release_rng_after_failed_capture(torch.device("cuda", 1))  # logged, not raised
    assert gens[1].state == "capturing" and "cuda:1" in caplog.text
