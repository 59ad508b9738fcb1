"""Launching ``hypic serve`` for ``hypic bench serve``: one fresh server process per PIC mode on
127.0.0.1, built from the benchmark's engine options, stopped before the next mode starts.

The engine options are the ones ``hypic serve`` takes (:data:`hypic.config.ENGINE_OPTIONS`); the
benchmark parses them with the same parser and writes back each one that differs from its
default, with ``--pic-mode`` set to the mode. ``--dummy-config FILE`` (a model's config.json, no
weights) becomes a model folder holding only that config, served with ``--load-format dummy``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

import hypic
from hypic.bench.serve_client import health_ok
from hypic.config import ENGINE_OPTIONS

# options the benchmark sets itself for each server
_SET_PER_SERVER = ("pic_mode", "model")
_PR_SET_PDEATHSIG = 1


def _flag_value(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def engine_flags(args: argparse.Namespace) -> List[str]:
    """``hypic serve`` flags for every engine option of ``args`` that is not at its default."""
    out: List[str] = []
    for option in ENGINE_OPTIONS:
        if option.name in _SET_PER_SERVER:
            continue
        value = getattr(args, option.name)
        if value == option.default:
            continue
        if isinstance(value, bool):
            out.append(option.flag if value else "--no-" + option.flag[2:])
        else:
            out.extend([option.flag, _flag_value(value)])
    return out


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: SIGTERM when the benchmark dies, so a killed run never leaves a server
    holding the GPU (Linux; elsewhere the benchmark's own shutdown has to do)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


# The server runs `python -m hypic` in the folder holding this hypic package: -m puts the working
# folder first on sys.path, so the server measured is this code also where another copy of hypic is
# installed.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(hypic.__file__)))


class LaunchedServer:
    """``with LaunchedServer(mode, args, log_path) as server: server.base_url ...``"""

    def __init__(self, mode: str, args: argparse.Namespace, log_path: str, *, start_timeout_s: float,
                 host: str = "127.0.0.1") -> None:
        self.mode, self.log_path, self.start_timeout_s = mode, log_path, start_timeout_s
        self.port = free_port(host)
        self.base_url = f"http://{host}:{self.port}"
        self._model_dir: Optional[str] = None
        model = str(args.model)
        if os.path.exists(model):  # a checkpoint folder: the server runs in another working folder
            model = os.path.abspath(model)
        if getattr(args, "dummy_config", None):
            self._model_dir = tempfile.mkdtemp(prefix="hypic-bench-model-")
            shutil.copyfile(args.dummy_config, os.path.join(self._model_dir, "config.json"))
            model = self._model_dir
        self.served_model_name = model_label(args)
        self.argv = [sys.executable, "-m", "hypic", "serve", model, "--host", host, "--port", str(self.port),
                     "--pic-mode", mode, "--served-model-name", self.served_model_name,
                     "--shutdown-timeout", "5", *engine_flags(args)]
        self.process: Optional[subprocess.Popen] = None
        self.startup_s: Optional[float] = None

    def __enter__(self) -> "LaunchedServer":
        folder = os.path.dirname(os.path.abspath(self.log_path))
        os.makedirs(folder, exist_ok=True)
        log = open(self.log_path, "w", encoding="utf-8")
        t0 = time.perf_counter()
        try:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=_CHECKOUT,
                                            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        finally:
            log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - t0
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"`hypic serve` ({self.mode}) exited with {self.process.returncode} before it "
                                   f"was ready; the end of {self.log_path}:\n{self.log_tail()}")
            if health_ok(self.base_url, timeout_s=5):
                return
            time.sleep(0.2)
        raise RuntimeError(f"`hypic serve` ({self.mode}) not ready after {self.start_timeout_s:g} s; the end of "
                           f"{self.log_path}:\n{self.log_tail()}")

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, num_lines: int = 30) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-num_lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGINT (uvicorn's graceful stop, then the engine drains), SIGKILL if it hangs."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self._model_dir is not None:
            shutil.rmtree(self._model_dir, ignore_errors=True)
            self._model_dir = None


def model_label(args: argparse.Namespace) -> str:
    """The model's name in reports: the dummy config's file name + ``-dummy``, else ``--model``."""
    if getattr(args, "dummy_config", None):
        return os.path.splitext(os.path.basename(args.dummy_config))[0] + "-dummy"
    return str(args.model) + ("-dummy" if args.load_format == "dummy" else "")
