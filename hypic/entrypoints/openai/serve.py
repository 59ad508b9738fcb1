"""``hypic serve``: build the engine from the command line's options and run uvicorn."""

from __future__ import annotations

import argparse
import logging

import uvicorn

from hypic.engine.async_engine import AsyncLLMEngine
from hypic.config import EngineConfig
from hypic.engine.engine import LLMEngine
from hypic.entrypoints.openai.api_server import create_app

logger = logging.getLogger(__name__)


def build_async_engine(args: argparse.Namespace) -> AsyncLLMEngine:
    """The server's engine: the one ``LLM(...)`` builds from the same options, stepped by the
    engine loop."""
    engine = LLMEngine(EngineConfig.from_cli_args(args))
    return AsyncLLMEngine(engine, max_waiting_requests=args.max_waiting_requests)


def run_server(args: argparse.Namespace) -> None:
    """Serve until SIGINT / SIGTERM; then uvicorn lets open requests finish (up to
    ``--shutdown-timeout``), and the engine drains what is left before it stops."""
    engine = build_async_engine(args)
    try:
        app = create_app(engine, served_model_name=args.served_model_name or str(args.model), api_key=args.api_key)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                                timeout_graceful_shutdown=args.shutdown_timeout)
        uvicorn.Server(config).run()
    finally:
        engine.shutdown(timeout_s=args.shutdown_timeout)
