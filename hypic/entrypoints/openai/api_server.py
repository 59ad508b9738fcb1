"""The FastAPI app: OpenAI routes, SGLang's ``/generate``, health, models, metrics, tokenizer.

Every route runs on the event loop and talks to the engine loop through
:class:`~hypic.engine.async_engine.AsyncLLMEngine`; nothing here blocks on a step. Errors use
OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: 400 for any input the engine
or the request schema refuses (the engine keeps serving the others), 401 without the API key,
404 for an unknown model or route, 503 when the waiting queue is full or the server is shutting
down.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hypic.engine.async_engine import AsyncLLMEngine, EngineClosedError, QueueFullError, RequestStream
from hypic.engine.outputs import RequestOutput
from hypic.entrypoints.llm import chat_prompt
from hypic.entrypoints.openai.logprobs import (
    chat_logprobs, completion_logprobs, joined, next_offset, prompt_logprobs,
)
from hypic.entrypoints.openai.metrics import ServerMetrics
from hypic.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    GenerateRequest,
    TokenizeRequest,
    UnsupportedField,
)
from hypic.pic.segments import PIC_SEP

_SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default for /generate


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
            503: "service_unavailable"}.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code or str(status)}}


def _error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status)


class _Choice:
    """What one completion (prompt ``prompt_index``, sample ``index``) has sent so far."""

    def __init__(self, index: int, prompt_index: int, holdback: int) -> None:
        self.index, self.prompt_index, self.holdback = index, prompt_index, holdback
        self.sent_chars = 0
        self.sent_tokens = 0  # tokens whose log-probabilities were streamed
        self.logprob_chars = 0  # characters of those tokens' own texts (the next text_offset)
        self.streamed_ids = 0  # tokens whose ids were streamed (return_token_ids)
        self.echoed = False  # the prompt's text went out (echo)
        self.output: RequestOutput | None = None

    def delta(self, output: RequestOutput) -> str:
        """New text to stream. While unfinished, the last ``holdback`` characters (longest stop
        string minus one) are held back: a stop string may still cut them off."""
        self.output = output
        text = output.outputs[0].text
        end = len(text) if output.finished else max(len(text) - self.holdback, self.sent_chars)
        piece = text[self.sent_chars:end]
        self.sent_chars = max(end, self.sent_chars)
        return piece

    def logprobs(self, chat: bool, num_top: int | None, streamed: bool) -> dict | None:
        """The choice's ``logprobs`` object: of every token (``streamed`` False) or of the tokens
        not streamed yet; None when the request asked for none."""
        completion = self.output.outputs[0]
        if num_top is None or completion.logprobs is None:
            return None
        start = self.sent_tokens if streamed else 0
        ids, entries = completion.token_ids[start:], completion.logprobs[start:]
        if chat:
            body = chat_logprobs(entries, ids, num_top)
        else:
            body = completion_logprobs(entries, ids, num_top, self.logprob_chars if streamed else 0)
        if streamed:
            self.sent_tokens = len(completion.token_ids)
            if not chat and body["tokens"]:
                self.logprob_chars = body["text_offset"][-1] + len(body["tokens"][-1])
        return body

    def new_token_ids(self) -> list[int]:
        """Token ids generated since the last call (after :meth:`delta` took the output)."""
        ids = self.output.outputs[0].token_ids
        new = list(ids[self.streamed_ids:])
        self.streamed_ids = len(ids)
        return new


def _usage(choices: list[_Choice]) -> dict:
    firsts = {}
    for c in choices:
        if c.output is not None:
            firsts.setdefault(c.prompt_index, c.output)
    prompt_tokens = sum(o.metrics.prompt_tokens for o in firsts.values())
    completion_tokens = sum(len(c.output.outputs[0].token_ids) for c in choices if c.output is not None)
    segment_hits = sum(o.metrics.cached_tokens for o in firsts.values())
    prefix_hits = sum(o.metrics.prefix_hit_tokens for o in firsts.values())
    live = sum(o.metrics.live_tokens if o.metrics.live_tokens is not None else o.metrics.prompt_tokens
               for o in firsts.values())
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": segment_hits + prefix_hits},
        "pic": {"segment_hit_tokens": segment_hits, "prefix_hit_tokens": prefix_hits, "live_tokens": live},
    }


async def _merge(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(stream index, output) of several streams as they come; closing it aborts them all."""
    if len(streams) == 1:
        async for output in streams[0]:
            yield 0, output
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for output in stream:
                queue.put_nowait((i, output))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait((i, e))
        finally:
            queue.put_nowait((i, done))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            i, item = await queue.get()
            if item is done:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()


def create_app(engine: AsyncLLMEngine, *, served_model_name: str, api_key: str | None = None) -> FastAPI:
    """The app over ``engine`` (which the caller starts and shuts down)."""
    app = FastAPI(title="hypic", version="0.1.0")
    metrics = ServerMetrics(engine, served_model_name)
    app.state.engine, app.state.metrics = engine, metrics
    created = int(time.time())

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError):
        metrics.http_errors.labels(status=str(e.status)).inc()
        return _error_response(e.status, e.message, e.param, e.code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, e: RequestValidationError):
        errors = e.errors()
        first = errors[0] if errors else {}
        param = ".".join(str(x) for x in first.get("loc", ())[1:]) or None
        message = "; ".join(f"{'.'.join(str(x) for x in err.get('loc', ()))}: {err.get('msg')}" for err in errors)
        metrics.http_errors.labels(status="400").inc()
        return _error_response(400, message or "invalid request", param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException):
        response = _error_response(e.status_code, str(e.detail))
        response.headers.update(e.headers or {})  # 405's Allow header (RFC 9110)
        return response

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, e: Exception):
        metrics.http_errors.labels(status="500").inc()
        return _error_response(500, f"internal error: {type(e).__name__}: {e}")

    if api_key is not None:
        @app.middleware("http")
        async def _check_key(request: Request, call_next):
            if request.url.path not in ("/health", "/metrics") and \
                    request.headers.get("authorization") != f"Bearer {api_key}":
                return _error_response(401, "missing or wrong API key (Authorization: Bearer <key>)",
                                       code="invalid_api_key")
            return await call_next(request)

    def check_model(name: str | None) -> None:
        if name is not None and name != served_model_name:
            raise APIError(404, f"the model `{name}` does not exist (this server serves `{served_model_name}`)",
                           "model", "model_not_found")

    def tokenizer():
        if engine.tokenizer is None:
            raise APIError(400, "this model has no tokenizer: send token ids")
        return engine.tokenizer

    async def submit(prompts: list, make_params: Callable[[int], Any], n: int, options: dict,
                     base_id: str) -> list[RequestStream]:
        """Queue n samples of every prompt; on any refusal abort what was queued and raise."""
        streams: list[RequestStream] = []
        try:
            for i, prompt in enumerate(prompts):
                for j in range(n):
                    params = make_params(j)
                    # samples 1..n-1 may start after sample 0 and reuse its prefill (LLMEngine.add_request)
                    after = {"start_after": f"{base_id}-{i}-0"} if j else {}
                    streams.append(await engine.add_request(prompt, params, f"{base_id}-{i}-{j}", **options, **after))
        except BaseException as e:
            for s in streams:
                s.finished = True
                engine.abort(s.request_id)
            if isinstance(e, (ValueError, TypeError)):
                raise APIError(400, str(e), getattr(e, "param", None)) from None
            if isinstance(e, QueueFullError):
                raise APIError(503, str(e)) from None
            if isinstance(e, EngineClosedError):
                raise APIError(503, str(e)) from None
            raise
        return streams

    def sampling(req, max_tokens: int | None):
        try:
            req.sampling_params(max_tokens)  # validated once here: a 400 before anything is queued
        except (ValueError, TypeError) as e:
            raise APIError(400, str(e), e.param if isinstance(e, UnsupportedField) else None) from None
        return lambda j: req.sampling_params(max_tokens, j)

    async def run(raw: Request, streams: list[RequestStream], choices: list[_Choice], stream: bool,
                  chunk: Callable[[_Choice, str, RequestOutput, list[int]], dict | None], final: Callable[[], dict],
                  include_usage: bool, usage_chunk: Callable[[dict], dict]):
        merged = _merge(streams)
        if not stream:
            try:
                async for i, output in merged:
                    choices[i].delta(output)
                    if await raw.is_disconnected():
                        return _error_response(400, "the client disconnected")
            finally:
                await merged.aclose()
            return JSONResponse(final())

        async def events():
            try:
                for c in choices:
                    first = chunk(c, None, None, [])  # role header of chat; None for completions
                    if first is not None:
                        yield _sse(first)
                async for i, output in merged:
                    c = choices[i]
                    piece = c.delta(output)
                    new_ids = c.new_token_ids()
                    # A chunk for every step that produced tokens, even when their text is held
                    # back (a stop string may still match) or empty (no tokenizer): clients time
                    # the first token and the gaps between tokens by these chunks.
                    if piece or new_ids or output.finished:
                        yield _sse(chunk(c, piece, output, new_ids))
                    if await raw.is_disconnected():
                        return
                if include_usage:
                    yield _sse(usage_chunk(_usage(choices)))
                yield "data: [DONE]\n\n"
            except Exception as e:  # noqa: BLE001 - headers are sent: the error is an event
                yield _sse(error_body(500, f"{type(e).__name__}: {e}"))
                yield "data: [DONE]\n\n"
            finally:
                await merged.aclose()

        return StreamingResponse(events(), media_type="text/event-stream")

    # ---- OpenAI routes ------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, raw: Request):
        check_model(req.model)
        prompts = _check(req, req.prompts)
        make = sampling(req, req.max_tokens)
        rid = f"cmpl-{uuid.uuid4().hex}"
        streams = await submit(prompts, make, req.n, req.pic_options(), rid)
        holdback = max((len(s) for s in req.stop_strings), default=1) - 1
        choices = [_Choice(k, k // req.n, holdback) for k in range(len(streams))]
        now = int(time.time())
        head = {"id": rid, "object": "text_completion", "created": now, "model": served_model_name}

        def echoed(c: _Choice) -> str:
            """The prompt's text when ``echo`` (its tokens decoded when it was given as ids or
            segments), else ''."""
            if not req.echo:
                return ""
            prompt = c.output.prompt
            if prompt is not None and PIC_SEP not in prompt:
                return prompt
            return engine.tokenizer.decode(c.output.prompt_token_ids) if engine.tokenizer is not None else ""

        def echoed_logprobs(c: _Choice) -> dict:
            """The prompt's part of an echo choice's logprobs; the completion's offsets go on after it."""
            ids = c.output.prompt_token_ids
            # the first token's text as the engine writes every scored token's (special tokens kept)
            first = (engine.tokenizer.decode([ids[0]], skip_special_tokens=False) if engine.tokenizer is not None
                     else f"token_id:{ids[0]}")
            body = prompt_logprobs(c.output.prompt_logprobs, ids, first, req.num_logprobs)
            c.logprob_chars = next_offset(body)
            return body

        def choice_logprobs(c: _Choice):
            """The whole choice's logprobs (with echo, the prompt's first; from the first chunk on, what
            was not streamed yet is all of it)."""
            if not req.echo or req.num_logprobs is None:
                return c.logprobs(False, req.num_logprobs, streamed=False)
            head_part = echoed_logprobs(c)
            return joined(head_part, c.logprobs(False, req.num_logprobs, streamed=True))

        def chunk(c: _Choice, piece, output, new_ids):
            if output is None:
                return None
            if req.echo and not c.echoed:  # the prompt goes out with the first token
                c.echoed = True
                piece = echoed(c) + piece
                logprobs = choice_logprobs(c)
            else:
                logprobs = c.logprobs(False, req.num_logprobs, streamed=True)
            choice = {"index": c.index, "text": piece, "logprobs": logprobs,
                      "finish_reason": _finish(output), "stop_reason": _stop(output)}
            if req.return_token_ids:
                choice["token_ids"] = new_ids
            body = dict(head, choices=[choice])
            if req.include_usage:
                body["usage"] = None
            return body

        def final():
            body = dict(head, choices=[{"index": c.index, "text": echoed(c) + c.output.outputs[0].text,
                                        "logprobs": choice_logprobs(c),
                                        "finish_reason": _finish(c.output), "stop_reason": _stop(c.output)}
                                       for c in choices], usage=_usage(choices))
            if req.return_token_ids:
                for c, choice in zip(choices, body["choices"]):
                    choice["token_ids"] = list(c.output.outputs[0].token_ids)
            return body

        return await run(raw, streams, choices, req.stream, chunk, final, req.include_usage,
                         lambda usage: dict(head, choices=[], usage=usage))

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, raw: Request):
        check_model(req.model)
        _check(req)
        tok = tokenizer()
        if tok.chat_template is None:
            raise APIError(400, "this model has no chat template: use /v1/completions with the prompt text",
                           "messages")
        conversation = [{"role": m.role, "content": _content(m.content, last=(k == len(req.messages) - 1))}
                        for k, m in enumerate(req.messages)]
        try:
            prompt = chat_prompt(tok, conversation, req.add_generation_prompt)
        except ValueError as e:
            raise APIError(400, str(e), "messages") from None
        make = sampling(req, req.requested_max_tokens)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        streams = await submit([prompt], make, req.n, req.pic_options(), rid)
        holdback = max((len(s) for s in req.stop_strings), default=1) - 1
        choices = [_Choice(k, 0, holdback) for k in range(len(streams))]
        head = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": served_model_name}

        def chunk(c: _Choice, piece, output, new_ids):
            logprobs = None
            if output is None:
                delta, finish = {"role": "assistant", "content": ""}, None
            else:
                delta, finish = ({"content": piece} if piece else {}), _finish(output)
                logprobs = c.logprobs(True, req.num_logprobs, streamed=True)
            body = dict(head, choices=[{"index": c.index, "delta": delta, "logprobs": logprobs,
                                        "finish_reason": finish}])
            if req.include_usage:
                body["usage"] = None
            return body

        def final():
            return dict(head, object="chat.completion", choices=[
                {"index": c.index, "message": {"role": "assistant", "content": c.output.outputs[0].text},
                 "logprobs": c.logprobs(True, req.num_logprobs, streamed=False),
                 "finish_reason": _finish(c.output), "stop_reason": _stop(c.output)}
                for c in choices], usage=_usage(choices))

        return await run(raw, streams, choices, req.stream, chunk, final, req.include_usage,
                         lambda usage: dict(head, choices=[], usage=usage))

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_model_name, "object": "model", "created": created,
                                            "owned_by": "hypic", "max_model_len": engine.max_model_len}]}

    # ---- SGLang's native route ----------------------------------------------------------
    @app.post("/generate")
    async def generate(req: GenerateRequest, raw: Request):
        try:
            prompt = req.prompt()
            max_new = req.sampling_params.get("max_new_tokens", _SGLANG_DEFAULT_MAX_NEW_TOKENS)
            params = req.to_sampling_params(max_new)
        except (ValueError, TypeError) as e:
            raise APIError(400, str(e), getattr(e, "param", "sampling_params")) from None
        rid = req.rid or f"gen-{uuid.uuid4().hex}"
        streams = await submit([prompt], lambda j: params, 1, {"cache_salt": req.cache_salt}, rid)
        choice = _Choice(0, 0, max((len(s) for s in params.stop), default=1) - 1)

        def body(output: RequestOutput) -> dict:
            m = output.metrics
            info = {"id": rid, "prompt_tokens": m.prompt_tokens, "completion_tokens": len(output.outputs[0].token_ids),
                    "cached_tokens": m.cached_tokens + m.prefix_hit_tokens,
                    "finish_reason": _sglang_finish(output)}
            return {"text": output.outputs[0].text[:choice.sent_chars] if not output.finished
                    else output.outputs[0].text, "output_ids": list(output.outputs[0].token_ids), "meta_info": info}

        if not req.stream:
            merged = _merge(streams)
            try:
                async for _, output in merged:
                    choice.delta(output)
                    if await raw.is_disconnected():
                        return _error_response(400, "the client disconnected")
            finally:
                await merged.aclose()
            return JSONResponse(body(choice.output))

        async def events():
            merged = _merge(streams)
            try:
                async for _, output in merged:
                    choice.delta(output)  # SGLang streams the cumulative text
                    yield _sse(body(output))
                    if await raw.is_disconnected():
                        return
                yield "data: [DONE]\n\n"
            finally:
                await merged.aclose()

        return StreamingResponse(events(), media_type="text/event-stream")

    # ---- service routes -----------------------------------------------------------------
    @app.get("/health")
    async def health():
        if not engine.is_running:
            return _error_response(503, "the engine is not running")
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/flush_cache")
    async def flush_cache():
        try:
            dropped = await engine.flush_cache()
        except EngineClosedError as e:
            raise APIError(503, str(e)) from None
        return {"flushed_entries": dropped}

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest):
        check_model(req.model)
        ids = tokenizer().encode(req.prompt, add_special_tokens=req.add_special_tokens)
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.max_model_len}

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest):
        check_model(req.model)
        tok = tokenizer()
        if any(not 0 <= t < tok.vocab_size for t in req.tokens):
            raise APIError(400, f"tokens must be ids in [0, {tok.vocab_size})", "tokens")
        return {"prompt": tok.decode(req.tokens)}

    _document_errors(app, api_key is not None)
    return app


_ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}
_ERROR_STATUSES = {"400": "invalid request", "401": "missing or wrong API key", "404": "unknown model",
                   "503": "queue full or shutting down"}


def _document_errors(app: FastAPI, with_key: bool) -> None:
    """The OpenAPI document says what the routes answer: OpenAI's error object with 400 (never
    FastAPI's 422), 401 where a key is required, 404 and 503 (/health answers 503 too)."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        for path, operations in schema.get("paths", {}).items():
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)
                statuses = dict(_ERROR_STATUSES)
                if not with_key or path in ("/health", "/metrics"):
                    statuses.pop("401")
                for status, description in statuses.items():
                    responses.setdefault(status, {"description": description,
                                                  "content": {"application/json": {"schema": _ERROR_SCHEMA}}})
        paths = schema.get("paths", {})
        for path in ("/v1/completions", "/v1/chat/completions", "/generate"):  # stream=true: SSE
            if path in paths:
                ok = paths[path]["post"]["responses"].setdefault("200", {"description": "the completion"})
                ok.setdefault("content", {})["text/event-stream"] = {"schema": {}}
        if "/health" in paths:  # an empty 200
            paths["/health"]["get"]["responses"]["200"] = {"description": "the engine is running"}
        if "/metrics" in paths:
            paths["/metrics"]["get"]["responses"]["200"] = {
                "description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}
        schema.get("components", {}).get("schemas", {}).pop("HTTPValidationError", None)
        schema.get("components", {}).get("schemas", {}).pop("ValidationError", None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi


def _check(req, then: Callable[[], Any] | None = None):
    """``req.check_supported()``, then ``then()``; an UnsupportedField is a 400 naming it."""
    try:
        req.check_supported()
        return then() if then is not None else None
    except UnsupportedField as e:
        raise APIError(400, str(e), e.param) from None


def _content(content, last: bool) -> str:
    """A message's text; several text parts of the last message are its segments."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = [part.text for part in content]
    return PIC_SEP.join(texts) if last else "".join(texts)


def _finish(output: RequestOutput) -> str | None:
    reason = output.outputs[0].finish_reason
    return None if reason is None else ("stop" if reason == "abort" else reason)


def _stop(output: RequestOutput):
    return output.outputs[0].stop_reason


def _sglang_finish(output: RequestOutput):
    reason = output.outputs[0].finish_reason
    if reason is None:
        return None
    if reason == "length":
        return {"type": "length", "length": len(output.outputs[0].token_ids)}
    return {"type": reason, "matched": output.outputs[0].stop_reason}


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"
