"""The load client of ``hypic bench serve``: streamed ``/v1/completions`` requests sent at given
instants over one ``httpx.AsyncClient``, each timed at the client, and ``/metrics`` scrapes.

Timing (``vllm bench serve``'s definitions): a request starts when its POST is sent; every SSE
event that carries a choice is a token event (the server streams one per engine step that
produced tokens); TTFT is the first token event's time after the start, ITL the gaps between
consecutive token events, E2EL the time of the last event. Output tokens are the usage chunk's
``completion_tokens`` (else the token ids the chunks carried, else the number of token events).
A request fails on a non-200 answer, an error event, a stream without a token event, a transport
error, or when it is still running ``drain_timeout_s`` after the last scheduled arrival (it is
then cancelled: the server sees the disconnect and aborts it).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import httpx
from prometheus_client.parser import text_string_to_metric_families

_JSON = {"Content-Type": "application/json"}


@dataclass
class RequestResult:
    index: int
    scheduled_s: float  # arrival offset the schedule asked for
    start_s: float = 0.0  # when the POST was sent, from the run's start
    success: bool = False
    error: str = ""
    ttft_s: Optional[float] = None
    itl_s: List[float] = field(default_factory=list)
    latency_s: Optional[float] = None
    output_tokens: int = 0
    prompt_tokens: Optional[int] = None  # the server's count (usage)
    cached_tokens: Optional[int] = None  # usage.prompt_tokens_details.cached_tokens
    segment_hit_tokens: Optional[int] = None  # hypic's usage.pic
    prefix_hit_tokens: Optional[int] = None

    @property
    def end_s(self) -> Optional[float]:
        return None if self.latency_s is None else self.start_s + self.latency_s


def _read_usage(result: RequestResult, usage: Dict) -> None:
    result.output_tokens = int(usage.get("completion_tokens") or 0)
    result.prompt_tokens = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details") or {}
    result.cached_tokens = details.get("cached_tokens")
    pic = usage.get("pic") or {}
    result.segment_hit_tokens = pic.get("segment_hit_tokens")
    result.prefix_hit_tokens = pic.get("prefix_hit_tokens")


def encode_body(body: Dict) -> bytes:
    """A request body as sent: encoded once before the schedule starts, so that encoding a
    32k-token prompt's JSON is not part of any timing."""
    return json.dumps(body, separators=(",", ":")).encode()


async def stream_completion(client: httpx.AsyncClient, url: str, body: bytes, result: RequestResult,
                            t0: float) -> RequestResult:
    """POST ``body`` (:func:`encode_body` of a ``stream: true`` request) and fill ``result`` from
    the SSE events as they arrive."""
    start = time.perf_counter()
    result.start_s = start - t0
    last = start
    token_events = 0
    token_ids = 0
    usage = None
    try:
        async with client.stream("POST", url, content=body, headers=_JSON) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                result.error = f"HTTP {response.status_code}: {text[:300]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators and SSE comments
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                event = json.loads(data)
                if "error" in event:
                    result.error = f"error event: {json.dumps(event['error'])[:300]}"
                    return result
                if event.get("choices"):
                    if token_events == 0:
                        result.ttft_s = now - start
                    else:
                        result.itl_s.append(now - last)
                    last = now
                    token_events += 1
                    token_ids += len(event["choices"][0].get("token_ids") or ())
                if event.get("usage"):
                    usage = event["usage"]
    except httpx.HTTPError as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    if token_events == 0:
        result.error = "the stream carried no token"
        return result
    result.latency_s = last - start
    result.success = True
    if usage is not None:
        _read_usage(result, usage)
    else:
        result.output_tokens = token_ids or token_events
    return result


async def _send_at(client: httpx.AsyncClient, url: str, body: bytes, result: RequestResult, t0: float) -> None:
    delay = t0 + result.scheduled_s - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    await stream_completion(client, url, body, result, t0)


async def run_schedule(base_url: str, bodies: Sequence[bytes], arrivals_s: Sequence[float], *,
                       drain_timeout_s: float, api_key: Optional[str] = None) -> List[RequestResult]:
    """Send ``bodies[i]`` at ``arrivals_s[i]`` seconds after the start; return one result each,
    in order. Requests still running ``drain_timeout_s`` after the last arrival are cancelled and
    fail."""
    if len(bodies) != len(arrivals_s):
        raise ValueError(f"{len(bodies)} bodies but {len(arrivals_s)} arrival times")
    url = base_url.rstrip("/") + "/v1/completions"
    results = [RequestResult(i, float(a)) for i, a in enumerate(arrivals_s)]
    async with _client(api_key) as client:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(_send_at(client, url, b, r, t0)) for b, r in zip(bodies, results)]
        deadline = t0 + (max(arrivals_s) if arrivals_s else 0.0) + drain_timeout_s
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    for r, task in zip(results, tasks):
        if task in pending:
            r.success, r.error = False, f"cancelled: still running {drain_timeout_s:g} s after the last arrival"
        elif task.exception() is not None:
            r.success, r.error = False, f"{type(task.exception()).__name__}: {task.exception()}"
    return results


async def run_closed_loop(base_url: str, bodies: Sequence[bytes], *, api_key: Optional[str] = None
                          ) -> List[RequestResult]:
    """Send ``bodies`` one after another, each when the previous one finished."""
    url = base_url.rstrip("/") + "/v1/completions"
    results = []
    async with _client(api_key) as client:
        t0 = time.perf_counter()
        for i, body in enumerate(bodies):
            result = RequestResult(i, time.perf_counter() - t0)
            results.append(await stream_completion(client, url, body, result, t0))
    return results


async def run_beside(base_url: str, long_body: bytes, bodies: Sequence[bytes], *, api_key: Optional[str] = None
                     ) -> Tuple[RequestResult, List[RequestResult]]:
    """Send ``long_body``, then ``bodies`` one after another while it runs (the next as the
    previous finishes, none once it has finished): how requests fare beside a long prefill.
    Returns the long request's result and those of the requests sent while it ran."""
    url = base_url.rstrip("/") + "/v1/completions"
    async with _client(api_key) as client:
        t0 = time.perf_counter()
        long_result = RequestResult(-1, 0.0)
        long_task = asyncio.ensure_future(stream_completion(client, url, long_body, long_result, t0))
        await asyncio.sleep(0)  # the long request is sent first
        results: List[RequestResult] = []
        for i, body in enumerate(bodies):
            if long_task.done():
                break
            result = RequestResult(i, time.perf_counter() - t0)
            results.append(await stream_completion(client, url, body, result, t0))
        await long_task
    return long_result, results


def _client(api_key: Optional[str]) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # no pool limit: a request never waits for a connection, so the client adds no queueing
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0), limits=limits, headers=headers)


# ---- the server's /metrics ---------------------------------------------------------------------


def parse_metrics(text: str) -> Dict[str, float]:
    """Sample name -> value of a Prometheus text page (label sets summed; ``*_created`` dropped)."""
    out: Dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def scrape_metrics(base_url: str, timeout_s: float = 10.0) -> Optional[Dict[str, float]]:
    """The server's ``/metrics`` parsed, or None where it has none (or it does not parse)."""
    try:
        response = httpx.get(base_url.rstrip("/") + "/metrics", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return parse_metrics(response.text)
    except ValueError:
        return None


def wait_idle(base_url: str, timeout_s: float) -> bool:
    """Wait until the server reports no running or waiting request (hypic's gauges); True when it
    did within ``timeout_s``, or when the server does not report them."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = scrape_metrics(base_url)
        if metrics is None or "hypic:num_requests_running" not in metrics:
            return True
        if metrics["hypic:num_requests_running"] + metrics.get("hypic:num_requests_waiting", 0) == 0:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def health_ok(base_url: str, timeout_s: float = 10.0) -> bool:
    try:
        return httpx.get(base_url.rstrip("/") + "/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def served_model(base_url: str, api_key: Optional[str] = None) -> str:
    """The first model ``/v1/models`` lists."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    response = httpx.get(base_url.rstrip("/") + "/v1/models", headers=headers, timeout=30)
    response.raise_for_status()
    return response.json()["data"][0]["id"]


def flush_cache(base_url: str) -> Optional[int]:
    """``POST /flush_cache`` (hypic, SGLang): entries dropped, or None where the route is absent."""
    try:
        response = httpx.post(base_url.rstrip("/") + "/flush_cache", timeout=60)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return response.json().get("flushed_entries")
    except ValueError:
        return None
