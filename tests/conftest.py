"""Shared fixtures for the whole suite.

The linear-attention, conv and RoPE tests use tiny tensors, for which OpenMP threading costs far
more than it saves (and oversubscribes a shared 2-core CI box, 10x slower under load). Modules opt
in with ``pytestmark = pytest.mark.usefixtures("single_thread_torch")``; the setting is restored
after each test.
"""

import pytest
import torch


@pytest.fixture
def single_thread_torch():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
