"""The training scripts hide modules from transformers; every test here gets them back."""

import sys

import pytest


@pytest.fixture(autouse=True)
def _restore_hidden_modules():
    """The trainers hide fla / causal_conv1d from transformers; undo that for the rest of the session."""
    before = {name: sys.modules.get(name, "absent") for name in ("fla", "causal_conv1d")}
    yield
    for name, value in before.items():
        if value == "absent":
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = value
