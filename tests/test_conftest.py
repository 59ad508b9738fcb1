"""The suite's own collection rules (tests/conftest.py)."""

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from tests import conftest


def _item(marked: bool):
    return SimpleNamespace(get_closest_marker=lambda name: object() if marked and name == "cuda" else None,
                           add_marker=lambda marker: None)


def test_cuda_tests_on_a_gpu_without_fla_stop_with_one_clear_error(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fla" else real_find_spec(name, *a))
    with pytest.raises(pytest.UsageError, match="fla-core"):
        conftest.pytest_collection_modifyitems(None, [_item(False), _item(True)])
    conftest.pytest_collection_modifyitems(None, [_item(False)])  # no CUDA test selected: nothing needed


def test_cuda_tests_are_skipped_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    added = []
    item = SimpleNamespace(get_closest_marker=lambda name: object() if name == "cuda" else None,
                           add_marker=added.append)
    conftest.pytest_collection_modifyitems(None, [item, _item(False)])
    assert len(added) == 1 and added[0].kwargs["reason"] == "needs a CUDA device"
