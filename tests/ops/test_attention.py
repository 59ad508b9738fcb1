import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hypic.ops.attention import varlen_attention


def _naive(q, k, v, cu_q, cu_k, pos_q, pos_k, scale):
    """Dense reference: one [Tq, Tk] score matrix over the whole batch, masked by sequence id
    and position, computed in fp64."""
    seq_q = torch.repeat_interleave(torch.arange(len(cu_q) - 1), torch.diff(cu_q))
    seq_k = torch.repeat_interleave(torch.arange(len(cu_k) - 1), torch.diff(cu_k))
    groups = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(groups, dim=1)
    vv = v.double().repeat_interleave(groups, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kk) * scale
    allowed = (seq_q[:, None] == seq_k[None, :]) & (pos_k[None, :] <= pos_q[:, None])
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv)


def _case(gen, lens_q, lens_k_extra, hq, hkv, d, dv, dtype, shuffle_keys, interleave=False):
    """Sequences whose keys are a cached prefix (positions 0..c-1, optionally shuffled) plus the
    live queries' own keys at positions c..c+n-1; or, ``interleave``, cached positions and the
    live queries' own interleaved (live tokens fill random slots of [0, c + n), cached keys the
    rest), keys stored in a random order - the PIC layout with a live token between reused
    segments."""
    qs, ks, vs, pq, pk = [], [], [], [], []
    for n, c in zip(lens_q, lens_k_extra):
        if interleave:
            slots = torch.randperm(c + n, generator=gen)
            live = slots[:n].sort().values
            positions = torch.cat([slots[n:], live])[torch.randperm(c + n, generator=gen)]
        else:
            positions = torch.arange(c + n)
            if shuffle_keys:
                positions = positions[torch.randperm(c + n, generator=gen)]
            live = torch.arange(c, c + n)
        pk.append(positions)
        pq.append(live)
        qs.append(torch.randn(n, hq, d, generator=gen, dtype=dtype))
        ks.append(torch.randn(c + n, hkv, d, generator=gen, dtype=dtype))
        vs.append(torch.randn(c + n, hkv, dv, generator=gen, dtype=dtype))
    cu_q = torch.tensor([0] + list(lens_q)).cumsum(0)
    cu_k = torch.tensor([0] + [n + c for n, c in zip(lens_q, lens_k_extra)]).cumsum(0)
    return torch.cat(qs), torch.cat(ks), torch.cat(vs), cu_q, cu_k, torch.cat(pq), torch.cat(pk)


def poison_fresh_buffers(monkeypatch):
    """Every buffer allocated uninitialised (``torch.empty``, ``torch.empty_like``) is filled with
    NaN: a row an op fails to write surfaces as NaN in its output."""
    real_empty_like, real_empty = torch.empty_like, torch.empty

    def nan_empty_like(*args, **kwargs):
        out = real_empty_like(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    def nan_empty(*args, **kwargs):
        out = real_empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty_like", nan_empty_like)
    monkeypatch.setattr(torch, "empty", nan_empty)


@settings(max_examples=25, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 7)), min_size=1, max_size=4),
    heads=st.sampled_from([(4, 4), (4, 2), (6, 1)]),
    block=st.sampled_from([None, 1, 3]),
    layout=st.sampled_from(["sorted", "shuffled", "interleaved"]),
    seed=st.integers(0, 1000),
)
def test_matches_naive_dense(lens, heads, block, layout, seed):
    gen = torch.Generator().manual_seed(seed)
    lens_q = [n for n, _ in lens]
    extra = [c for _, c in lens]  # cached keys beside the live ones (sequences may have no queries)
    q, k, v, cu_q, cu_k, pq, pk = _case(gen, lens_q, extra, heads[0], heads[1], 8, 5, torch.float64,
                                        layout == "shuffled", interleave=layout == "interleaved")
    out = varlen_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, positions_q=pq, positions_k=pk,
                           scale=0.3, block_size=block)
    torch.testing.assert_close(out, _naive(q, k, v, cu_q, cu_k, pq, pk, 0.3), atol=1e-10, rtol=0)


def test_fp32_default_scale_and_decode_shape():
    gen = torch.Generator().manual_seed(0)
    q, k, v, cu_q, cu_k, pq, pk = _case(gen, [1, 1, 1], [5, 0, 12], 4, 2, 16, 16, torch.float32, False)
    out = varlen_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, positions_q=pq, positions_k=pk)
    assert out.shape == (3, 4, 16) and out.dtype == torch.float32
    ref = _naive(q, k, v, cu_q, cu_k, pq, pk, 16**-0.5)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)


def test_gap_in_positions_is_by_position_not_index():
    """A query attends keys by position: a key stored later in the buffer but at an earlier
    position is visible; a key at a later position is not."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 4, generator=gen, dtype=torch.float64)
    k = torch.randn(3, 2, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(3, 2, 4, generator=gen, dtype=torch.float64)
    pk = torch.tensor([100, 3, 7])
    out = varlen_attention(q, k, v, cu_seqlens_q=torch.tensor([0, 1]), cu_seqlens_k=torch.tensor([0, 3]),
                           positions_q=torch.tensor([7]), positions_k=pk)
    ref = varlen_attention(q, k[1:], v[1:], cu_seqlens_q=torch.tensor([0, 1]), cu_seqlens_k=torch.tensor([0, 2]),
                           positions_q=torch.tensor([7]), positions_k=pk[1:])
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(k=torch.zeros(4, 3, 8), v=torch.zeros(4, 3, 8)), "multiple of kv heads"),
        (dict(q=torch.zeros(4, 4)), "rank-3"),
        (dict(cu_seqlens_q=torch.tensor([0, 3])), "end at 4"),
        (dict(positions_k=torch.zeros(3, dtype=torch.long)), "positions_k"),
        (dict(positions_q=torch.full((4,), -1)), "no key at or before"),
        (dict(v=torch.zeros(4, 2, 8, dtype=torch.float64)), "share a dtype"),
    ],
)
def test_validation(kwargs, message):
    args = dict(q=torch.zeros(4, 4, 8), k=torch.zeros(4, 2, 8), v=torch.zeros(4, 2, 8),
                cu_seqlens_q=torch.tensor([0, 4]), cu_seqlens_k=torch.tensor([0, 4]),
                positions_q=torch.arange(4), positions_k=torch.arange(4))
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        varlen_attention(**args)


def test_interleaved_pic_layout_into_nan_poisoned_buffers(monkeypatch):
    """Live queries between cached keys, keys in a random order, sequences longer than a query
    block, into NaN-poisoned buffers."""
    poison_fresh_buffers(monkeypatch)
    gen = torch.Generator().manual_seed(11)
    case = _case(gen, [3, 0, 140], [9, 4, 20], 4, 2, 8, 8, torch.float64, False, interleave=True)
    q, k, v, cu_q, cu_k, pq, pk = case
    out = varlen_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, positions_q=pq, positions_k=pk,
                           scale=0.3, block_size=64)
    assert not bool(out.isnan().any())
    torch.testing.assert_close(out, _naive(*case, 0.3), atol=1e-10, rtol=0)


def test_impl_is_validated():
    q = torch.zeros(2, 2, 8)
    with pytest.raises(ValueError, match="impl must be one of"):
        varlen_attention(q, q, q, cu_seqlens_q=torch.tensor([0, 2]), cu_seqlens_k=torch.tensor([0, 2]),
                         positions_q=torch.arange(2), positions_k=torch.arange(2), impl="flex")
