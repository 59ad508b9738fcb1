"""Tests of hypic.envs: the one table of developer knobs and its parser."""

import pytest

from hypic import envs
from hypic.envs import ENV_VARS, EnvVar, get, triton_interpret


@pytest.fixture
def knobs(monkeypatch):
    """Three declared test knobs, one of each type, unset."""
    table = dict(ENV_VARS)
    table["HYPIC_TEST_FLAG"] = EnvVar(bool, False, "a test flag")
    table["HYPIC_TEST_COUNT"] = EnvVar(int, 4, "a test count", choices=(1, 2, 4))
    table["HYPIC_TEST_NAME"] = EnvVar(str, "a", "a test name", choices=("a", "b"))
    monkeypatch.setattr(envs, "ENV_VARS", table)
    for name in ("HYPIC_TEST_FLAG", "HYPIC_TEST_COUNT", "HYPIC_TEST_NAME"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_defaults_values_and_errors(knobs):
    assert get("HYPIC_TEST_FLAG") is False and get("HYPIC_TEST_COUNT") == 4 and get("HYPIC_TEST_NAME") == "a"
    knobs.setenv("HYPIC_TEST_FLAG", "1")
    knobs.setenv("HYPIC_TEST_COUNT", "2")
    knobs.setenv("HYPIC_TEST_NAME", "b")
    assert get("HYPIC_TEST_FLAG") is True and get("HYPIC_TEST_COUNT") == 2 and get("HYPIC_TEST_NAME") == "b"
    for name, bad, message in (("HYPIC_TEST_FLAG", "true", "must be 0 or 1"),
                               ("HYPIC_TEST_COUNT", "two", "must be an integer"),
                               ("HYPIC_TEST_COUNT", "3", "must be one of 1, 2, 4"),
                               ("HYPIC_TEST_NAME", "c", "must be one of a, b")):
        knobs.setenv(name, bad)
        with pytest.raises(ValueError, match=f"{name} {message}"):
            get(name)


def test_an_undeclared_name_is_refused():
    with pytest.raises(KeyError, match="not a declared hypic environment variable"):
        get("HYPIC_NOT_DECLARED")


def test_the_package_reads_only_declared_names():
    """No module but hypic.envs reads the environment, and the table stays small."""
    import pathlib
    import re

    root = pathlib.Path(envs.__file__).resolve().parent
    readers = [p.relative_to(root).as_posix() for p in root.rglob("*.py")
               if p.name != "envs.py" and re.search(r"os\.environ|os\.getenv", p.read_text())]
    assert readers == []
    assert len(ENV_VARS) <= 8


def test_triton_interpret_reads_tritons_switch(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert triton_interpret() is False
    for on in ("1", "true", "ON"):
        monkeypatch.setenv("TRITON_INTERPRET", on)
        assert triton_interpret() is True
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert triton_interpret() is False
