import hashlib

import pytest

from hypic.pic.keys import KIND_PREFIX, KIND_SEGMENT, Keyer, KeyNamespace
from tests.pic.helpers import keyer


def test_segment_key_is_sha256_and_deterministic():
    k1 = keyer().segment_key([1, 2, 3], 1)
    k2 = keyer().segment_key((1, 2, 3), 1)
    assert k1 == k2 and hash(k1) == hash(k2)
    assert len(k1.digest) == hashlib.sha256().digest_size
    assert k1.kind == KIND_SEGMENT and k1.token_ids == (1, 2, 3) and k1.num_tokens == 3


@pytest.mark.parametrize(
    "other",
    [
        lambda: keyer().segment_key([1, 2, 4], 1),  # tokens
        lambda: keyer().segment_key([1, 2, 3], 2),  # seam (body start)
        lambda: keyer(model_id="other").segment_key([1, 2, 3], 1),  # model
        lambda: keyer(dtype="bfloat16").segment_key([1, 2, 3], 1),  # dtype
        lambda: keyer().segment_key([1, 2, 3], 1, tenant_salt="t1"),  # tenant
    ],
)
def test_every_key_field_changes_the_digest(other):
    base = keyer().segment_key([1, 2, 3], 1)
    k = other()
    assert k.digest != base.digest and k != base


def test_forced_collision_is_not_equal():
    kr = keyer(hash_fn=lambda data: b"same")
    a, b = kr.segment_key([1, 2], 0), kr.segment_key([3, 4], 0)
    assert a.digest == b.digest and hash(a) == hash(b)
    assert a != b
    assert len({a: 1, b: 2}) == 2  # dict chaining keeps both
    assert a == kr.segment_key([1, 2], 0)


def test_prefix_keys_chain():
    kr = keyer()
    ab = kr.prefix_chain([1, 2, 3, 4], 2)
    abc = kr.prefix_chain([1, 2, 3, 4, 5], 2)
    ba = kr.prefix_chain([3, 4, 1, 2], 2)
    assert ab == abc[:2] and abc[2].token_ids == (5,) and abc[2].parent == ab[1]
    assert ab[0].kind == KIND_PREFIX and ab[1].token_ids == (3, 4) and ab[1].parent == ab[0]
    assert ab[1].position == 4 and ab[1].prefix_token_ids() == (1, 2, 3, 4)
    assert ab[1] != ba[1] and ab[0] != ba[1]  # a block after another prefix is another key
    assert ab[1].parent_digest == ab[0].digest and ab[0].parent_digest == kr.prefix_root()
    # a prefix key never equals a segment key with the same tokens, nor one of another tenant
    assert kr.prefix_chain([3], 4)[0] != kr.segment_key([3], 0)
    assert kr.prefix_chain([1, 2], 2, tenant_salt="t")[0] != ab[0]
    assert kr.prefix_root(tenant_salt="t") != kr.prefix_root()
    with pytest.raises(ValueError, match="another namespace"):
        kr.prefix_key(ab[0], [5], tenant_salt="t")


def test_forced_collision_of_prefix_keys_is_not_equal():
    # every digest equal: the chains still differ by their tokens, block by block
    kr = keyer(hash_fn=lambda data: b"same")
    a = kr.prefix_chain([1, 2, 9, 9], 2)
    b = kr.prefix_chain([3, 4, 9, 9], 2)
    assert a[1].digest == b[1].digest and a[1].token_ids == b[1].token_ids
    assert a[1] != b[1] and a[0] != b[0]
    assert a[1] == kr.prefix_chain([1, 2, 9, 9], 2)[1]


def test_long_chains_compare_without_recursion():
    kr = keyer()
    tokens = list(range(6000))
    a, b = kr.prefix_chain(tokens, 2)[-1], kr.prefix_chain(tokens, 2)[-1]  # 3000 keys deep, apart
    assert a is not b and a == b and a.position == 6000


def test_key_errors():
    with pytest.raises(ValueError, match="at least one token"):
        keyer().segment_key([], 0)
    with pytest.raises(ValueError, match="body_start"):
        keyer().segment_key([1], 2)
    with pytest.raises(ValueError, match="body_start"):
        keyer().segment_key([1], True)
    with pytest.raises(ValueError, match="model_id"):
        KeyNamespace("", "float32")
    with pytest.raises(ValueError, match="hash_fn"):
        Keyer(KeyNamespace("m", "f"), hash_fn=lambda b: b"").segment_key([1], 0)
    with pytest.raises(ValueError, match="at least one token"):
        keyer().prefix_key(None, [])
    with pytest.raises(ValueError, match="block_tokens"):
        keyer().prefix_chain([1], 0)


def test_token_ids_of_any_integer_type_give_the_same_key():
    import numpy as np
    import torch

    k = keyer()
    want = k.segment_key((5, 7, 0, 9), 1)
    for ids in ([5, 7, 0, 9], np.array([5, 7, 0, 9]), (np.int32(5), 7, 0, 9), torch.tensor([5, 7, 0, 9]),
                [np.int64(5), np.uint16(7), 0, 9]):
        got = k.segment_key(ids, 1)
        assert got == want and got.digest == want.digest
        assert got.token_ids == (5, 7, 0, 9) and all(type(t) is int for t in got.token_ids)
    assert k.segment_key((True, 7), 0).token_ids == (1, 7)  # bools count as 0/1, as int() does
    assert k.prefix_chain(np.array([5, 7, 0, 9]), 2) == k.prefix_chain((5, 7, 0, 9), 2)


def test_segment_keys_are_remembered_by_token_tuple(monkeypatch):
    import hypic.pic.keys as keys

    k = keyer()
    tokens = tuple(range(40))
    first = k.segment_key(tokens, 8)
    assert k.segment_key(tuple(range(40)), 8) is first  # an equal tuple: the same key object
    assert k.segment_key(list(tokens), 8) == first  # lists are keyed afresh, to the same key
    assert k.segment_key(tokens, 4) != first and k.segment_key(tokens, 8, tenant_salt="t") != first
    fresh = keyer().segment_key(tokens, 8)
    assert fresh == first and fresh.digest == first.digest and fresh is not first
    # bounded: the least recently used goes first
    monkeypatch.setattr(keys, "MEMO_SEGMENT_KEYS", 2)
    small = keyer()
    a, b = small.segment_key((1,), 0), small.segment_key((2,), 0)
    assert small.segment_key((1,), 0) is a  # (1,) is now the most recent
    small.segment_key((3,), 0)  # evicts (2,)
    assert small.segment_key((1,), 0) is a and small.segment_key((2,), 0) is not b
    # items that cannot be hashed are not looked up, and fail as before
    with pytest.raises((TypeError, ValueError)):
        k.segment_key(([1], 2), 0)


def test_tuples_sharing_the_probe_sample_keep_their_own_keys(monkeypatch):
    import hypic.pic.keys as keys

    k = keyer()
    base = list(range(1000, 1512))
    # the probe samples every 32nd token and the last: the same for these two
    a, b = tuple(base), tuple(base[:-3] + [7, 7] + base[-1:])
    assert a[::32] == b[::32] and a[-1] == b[-1]
    key_a, key_b = k.segment_key(a, 8), k.segment_key(b, 8)
    assert key_a.token_ids == a and key_b.token_ids == b and key_a.digest != key_b.digest
    for _ in range(3):  # taking turns in the probe's slot, each finds its own key in the memo
        assert k.segment_key(tuple(a), 8) is key_a and k.segment_key(tuple(b), 8) is key_b
    assert keyer().segment_key(b, 8) == key_b
    # bounded with the memo: a probe hit counts as a use there too
    monkeypatch.setattr(keys, "MEMO_SEGMENT_KEYS", 2)
    small = keyer()
    first, second = small.segment_key(a, 8), small.segment_key((1, 2), 0)
    assert small.segment_key(tuple(a), 8) is first  # a is now the most recent
    small.segment_key((3, 4), 0)  # evicts (1, 2) from both
    assert len(small._memo) == len(small._probe) == 2
    assert small.segment_key(a, 8) is first and small.segment_key((1, 2), 0) is not second


def test_segment_keys_is_segment_key_of_each(monkeypatch):
    import hypic.pic.keys as keys

    monkeypatch.setattr(keys, "MEMO_SEGMENT_KEYS", 6)
    base = list(range(1000, 1512))
    a, b = tuple(base), tuple(base[:-3] + [7, 7] + base[-1:])  # one probe sample
    segments = [a, (1, 2, 3), b, [4, 5, 6], (9,), tuple(a), (1, 2, 3), (8, 8)]
    starts = [8, 1, 8, 1, 1, 8, 3, 0]  # (1, 2, 3) with body start 3: no body, no key
    for salt in (None, "t"):
        one, many = keyer(), keyer()
        for _ in range(2):  # cold, then every key remembered
            want = [None if s == len(seg) else one.segment_key(seg, s, tenant_salt=salt)
                    for seg, s in zip(segments, starts)]
            got = many.segment_keys(segments, starts, tenant_salt=salt)
            assert type(got) is tuple and list(got) == want and got[6] is None
            assert list(one._memo) == list(many._memo) and list(one._probe) == list(many._probe)
        assert many.segment_keys([tuple(a)], [8], tenant_salt=salt)[0] is got[0]
