"""FlexAttention varlen path (hypic.ops.attention_flex) against the dense oracle and the reference.

Eager flex_attention (CPU) applies ``mask_mod`` to every (query, key) pair and ignores the block
sparsity, so the block mask is tested on its own: every tile holding an allowed pair must be
visited, and a tile marked *full* must hold only allowed, in-bounds pairs. The compiled kernel
(which does skip tiles) is covered by the opt-in ``test_compiled_flex_matches_reference``.
"""

import os
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hypic.ops.attention as attention_module
from hypic.ops.attention import varlen_attention
from hypic.ops.attention_flex import build_varlen_block_mask
from tests.ops.test_attention import _case, _naive

pytestmark = [
    pytest.mark.usefixtures("single_thread_torch"),
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]


def _call(q, k, v, cu_q, cu_k, pq, pk, impl, scale=0.3, **extra):
    return varlen_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, positions_q=pq, positions_k=pk,
                            scale=scale, impl=impl, **extra)


def _interleaved_case(gen, lens_q, lens_cached, hq, hkv, d, dv, dtype):
    """Keys of each sequence: cached positions and the live queries' own positions interleaved
    (live tokens fill random slots of [0, c + n), cached keys the rest), keys stored in a
    random order - the PIC layout with a live token between reused segments."""
    qs, ks, vs, pq, pk = [], [], [], [], []
    for n, c in zip(lens_q, lens_cached):
        slots = torch.randperm(c + n, generator=gen)
        live = slots[:n].sort().values
        pk.append(torch.cat([slots[n:], live])[torch.randperm(c + n, generator=gen)])
        pq.append(live)
        qs.append(torch.randn(n, hq, d, generator=gen, dtype=dtype))
        ks.append(torch.randn(c + n, hkv, d, generator=gen, dtype=dtype))
        vs.append(torch.randn(c + n, hkv, dv, generator=gen, dtype=dtype))
    cu_q = torch.tensor([0] + list(lens_q)).cumsum(0)
    cu_k = torch.tensor([0] + [n + c for n, c in zip(lens_q, lens_cached)]).cumsum(0)
    return torch.cat(qs), torch.cat(ks), torch.cat(vs), cu_q, cu_k, torch.cat(pq), torch.cat(pk)


@settings(max_examples=12, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 30)), min_size=1, max_size=4),
    heads=st.sampled_from([(4, 4), (4, 2), (6, 1)]),
    layout=st.sampled_from(["sorted", "shuffled", "interleaved"]),
    seed=st.integers(0, 10**6),
)
def test_flex_matches_dense_oracle(lens, heads, layout, seed):
    gen = torch.Generator().manual_seed(seed)
    lens_q, extra = [n for n, _ in lens], [c for _, c in lens]
    if layout == "interleaved":
        case = _interleaved_case(gen, lens_q, extra, heads[0], heads[1], 8, 5, torch.float64)
    else:
        case = _case(gen, lens_q, extra, heads[0], heads[1], 8, 5, torch.float64, layout == "shuffled")
    out = _call(*case, impl="flex")
    assert out.shape == (case[0].shape[0], heads[0], 5) and out.is_contiguous()
    torch.testing.assert_close(out, _naive(*case, 0.3), atol=1e-10, rtol=0)


def test_flex_fp32_long_sequences_cross_tile_boundaries():
    """Sequences longer than one 128-row tile, starting mid-tile, fp32, GQA, default scale."""
    gen = torch.Generator().manual_seed(5)
    case = _interleaved_case(gen, [131, 1, 260], [100, 300, 5], 8, 2, 16, 16, torch.float32)
    out = _call(*case, impl="flex", scale=None)
    ref = _call(*case, impl="reference", scale=None)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(out.double(), _naive(*case, 16**-0.5), atol=2e-6, rtol=0)


def _tile_sets(counts, indices):
    return [set(indices[0, 0, i, : int(counts[0, 0, i])].tolist()) for i in range(counts.shape[-1])]


def _check_block_mask(cu_q, cu_k, pq, pk, block):
    num_q, num_k = pq.numel(), pk.numel()
    mask = build_varlen_block_mask(cu_q, cu_k, pq, pk, block_size=block)
    seq_q = torch.repeat_interleave(torch.arange(len(cu_q) - 1), torch.diff(cu_q))
    seq_k = torch.repeat_interleave(torch.arange(len(cu_k) - 1), torch.diff(cu_k))
    allowed = (seq_q[:, None] == seq_k[None, :]) & (pk[None, :] <= pq[:, None])
    # The mask_mod itself agrees with the token-level definition.
    got = mask.mask_mod(0, 0, torch.arange(num_q)[:, None], torch.arange(num_k)[None, :])
    assert torch.equal(got, allowed)
    partial = _tile_sets(mask.kv_num_blocks, mask.kv_indices)
    full = _tile_sets(mask.full_kv_num_blocks, mask.full_kv_indices)
    tiles_q, tiles_k = len(partial), mask.kv_indices.shape[-1]
    assert tiles_q == max(1, -(-num_q // block)) and tiles_k == max(1, -(-num_k // block))
    exact_any = torch.zeros(tiles_q, tiles_k, dtype=torch.bool)
    for i in range(tiles_q):
        assert not (partial[i] & full[i])
        rows = slice(i * block, (i + 1) * block)
        for j in range(tiles_k):
            tile = allowed[rows, j * block : (j + 1) * block]
            exact_any[i, j] = bool(tile.any())
            if exact_any[i, j]:
                assert j in partial[i] | full[i], (i, j)
            if j in full[i]:
                assert tile.shape == (block, block) and bool(tile.all()), (i, j)
    return partial, full, exact_any


@settings(max_examples=20, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=5),
    layout=st.sampled_from(["sorted", "shuffled", "interleaved"]),
    block=st.sampled_from([1, 2, 4, 8]),
    seed=st.integers(0, 10**6),
)
def test_block_mask_never_skips_allowed_pairs_nor_unmasks_forbidden_ones(lens, layout, block, seed):
    gen = torch.Generator().manual_seed(seed)
    lens_q, extra = [n for n, _ in lens], [c for _, c in lens]
    if layout == "interleaved":
        case = _interleaved_case(gen, lens_q, extra, 1, 1, 1, 1, torch.float32)
    else:
        case = _case(gen, lens_q, extra, 1, 1, 1, 1, torch.float32, layout == "shuffled")
    _check_block_mask(*case[3:], block)


def test_block_mask_is_tight_for_one_sorted_sequence():
    """Full recompute of one sequence (keys = positions 0..n-1 in order): exactly the causal tiles
    are visited, and every complete tile strictly below the diagonal is full."""
    n, block = 37, 4
    pos = torch.arange(n)
    cu = torch.tensor([0, n])
    partial, full, exact_any = _check_block_mask(cu, cu, pos, pos, block)
    tiles = exact_any.shape[0]
    for i in range(tiles):
        assert partial[i] | full[i] == {j for j in range(tiles) if exact_any[i, j]}
        complete_row = (i + 1) * block <= n
        assert full[i] == ({j for j in range(i)} if complete_row else set())


@pytest.mark.parametrize("impl", ["flex", "reference"])
def test_nan_poisoned_fresh_buffers_are_fully_overwritten(impl, monkeypatch):
    real_empty_like, real_empty = torch.empty_like, torch.empty

    def nan_empty_like(*args, **kwargs):
        out = real_empty_like(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    def nan_empty(*args, **kwargs):
        out = real_empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty_like", nan_empty_like)
    monkeypatch.setattr(torch, "empty", nan_empty)
    gen = torch.Generator().manual_seed(11)
    case = _interleaved_case(gen, [3, 0, 140], [9, 4, 20], 4, 2, 8, 8, torch.float64)
    out = _call(*case, impl=impl)
    assert not bool(out.isnan().any())
    torch.testing.assert_close(out, _naive(*case, 0.3), atol=1e-10, rtol=0)


def test_block_mask_cache_follows_layout_key():
    gen = torch.Generator().manual_seed(2)
    q, k, v, cu_q, cu_k, pq, pk = _case(gen, [5, 3], [4, 2], 2, 2, 8, 8, torch.float64, False)

    class Forward:  # stands for a forward context: alive while its layout is in use
        pass

    key = Forward()
    first = attention_module._cached_block_mask(cu_q, cu_k, pq, pk, q.device, key)
    assert attention_module._cached_block_mask(cu_q, cu_k, pq, pk, q.device, key) is first
    # A new forward (new key) rebuilds, as does every call without a key.
    other = Forward()
    second = attention_module._cached_block_mask(cu_q, cu_k, pq, pk, q.device, other)
    assert second is not first
    assert attention_module._cached_block_mask(cu_q, cu_k, pq, pk, q.device, None) is not second
    assert attention_module._cached_block_mask(cu_q, cu_k, pq, pk, q.device, None) is not second
    # Inference tensors (no version counter) work too.
    with torch.inference_mode():
        layout = [t.clone() for t in (cu_q, cu_k, pq, pk)]
        third = attention_module._cached_block_mask(*layout, q.device, key)
        assert attention_module._cached_block_mask(*layout, q.device, key) is third


def test_flash_preference_from_the_environment_falls_back_on_pic_layouts(monkeypatch):
    gen = torch.Generator().manual_seed(6)
    case = _interleaved_case(gen, [3, 5], [9, 4], 4, 2, 8, 8, torch.float64)
    monkeypatch.setenv("HYPIC_ATTENTION_IMPL", "flash")
    out = _call(*case, impl="auto")  # not index-causal: the automatic choice, no error
    torch.testing.assert_close(out, _naive(*case, 0.3), atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="causal by index"):
        _call(*case, impl="flash")  # an explicit request still refuses


def test_dispatch_and_validation(monkeypatch):
    gen = torch.Generator().manual_seed(4)
    case = _case(gen, [3, 2], [2, 0], 4, 2, 8, 8, torch.float64, False)
    calls = []
    real = attention_module.flex_varlen_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention_module, "flex_varlen_attention", spy)
    monkeypatch.delenv("HYPIC_ATTENTION_IMPL", raising=False)
    _call(*case, impl="auto")  # CPU: the reference
    assert calls == []
    monkeypatch.setenv("HYPIC_ATTENTION_IMPL", "flex")
    _call(*case, impl="auto")
    assert calls == [1]
    _call(*case, impl="reference")  # an explicit impl beats the environment
    assert calls == [1]
    monkeypatch.setenv("HYPIC_ATTENTION_IMPL", "fast")
    with pytest.raises(ValueError, match="HYPIC_ATTENTION_IMPL"):
        _call(*case, impl="auto")
    with pytest.raises(ValueError, match="impl must be one of"):
        _call(*case, impl="fast")
    q, k, v, cu_q, cu_k, pq, pk = case
    with pytest.raises(ValueError, match="no key at or before"):
        _call(q, k, v, cu_q, cu_k, pq - 10, pk, impl="flex")
    with pytest.raises(ValueError, match="no key at or before"):  # sequence 1 has queries, no keys
        _call(q, k, v, cu_q, torch.tensor([0, 7, 7]), pq, pk, impl="flex")
    with pytest.raises(ValueError, match="cu_seqlens_k must start at 0"):
        _call(q, k, v, cu_q, torch.tensor([0, 8, 7]), pq, pk, impl="flex")
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0"):
        _call(q, k, v, torch.tensor([1, 3, 5]), cu_k, pq, pk, impl="flex")
    empty = _call(q[:0], k, v, torch.tensor([0, 0, 0]), cu_k, pq[:0], pk, impl="flex")
    assert empty.shape == (0, 4, 8)


@pytest.mark.skipif(os.environ.get("HYPIC_RUN_COMPILE_TESTS") != "1",
                    reason="compiles flex_attention (~40 s on CPU); set HYPIC_RUN_COMPILE_TESTS=1")
def test_compiled_flex_matches_reference(monkeypatch):
    """The compiled kernel skips tiles the block mask leaves out and drops the mask on full
    tiles, so this is the test of the block mask in use (CUDA if present, else CPU inductor,
    which only builds the flex template for static shapes). Two layouts: the second call is a
    new shape, i.e. a recompile (or, dynamic on CUDA, a reuse)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        monkeypatch.setenv("HYPIC_FLEX_COMPILE", "static")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(9)
    for lens_q, cached in (([300, 7, 200], [40, 260, 0]), ([130, 1], [500, 3])):
        case = _interleaved_case(gen, lens_q, cached, 8, 2, 64, 64, torch.float32)
        case = [t.to(device, dtype) for t in case[:3]] + [t.to(device) for t in case[3:]]
        from hypic.ops.attention_flex import flex_varlen_attention

        mask = build_varlen_block_mask(*case[3:])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = flex_varlen_attention(*case[:3], block_mask=mask, scale=0.125, use_compile=True)
        ref = _call(*[t.float() for t in case[:3]], *case[3:], impl="reference", scale=0.125)
        tol = 2e-2 if dtype == torch.bfloat16 else 2e-5
        torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_flex_path_is_sync_free():
    """After a warm-up call (compilation may synchronise), a call with a new layout - value
    checks, block-mask build and the compiled kernel - must not synchronise with the host."""
    gen = torch.Generator().manual_seed(12)
    warm = _interleaved_case(gen, [200, 9], [300, 40], 16, 2, 256, 256, torch.float32)
    case = _interleaved_case(gen, [150, 30, 3], [500, 0, 77], 16, 2, 256, 256, torch.float32)
    warm, case = ([t.cuda().bfloat16() if t.is_floating_point() else t.cuda() for t in c] for c in (warm, case))
    _call(*warm, impl="auto")
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = _call(*case, impl="auto")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref = _call(*[t.float() for t in case[:3]], *case[3:], impl="reference")
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
