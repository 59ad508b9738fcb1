"""Shared fixtures and markers for the whole suite.

The linear-attention, conv and RoPE tests use tiny tensors, for which OpenMP threading costs far
more than it saves (and oversubscribes a shared 2-core CI box, 10x slower under load). Modules opt
in with ``pytestmark = pytest.mark.usefixtures("single_thread_torch")``; the setting is restored
after each test.

``@pytest.mark.cuda`` marks a test that needs a CUDA device: it is skipped where none is present,
and ``python3 -m pytest -m cuda tests`` runs exactly those tests on a GPU machine (which needs
fla-core: without it the run stops at collection with that message).
"""

import importlib.util
import threading

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    cuda_items = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in cuda_items:
            item.add_marker(skip)
        return
    # On a GPU the engine's linear-attention ops run through fla-core: without it every such test
    # would fail with the same ModuleNotFoundError, so the run stops once, saying so.
    if cuda_items and importlib.util.find_spec("fla") is None:
        raise pytest.UsageError("the CUDA tests need fla-core, which is not importable: pip install '.[gpu]' "
                                "(or put its wheel's contents on PYTHONPATH)")


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
