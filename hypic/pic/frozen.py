"""Fast positional constructors of frozen dataclasses made in bulk on a request's host path.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (its own
``__setattr__`` raises): ~1.1 us for a 10-field :class:`~hypic.pic.plan.Span` on the CPU this was
measured on, ~0.45 us for a 3-field live element. An all-hit 32k-token request makes 65 spans and
129 layout elements before its first layer runs, where every microsecond of host time is GPU idle.
:func:`frozen_constructor` returns a function that writes the fields straight into the new
instance's ``__dict__`` (0.41 us for a span): the same object (same fields, equality, hash,
repr, still frozen), made without the per-field calls.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Callable


def frozen_constructor(cls: type) -> Callable[..., object]:
    """``make(*fields)``: ``cls(*fields)`` for a frozen dataclass ``cls`` whose every field is
    given positionally, in declaration order (no defaults are filled in). Only for classes
    whose ``__init__`` does nothing else: no ``__post_init__``, no ``__slots__``, every field
    ``init=True``; anything else raises TypeError here, at import time."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"{cls.__name__}: not a frozen dataclass")
    if hasattr(cls, "__post_init__") or "__slots__" in cls.__dict__:
        raise TypeError(f"{cls.__name__}: __post_init__ or __slots__ would be skipped")
    names = [f.name for f in dataclasses.fields(cls)]
    if list(inspect.signature(cls.__init__).parameters)[1:] != names:  # an InitVar, an init=False field
        raise TypeError(f"{cls.__name__}: __init__ takes other arguments than its fields")
    lines = [f"def make({', '.join(names)}):", "    obj = new(cls)", "    d = obj.__dict__"]
    lines += [f"    d[{name!r}] = {name}" for name in names]
    lines.append("    return obj")
    namespace = {"new": object.__new__, "cls": cls}
    exec("\n".join(lines), namespace)  # as dataclasses makes __init__
    make = namespace["make"]
    make.__name__ = make.__qualname__ = f"make_{cls.__name__}"
    make.__doc__ = f"{cls.__name__}({', '.join(names)}), every field given (hypic.pic.frozen)."
    return make
