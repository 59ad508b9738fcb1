"""Developer knobs read from the environment, declared once in one table (as vLLM's ``envs.py``).

User settings live in :mod:`hypic.config` and reach the engine through ``LLM(...)`` and the CLI;
nothing on the default path reads the environment. The few names below exist for developers
(debugging a kernel, profiling); no other module reads ``os.environ``. Each value is parsed and
validated here, at the call, so a bad value is a ``ValueError`` naming the variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Union

Value = Union[bool, int, str]


@dataclass(frozen=True)
class EnvVar:
    """One knob: its type (``bool`` is ``0``/``1``), default, allowed values (None: any) and doc."""

    type: type
    default: Value
    doc: str
    choices: tuple[Value, ...] | None = None


ENV_VARS: dict[str, EnvVar] = {
    "TRITON_INTERPRET": EnvVar(
        str, "0",
        "Triton's own switch (1, true, yes or on): Triton kernels run on CPU tensors through its "
        "interpreter (the kernel tests). Read here so that ops route CPU tensors to a kernel only then."),
}


def get(name: str) -> Value:
    """The parsed value of the declared knob ``name`` (its default when unset)."""
    if name not in ENV_VARS:
        raise KeyError(f"{name} is not a declared hypic environment variable (see hypic.envs.ENV_VARS)")
    var = ENV_VARS[name]
    raw = os.environ.get(name)
    if raw is None:
        return var.default
    if var.type is bool:
        if raw not in ("0", "1"):
            raise ValueError(f"{name} must be 0 or 1, got {raw!r}")
        return raw == "1"
    if var.type is int:
        try:
            value: Value = int(raw)
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    else:
        value = raw
    if var.choices is not None and value not in var.choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, var.choices))}, got {raw!r}")
    return value


def triton_interpret() -> bool:
    """Whether Triton runs kernels through its interpreter (``TRITON_INTERPRET=1``): then a kernel
    takes CPU tensors, which the ops' fast paths check for beside the tensors' device."""
    return str(get("TRITON_INTERPRET")).strip().lower() in ("1", "true", "yes", "on", "y")


__all__ = ["ENV_VARS", "EnvVar", "get", "triton_interpret"]
