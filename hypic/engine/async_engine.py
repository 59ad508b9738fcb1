"""AsyncLLMEngine: one :class:`~hypic.engine.engine.LLMEngine` stepped by one background thread
(the **engine loop**) beside any number of asyncio event loops and threads.

* Requests are submitted from any thread or coroutine into a thread-safe command queue; the loop
  applies it before its next step, so a request joins the running batch at the next step
  (continuous batching is the scheduler's: prefill and decode interleave under
  ``max_num_batched_tokens``). Only the loop thread touches the engine, so nothing in
  :class:`LLMEngine` needs a lock.
* ``await engine.add_request(...)`` returns once the loop has accepted the request (a
  :class:`RequestStream`), or raises the engine's ``ValueError`` for input it cannot serve: the
  HTTP server answers 400 before it sends any header. ``async for out in engine.generate(...)``
  does both.
* A stream that is closed before its request finished (client disconnect, task cancelled, a
  ``break``) aborts the request: the engine drops it and its cache.
* A bounded waiting queue: with ``max_waiting_requests`` requests submitted and not yet producing
  tokens, :meth:`add_request` raises :class:`QueueFullError` (the server answers 503).
* An exception inside a step (not an input error: those are caught by ``add_request``) fails the
  requests the engine held with :class:`EngineStepError` and the loop keeps serving new ones.
* :meth:`shutdown` stops admitting, lets running requests finish (up to a timeout), aborts the
  rest, and stops the loop.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import logging
import threading
import time
from typing import AsyncIterator, Callable

from hypic.engine.engine import LLMEngine
from hypic.engine.outputs import RequestOutput
from hypic.engine.sampling_params import SamplingParams
from hypic.pic.store import StoreStats

logger = logging.getLogger(__name__)

# listener(output, num_new_tokens, now): called on the loop thread for every output of a step
OutputListener = Callable[[RequestOutput, int, float], None]


class QueueFullError(RuntimeError):
    """The waiting queue holds ``max_waiting_requests`` requests: try again later."""


class EngineClosedError(RuntimeError):
    """The engine is shutting down (or its loop has stopped) and admits no request."""


class EngineStepError(RuntimeError):
    """A step of the engine raised while this request was in it."""


_ACCEPTED = object()


class RequestStream:
    """Outputs of one request, delivered from the loop thread into the consumer's event loop."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop, engine: "AsyncLLMEngine") -> None:
        self.request_id = request_id
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self._engine = engine
        self.finished = False
        # set by the loop thread: a first token arrived; output tokens delivered so far
        self.started = False
        self.num_tokens = 0

    def put(self, item) -> bool:
        """From the loop thread: hand ``item`` (an output, ``_ACCEPTED`` or an exception) over.
        False when the consumer's event loop is gone."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
            return True
        except RuntimeError:  # the consumer's event loop is closed
            return False

    async def _get(self):
        return await self._queue.get()

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._outputs()

    async def _outputs(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                item = await self._queue.get()
                if isinstance(item, BaseException):
                    self.finished = True
                    raise item
                if item.finished:
                    self.finished = True
                yield item
        finally:
            if not self.finished:  # closed early: disconnect, cancellation, break
                self.finished = True
                self._engine.abort(self.request_id)


class AsyncLLMEngine:
    """Serve one :class:`LLMEngine` from a background thread. ``max_waiting_requests``: requests
    submitted and not yet producing tokens beyond which :meth:`add_request` raises
    :class:`QueueFullError` (None: unbounded)."""

    def __init__(self, engine: LLMEngine, *, max_waiting_requests: int | None = 256) -> None:
        if max_waiting_requests is not None and (not isinstance(max_waiting_requests, int)
                                                 or isinstance(max_waiting_requests, bool) or max_waiting_requests < 1):
            raise ValueError(f"max_waiting_requests must be an int >= 1 or None, got {max_waiting_requests!r}")
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self._cv = threading.Condition()
        self._commands: collections.deque = collections.deque()
        self._streams: dict[str, RequestStream] = {}  # requests submitted and not finished
        self._num_waiting = 0  # of those, the ones without a first token
        self._accepting = True
        self._stop = False
        self._listeners: list[OutputListener] = []
        self._ids = itertools.count()
        self.num_aborted_requests = 0  # aborted while the engine held them (cancel, disconnect)
        self._thread = threading.Thread(target=self._run_loop, name="hypic-engine-loop", daemon=True)
        self._thread.start()

    # ---- any thread ------------------------------------------------------------------------
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self._accepting

    @property
    def num_unfinished_requests(self) -> int:
        """Requests submitted whose stream has not finished."""
        with self._cv:
            return len(self._streams)

    @property
    def num_waiting_requests(self) -> int:
        """Requests submitted that have no token yet (queued or prefilling)."""
        with self._cv:
            return self._num_waiting

    @property
    def num_running_requests(self) -> int:
        """Requests producing tokens."""
        with self._cv:
            return len(self._streams) - self._num_waiting

    def segment_cache_stats(self) -> StoreStats:
        return self.engine.segment_cache_stats()  # the store takes its own lock

    def segment_worker_counts(self) -> tuple[int, int, int]:
        """``(live workers, worker faults, segments the engine prefilled for failed workers)``:
        plain counters the loop thread only increments, read without a lock."""
        stats = self.engine.stats
        return (self.engine.num_live_segment_workers, stats.num_segment_worker_faults,
                stats.num_segments_recomputed)

    def add_output_listener(self, listener: OutputListener) -> None:
        """``listener(output, num_new_tokens, now)`` runs on the loop thread after each step for
        each output (keep it short: it delays the next step)."""
        self._listeners.append(listener)

    async def add_request(
        self,
        prompt,
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
        **options,
    ) -> RequestStream:
        """Submit a request; returns its stream once the loop accepted it. ``options``: the
        per-request PIC settings of :meth:`LLMEngine.add_request` (mode, seam, cold_policy,
        cache_salt). Raises ValueError (bad input), QueueFullError, EngineClosedError."""
        if request_id is None:
            request_id = f"async-{next(self._ids)}"
        stream = RequestStream(request_id, asyncio.get_running_loop(), self)
        with self._cv:
            if not self._accepting or not self._thread.is_alive():
                raise EngineClosedError("the engine is shutting down")
            if request_id in self._streams:
                raise ValueError(f"request_id {request_id!r} is already in use")
            if self.max_waiting_requests is not None and self._num_waiting >= self.max_waiting_requests:
                raise QueueFullError(f"the waiting queue is full ({self.max_waiting_requests} requests); retry later")
            self._streams[request_id] = stream
            self._num_waiting += 1
            self._commands.append(("add", request_id, prompt, sampling_params, options))
            self._cv.notify()
        try:
            item = await stream._get()
        except BaseException:  # cancelled while waiting to be accepted
            stream.finished = True
            self.abort(request_id)
            raise
        if isinstance(item, BaseException):
            stream.finished = True
            raise item
        return stream

    async def generate(self, prompt, sampling_params: SamplingParams | None = None, request_id: str | None = None,
                       **options) -> AsyncIterator[RequestOutput]:
        """``async for output in engine.generate(...)``: cumulative outputs after every step that
        gave the request a token, the last one with ``finished``. Leaving the loop early aborts
        the request."""
        stream = await self.add_request(prompt, sampling_params, request_id, **options)
        async for output in stream:
            yield output

    def abort(self, request_id: str) -> None:
        """Abort a request (no-op if it is unknown or finished); applied before the next step."""
        with self._cv:
            self._commands.append(("abort", request_id))
            self._cv.notify()

    async def flush_cache(self) -> int:
        """Drop every segment-store entry no request holds, between two steps; returns how many."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if not self._thread.is_alive():
                raise EngineClosedError("the engine loop has stopped")
            self._commands.append(("flush", done))
            self._cv.notify()
        return await asyncio.wrap_future(done)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop admitting requests, let the unfinished ones run for up to ``timeout_s``, abort the
        rest (their streams end with EngineClosedError), stop the loop and the engine's workers."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            self._accepting = False
            while self._streams and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(min(left, 0.05))
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=max(1.0, deadline - time.monotonic()))
        self.engine.shutdown()

    # ---- the loop thread -------------------------------------------------------------------
    def _run_loop(self) -> None:
        engine = self.engine
        while True:
            with self._cv:
                while not self._commands and not engine.has_unfinished_requests() and not self._stop:
                    self._cv.wait()
                commands = list(self._commands)
                self._commands.clear()
                stop = self._stop
            for command in commands:
                self._apply(command)
            if stop:
                self._close_all(EngineClosedError("the engine shut down before the request finished"))
                return
            if engine.has_unfinished_requests():
                try:
                    outputs = engine.step()
                except Exception as e:  # noqa: BLE001 - fail the held requests, keep serving
                    logger.exception("engine step failed")
                    self._close_all(EngineStepError(f"engine step failed: {type(e).__name__}: {e}"),
                                    held_only=True)
                    continue
                self._dispatch(outputs)

    def _apply(self, command) -> None:
        if command[0] == "flush":
            command[1].set_result(self.engine.store.clear())
            return
        if command[0] == "abort":
            request_id = command[1]
            if self.engine.abort_request(request_id):
                self.num_aborted_requests += 1
            with self._cv:
                stream = self._streams.pop(request_id, None)
                if stream is not None and not stream.started:
                    self._num_waiting -= 1
                self._cv.notify_all()
            return
        _, request_id, prompt, params, options = command
        with self._cv:
            stream = self._streams.get(request_id)
        if stream is None:  # aborted before it was added
            return
        try:
            self.engine.add_request(prompt, params, request_id=request_id, **options)
        except Exception as e:  # noqa: BLE001 - input errors go to this request only
            with self._cv:
                self._streams.pop(request_id, None)
                self._num_waiting -= 1
                self._cv.notify_all()
            stream.put(e if isinstance(e, ValueError) else ValueError(f"{type(e).__name__}: {e}"))
            return
        if not stream.put(_ACCEPTED):
            self.engine.abort_request(request_id)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        now = time.monotonic()
        lost = []
        with self._cv:
            for output in outputs:
                stream = self._streams.get(output.request_id)
                if stream is None:
                    continue
                num_new = len(output.outputs[0].token_ids) - stream.num_tokens
                stream.num_tokens += num_new
                if not stream.started:
                    stream.started = True
                    self._num_waiting -= 1
                if output.finished:
                    del self._streams[output.request_id]
                # listeners first: a client that has its answer finds it counted
                for listener in self._listeners:
                    try:
                        listener(output, num_new, now)
                    except Exception:  # noqa: BLE001 - metrics never stop the loop
                        logger.exception("output listener failed")
                if not stream.put(output) and not output.finished:
                    lost.append(output.request_id)
            self._cv.notify_all()
        for request_id in lost:
            self._apply(("abort", request_id))

    def _close_all(self, error: BaseException, held_only: bool = False) -> None:
        """End the streams of the requests the engine holds (``held_only``; requests submitted
        meanwhile are added by the next pass) or of all requests, with ``error``."""
        with self._cv:
            streams = list(self._streams.items())
        closed = []
        for request_id, stream in streams:
            if self.engine.abort_request(request_id) or not held_only:
                closed.append((request_id, stream))
        with self._cv:
            for request_id, stream in closed:
                if self._streams.pop(request_id, None) is not None and not stream.started:
                    self._num_waiting -= 1
            self._cv.notify_all()
        for _, stream in closed:
            stream.put(error)
