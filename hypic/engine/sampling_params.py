"""SamplingParams: per-request sampling settings shaped like vLLM's (torch-free, so the
scheduler and requests stay plain Python)."""

from __future__ import annotations

from dataclasses import dataclass, field

# Temperatures below this are treated as greedy: dividing logits by ~0 overflows to inf/nan.
_GREEDY_EPS = 1e-5
# Most top log-probabilities a request may ask for per token (vLLM's default max_logprobs; the
# OpenAI chat API's top_logprobs limit).
MAX_LOGPROBS = 20


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
    n: number of completions; only 1 is supported.
    skip_special_tokens: drop special tokens when detokenising the output.
    logprobs: None (none), or the number k in [0, 20] of most likely tokens whose log-probabilities
    are returned for every generated token, beside the sampled token's own (vLLM's meaning). They
    are the model's raw distribution (log-softmax of the logits, before temperature, top-k and
    top-p), as vLLM returns by default.
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
        if self.n != 1:
            raise ValueError(f"n must be 1 (several completions per prompt are not supported), got {self.n!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
