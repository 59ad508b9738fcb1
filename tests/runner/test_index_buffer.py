"""Tests of hypic/runner/index_buffer.py: the packed host buffer of a forward's index tables."""

import numpy as np
import pytest
import torch

from hypic.runner.index_buffer import IndexBuffer, fill_ranges, iota


def test_fill_ranges_expands_runs_in_order():
    cases = [
        ([5], [3]),
        ([10, 0, 7], [2, 3, 1]),
        ([4, 9, 2], [0, 2, 0]),  # empty runs take no room
        ([100, 3], [4, 4]),
    ]
    for starts, lengths in cases:
        want = [s + i for s, n in zip(starts, lengths) for i in range(n)]
        out = np.full(len(want), -1, dtype=np.int64)
        fill_ranges(out, np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64))
        assert out.tolist() == want


def test_iota_grows_and_is_read_only():
    assert iota(3).tolist() == [0, 1, 2]
    big = iota(1000)
    assert big.tolist() == list(range(1000)) and not big.flags.writeable
    assert iota(0).size == 0


def test_tables_are_aligned_views_of_one_buffer():
    buf = IndexBuffer()
    buf.add("table", 3, lambda out: out.__setitem__(slice(None), [7, 8, 9]))  # odd: padded
    buf.ranges("r", [0, 10], [2, 3])
    buf.values("a", [1, 2, 3])
    buf.values("empty", [])
    buf.ranges("one", [4], [1])
    buf.values("b", [-4, 2**40])
    buf.add("nothing", 0, None)
    host, dev = buf.finish(torch.device("cpu"), host_names=("a", "r"))
    assert dev["a"].tolist() == [1, 2, 3] and dev["empty"].tolist() == [] and dev["b"].tolist() == [-4, 2**40]
    assert dev["r"].tolist() == [0, 1, 10, 11, 12] and dev["one"].tolist() == [4]
    assert dev["table"].tolist() == [7, 8, 9] and dev["nothing"].tolist() == []
    assert all(t.dtype == torch.int64 and t.dim() == 1 for t in dev.values())
    base = dev["a"].untyped_storage().data_ptr()
    for name, t in dev.items():
        assert t.untyped_storage().data_ptr() == base, name  # one buffer, one copy
        assert t.data_ptr() % 16 == 0, name
    assert set(host) == {"a", "r"} and host["a"].tolist() == [1, 2, 3] and host["r"].device.type == "cpu"
    whole = torch.empty(0, dtype=torch.long).set_(dev["a"].untyped_storage())
    assert whole[3].item() == 0  # the padding after a list is zero


def test_host_views_of_another_device():
    # the meta device stands in for an accelerator: the device views are the copy's, the host
    # views the buffer's
    buf = IndexBuffer()
    buf.values("a", [1, 2, 3])
    buf.ranges("r", [5], [4])
    host, dev = buf.finish(torch.device("meta"), host_names=("r",))
    assert dev["a"].device.type == "meta" and dev["a"].shape == (3,) and dev["r"].shape == (4,)
    assert list(host) == ["r"] and host["r"].device.type == "cpu" and host["r"].tolist() == [5, 6, 7, 8]


def _buffer(values, positions):
    buf = IndexBuffer()
    buf.values("a", values)
    buf.ranges("b", [positions, 0], [3, 2])
    return buf


def test_signature_holds_every_size_and_the_named_values():
    sig = _buffer([1, 2, 3], 7).signature(("a",))
    assert sig == _buffer([1, 2, 3], 40).signature(("a",))  # ranges' values are not in it
    assert sig != _buffer([1, 2, 4], 7).signature(("a",))  # a host-read table's values are
    assert sig != _buffer([1, 2], 7).signature(("a",))  # and every size
    assert _buffer([1, 2, 3], 7).signature(()) == _buffer([9, 9, 9], 7).signature(())
    with pytest.raises(ValueError, match="not value tables"):
        _buffer([1], 0).signature(("b",))


def test_finish_into_an_earlier_buffer_rewrites_its_views():
    first = _buffer([1, 2, 3], 7)
    _, dev1 = first.finish(torch.device("cpu"))
    whole = first.device_tensor
    assert whole.numel() == first.numel() == 4 + 6
    second = _buffer([4, 5, 6], 20)
    host, dev2 = second.finish(torch.device("cpu"), host_names=("a",), out=whole)
    assert second.device_tensor is whole
    assert dev1["a"].tolist() == [4, 5, 6] and dev1["b"].tolist() == [20, 21, 22, 0, 1]
    assert dev2["b"].data_ptr() == dev1["b"].data_ptr()
    assert host["a"].tolist() == [4, 5, 6] and host["a"].data_ptr() != dev2["a"].data_ptr()
    for bad in (torch.zeros(9, dtype=torch.long), torch.zeros(10, dtype=torch.int32),
                torch.zeros(20, dtype=torch.long)[::2]):
        with pytest.raises(ValueError, match="out must be"):
            _buffer([4, 5, 6], 20).finish(torch.device("cpu"), out=bad)
