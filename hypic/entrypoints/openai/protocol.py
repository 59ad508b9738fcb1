"""Request bodies of the HTTP server (pydantic) and their mapping onto :class:`SamplingParams`.

Field names and defaults follow OpenAI's API and vLLM's extensions (``top_k``, ``ignore_eos``,
``stop_token_ids``, ``skip_special_tokens``, ``cache_salt``, ``return_token_ids``); hypic adds
``segments`` (a list of segment texts or token-id lists, the last one the query) and the per-request PIC settings
``pic_mode`` / ``seam`` / ``cold_policy``. The penalties (``presence_penalty``,
``frequency_penalty``, vLLM's ``repetition_penalty``), ``logit_bias`` (token-id strings as keys),
``min_p`` and ``min_tokens`` have vLLM's meaning (:class:`SamplingParams`). Fields OpenAI defines
that the engine cannot honour (tools, ``suffix``, ...) are accepted only at
their neutral value; anything else is refused with :class:`UnsupportedField` (a 400 naming the field).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from hypic.engine.sampling_params import MAX_LOGPROBS, SamplingParams

# Strict models: a JSON value of another type is a 400, never coerced ("1" or true as an int).
TokenIds = list[Annotated[int, Field(ge=0)]]
SegmentPiece = Union[str, TokenIds]


class UnsupportedField(ValueError):
    """A field this server does not implement was set to a non-neutral value."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingFields(BaseModel):
    """Sampling fields shared by the OpenAI routes."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = Field(None, ge=0)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    min_p: float | None = None
    min_tokens: int = 0
    user: str | None = None
    cache_salt: str | None = None
    pic_mode: str | None = None
    seam: int | float | None = None
    cold_policy: str | None = None

    def check_supported(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise UnsupportedField("stream_options", "stream_options is only allowed with stream=true")

    def pic_options(self) -> dict[str, Any]:
        """Per-request keyword arguments of LLMEngine.add_request."""
        return {"mode": self.pic_mode, "seam": self.seam, "cold_policy": self.cold_policy,
                "cache_salt": self.cache_salt}

    def sampling_params(self, max_tokens: int, index: int = 0) -> SamplingParams:
        """The engine's settings for completion ``index`` of ``n`` (a seeded request's
        completions draw from seeds seed, seed + 1, ...). Raises ValueError on bad values."""
        seed = None if self.seed is None else self.seed + index
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            max_tokens=max_tokens,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            seed=seed,
            skip_special_tokens=self.skip_special_tokens,
            logprobs=self.num_logprobs,
            min_p=0.0 if self.min_p is None else self.min_p,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=_token_bias(self.logit_bias),
            min_tokens=self.min_tokens,
        )

    @property
    def num_logprobs(self) -> int | None:
        """Top log-probabilities per generated token (SamplingParams.logprobs); None: none."""
        return None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


def _token_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's ``logit_bias`` (token ids written as strings) with int keys."""
    if not bias:
        return None
    try:
        return {int(token): value for token, value in bias.items()}
    except ValueError:
        raise UnsupportedField("logit_bias", f"logit_bias keys must be token ids, got {sorted(bias)[:3]}") from None


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``. ``prompt``: text, a list of texts (one choice group each),
    token ids, or a list of token-id lists; or ``segments`` instead of ``prompt``."""

    prompt: str | list[str] | TokenIds | list[TokenIds] | None = None
    segments: list[SegmentPiece] | None = Field(None, min_length=1)
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None
    return_token_ids: bool = False  # vLLM's: each choice (each streamed chunk) carries its new token ids

    def check_supported(self) -> None:
        super().check_supported()
        if self.best_of not in (None, 1, self.n):
            raise UnsupportedField("best_of", "best_of other than n is not supported by this server")
        if self.suffix:
            raise UnsupportedField("suffix", "suffix is not supported by this server")
        if (self.prompt is None) == (self.segments is None):
            raise UnsupportedField("prompt", "give exactly one of prompt and segments")

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    def sampling_params(self, max_tokens: int, index: int = 0) -> SamplingParams:
        """As the other routes'; with ``echo`` and ``logprobs`` the prompt tokens are scored too
        (``prompt_logprobs``: the request is then prefilled in full, no cache reuse)."""
        params = super().sampling_params(max_tokens, index)
        if self.echo and self.logprobs is not None:
            params = dataclasses.replace(params, prompt_logprobs=self.logprobs)
        return params

    def prompts(self) -> list:
        """The engine prompts, one per choice group."""
        if self.segments is not None:
            return [{"segments": self.segments}]
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise UnsupportedField("prompt", "prompt is empty")
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)  # texts or token-id lists: one prompt each


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``. A message's content given as several text parts makes each
    part of the last message one segment (as if joined with ``<<PIC_SEP>>``)."""

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise UnsupportedField("top_logprobs", "top_logprobs needs logprobs=true")
        if self.tools:
            raise UnsupportedField("tools", "tools are not supported by this server")
        if self.tool_choice not in (None, "none"):
            raise UnsupportedField("tool_choice", "tool_choice is not supported by this server")
        if self.response_format not in (None, {"type": "text"}):
            raise UnsupportedField("response_format", "response_format other than text is not supported")

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


GENERATE_SAMPLING_KEYS = frozenset({"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop",
                                    "stop_token_ids", "ignore_eos", "skip_special_tokens", "seed", "n",
                                    "presence_penalty", "frequency_penalty", "repetition_penalty",
                                    "min_new_tokens"})


class GenerateRequest(BaseModel):
    """SGLang's ``POST /generate``: ``text`` or ``input_ids`` (or hypic's ``segments``) and
    ``sampling_params`` with SGLang's names (``max_new_tokens``, ``temperature``, ``top_p``,
    ``top_k``, ``min_p``, ``stop``, ``stop_token_ids``, ``ignore_eos``, ``skip_special_tokens``,
    ``seed``, ``presence_penalty``, ``frequency_penalty``, ``repetition_penalty``,
    ``min_new_tokens``)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    text: str | None = None
    input_ids: TokenIds | None = Field(None, min_length=1)
    segments: list[SegmentPiece] | None = Field(None, min_length=1)
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False
    rid: str | None = None
    cache_salt: str | None = None

    def prompt(self):
        given = [x is not None for x in (self.text, self.input_ids, self.segments)]
        if sum(given) != 1:
            raise UnsupportedField("text", "give exactly one of text, input_ids and segments")
        if self.segments is not None:
            return {"segments": self.segments}
        return self.text if self.text is not None else list(self.input_ids)

    def to_sampling_params(self, max_tokens: int) -> SamplingParams:
        sp = self.sampling_params
        unknown = sorted(set(sp) - GENERATE_SAMPLING_KEYS)
        if unknown:
            raise UnsupportedField(f"sampling_params.{unknown[0]}", f"sampling_params.{unknown[0]} is not supported")
        if sp.get("n", 1) != 1:
            raise UnsupportedField("sampling_params.n", "sampling_params.n must be 1")
        return SamplingParams(
            temperature=sp.get("temperature", 1.0), top_p=sp.get("top_p", 1.0), top_k=sp.get("top_k", 0) or 0,
            max_tokens=max_tokens, stop=sp.get("stop"), stop_token_ids=sp.get("stop_token_ids"),
            ignore_eos=sp.get("ignore_eos", False), skip_special_tokens=sp.get("skip_special_tokens", True),
            seed=sp.get("seed"), min_p=sp.get("min_p", 0.0), presence_penalty=sp.get("presence_penalty", 0.0),
            frequency_penalty=sp.get("frequency_penalty", 0.0), repetition_penalty=sp.get("repetition_penalty", 1.0),
            min_tokens=sp.get("min_new_tokens", 0),
        )


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    tokens: TokenIds
