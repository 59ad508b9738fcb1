"""Fixtures of the server tests: the seeded test model (it has a ChatML template, which the
embedded ``tiny`` lacks) served by a real uvicorn server. The server's dependencies are imported
inside the fixtures: a machine without them skips the test modules (their ``importorskip``)
instead of failing at this file."""

import pytest


@pytest.fixture(scope="module")
def seeded_dir(tmp_path_factory):
    from hypic.assets.make_seeded_tiny import write_tiny_model

    path = tmp_path_factory.mktemp("seeded")
    write_tiny_model(path)
    return path


@pytest.fixture(scope="module")
def live_server(seeded_dir):
    """(base URL, engine): uvicorn on a free port of 127.0.0.1 serving the seeded test model."""
    from hypic.engine.async_engine import AsyncLLMEngine
    from hypic.engine.engine import LLMEngine
    from hypic.entrypoints.openai.api_server import create_app

    from .helpers import ENGINE, serve

    engine = AsyncLLMEngine(LLMEngine(str(seeded_dir), **ENGINE))
    try:
        with serve(create_app(engine, served_model_name="seeded")) as url:
            yield url, engine
    finally:
        engine.shutdown(timeout_s=5)
