"""The interpreter helper's skip switch (set by the device scripts)."""

from __future__ import annotations

import pytest

from tests.interpreter import SKIP_ENV, interpreted_error


def test_skip_switch_skips_before_running_anything(monkeypatch):
    monkeypatch.setenv(SKIP_ENV, "1")
    with pytest.raises(pytest.skip.Exception, match=SKIP_ENV):
        interpreted_error("raise SystemExit(3)")  # would fail the test if it ran


def test_without_the_switch_the_script_runs(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv(SKIP_ENV, raising=False)
    assert interpreted_error("print(0.5)") == 0.5
