"""The engine's end of one segment worker: its process, its pipe, and two threads, so that the
engine's own thread never blocks on a worker (:mod:`hypic.runner.segment_parallel`).

* The **sender** thread writes the engine's messages to the pipe. A worker that stops reading
  (hung) fills the pipe and blocks this thread, not the engine; killing the worker unblocks it.
* The **receiver** thread waits on the pipe and on the process's sentinel together, so a worker
  that dies is seen at once (its pipe closes; its sentinel fires even where a child of it still
  holds the pipe open), and reads each answer with its buffer (:mod:`hypic.runner.segment_wire`):
  a CUDA buffer, a handle to the worker's memory, is copied onto the engine's device on a
  stream of its own, beside the engine's compute, and waited for here, so the worker may free
  it once the answer is taken. Each answer, or :class:`Lost` when the pipe closes or an answer
  cannot be read, goes to the engine's event queue as ``(rank, message)``.

A worker that is alive but silent (hung) is found by the engine's own reply timeout, which then
kills it (:meth:`WorkerLink.kill`).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Optional

import torch

from hypic.runner.segment_wire import Entries, now_s, receive_buffer

KILL_JOIN_TIMEOUT_S = 10.0  # a SIGKILLed process is reaped well within this


@dataclass
class Lost:
    """The worker's pipe closed or failed: the process died, or its answer could not be read."""

    detail: str


def exit_detail(exitcode: Optional[int]) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


class WorkerLink:
    """``process`` (started; ``conn`` its end of the pipe) as rank ``rank``; answers go to
    ``events``. ``device``: the engine's device, where CUDA buffers are copied to."""

    def __init__(self, rank: int, process, conn, events: "queue.Queue", device: torch.device) -> None:
        self.rank = rank
        self.process = process
        self.pid = process.pid
        self.conn = conn
        self.device = torch.device(device)
        self.alive = True
        self.last_heard_s = now_s()  # the reply timeout runs from here
        self._events = events
        self._outbox: "queue.Queue" = queue.Queue()
        self._copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._sender = threading.Thread(target=self._send_loop, name=f"segment-worker-{rank}-send", daemon=True)
        self._sender.start()
        threading.Thread(target=self._receive_loop, name=f"segment-worker-{rank}-receive", daemon=True).start()

    def send(self, message) -> None:
        """Queue ``message`` for the worker (never blocks)."""
        self._outbox.put(message)

    def kill(self) -> str:
        """SIGKILL the worker and reap it; returns how it ended. Its threads end on their own."""
        self.alive = False
        if self.process.is_alive():
            self.process.kill()
        self.process.join(KILL_JOIN_TIMEOUT_S)
        return exit_detail(self.process.exitcode)

    def _send_loop(self) -> None:
        while True:
            message = self._outbox.get()
            if message is None:
                return
            try:
                self.conn.send(message)
            except (OSError, ValueError):  # the worker is gone or the pipe closed: the receiver says so
                return

    def _receive_loop(self) -> None:
        while True:
            try:
                ready = wait([self.conn, self.process.sentinel])
                if self.conn not in ready:
                    raise EOFError("the process ended")
                message = self.conn.recv()
                self.last_heard_s = now_s()
                if isinstance(message, Entries):
                    message.buffer = self._local_copy(receive_buffer(self.conn, message))
                    message.received_at = self.last_heard_s = now_s()
            except Exception as exc:  # noqa: BLE001 - EOF, a reset pipe, a handle of a dead process: all lose it
                self._events.put((self.rank, Lost(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)))
                break
            self._events.put((self.rank, message))
        # The pipe is closed only here, once the sender has stopped too, so that neither thread
        # can touch its descriptor after the close (nor a file that reuses the number). The
        # sender ends once the process is gone: the engine kills a worker it has lost.
        self._outbox.put(None)
        self._sender.join()
        self.conn.close()

    def _local_copy(self, buffer: torch.Tensor) -> torch.Tensor:
        """``buffer`` (bytes read from the pipe, or a mapping of the worker's CUDA memory) on the
        engine's device, the copy finished: the worker may free its buffer once this returns."""
        if buffer.device.type == "cpu" and self.device.type == "cpu":
            return buffer
        if self._copy_stream is None:
            return buffer.to(self.device)
        # The copy waits for the destination's current stream: this thread's own stream, not the
        # engine's compute.
        with torch.cuda.stream(self._copy_stream):
            local = buffer.to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._copy_stream)
        done.synchronize()
        return local


__all__ = ["KILL_JOIN_TIMEOUT_S", "Lost", "WorkerLink", "exit_detail"]
