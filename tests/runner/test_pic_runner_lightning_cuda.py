"""The lightning-attention families on CUDA (fla's chunked simple-GLA kernels, the Triton scan with
scalar T, bodies read through the address table or re-rotated, the MoE kernels, CUDA graphs of the
row-wise phases) against the same requests on CPU (torch references), fp32 and bf16."""

import pytest
import torch

from hypic.models.loader import load_model
from hypic.pic.keys import Keyer, KeyNamespace
from hypic.pic.modes import PICConfig
from hypic.pic.plan import plan_request
from hypic.pic.segments import SegmentedPrompt
from hypic.pic.store import SegmentStore
from hypic.runner.pic_runner import PicRunner
from tests.models._hf import hypic_greedy
from tests.models._lightning import build_minimax, save_ring_checkpoint
from tests.runner.pic_helpers import random_segment

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module", params=("ring", "minimax"))
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param + "_cuda")
    if request.param == "ring":
        save_ring_checkpoint(path)
    else:
        build_minimax(seed=2).save_pretrained(str(path))
    return request.param, str(path)


class Harness:
    def __init__(self, model, spec, device, dtype):
        self.device = torch.device(device)
        self.store = SegmentStore(None, 0, device=self.device)
        self.keyer = Keyer(KeyNamespace("cuda-test", str(dtype)))
        self.runner = PicRunner(model, spec, self.store, self.device, dtype)

    def run(self, segments, query, mode="hypic", cold_policy="inline"):
        policy = PICConfig(mode=mode, seam=4, cold_policy=cold_policy).resolve()
        # prefix_cache mode resumes from checkpoints of the prefix cache's spine: 16 tokens apart here
        block = 16 if policy.mode.uses_prefix_checkpoints else None
        plan = plan_request(SegmentedPrompt(tuple(map(tuple, segments)), tuple(query)), policy, store=self.store,
                            keyer=self.keyer, prefix_block_tokens=block)
        with plan:
            return plan, self.runner.prefill([plan])[0]


def _rel(a, b):
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).norm() / b.norm())


# fla's chunk kernels run fp32 dots in TF32 (2^-11 rounding); the states they carry are fp32. The
# spine of prefix_cache (a chunk boundary every 16 tokens) and addition's uncorrected sums carry
# more of those roundings to the logits: on an H100, Ring's 2.8e-3 (prefix_cache, cold) and
# 6.8e-3 (addition, inline entries) against at most 2e-3 in the other modes. A wrong state,
# span or rotation is off by O(1e-1) or more.
TF32_RTOL = {"hypic": 2e-3, "transition_rope": 2e-3, "transition": 2e-3, "addition": 1e-2, "prefix_cache": 1e-2}


@pytest.mark.parametrize("mode", ["hypic", "transition_rope", "transition", "addition", "prefix_cache"])
@pytest.mark.parametrize("cold_policy", ["inline", "standalone"])
def test_cached_requests_on_cuda_match_cpu(checkpoint, mode, cold_policy):
    name, path = checkpoint
    spec, cpu_model = load_model(path, dtype=torch.float32)
    _, gpu_model = load_model(path, dtype=torch.float32, device="cuda")
    segs = [random_segment(40 + 24 * i, seed=10 + i) for i in range(5)]  # spans past a 64-token chunk
    query = random_segment(12, seed=99)
    cpu, gpu = Harness(cpu_model, spec, "cpu", torch.float32), Harness(gpu_model, spec, "cuda", torch.float32)
    for h in (cpu, gpu):
        _, cold = h.run(list(reversed(segs)), query, mode, cold_policy)
        h.cold = cold
    rtol = TF32_RTOL[mode]
    assert _rel(gpu.cold.logits, cpu.cold.logits) < rtol, (name, mode)
    plan, want = cpu.run(segs, query, mode, cold_policy)
    _, got = gpu.run(segs, query, mode, cold_policy)
    if mode not in ("prefix_cache",):
        assert plan.cached_tokens > 0
    assert _rel(got.logits, want.logits) < rtol, (name, mode)
    for layer in spec.linear_layer_ids:
        assert _rel(got.cache.layers[layer].recurrent_state, want.cache.layers[layer].recurrent_state) < rtol
    assert got.logits.argmax() == want.logits.argmax()


def test_bf16_cached_request_and_greedy_decode_on_cuda(checkpoint):
    name, path = checkpoint
    spec, cpu_model = load_model(path, dtype=torch.float32)
    _, gpu_model = load_model(path, dtype=torch.bfloat16, device="cuda")
    segs = [random_segment(64, seed=20 + i) for i in range(4)]
    query = random_segment(16, seed=7)
    cpu, gpu = Harness(cpu_model, spec, "cpu", torch.float32), Harness(gpu_model, spec, "cuda", torch.bfloat16)
    for h in (cpu, gpu):
        h.run(list(reversed(segs)), query)
    _, want = cpu.run(segs, query)
    _, got = gpu.run(segs, query)
    assert gpu.runner.graphs is not None and not gpu.runner.graphs.failures(), gpu.runner.graphs.failures()
    assert _rel(got.logits, want.logits) < 5e-2
    prompt = [t for s in segs for t in s] + query
    cpu_tokens = hypic_greedy(spec, cpu_model, prompt, 6)
    gpu_tokens = hypic_greedy(spec, gpu_model, prompt, 6, dtype=torch.bfloat16, device="cuda")
    # bf16 may flip a near-tie late; the first tokens agree
    assert gpu_tokens[:2] == cpu_tokens[:2]


@pytest.mark.parametrize("name", ["ring", "minimax"])
def test_all_hit_cores_replay_from_graphs_without_a_host_sync(name, tmp_path, monkeypatch):
    """An all-hit request in bf16 whose layout was seen before (kept graphs): every lightning
    layer takes the chain walk (bodies read through the address table, rotated on load for Ring)
    and replays its core from a graph, nothing in ``lightning_attention`` reads the device back
    (``torch.cuda.set_sync_debug_mode("error")`` around it), and the logits stay near the CPU's.
    16 heads: an entry's per-layer log decays lie 64 bytes apart, so the bodies have an address
    table as at the full models' head counts."""
    from hypic.ops.linear import fla_paths
    from hypic.runner import pic_context
    from tests.models._lightning import RING_CONFIG

    if name == "ring":
        save_ring_checkpoint(tmp_path, dict(RING_CONFIG, num_attention_heads=16))
    else:
        build_minimax(seed=2, num_attention_heads=16).save_pretrained(str(tmp_path))
    spec, cpu_model = load_model(str(tmp_path), dtype=torch.float32)
    _, gpu_model = load_model(str(tmp_path), dtype=torch.bfloat16, device="cuda")
    num_linear = len(spec.linear_layer_ids)
    segs = [random_segment(48, seed=40 + i) for i in range(6)]
    query = random_segment(16, seed=8)
    orders = [[5, 4, 3, 2, 1, 0], [1, 3, 5, 0, 2, 4], [2, 0, 4, 1, 5, 3], [4, 5, 0, 3, 1, 2]]
    cpu, gpu = Harness(cpu_model, spec, "cpu", torch.float32), Harness(gpu_model, spec, "cuda", torch.bfloat16)
    for h in (cpu, gpu):
        h.run([segs[i] for i in orders[0]], query)  # caches every segment
    for order in orders[1:3]:  # the signature's first two forwards: the second's graphs are kept
        gpu.run([segs[i] for i in order], query)
    walks = []
    walk = fla_paths.simple_gla_chain_walk
    monkeypatch.setattr(fla_paths, "simple_gla_chain_walk", lambda *a, **kw: walks.append(1) or walk(*a, **kw))
    attend = pic_context.PicContext.lightning_attention

    def no_sync(self, *args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return attend(self, *args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(pic_context.PicContext, "lightning_attention", no_sync)
    replays = gpu.runner.layout_graphs
    _, got = gpu.run([segs[i] for i in orders[3]], query)
    kept = gpu.runner._replays
    assert replays.num_reused >= 1 and kept is not None and not kept.failures(), kept.failures()
    assert walks == [] and kept.num_replays >= num_linear  # every layer replayed: no eager walk
    _, want = cpu.run([segs[i] for i in orders[3]], query)
    assert _rel(got.logits, want.logits) < 5e-2
    for layer in spec.linear_layer_ids:
        assert _rel(got.cache.layers[layer].recurrent_state, want.cache.layers[layer].recurrent_state) < 5e-2
