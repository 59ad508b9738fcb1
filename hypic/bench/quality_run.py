"""Running the quality benchmark: configurations, tokenisation checks, and the per-request loop.

How the segment store is warmed (the honest "a server saw it before" model):

* every configuration (mode, seam, cold policy) gets a **fresh engine and store** per task, so
  configurations never share entries and a task's numbers do not depend on which other tasks ran;
* the task's requests go through that engine **in suite order**; a document (or, for
  ``prefix_cache``, a chain of leading documents) seen in an earlier request is in the store;
* requests are grouped into batches (one engine run each, prefill and decode batched) only when
  grouping cannot change a hit into a miss: a group never holds two requests that share a cache
  unit which is not yet in the store before the group. Sequential processing
  (``batch_size=1``) gives the same hits and misses, so batching changes throughput only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Tuple, Union

from hypic.data.request import Request
from hypic.data.scoring import score_request
from hypic.pic.modes import (
    COLD_POLICIES, MODES, get_mode, validate_cold_policy, validate_seam, validate_seam_bounds,
)

SeamSetting = Union[int, float]
ALL_MODES: Tuple[str, ...] = tuple(MODES)


@dataclass(frozen=True)
class SeamSpec:
    """A seam window to measure: ``seam`` (tokens or a fraction) with a floor and a cap in tokens
    (:func:`hypic.pic.modes.seam_tokens`); written ``8``, ``0.1:8`` or ``0.1:8:24``."""

    seam: SeamSetting
    min_tokens: int = 0
    max_tokens: Optional[int] = None

    def __post_init__(self) -> None:
        validate_seam(self.seam)
        validate_seam_bounds(self.min_tokens, self.max_tokens)

    @property
    def label(self) -> str:
        return seam_label(self.seam, self.min_tokens, self.max_tokens)


def seam_label(seam: Optional[SeamSetting], min_tokens: int = 0, max_tokens: Optional[int] = None) -> str:
    if seam is None:
        return "-"
    if max_tokens is not None:
        return f"{seam}:{min_tokens}:{max_tokens}"
    return f"{seam}:{min_tokens}" if min_tokens else str(seam)


@dataclass(frozen=True)
class Configuration:
    """One benchmark column. ``seam`` is None for modes without a segment store (full_recompute,
    prefix_cache), the mode's own fixed seam (0) for addition / transition / transition_rope, and
    the requested ``w`` for hypic, with its floor and cap in tokens (``seam_min_tokens``,
    ``seam_max_tokens``; hypic only). ``cold_policy`` is None where it has no effect (no store)."""

    mode: str
    seam: Optional[SeamSetting]
    cold_policy: Optional[str]
    seam_min_tokens: int = 0
    seam_max_tokens: Optional[int] = None

    def __post_init__(self) -> None:
        spec = get_mode(self.mode)
        if (self.seam_min_tokens or self.seam_max_tokens is not None) and not spec.seam_configurable:
            raise ValueError(f"mode {self.mode!r} takes no seam floor or cap")
        validate_seam_bounds(self.seam_min_tokens, self.seam_max_tokens)
        if spec.name != self.mode:
            raise ValueError(f"mode: use the canonical name {spec.name!r}, got {self.mode!r}")
        if spec.uses_segment_store:
            if self.seam is None:
                raise ValueError(f"seam: mode {self.mode!r} needs a seam")
            validate_seam(self.seam)
            if spec.fixed_seam is not None and self.seam != spec.fixed_seam:
                raise ValueError(f"seam: mode {self.mode!r} has a fixed seam of {spec.fixed_seam}, got {self.seam!r}")
            if self.cold_policy is None:
                raise ValueError(f"cold_policy: mode {self.mode!r} needs a cold policy")
            validate_cold_policy(self.cold_policy)
        elif self.seam is not None or self.cold_policy is not None:
            raise ValueError(f"mode {self.mode!r} takes neither a seam nor a cold policy")

    @property
    def label(self) -> str:
        parts = [self.mode]
        if get_mode(self.mode).seam_configurable:
            parts.append(f"w={seam_label(self.seam, self.seam_min_tokens, self.seam_max_tokens)}")
        if self.cold_policy is not None:
            parts.append(self.cold_policy)
        return " ".join(parts)

    def engine_overrides(self) -> dict:
        """Keyword overrides for ``LLMEngine.add_request``."""
        out: dict = {"mode": self.mode}
        if get_mode(self.mode).seam_configurable:
            out["seam"] = self.seam
        if self.cold_policy is not None:
            out["cold_policy"] = self.cold_policy
        return out


def parse_modes(text: str) -> Tuple[str, ...]:
    """Comma-separated mode names (aliases allowed) -> canonical names, order kept, no duplicates."""
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    if not names:
        raise ValueError(f"modes: no mode given; valid modes: {', '.join(ALL_MODES)}")
    return tuple(dict.fromkeys(get_mode(n).name for n in names))


def parse_seams(text: str) -> Tuple[SeamSetting, ...]:
    """``"0,1,8,0.5"`` -> (0, 1, 8, 0.5): ints are token counts, numbers with a '.' fractions."""
    out = []
    for item in (t.strip() for t in str(text).split(",")):
        if not item:
            continue
        try:
            value: SeamSetting = float(item) if "." in item or "e" in item.lower() else int(item)
        except ValueError:
            raise ValueError(f"seams: {item!r} is not an int token count or a fraction in (0, 1]") from None
        out.append(validate_seam(value))
    if not out:
        raise ValueError("seams: no seam given (e.g. 0,1,2,4,8,16,32)")
    return tuple(dict.fromkeys(out))


def parse_seam_specs(text: str) -> Tuple[SeamSpec, ...]:
    """``"8,0.1:8,0.1:8:24"`` -> seam specs: a seam (as :func:`parse_seams` reads it), optionally
    ``:floor`` and ``:cap`` in tokens."""
    specs = []
    for item in (t.strip() for t in str(text).split(",")):
        if not item:
            continue
        parts = item.split(":")
        if len(parts) > 3:
            raise ValueError(f"seams: {item!r} has more than seam:floor:cap")
        (seam,) = parse_seams(parts[0])
        try:
            bounds = [int(p) for p in parts[1:]]
        except ValueError:
            raise ValueError(f"seams: the floor and cap of {item!r} must be int token counts") from None
        specs.append(SeamSpec(seam, *bounds))
    if not specs:
        raise ValueError("seams: no seam given (e.g. 0,1,2,4,8,16,32 or 0.1:8)")
    return tuple(dict.fromkeys(specs))


def parse_cold_policies(text: str) -> Tuple[str, ...]:
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    if not names:
        raise ValueError(f"cold_policies: none given; valid: {', '.join(COLD_POLICIES)}")
    return tuple(dict.fromkeys(validate_cold_policy(n) for n in names))


def expand_configurations(
    modes: Sequence[str], seams: Sequence[Union[SeamSetting, SeamSpec]], cold_policies: Sequence[str]
) -> Tuple[Configuration, ...]:
    """Every (mode, seam, policy) column: store-free modes once, fixed-seam modes once per policy,
    hypic once per (seam, policy)."""
    specs = [s if isinstance(s, SeamSpec) else SeamSpec(s) for s in seams]
    configs = []
    for mode in modes:
        spec = get_mode(mode)
        if not spec.uses_segment_store:
            configs.append(Configuration(spec.name, None, None))
            continue
        mode_seams = (SeamSpec(spec.fixed_seam),) if spec.fixed_seam is not None else tuple(specs)
        if not mode_seams:
            raise ValueError(f"seams: mode {spec.name!r} needs at least one seam")
        for seam in mode_seams:
            for policy in cold_policies:
                configs.append(Configuration(spec.name, seam.seam, policy, seam.min_tokens, seam.max_tokens))
    return tuple(configs)


# ---- tokenisation ------------------------------------------------------------------------------


class PromptEncoder:
    """Tokenises documents, queries and answers with a checkpoint's ``tokenizer.json`` (no special
    tokens added; every segment on its own, as the engine caches it) and refuses text the model
    cannot read: a token mapped to the tokenizer's unknown token, text that encodes to nothing, or
    ids outside the model's vocabulary."""

    def __init__(self, model_path: Path, vocab_size: int) -> None:
        from tokenizers import Tokenizer

        path = Path(model_path) / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"model: {model_path} has no tokenizer.json; the quality bench needs text prompts")
        self.model_path = Path(model_path)
        self._tok = Tokenizer.from_file(str(path))
        self.vocab_size = int(vocab_size)
        unk = getattr(self._tok.model, "unk_token", None)
        self.unk_token: Optional[str] = unk if isinstance(unk, str) and unk else None
        self.unk_id = self._tok.token_to_id(self.unk_token) if self.unk_token is not None else None
        self._cache: dict = {}

    def encode(self, text: str, what: str) -> Tuple[int, ...]:
        if text in self._cache:
            return self._cache[text]
        ids = tuple(self._tok.encode(text, add_special_tokens=False).ids)
        if not ids:
            raise ValueError(f"{what}: encodes to 0 tokens with the tokenizer of {self.model_path}: {text!r:.80}")
        if self.unk_id is not None and self.unk_id in ids:
            words = text.split()
            unknown = [
                w for w in dict.fromkeys(words) if self.unk_id in self._tok.encode(w, add_special_tokens=False).ids
            ]
            raise ValueError(
                f"{what}: the tokenizer of {self.model_path} maps {len(unknown) or 'some'} word(s) to "
                f"{self.unk_token!r} (e.g. {unknown[:5]}); the model cannot read this text"
            )
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"{what}: token ids {bad[:5]} are outside the model's vocabulary [0, {self.vocab_size})")
        self._cache[text] = ids
        return ids

    def bos_token_id(self) -> int:
        """The id of ``bos_token`` from tokenizer_config.json; ValueError when there is none."""
        config_path = self.model_path / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        token = config.get("bos_token")
        if isinstance(token, dict):
            token = token.get("content")
        token_id = self._tok.token_to_id(token) if isinstance(token, str) else None
        if token_id is None:
            raise ValueError(f"bos: the tokenizer of {self.model_path} has no bos_token")
        return token_id

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` (no checks: answers are only measured, never fed to the model)."""
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def check_word_level(self, requests: Iterable[Request]) -> None:
        """The synthetic suites are written for the word-level tokenizer of ``hypic.data.vocab``:
        every whitespace-separated word (``<sep>`` included) must be one known token. A tokenizer
        that splits or does not know the suite's words belongs to a model never trained on them."""
        words = dict.fromkeys(w for r in requests for text in r.segments() + r.answers for w in text.split())
        bad = []
        for word in words:
            ids = self._tok.encode(word, add_special_tokens=False).ids
            if len(ids) != 1 or (self.unk_id is not None and ids[0] == self.unk_id):
                bad.append(word)
        if bad:
            raise ValueError(
                f"model: the tokenizer of {self.model_path} does not cover the synthetic suites' vocabulary "
                f"({len(bad)} of {len(words)} words are unknown or split into several tokens, e.g. {bad[:5]}). "
                "The suites need a model trained on hypic.data (word-level tokenizer from "
                "hypic.data.vocab, such as the embedded 'tiny'; the long tasks need the extended vocabulary "
                "of hypic.data.long_vocab); a model that never saw them cannot be "
                "scored on them. Pass --model with a checkpoint trained on hypic.data, or --longbench FILE "
                "for any checkpoint."
            )


@dataclass(frozen=True)
class EncodedRequest:
    request: Request
    segments: Tuple[Tuple[int, ...], ...]  # documents then the query, token ids
    answer_tokens: int  # longest reference answer, in tokens

    @property
    def prompt_tokens(self) -> int:
        return sum(len(s) for s in self.segments)


def encode_requests(
    encoder: PromptEncoder, requests: Sequence[Request], bos_id: Optional[int] = None
) -> Tuple[EncodedRequest, ...]:
    """Token ids of every request; ``bos_id`` (optional) is put in front as a one-token segment of
    its own (identical in every request, so it never changes what the documents reuse)."""
    out = []
    for r in requests:
        segs = tuple(encoder.encode(d, f"request {r.request_id} document {i}") for i, d in enumerate(r.documents))
        if bos_id is not None:
            segs = ((int(bos_id),),) + segs
        query = encoder.encode(r.query, f"request {r.request_id} query")
        answer_tokens = max(encoder.count_tokens(a) for a in r.answers)
        out.append(EncodedRequest(r, segs + (query,), answer_tokens))
    return tuple(out)


# ---- batching ----------------------------------------------------------------------------------


def cache_units(encoded: EncodedRequest, mode: str) -> Tuple[tuple, ...]:
    """What a request may read from / write to the store in ``mode``: its documents (store modes),
    the chains of leading documents (prefix_cache), nothing (full_recompute)."""
    spec = get_mode(mode)
    docs = encoded.segments[:-1]
    if spec.uses_segment_store:
        return tuple(dict.fromkeys(docs))
    if spec.uses_prefix_checkpoints:
        return tuple(tuple(docs[: k + 1]) for k in range(len(docs)))
    return ()


def group_requests(encoded: Sequence[EncodedRequest], mode: str, batch_size: int) -> list:
    """Consecutive groups of at most ``batch_size`` requests such that each request sees the same
    store contents as it would if all requests ran one by one (see the module docstring)."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size: must be an int >= 1, got {batch_size!r}")
    seen: set = set()
    groups: list = []
    current: list = []
    new_in_group: set = set()
    for e in encoded:
        units = set(cache_units(e, mode))
        fresh = units - seen
        if current and (len(current) >= batch_size or fresh & new_in_group):
            groups.append(current)
            seen |= new_in_group
            current, new_in_group = [], set()
            fresh = units - seen
        current.append(e)
        new_in_group |= fresh
    if current:
        groups.append(current)
    return groups


# ---- running -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestRecord:
    """One request's outcome under one configuration."""

    task: str
    request_id: str
    prediction: str
    score: float
    prompt_tokens: int
    cached_tokens: int
    live_tokens: int
    prefix_hit_tokens: int
    seam_tokens: int = 0  # the seam windows of the request's documents (what reusing them all recomputes)


def run_task(
    model_path: Path,
    configuration: Configuration,
    encoded: Sequence[EncodedRequest],
    *,
    max_tokens: int,
    device: str,
    dtype: str,
    seed: int,
    batch_size: int,
    on_request_done: Optional[Callable[[], None]] = None,
) -> Tuple[RequestRecord, ...]:
    """Run ``encoded`` (one task, in order) through a fresh engine under ``configuration``; greedy
    decoding up to ``max_tokens``, stopping at the tokenizer's end-of-sequence tokens."""
    from hypic.engine.engine import LLMEngine
    from hypic.engine.sampling import SamplingParams

    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens: must be an int >= 1, got {max_tokens!r}")
    engine = LLMEngine(model_path, dtype=dtype, device=device, seed=seed,
                       max_num_seqs=max(batch_size, 1), segment_cache_bytes=None,
                       seam_min_tokens=configuration.seam_min_tokens, seam_max_tokens=configuration.seam_max_tokens)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=seed)
    overrides = configuration.engine_overrides()
    policy = engine.pic.resolve(**{k: v for k, v in overrides.items() if k in ("mode", "seam", "cold_policy")})
    seams_live = policy.mode.seam_configurable
    records = []
    for group in group_requests(encoded, configuration.mode, batch_size):
        ids = [engine.add_request({"segments": [list(s) for s in e.segments]}, params, **overrides) for e in group]
        done: dict = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out
        for request_id, e in zip(ids, group):
            out = done[request_id]
            m = out.metrics
            prediction = out.outputs[0].text
            live = m.live_tokens if m.live_tokens is not None else e.prompt_tokens
            records.append(RequestRecord(
                task=e.request.task, request_id=e.request.request_id, prediction=prediction,
                score=score_request(e.request, prediction), prompt_tokens=e.prompt_tokens,
                cached_tokens=int(m.cached_tokens or 0), live_tokens=int(live),
                prefix_hit_tokens=int(m.prefix_hit_tokens or 0),
                seam_tokens=sum(policy.live_tokens(len(d)) for d in e.segments[:-1]) if seams_live else 0,
            ))
            if on_request_done is not None:
                on_request_done()
    return tuple(records)


def write_records(path: str, records: Iterable[Tuple[Configuration, RequestRecord]]) -> None:
    """Per-request outcomes as jsonl (one object per request and configuration)."""
    with open(path, "w", encoding="utf-8") as handle:
        for config, r in records:
            row = {"mode": config.mode, "seam": config.seam, "cold_policy": config.cold_policy,
                   "seam_min_tokens": config.seam_min_tokens, "seam_max_tokens": config.seam_max_tokens, **r.__dict__}
            handle.write(json.dumps(row) + "\n")
