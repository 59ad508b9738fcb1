"""Tests of hypic.envs: the 0/1 switch parser every call-time switch goes through."""

import pytest

from hypic.envs import env_switch


def test_env_switch_default_values_and_errors(monkeypatch):
    monkeypatch.delenv("HYPIC_TEST_SWITCH", raising=False)
    assert env_switch("HYPIC_TEST_SWITCH") is True
    assert env_switch("HYPIC_TEST_SWITCH", default=False) is False
    monkeypatch.setenv("HYPIC_TEST_SWITCH", "0")
    assert env_switch("HYPIC_TEST_SWITCH") is False
    monkeypatch.setenv("HYPIC_TEST_SWITCH", "1")
    assert env_switch("HYPIC_TEST_SWITCH", default=False) is True
    for bad in ("", "true", "2", " 1"):
        monkeypatch.setenv("HYPIC_TEST_SWITCH", bad)
        with pytest.raises(ValueError, match="HYPIC_TEST_SWITCH must be 0 or 1"):
            env_switch("HYPIC_TEST_SWITCH")


def test_triton_interpret_reads_tritons_switch(monkeypatch):
    from hypic.envs import triton_interpret

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert triton_interpret() is False
    for on in ("1", "true", "ON"):
        monkeypatch.setenv("TRITON_INTERPRET", on)
        assert triton_interpret() is True
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert triton_interpret() is False
