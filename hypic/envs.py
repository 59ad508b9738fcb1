"""Environment switches read at call time (A/B runs and escape hatches), parsed in one place."""

from __future__ import annotations

import os


def env_switch(name: str, default: bool = True) -> bool:
    """The 0/1 switch ``name`` (unset: ``default``); any other value is a ``ValueError`` naming it."""
    value = os.environ.get(name, "1" if default else "0")
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


__all__ = ["env_switch"]
