"""SamplingParams: per-request sampling settings shaped like vLLM's (torch-free, so the
scheduler and requests stay plain Python)."""

from __future__ import annotations

from dataclasses import dataclass, field

# Temperatures below this are treated as greedy: dividing logits by ~0 overflows to inf/nan.
_GREEDY_EPS = 1e-5
# Most top log-probabilities a request may ask for per token (vLLM's default max_logprobs; the
# OpenAI chat API's top_logprobs limit).
MAX_LOGPROBS = 20
# Most completions per prompt (the server's limit as well).
MAX_N = 128


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings (the vLLM field names and defaults).

    temperature: 0 means greedy (argmax); otherwise logits are divided by it.
    top_p: nucleus mass in (0, 1]; 1 disables. top_k: keep the k largest logits; 0 or -1 disables.
    max_tokens: maximum number of generated tokens (>= 1), or None for the room left under the
    engine's max_model_len (as vLLM). prompt + max_tokens must fit max_model_len, else the engine
    refuses the request (ValueError); it never clamps an explicit value.
    stop: strings that end generation when they appear in the generated text; the output text
    is cut before the stop string. stop_token_ids: token ids that end generation.
    ignore_eos: keep generating past the model's end-of-sequence tokens.
    seed: seeds this request's own generator (reproducible regardless of batch neighbours).
    n: completions per prompt. ``LLM.generate`` (and the server's ``n``) run them as n requests
    of one completion each, seeded seed, seed + 1, ... when seeded; completions 1..n-1 of a
    prompt without segments start once completion 0 has prefilled it, so they resume from its
    prefix-cache checkpoints (``LLMEngine.add_request``'s ``start_after``). LLMEngine.add_request
    takes n = 1 only.
    skip_special_tokens: drop special tokens when detokenising the output.
    logprobs: None (none), or the number k in [0, 20] of most likely tokens whose log-probabilities
    are returned for every generated token, beside the sampled token's own (vLLM's meaning). They
    are the model's raw distribution (log-softmax of the logits, before penalties, bias,
    temperature, top-k and top-p), as vLLM returns by default.
    prompt_logprobs: None, or the number k in [0, 20]: the log-probability of every prompt token
    after the first (and of the k most likely tokens at its position) under the raw distribution,
    in ``RequestOutput.prompt_logprobs`` (its first entry None). Such a request is prefilled in
    full: it neither resumes from the prefix cache nor reuses segments (a cached token has no
    logits to read), as vLLM does.
    min_p: drop tokens whose probability (after temperature) is below min_p times the most likely
    token's; 0 disables.
    presence_penalty / frequency_penalty: in [-2, 2]; subtract the penalty once for every token
    already generated (presence) or once per time it was generated (frequency). repetition_penalty:
    > 0, 1 disables; the logit of every token in the prompt or the output is divided by it when
    positive and multiplied by it when negative. logit_bias: ``{token_id: bias}``, bias in
    [-100, 100], added to the logits. min_tokens: no end-of-sequence, ``stop_token_ids`` or stop
    string ends the request before this many tokens (<= max_tokens). Penalties, bias and
    min_tokens also apply to greedy requests (the argmax is taken after them), as vLLM does.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = 16
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    skip_special_tokens: bool = True
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] | None = None
    min_tokens: int = 0

    def __post_init__(self) -> None:
        # Accept the vLLM spellings (a single string, lists) but store immutable tuples.
        stop = self.stop
        if stop is None:
            stop = ()
        elif isinstance(stop, str):
            stop = (stop,)
        object.__setattr__(self, "stop", tuple(stop))
        stop_token_ids = () if self.stop_token_ids is None else tuple(self.stop_token_ids)
        object.__setattr__(self, "stop_token_ids", stop_token_ids)

        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise ValueError(f"temperature must be a number, got {self.temperature!r}")
        if not self.temperature >= 0.0 or self.temperature == float("inf"):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)):
            raise ValueError(f"top_p must be a number, got {self.top_p!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be an int >= -1 (0 or -1 disable it), got {self.top_k!r}")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be None or an int >= 1, got {self.max_tokens!r}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop must hold non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            if not _is_int(t) or t < 0:
                raise ValueError(f"stop_token_ids must hold ints >= 0, got {t!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise ValueError(f"seed must be None or an int >= 0, got {self.seed!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be None or an int in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        if self.prompt_logprobs is not None and (not _is_int(self.prompt_logprobs)
                                                 or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS):
            raise ValueError(f"prompt_logprobs must be None or an int in [0, {MAX_LOGPROBS}], "
                             f"got {self.prompt_logprobs!r}")
        for name, low, high in (("min_p", 0.0, 1.0), ("presence_penalty", -2.0, 2.0),
                                ("frequency_penalty", -2.0, 2.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise ValueError(f"{name} must be a number in [{low:g}, {high:g}], got {value!r}")
        rp = self.repetition_penalty
        if isinstance(rp, bool) or not isinstance(rp, (int, float)) or not 0.0 < rp < float("inf"):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {rp!r}")
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an int >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if not _is_int(self.n) or not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be an int in [1, {MAX_N}], got {self.n!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        """Whether the sampled token depends on the request's tokens so far (penalties)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0


def _logit_bias(bias) -> tuple[tuple[int, float], ...] | None:
    """``{token_id: bias}`` (or pairs) as sorted ``(token_id, bias)`` pairs, hashable like the
    rest of the frozen params; None when empty."""
    if bias is None:
        return None
    items = bias.items() if isinstance(bias, dict) else bias
    try:
        pairs = [(t, b) for t, b in items]
    except (TypeError, ValueError):
        raise ValueError(f"logit_bias must map token ids to biases, got {bias!r}") from None
    for t, b in pairs:
        if not _is_int(t) or t < 0:
            raise ValueError(f"logit_bias keys must be token ids (ints >= 0), got {t!r}")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100.0 <= b <= 100.0:
            raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {b!r} for token {t}")
    if len({t for t, _ in pairs}) != len(pairs):
        raise ValueError("logit_bias names a token id twice")
    return tuple(sorted((t, float(b)) for t, b in pairs)) or None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
