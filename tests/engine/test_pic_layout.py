"""Tests of hypic/engine/pic_layout.py: the scan's recorded rows and the bodies' address table."""

import torch

from hypic.engine.pic_layout import (
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
from hypic.pic.payload import LinearLayerCache, SegmentEntry

KEYER = Keyer(KeyNamespace("layout-test", "float32"))
HV, K, V = 2, 4, 4


def entry(tokens, dtype=torch.float32, body_start=1):
    key = KEYER.segment_key(tokens, body_start)
    summary = DenseSummary(torch.randn(1, HV, K, K, dtype=dtype), torch.randn(1, HV, K, V, dtype=dtype))
    return SegmentEntry(key=key, linear={0: LinearLayerCache(summary, torch.zeros(8, 3, dtype=dtype)),
                                         2: LinearLayerCache(summary, torch.zeros(8, 3, dtype=dtype))})


def write(kind, tokens):
    key = KEYER.checkpoint_keys([tokens])[0] if kind == WRITE_CHECKPOINT else KEYER.segment_key(tokens, 1)
    return Write(kind, key, 0)


def test_recorded_rows_keep_live_spans_then_states_after_checkpoints():
    a, b = entry((5, 6, 7, 8)), entry((9, 10, 11))
    req0 = RequestLayout((
        LiveElement((1, 2), 0, write(WRITE_CHECKPOINT, (1, 2))),  # followed by a body: a new row
        BodyElement(a, 2, 3, 1),
        LiveElement((3,), 5, write(WRITE_CHECKPOINT, (3,))),  # followed by live span 2: row 2
        LiveElement((4, 4), 6, write(WRITE_SEGMENT, (4, 4))),  # segment write: no state
        BodyElement(b, 8, 2, 7),
        LiveElement((7,), 10, write(WRITE_CHECKPOINT, (7,))),  # last: the request's final state
    ))
    req1 = RequestLayout((LiveElement((1, 1, 1), 0),))
    lay = build_layout([req0, req1], conv_width=4, device=torch.device("cpu"))
    # chain: live0 body0 live1 live2 body1 live3 | live4
    assert lay.chain_record_rows.tolist() == [0, 5, 1, 2, -1, 3, 4]
    assert lay.num_record_rows == 6
    assert lay.write_after_rows == [5, 2, None, -1]
    assert lay.write_spans.tolist() == [0, 1, 2, 3] and lay.write_span_range == (0, 4)
    # addresses per layer [L, 2, NB]: each body's T and S pointers where the entry holds them
    addr = lay.body_addresses
    assert addr.shape == (3, 2, 2)
    for j, e in enumerate((a, b)):
        for layer in (0, 2):
            summ = e.linear[layer].summary
            assert addr[layer, :, j].tolist() == [summ.transition.data_ptr(), summ.state.data_ptr()]
    # every index tensor starts 16-byte aligned (Triton specialises kernels on pointer alignment)
    for name in ("cu_chains", "chain_source", "chain_record_rows", "cu_spans", "key_index",
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
