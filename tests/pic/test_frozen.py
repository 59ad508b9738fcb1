"""Tests of hypic/pic/frozen.py: the fast constructors make the objects the dataclass would."""

import dataclasses
from dataclasses import InitVar, dataclass, field

import pytest

from hypic.runner.layout import BodyElement, LiveElement, Write
from hypic.pic.frozen import frozen_constructor
from hypic.pic.plan import ENTRY_FROM_STORE, Span, SpanKind


@pytest.mark.parametrize("cls,args", [
    (Span, (SpanKind.HIT, 3, 100, 512, 8, 8, "key", 3, ENTRY_FROM_STORE, False, 0)),
    (Span, (SpanKind.QUERY, -1, 0, 4, 4, 4, None, -1, None, False, 2)),
    (LiveElement, ((1, 2, 3), 7, (Write("segment", "k", 7, 7),))),
    (BodyElement, ("entry", 10, 502, 2)),
])
def test_makes_what_the_dataclass_makes(cls, args):
    made, want = frozen_constructor(cls)(*args), cls(*args)
    assert type(made) is cls and made == want and hash(made) == hash(want) and repr(made) == repr(want)
    assert vars(made) == vars(want) and list(vars(made)) == list(vars(want))  # field order too
    assert dataclasses.astuple(made) == dataclasses.astuple(want)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.start = 0
    with pytest.raises(TypeError):
        frozen_constructor(cls)(*args[:-1])  # every field given


def test_refuses_classes_whose_init_does_more():
    @dataclass
    class Mutable:
        a: int

    @dataclass(frozen=True)
    class Checked:
        a: int

        def __post_init__(self):
            pass

    @dataclass(frozen=True)
    class Hidden:
        a: int
        b: int = field(init=False, default=0)

    @dataclass(frozen=True)
    class WithInitVar:
        a: int
        scale: InitVar[int] = 1

    @dataclass(frozen=True, slots=True)
    class Slotted:
        a: int

    for cls in (Mutable, Checked, Hidden, WithInitVar, Slotted, int):
        with pytest.raises(TypeError):
            frozen_constructor(cls)
