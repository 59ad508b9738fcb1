"""Tests of hypic/ops/linear/_layout_tables.py: tables kept while their layout tensor lives."""

import gc

import torch

from hypic.ops.linear._layout_tables import ByIdentity, LayoutTables


def test_an_answer_is_kept_for_the_tensors_and_key_while_cu_lives():
    tables = LayoutTables()
    cu, cu_cpu = torch.tensor([0, 3, 5]), torch.tensor([0, 3, 5])
    built = []

    def build():
        built.append(torch.arange(3))
        return built[-1]

    first = tables.get(cu, cu_cpu, "a", build)
    assert tables.get(cu, cu_cpu, "a", build) is first and len(built) == 1
    tables.get(cu, cu_cpu, "b", build)  # another key
    tables.get(cu, cu_cpu.clone(), "a", build)  # another host copy (by identity)
    tables.get(cu.clone(), cu_cpu, "a", build)  # an equal but other device tensor
    assert len(built) == 4
    assert len(tables) == 1  # the clone of cu died at once, and its entry with it
    del cu
    gc.collect()
    assert len(tables) == 0  # nothing is kept past its layout tensor


def test_by_identity_keys():
    t = torch.zeros(3)
    assert ByIdentity(t) == ByIdentity(t) and hash(ByIdentity(t)) == hash(ByIdentity(t))
    assert ByIdentity(t) != ByIdentity(t.clone()) and ByIdentity(t) != t
