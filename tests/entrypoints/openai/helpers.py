"""Shared by the server tests: the engine settings and a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Iterator


ENGINE = dict(dtype="float32", device="cpu", seed=0, max_model_len=256, max_num_batched_tokens=64)


@contextlib.contextmanager
def serve(app) -> Iterator[str]:
    """Run ``app`` under uvicorn on a free port of 127.0.0.1 (a thread); yields its base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.started, "the server did not start within 30 s"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
