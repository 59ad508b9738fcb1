import pytest
import torch

from hypic.bench.floor import WorkCount, WorkModel, visible_pairs
from hypic.bench.flops import flop_model
from hypic.models.config import spec_from_config
from hypic.models.loader import build_empty_model
from hypic.pic.keys import Keyer, KeyNamespace
from hypic.pic.modes import PICConfig
from hypic.pic.plan import plan_request
from hypic.pic.segments import SegmentedPrompt
from hypic.pic.store import SegmentStore
from tests.runner.pic_helpers import TINY_CONFIG

MOE_CONFIG = dict(TINY_CONFIG, model_type="qwen3_5_moe_text", num_experts=8, num_experts_per_tok=2,
                  moe_intermediate_size=32, shared_expert_intermediate_size=32)


def _plan(mode, segments, query, store=None, **kw):
    keyer = Keyer(KeyNamespace("floor-test", "float32"))
    kw.setdefault("segment_min_tokens", 0)
    kw.setdefault("cold_policy", "inline")
    return plan_request(SegmentedPrompt(segments, query), PICConfig(mode=mode, **kw).resolve(),
                        store=store, keyer=keyer)


def test_visible_pairs_full_recompute_is_causal_triangle():
    segs = ((1,) * 5, (2,) * 7)
    plan = _plan("full_recompute", segs, (3,) * 4)
    n = 16
    assert visible_pairs(plan) == n * (n + 1) // 2


def test_visible_pairs_of_seams_and_query():
    # hypic plan, all segments cold (inline): every token live -> the triangle again
    store = SegmentStore(None)
    segs = ((1,) * 10, (2,) * 10)
    plan = _plan("hypic", segs, (3,) * 3, store=store, seam=2)
    assert plan.live_tokens == 23 and visible_pairs(plan) == 23 * 24 // 2
    plan.release()


def test_work_count_floor():
    w = WorkCount(flops=790e12, bytes=2 * 4.3e12, live_tokens=1)
    assert w.floor_s() == pytest.approx(2.0)
    assert WorkCount(flops=3 * 790e12, bytes=0.0, live_tokens=1).floor_s() == pytest.approx(3.0)
    with pytest.raises(ValueError):
        w.floor_s(peak_flops=0)


def test_weight_bytes_dense_and_moe():
    spec = spec_from_config(TINY_CONFIG)
    model = build_empty_model(spec, torch.float32, "cpu")
    wm = WorkModel(spec, model)
    total = sum(p.numel() * 4 for p in model.parameters())
    emb = spec.vocab_size * spec.hidden_size * 4
    assert wm.weight_bytes(10) == total - emb + 10 * spec.hidden_size * 4
    assert wm.kv_bytes_per_token == 2 * 2 * spec.num_key_value_heads * spec.head_dim * 4

    spec = spec_from_config(MOE_CONFIG)
    model = build_empty_model(spec, torch.bfloat16, "cpu")
    wm = WorkModel(spec, model)
    experts = sum(p.numel() * 2 for n, p in model.named_parameters() if ".mlp.experts." in n)
    emb = spec.vocab_size * spec.hidden_size * 2
    rest = sum(p.numel() * 2 for p in model.parameters()) - experts - emb
    # one token touches top-k experts of each MoE layer; many tokens touch all of them
    assert wm.weight_bytes(1) == pytest.approx(rest + experts * 2 / 8 + spec.hidden_size * 2)
    assert wm.weight_bytes(10_000) == pytest.approx(rest + experts + 10_000 * spec.hidden_size * 2)
    assert wm.weight_bytes(0) == 0.0


def test_count_standalone_and_flops():
    spec = spec_from_config(TINY_CONFIG)
    model = build_empty_model(spec, torch.float32, "cpu")
    wm = WorkModel(spec, model)
    fm = flop_model(spec)
    store = SegmentStore(None)
    segs = ((1,) * 10, (2,) * 12)
    plan = _plan("hypic", segs, (3,) * 3, store=store, seam=2, cold_policy="standalone")
    # main pass: seams [0,2) and [10,12) and the query [22,25)
    assert plan.live_tokens == 7
    pairs = (1 + 2) + (11 + 12) + (23 + 24 + 25)
    assert visible_pairs(plan) == pairs
    work = wm.count(plan, written_entry_bytes=100, reread_entry_bytes=100)
    expected = fm.prefill(7, pairs, 1) + fm.prefill(22, 10 * 11 // 2 + 12 * 13 // 2, 0)
    assert work.flops == pytest.approx(expected)
    expected_bytes = (wm.weight_bytes(7) + wm.weight_bytes(22) + (7 + 22) * wm.kv_bytes_per_token + 200)
    assert work.bytes == pytest.approx(expected_bytes)
    assert work.live_tokens == 29
    with pytest.raises(ValueError):
        wm.count(plan, written_entry_bytes=-1)
    plan.release()


def test_count_prefix_cache_reads_kv_of_all_and_state_of_last_checkpoint():
    from tests.runner.pic_helpers import PicHarness, tiny_model

    spec, model = tiny_model()
    harness = PicHarness(spec, model, config=PICConfig(mode="prefix_cache", cold_policy="inline", segment_min_tokens=0))
    segs = [[1] * 8, [2] * 8, [3] * 8]
    with harness.plan(segs, [4] * 3) as plan:
        harness.runner.prefill([plan])
    wm = WorkModel(spec, model)
    with harness.plan(segs, [5] * 3) as plan:
        assert plan.prefix_tokens == 24 and plan.handles == ()
        kv = sum(a.nbytes for h in plan.prefix_handles for a in h.entry.attention.values())
        last = plan.prefix_handles[-1].entry
        state = last.nbytes - sum(a.nbytes for a in last.attention.values())
        work = wm.count(plan)
        assert plan.live_tokens == 3
        expected = wm.weight_bytes(3) + 3 * wm.kv_bytes_per_token + kv + state
        assert work.bytes == pytest.approx(expected)


def test_device_peaks_follow_the_gpu_name():
    from hypic.bench.floor import H100_PEAK_BYTES_PER_S, H200_PEAK_BYTES_PER_S, H200_PEAK_FLOPS, device_peaks

    assert device_peaks("NVIDIA H200") == (H200_PEAK_FLOPS, H200_PEAK_BYTES_PER_S)
    assert device_peaks("NVIDIA H100 80GB HBM3") == (H200_PEAK_FLOPS, H100_PEAK_BYTES_PER_S)
    assert device_peaks("cpu (x86_64, 2 threads)") == (H200_PEAK_FLOPS, H200_PEAK_BYTES_PER_S)
