"""Request outputs in the shape vLLM users know (``RequestOutput.outputs[0].text`` ...)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hypic.engine.request import Request, RequestMetrics


@dataclass
class CompletionOutput:
    """One completion. finish_reason: None while running, else "stop" | "length" | "abort";
    stop_reason: the stop string or stop token id that fired (None for eos or length);
    logprobs: per generated token ``{token_id: Logprob}`` (the sampled token and the top
    ``SamplingParams.logprobs`` ones), or None when not requested (vLLM's shape)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[dict] | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """Snapshot of a request after a step; ``metrics`` holds prompt_tokens, ttft and timestamps."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    # SamplingParams.prompt_logprobs: None for the first prompt token, then ``{token_id: Logprob}``
    # per prompt token (filled as the prefill's chunks run); None when not requested
    prompt_logprobs: list[dict | None] | None = None

    @classmethod
    def from_request(cls, request: Request) -> "RequestOutput":
        completion = CompletionOutput(
            index=0,
            text=request.output_text,
            token_ids=list(request.output_token_ids),
            finish_reason=request.finish_reason,
            stop_reason=request.stop_reason,
            logprobs=None if request.output_logprobs is None else list(request.output_logprobs),
        )
        return cls(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=list(request.prompt_token_ids),
            outputs=[completion],
            finished=request.is_finished,
            metrics=dataclasses.replace(request.metrics),
            prompt_logprobs=None if request.prompt_logprobs is None else list(request.prompt_logprobs),
        )
