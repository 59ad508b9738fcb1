"""Tests of hypic/runner/layout.py: the scan's recorded rows, the bodies' address table and the
cached pieces' K/V table."""

import torch

from hypic.runner.layout import (
    WRITE_CHECKPOINT,
    WRITE_SEGMENT,
    BodyElement,
    LiveElement,
    RequestLayout,
    Write,
    build_layout,
)
from hypic.ops.linear.summary import DenseSummary
from hypic.pic.keys import Keyer, KeyNamespace
from hypic.pic.payload import AttentionLayerCache, LinearLayerCache, SegmentEntry

KEYER = Keyer(KeyNamespace("layout-test", "float32"))
HV, K, V = 2, 4, 4


def entry(tokens, dtype=torch.float32, body_start=1):
    key = KEYER.segment_key(tokens, body_start)
    summary = DenseSummary(torch.randn(1, HV, K, K, dtype=dtype), torch.randn(1, HV, K, V, dtype=dtype))
    return SegmentEntry(key=key, linear={0: LinearLayerCache(summary, torch.zeros(8, 3, dtype=dtype)),
                                         2: LinearLayerCache(summary, torch.zeros(8, 3, dtype=dtype))})


def write(kind, tokens):
    key = KEYER.prefix_key(None, tokens) if kind == WRITE_CHECKPOINT else KEYER.segment_key(tokens, 1)
    return (Write(kind, key, 0),)


def test_recorded_rows_are_the_states_after_checkpoints():
    a, b = entry((5, 6, 7, 8)), entry((9, 10, 11))
    req0 = RequestLayout((
        LiveElement((1, 2), 0, write(WRITE_CHECKPOINT, (1, 2))),  # followed by a body: row 0
        BodyElement(a, 2, 3, 1),
        LiveElement((3,), 5, write(WRITE_CHECKPOINT, (3,))),  # followed by live span 2: row 1
        LiveElement((4, 4), 6, write(WRITE_SEGMENT, (4, 4))),  # segment write: no state
        BodyElement(b, 8, 2, 7),
        LiveElement((7,), 10, write(WRITE_CHECKPOINT, (7,))),  # last: the request's final state
    ))
    req1 = RequestLayout((LiveElement((1, 1, 1), 0),))
    lay = build_layout([req0, req1], conv_width=4, device=torch.device("cpu"))
    # chain: live0 body0 live1 live2 body1 live3 | live4
    assert lay.checkpoint_record_rows.tolist() == [-1, 0, -1, 1, -1, -1, -1]
    assert lay.num_checkpoint_records == 2
    assert lay.write_after_checkpoint_rows == [0, 1, None, -1]
    # summaries only for the segment write (live span 2)
    assert lay.write_spans.tolist() == [2] and lay.write_span_range == (2, 3) and lay.write_parts == [1]
    # addresses per layer [L, 2, NB]: each body's T and S pointers where the entry holds them
    addr = lay.body_addresses
    assert addr.shape == (3, 2, 2)
    for j, e in enumerate((a, b)):
        for layer in (0, 2):
            summ = e.linear[layer].summary
            assert addr[layer, :, j].tolist() == [summ.transition.data_ptr(), summ.state.data_ptr()]
    # every index tensor starts 16-byte aligned (Triton specialises kernels on pointer alignment)
    for name in ("cu_chains", "chain_source", "checkpoint_record_rows", "cu_spans", "key_index",
                 "cu_keys", "tail_index", "write_spans", "positions", "input_ids"):
        assert getattr(lay, name).data_ptr() % 16 == 0, name


def test_address_table_rows_padded_to_an_even_count():
    bodies = [entry((5, 6, 7, 8 + i)) for i in range(3)]
    elems, pos = [], 0
    for e in bodies:
        elems += [LiveElement((1,), pos), BodyElement(e, pos + 1, 3, pos)]
        pos += 4
    elems.append(LiveElement((2,), pos))
    lay = build_layout([RequestLayout(tuple(elems))], 4, torch.device("cpu"))
    assert lay.body_addresses.shape == (3, 2, 4)
    assert lay.body_addresses[:, :, 3].eq(0).all()
    assert all(lay.body_addresses[layer].data_ptr() % 16 == 0 for layer in range(3))


def test_no_address_table_when_a_body_must_be_copied():
    a, b64 = entry((5, 6, 7, 8)), entry((9, 10, 11), dtype=torch.float64)
    elems = (LiveElement((1,), 0), BodyElement(a, 1, 3, 0), LiveElement((2,), 4), BodyElement(b64, 5, 2, 4),
             LiveElement((3,), 7))
    assert build_layout([RequestLayout(elems)], 4, torch.device("cpu")).body_addresses is None
    # `addition` mode replaces T by the identity: also concatenated
    elems = (LiveElement((1,), 0), BodyElement(a, 1, 3, 0), LiveElement((2,), 4))
    assert build_layout([RequestLayout(elems, use_transition=False)], 4, torch.device("cpu")).body_addresses is None
    assert build_layout([RequestLayout(elems)], 4, torch.device("cpu")).body_addresses is not None


def test_write_span_range_only_for_writes_in_order():
    req0 = RequestLayout((LiveElement((1, 2), 0), LiveElement((3,), 2, write(WRITE_SEGMENT, (3,))),
                          LiveElement((4,), 3, write(WRITE_SEGMENT, (4,)))))
    lay = build_layout([req0], conv_width=4, device=torch.device("cpu"))
    assert lay.write_span_range == (1, 3)
    req1 = RequestLayout((LiveElement((5,), 0, write(WRITE_SEGMENT, (5,))), LiveElement((6,), 1)))
    gap = build_layout([req0, req1], conv_width=4, device=torch.device("cpu"))  # writes 1, 2, 3
    assert gap.write_spans.tolist() == [1, 2, 3] and gap.write_span_range == (1, 4)
    req2 = RequestLayout((LiveElement((5,), 0, write(WRITE_SEGMENT, (5,))), LiveElement((6,), 1),
                          LiveElement((7,), 2, write(WRITE_SEGMENT, (7,)))))
    holes = build_layout([req2], conv_width=4, device=torch.device("cpu"))
    assert holes.write_spans.tolist() == [0, 2] and holes.write_span_range is None
    assert build_layout([RequestLayout((LiveElement((1,), 0),))], 4, torch.device("cpu")).write_span_range is None


def kv_entry(tokens, origin, dtype=torch.float32, layers=(1, 3), offset_elems=0):
    """A body entry with K/V [n, 2, 8] (V [n, 2, 4]) per attention layer; ``offset_elems`` puts K
    that many elements into its buffer."""
    key = KEYER.segment_key(tokens, 1)
    n = len(tokens) - 1
    att = {}
    for layer in layers:
        flat = torch.randn(offset_elems + n * 16, dtype=dtype)
        att[layer] = AttentionLayerCache(flat[offset_elems:].view(n, 2, 8), torch.randn(n, 2, 4, dtype=dtype))
    return SegmentEntry(key=key, attention=att, origin_position=origin)


def kv_request(*entries):
    elems, pos = [], 0
    for e in entries:
        n = e.num_body_tokens
        elems += [LiveElement((1,), pos), BodyElement(e, pos + 1, n, pos)]
        pos += n + 1
    elems.append(LiveElement((2, 2), pos))
    return RequestLayout(tuple(elems))


def test_kv_table_of_the_cached_pieces():
    a, b, c = kv_entry((5, 6, 7, 8), origin=0), kv_entry((9, 10, 11), origin=4), kv_entry((3, 4, 5), origin=7)
    lay = build_layout([kv_request(a, b), kv_request(c)], 4, torch.device("cpu"))
    # pieces in order: a (3 rows, cached at 0, now at 0: no shift), b (2, 4 -> 4), c (2, 7 -> 0)
    assert lay.cu_cached.tolist() == [0, 3, 5, 7]
    assert lay.cached_shift.tolist() == [0, 0, -7] and lay.any_rerotate
    assert lay.kv_addresses.shape == (4, 2, 4)  # layers 0..3, pieces padded to an even count
    for j, e in enumerate((a, b, c)):
        for layer in (1, 3):
            att = e.attention[layer]
            assert lay.kv_addresses[layer, :, j].tolist() == [att.key.data_ptr(), att.value.data_ptr()]
    assert lay.kv_addresses[0].eq(0).all() and lay.kv_addresses[:, :, 3].eq(0).all()
    fmt = lay.kv_format
    assert (fmt.dtype, fmt.num_heads, fmt.key_dim, fmt.value_dim) == (torch.float32, 2, 8, 4)
    table = lay.piece_table(3)
    assert table.fmt == fmt and table.addresses.data_ptr() == lay.kv_addresses[3].data_ptr()
    assert table.addresses.data_ptr() % 16 == 0 and lay.cu_cached.data_ptr() % 16 == 0
    assert lay.piece_table(4) is None  # past the table
    # the least alignment of any piece
    odd = kv_entry((1, 2, 3), origin=0, offset_elems=1)
    assert build_layout([kv_request(a, odd)], 4, torch.device("cpu")).kv_format.align_bytes == 4


def test_no_kv_table_when_a_piece_must_be_copied():
    a = kv_entry((5, 6, 7, 8), origin=0)
    cases = [
        kv_entry((9, 10, 11), origin=4, dtype=torch.float64),  # no kernel dtype
        kv_entry((9, 10, 11), origin=4, dtype=torch.float16),  # pieces of two dtypes
        kv_entry((9, 10, 11), origin=4, layers=(1,)),  # another set of layers
    ]
    for other in cases:
        lay = build_layout([kv_request(a, other)], 4, torch.device("cpu"))
        assert lay.kv_addresses is None and lay.kv_format is None and lay.piece_table(1) is None
    mixed = SegmentEntry(key=KEYER.segment_key((9, 10, 11), 1), origin_position=4, attention={
        1: AttentionLayerCache(torch.zeros(2, 2, 8), torch.zeros(2, 2, 4)),
        3: AttentionLayerCache(torch.zeros(2, 8, 2).transpose(1, 2), torch.zeros(2, 2, 4))})  # not contiguous
    assert build_layout([kv_request(a, mixed)], 4, torch.device("cpu")).kv_addresses is None
    plain = build_layout([RequestLayout((LiveElement((1, 2), 0),))], 4, torch.device("cpu"))
    assert plain.kv_addresses is None and plain.cu_cached.tolist() == [0] and not plain.any_rerotate
