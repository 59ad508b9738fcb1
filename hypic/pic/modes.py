"""PIC modes, seam windows and cold policies (architecture.md section 3).

| mode              | segment store | linear layers          | full-attention K      | seam   |
| ----------------- | ------------- | ---------------------- | --------------------- | ------ |
| full_recompute    | no            | all live               | live                  | -      |
| prefix_cache      | checkpoints   | resume at longest      | live after prefix     | -      |
|                   |               | cached segment prefix  |                       |        |
| addition          | yes           | S <- S + S_body        | as cached             | 0      |
| transition        | yes           | S <- T S + S_body      | as cached             | 0      |
| transition_rope   | yes           | as transition, RoPE'd  | re-rotated            | 0      |
|                   |               | summaries re-rotated   |                       |        |
| hypic             | yes           | as transition_rope     | re-rotated            | w (8)  |

``transition_rope_recompute`` (the published system's name for the full method) is an alias of
``hypic``. Modes are chosen per engine (:class:`PICConfig`) and may be overridden per request
(:meth:`PICConfig.resolve`). An engine without a mode of its own (``PICConfig.mode`` None, the
default) serves prompts that carry segments in ``hypic`` mode and every other prompt plainly.

Seam window ``w``: an ``int >= 0`` is a token count; a ``float`` in (0, 1] is a fraction of the
segment, ``w_eff = ceil(w * L)`` (with a 1e-9 tolerance so 0.3 * 10 is 3, not 4). A floor and a
cap in tokens (``seam_min_tokens``, ``seam_max_tokens``; 0 and none by default) bound it:
``w_eff = min(max(w_eff, floor), cap)``: a fraction with a floor recomputes at least the floor on
short segments and a share of long ones. Either way ``w_eff`` is clipped to ``L``: a window
covering the whole segment makes it entirely live. Modes with a fixed seam (0) ignore both.

Minimum segment length (``segment_min_tokens``): a segment shorter than it is never looked up or
stored; it runs live with its neighbours (a seam window that covers a segment has the same
effect), so hundreds of tiny segments cost what their tokens cost.

Cold policies: ``inline`` (a MISS runs live with its true prefix; its entry is summarised from
those activations, so it carries that request's context), ``standalone`` (MISS segments are first
prefilled alone at position 0, which writes canonical entries; then the request runs as all-HIT)
and ``canonical`` (a MISS runs live with its true prefix, exact for this request like ``inline``,
and its entry is written canonically by a standalone pass after the request's forward: later
requests reuse context-free entries, at the price of that extra pass).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

SeamSetting = Union[int, float]

COLD_INLINE = "inline"
COLD_STANDALONE = "standalone"
COLD_CANONICAL = "canonical"
COLD_POLICIES = (COLD_INLINE, COLD_STANDALONE, COLD_CANONICAL)
DEFAULT_SEAM = 8
DEFAULT_SEAM_MIN_TOKENS = 0
DEFAULT_SEAM_MAX_TOKENS: Optional[int] = None
DEFAULT_MODE = "hypic"
# Segments shorter than this are not cached but computed live with their neighbours: the shortest
# length whose caching pays for itself by its first reuse (a cold request and one reordered warm
# one together cost no more than two full recomputes). Measured on the CPU with the embedded model
# (benchmarks/results/small_segments/cpu_tiny.json: 6,219-token prompts cut into segments of L
# tokens, every one cached, standalone cold policy): cold + warm = 1.86x at L = 32, 2.28x at 24,
# 3.5x at 16 (docs/decisions.md).
DEFAULT_SEGMENT_MIN_TOKENS = 32


@dataclass(frozen=True)
class ModeSpec:
    name: str
    uses_segment_store: bool  # HIT/MISS spans over segment entries
    uses_prefix_checkpoints: bool  # prefix_cache: resume from boundary checkpoints
    use_transition: bool  # linear: apply T (False: add zero-init states, T dropped)
    rerotate_keys: bool  # move cached K / RoPE'd linear summaries to their true positions
    fixed_seam: Optional[int]  # the mode's own seam (0), or None = configurable w

    @property
    def seam_configurable(self) -> bool:
        return self.uses_segment_store and self.fixed_seam is None


MODES = {
    "full_recompute": ModeSpec("full_recompute", False, False, True, True, None),
    "prefix_cache": ModeSpec("prefix_cache", False, True, True, True, None),
    "addition": ModeSpec("addition", True, False, False, False, 0),
    "transition": ModeSpec("transition", True, False, True, False, 0),
    "transition_rope": ModeSpec("transition_rope", True, False, True, True, 0),
    "hypic": ModeSpec("hypic", True, False, True, True, None),
}
MODE_ALIASES = {"transition_rope_recompute": "hypic"}


def get_mode(name: Union[str, ModeSpec]) -> ModeSpec:
    """Look a mode up by name (or pass a ModeSpec through). Unknown -> ValueError listing modes."""
    if isinstance(name, ModeSpec):
        return name
    if not isinstance(name, str):
        raise ValueError(f"mode: expected str, got {type(name).__name__}")
    name = MODE_ALIASES.get(name, name)
    if name not in MODES:
        raise ValueError(
            f"unknown mode {name!r}; valid modes: {', '.join(MODES)} "
            f"(alias: {', '.join(f'{a} = {b}' for a, b in MODE_ALIASES.items())})"
        )
    return MODES[name]


def validate_seam(seam: SeamSetting) -> SeamSetting:
    if isinstance(seam, bool):
        raise ValueError("seam: expected int >= 0 or float in (0, 1], got bool")
    if isinstance(seam, int):
        if seam < 0:
            raise ValueError(f"seam: token count must be >= 0, got {seam}")
        return seam
    if isinstance(seam, float):
        if not (0.0 < seam <= 1.0) or math.isnan(seam):
            raise ValueError(f"seam: a fraction must be in (0, 1], got {seam}")
        return seam
    raise ValueError(f"seam: expected int >= 0 or float in (0, 1], got {type(seam).__name__}")


def seam_tokens(seam: SeamSetting, num_tokens: int, min_tokens: int = 0, max_tokens: Optional[int] = None) -> int:
    """Effective seam window ``w_eff`` of a segment of ``num_tokens`` tokens (0 <= w_eff <= L):
    ``seam`` as tokens or a fraction, raised to ``min_tokens`` and lowered to ``max_tokens``."""
    seam = validate_seam(seam)
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
        raise ValueError(f"num_tokens: expected int >= 0, got {num_tokens!r}")
    w = seam if isinstance(seam, int) else math.ceil(seam * num_tokens - 1e-9)
    w = max(w, min_tokens)
    if max_tokens is not None:
        w = min(w, max_tokens)
    return min(w, num_tokens)


def validate_seam_bounds(min_tokens: int, max_tokens: Optional[int]) -> None:
    """The seam floor (int >= 0) and cap (None or an int >= the floor), in tokens."""
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
        raise ValueError(f"seam_min_tokens must be an int >= 0, got {min_tokens!r}")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < min_tokens):
        raise ValueError(f"seam_max_tokens must be None or an int >= seam_min_tokens={min_tokens}, got {max_tokens!r}")


def validate_cold_policy(policy: str) -> str:
    if policy not in COLD_POLICIES:
        raise ValueError(f"unknown cold policy {policy!r}; cold_policy must be one of: {', '.join(COLD_POLICIES)}")
    return policy


def validate_segment_min_tokens(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"segment_min_tokens must be an int >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class RequestPolicy:
    """A request's resolved mode, seam (with its floor and cap in tokens), cold policy and minimum
    cached segment length."""

    mode: ModeSpec
    seam: SeamSetting
    cold_policy: str
    segment_min_tokens: int = 0
    seam_min_tokens: int = 0
    seam_max_tokens: Optional[int] = None

    def seam_tokens(self, num_tokens: int) -> int:
        return seam_tokens(self.seam, num_tokens, self.seam_min_tokens, self.seam_max_tokens)

    def live_tokens(self, num_tokens: int) -> int:
        """Tokens of a segment of ``num_tokens`` computed live when its body is reused: its seam
        window, or all of them when it is shorter than ``segment_min_tokens`` (never cached)."""
        if num_tokens < self.segment_min_tokens:
            return num_tokens
        return self.seam_tokens(num_tokens)


@dataclass(frozen=True)
class PICConfig:
    """Engine-wide defaults; :meth:`resolve` applies per-request overrides. ``mode`` None:
    :data:`DEFAULT_MODE` for prompts that carry segments, the plain path for the rest; a mode
    name: that mode for every prompt (:attr:`every_prompt`)."""

    mode: Optional[str] = None
    seam: SeamSetting = DEFAULT_SEAM
    # standalone: entries never carry the context of the request that wrote them (docs/decisions.md)
    cold_policy: str = COLD_STANDALONE
    segment_min_tokens: int = DEFAULT_SEGMENT_MIN_TOKENS
    seam_min_tokens: int = DEFAULT_SEAM_MIN_TOKENS
    seam_max_tokens: Optional[int] = DEFAULT_SEAM_MAX_TOKENS

    def __post_init__(self):
        if self.mode is not None:
            get_mode(self.mode)
        validate_seam(self.seam)
        validate_cold_policy(self.cold_policy)
        validate_segment_min_tokens(self.segment_min_tokens)
        validate_seam_bounds(self.seam_min_tokens, self.seam_max_tokens)

    @property
    def every_prompt(self) -> bool:
        """Whether every prompt is served through segment caching (a mode was named)."""
        return self.mode is not None

    def resolve(
        self,
        mode: Optional[str] = None,
        seam: Optional[SeamSetting] = None,
        cold_policy: Optional[str] = None,
    ) -> RequestPolicy:
        """Per-request policy. Modes with a fixed seam (addition, transition, transition_rope) use
        it; an explicit conflicting per-request ``seam`` is an error rather than silently ignored."""
        spec = get_mode(mode if mode is not None else self.mode or DEFAULT_MODE)
        policy = validate_cold_policy(self.cold_policy if cold_policy is None else cold_policy)
        if seam is not None:
            validate_seam(seam)
        if spec.fixed_seam is not None:
            if seam is not None and seam != spec.fixed_seam:
                raise ValueError(
                    f"seam: mode {spec.name!r} has a fixed seam of {spec.fixed_seam}, got {seam!r}"
                )
            return RequestPolicy(spec, spec.fixed_seam, policy, self.segment_min_tokens)
        resolved = self.seam if seam is None else seam
        return RequestPolicy(spec, resolved, policy, self.segment_min_tokens, self.seam_min_tokens,
                             self.seam_max_tokens)
