"""``hypic serve``: build the engine from the command line's options and run uvicorn."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

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


class _Terminated(Exception):
    """SIGTERM, re-raised by uvicorn after its graceful shutdown (see :func:`run_server`)."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated()


def run_server(args: argparse.Namespace) -> None:
    """Serve until SIGINT / SIGTERM; then uvicorn lets open requests finish (up to
    ``--shutdown-timeout``), and the engine drains what is left before it stops.

    uvicorn re-raises the signal it caught once it has shut down, so that the process ends by it;
    under the default SIGTERM action that would kill the process before the engine's drain (and
    the segment store's last writes to disk) ran. Both signals therefore end here as exceptions,
    the drain runs, and the command exits 0."""
    engine = build_async_engine(args)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    try:
        app = create_app(engine, served_model_name=args.served_model_name or str(args.model), api_key=args.api_key)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                                timeout_graceful_shutdown=args.shutdown_timeout)
        try:
            uvicorn.Server(config).run()
        except (KeyboardInterrupt, _Terminated):
            logger.info("stopped by a signal: draining the engine")
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        engine.shutdown(timeout_s=args.shutdown_timeout)
