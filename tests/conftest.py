"""Shared fixtures and markers for the whole suite.

The linear-attention, conv and RoPE tests use tiny tensors, for which OpenMP threading costs far
more than it saves (and oversubscribes a shared 2-core CI box, 10x slower under load). Modules opt
in with ``pytestmark = pytest.mark.usefixtures("single_thread_torch")``; the setting is restored
after each test.

``@pytest.mark.cuda`` marks a test that needs a CUDA device: it is skipped where none is present,
and ``python3 -m pytest -m cuda tests`` runs exactly those tests on a GPU machine.
"""

import threading

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture
def single_thread_torch():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture
def hold_steps():
    """``hold_steps(engine) -> release``: the engine's steps wait until ``release.set()`` (at most
    10 s each), so a test can fill an asynchronous engine's queue before anything runs. Every
    hold is released when the test ends, pass or fail."""
    releases = []

    def hold(engine):
        release = threading.Event()
        step = engine.step

        def held_step():
            release.wait(10)
            return step()

        engine.step = held_step
        releases.append(release)
        return release

    yield hold
    for release in releases:
        release.set()
