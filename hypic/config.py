"""The engine's configuration: frozen, validated dataclasses, one surface for every entry point.

:class:`EngineConfig` is composed of

* :class:`ModelConfig` (model, dtype, device, seed, load_format, max_model_len),
* :class:`~hypic.pic.modes.PICConfig` (mode, seam and its floor and cap, cold policy),
* :class:`~hypic.engine.scheduler.SchedulerConfig` (max_num_batched_tokens, max_num_seqs),
* :class:`CacheConfig` (the segment store's device, host and disk tiers; the prefix cache),
* :class:`~hypic.runner.segment_parallel.SegmentParallelConfig` (segment workers),
* :class:`KernelConfig` (enforce_eager, moe_backend).

``LLM(...)``, ``LLMEngine(...)``, ``hypic generate`` and every command that builds an engine take
the same options one-to-one: :data:`ENGINE_OPTIONS` names each field once, with its flat name
(``LLM``'s keyword, ``--flag-name`` on the command line) and its help text.
:meth:`EngineConfig.from_kwargs` builds a config from flat keywords, :func:`add_engine_args` adds
one flag per field to a parser, :meth:`EngineConfig.from_cli_args` reads them back. Every
dataclass validates itself in ``__post_init__``: a bad value is a ``ValueError`` naming the field
and what it may be. Nothing here reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch

from hypic.engine.scheduler import SchedulerConfig
from hypic.models.loader import LOAD_FORMATS
from hypic.models.layers import MOE_BACKENDS
from hypic.pic.modes import COLD_POLICIES, MODE_ALIASES, MODES, PICConfig, SeamSetting
from hypic.runner.segment_assign import ASSIGNMENTS
from hypic.runner.segment_parallel import SegmentParallelConfig

DTYPES: Dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
}
DEFAULT_SEGMENT_CACHE_BYTES = 8 << 30
DEFAULT_DISK_CACHE_BYTES = 64 << 30


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: Any, minimum: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not _is_int(value) or value < minimum:
        none = " or None" if optional else ""
        raise ValueError(f"{name} must be an int >= {minimum}{none}, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """What runs and where. ``dtype`` ``auto``: float32 on CPU, bfloat16 on accelerators;
    ``device`` ``auto``: CUDA when available, else CPU; ``max_model_len`` None: the model's
    ``max_position_embeddings`` (checked against it when the engine reads the model's config)."""

    model: Union[str, Path] = "tiny"
    dtype: Union[str, torch.dtype] = "auto"
    device: Union[str, torch.device] = "auto"
    seed: int = 0
    load_format: str = "safetensors"
    max_model_len: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, Path)) or not str(self.model):
            raise ValueError(f"model must be a checkpoint folder or an embedded model name, got {self.model!r}")
        if isinstance(self.dtype, torch.dtype):
            if self.dtype not in DTYPES.values():
                raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}, got {self.dtype}")
        elif self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.device, torch.device):
            if not isinstance(self.device, str):
                raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
            if self.device != "auto":
                try:
                    torch.device(self.device)
                except (RuntimeError, TypeError):
                    raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}") from None
        _check_int("seed", self.seed, 0)
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        _check_int("max_model_len", self.max_model_len, 1, optional=True)


@dataclass(frozen=True)
class CacheConfig:
    """The segment store (segment entries and prefix-cache checkpoints, one byte accounting):
    ``segment_cache_bytes`` of device memory (None: unbounded), ``host_cache_bytes`` of host
    memory below it (evicted entries spill there), and, with ``segment_cache_dir``, a directory
    that every entry is written to and that a later engine started on it reads back (its own
    budget ``disk_cache_bytes``; it refuses a directory another model, dtype or configuration
    wrote). ``enable_prefix_caching``: automatic prefix caching of every prompt
    (:mod:`hypic.pic.prefix`), its checkpoints every ``prefix_block_tokens`` tokens (None: the
    model's own spacing, where a checkpoint costs at most the K/V of its block)."""

    segment_cache_bytes: Optional[int] = DEFAULT_SEGMENT_CACHE_BYTES
    host_cache_bytes: int = 0
    enable_prefix_caching: bool = True
    prefix_block_tokens: Optional[int] = None
    segment_cache_dir: Optional[Union[str, Path]] = None
    disk_cache_bytes: int = DEFAULT_DISK_CACHE_BYTES

    def __post_init__(self) -> None:
        _check_int("segment_cache_bytes", self.segment_cache_bytes, 0, optional=True)
        _check_int("host_cache_bytes", self.host_cache_bytes, 0)
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching must be True or False, got {self.enable_prefix_caching!r}")
        _check_int("prefix_block_tokens", self.prefix_block_tokens, 1, optional=True)
        if self.segment_cache_dir is not None and (not isinstance(self.segment_cache_dir, (str, Path))
                                                   or not str(self.segment_cache_dir)):
            raise ValueError(f"segment_cache_dir must be a directory path or None, got {self.segment_cache_dir!r}")
        _check_int("disk_cache_bytes", self.disk_cache_bytes, 0)


@dataclass(frozen=True)
class KernelConfig:
    """``enforce_eager``: run every layer eagerly, without CUDA graphs (as vLLM's option; graphs
    are on by default on CUDA, and a CPU device has none). ``moe_backend``: how routed experts
    run, ``"auto"`` (the kernels for the device) or ``"torch"`` (the pure-PyTorch reference, for
    debugging a kernel)."""

    enforce_eager: bool = False
    moe_backend: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager must be True or False, got {self.enforce_eager!r}")
        if self.moe_backend not in MOE_BACKENDS:
            raise ValueError(f"moe_backend must be one of {tuple(MOE_BACKENDS)}, got {self.moe_backend!r}")


@dataclass(frozen=True)
class EngineConfig:
    """Every setting of one engine, by part."""

    model: ModelConfig = field(default_factory=ModelConfig)
    pic: PICConfig = field(default_factory=PICConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    parallel: SegmentParallelConfig = field(default_factory=SegmentParallelConfig)
    kernel: KernelConfig = field(default_factory=KernelConfig)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value, cls = getattr(self, f.name), SECTIONS[f.name]
            if not isinstance(value, cls):
                raise ValueError(f"{f.name} must be a {cls.__name__}, got {type(value).__name__}")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "EngineConfig":
        """A config from flat keywords (:data:`ENGINE_OPTIONS`' names, as ``LLM`` takes them);
        a missing one keeps its default, an unknown one is a ValueError listing the valid ones."""
        unknown = sorted(set(kwargs) - set(OPTIONS_BY_NAME))
        if unknown:
            raise ValueError(f"unknown engine option(s) {', '.join(unknown)}; valid: {', '.join(OPTIONS_BY_NAME)}")
        parts: Dict[str, Dict[str, Any]] = {name: {} for name in SECTIONS}
        for name, value in kwargs.items():
            option = OPTIONS_BY_NAME[name]
            parts[option.section][option.field] = value
        return cls(**{name: SECTIONS[name](**values) for name, values in parts.items()})

    def to_kwargs(self) -> Dict[str, Any]:
        """The flat keywords of this config (``from_kwargs(**c.to_kwargs()) == c``)."""
        return {o.name: getattr(getattr(self, o.section), o.field) for o in ENGINE_OPTIONS}

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineConfig":
        """The config of the flags :func:`add_engine_args` added (``args`` from its parser)."""
        return cls.from_kwargs(**{o.name: getattr(args, o.name) for o in ENGINE_OPTIONS})


SECTIONS: Dict[str, type] = {
    "model": ModelConfig, "pic": PICConfig, "scheduler": SchedulerConfig, "cache": CacheConfig,
    "parallel": SegmentParallelConfig, "kernel": KernelConfig,
}


# ---- flat names, CLI flags and help: one row per field ------------------------------------------


def parse_optional_int(text: str) -> Optional[int]:
    """``none`` -> None, else an int."""
    return None if text.lower() == "none" else int(text)


_BYTE_UNITS = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
               "t": 1 << 40, "tib": 1 << 40}


def parse_optional_str(text: str) -> Optional[str]:
    """``none`` -> None, else the text."""
    return None if text.lower() == "none" else text


def parse_bytes(text: str) -> Optional[int]:
    """A byte count: ``1073741824``, ``512MiB``, ``8GiB`` (binary units; ``none``: None)."""
    if text.lower() == "none":
        return None
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if match is None or match.group(2).lower() not in _BYTE_UNITS:
        raise argparse.ArgumentTypeError(f"not a byte count (e.g. 8GiB, 512MiB, 1048576): {text!r}")
    return int(match.group(1)) * _BYTE_UNITS[match.group(2).lower()]


def parse_seam(text: str) -> SeamSetting:
    """``8`` -> 8 tokens; ``0.25`` -> a quarter of each segment."""
    return float(text) if "." in text else int(text)


def parse_devices(text: str) -> Optional[Tuple[str, ...]]:
    """``cuda:0,cuda:1`` -> one device per segment worker (``none``: the default)."""
    return None if text.lower() == "none" else tuple(d.strip() for d in text.split(",") if d.strip())


@dataclass(frozen=True)
class EngineOption:
    """One field: its flat name (the CLI flag is ``--`` plus the name with dashes), where it
    lives (``EngineConfig.<section>.<field>``), its help, and how the CLI parses it."""

    name: str
    section: str
    field: str
    help: str
    parse: Optional[Callable[[str], Any]] = None
    choices: Optional[Tuple[str, ...]] = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def default(self) -> Any:
        f = next(f for f in dataclasses.fields(SECTIONS[self.section]) if f.name == self.field)
        return f.default_factory() if f.default is dataclasses.MISSING else f.default


ENGINE_OPTIONS: Tuple[EngineOption, ...] = (
    EngineOption("model", "model", "model", "checkpoint folder or an embedded model name ('tiny')"),
    EngineOption("dtype", "model", "dtype", "weights and activations; auto: float32 on CPU, bfloat16 on GPU",
                 choices=("auto",) + tuple(DTYPES)),
    EngineOption("device", "model", "device", "auto (CUDA when available) | cpu | cuda | cuda:N"),
    EngineOption("seed", "model", "seed", "seeds requests without a seed of their own, and dummy weights", int),
    EngineOption("load_format", "model", "load_format", "weights: safetensors files or dummy (random)",
                 choices=tuple(LOAD_FORMATS)),
    EngineOption("max_model_len", "model", "max_model_len",
                 "prompt + output tokens per request (default: the model's max_position_embeddings)",
                 parse_optional_int),
    EngineOption("pic_mode", "pic", "mode",
                 "segment-caching mode for every prompt: " + " | ".join(MODES) + " (default: hypic for "
                 "prompts that carry segments, the plain path for the rest)",
                 choices=tuple(MODES) + tuple(MODE_ALIASES)),
    EngineOption("seam", "pic", "seam", "seam window: tokens (int) or a fraction of each segment in (0, 1]",
                 parse_seam),
    EngineOption("seam_min_tokens", "pic", "seam_min_tokens",
                 "floor of the seam window in tokens (with a fractional seam: at least this many tokens)", int),
    EngineOption("seam_max_tokens", "pic", "seam_max_tokens",
                 "cap of the seam window in tokens (none: no cap)", parse_optional_int),
    EngineOption("pic_segment_min_tokens", "pic", "segment_min_tokens",
                 "segments shorter than this are not cached but computed live with their neighbours", int),
    EngineOption("cold_policy", "pic", "cold_policy",
                 "cold segments: inline (exact, context-bound entries), standalone (canonical entries "
                 "first, then all-hit) or canonical (exact now, canonical entries after)",
                 choices=tuple(COLD_POLICIES)),
    EngineOption("max_num_batched_tokens", "scheduler", "max_num_batched_tokens",
                 "token budget of one prefill step", int),
    EngineOption("max_num_seqs", "scheduler", "max_num_seqs", "requests holding a cache at once", int),
    EngineOption("segment_cache_bytes", "cache", "segment_cache_bytes",
                 "segment store, device tier (bytes, e.g. 8GiB; none: unbounded)", parse_bytes),
    EngineOption("host_cache_bytes", "cache", "host_cache_bytes",
                 "segment store, host tier below the device tier (bytes, e.g. 32GiB)", parse_bytes),
    EngineOption("enable_prefix_caching", "cache", "enable_prefix_caching",
                 "automatic prefix caching of every prompt (checkpoints of the exact state at block boundaries)"),
    EngineOption("prefix_block_tokens", "cache", "prefix_block_tokens",
                 "tokens between prefix-cache checkpoints (none: the model's spacing, a checkpoint costing at "
                 "most its block's K/V)", parse_optional_int),
    EngineOption("segment_cache_dir", "cache", "segment_cache_dir",
                 "directory of the segment store's persistent tier (entries survive a restart)", parse_optional_str),
    EngineOption("disk_cache_bytes", "cache", "disk_cache_bytes",
                 "segment store, disk tier in segment_cache_dir (bytes, e.g. 64GiB)", parse_bytes),
    EngineOption("segment_workers", "parallel", "num_workers",
                 "processes (one device each, the engine's included) that prefill standalone cold segments",
                 int),
    EngineOption("segment_devices", "parallel", "devices",
                 "one device per segment worker, comma-separated (default: cuda:r on CUDA, else the "
                 "engine's device)", parse_devices),
    EngineOption("segment_assignment", "parallel", "assignment",
                 "how a batch's cold segments are split over the segment workers: lpt (longest first to the "
                 "least loaded) | round_robin", choices=tuple(ASSIGNMENTS)),
    EngineOption("segment_group_tokens", "parallel", "group_tokens",
                 "tokens of one forward on a segment worker; each group's entries are sent as soon as they "
                 "are written (none: a worker's whole share at once)", parse_optional_int),
    EngineOption("segment_start_timeout_s", "parallel", "start_timeout_s",
                 "how long a segment worker may take to load the model (seconds)", float),
    EngineOption("segment_reply_timeout_s", "parallel", "reply_timeout_s",
                 "how long a segment worker with work may stay silent before the engine kills it and "
                 "prefills the rest of its share itself (seconds; one group's forward must fit)", float),
    EngineOption("enforce_eager", "kernel", "enforce_eager", "run without CUDA graphs"),
    EngineOption("moe_backend", "kernel", "moe_backend",
                 "routed experts: auto (the kernels for the device) | torch (the reference)",
                 choices=tuple(MOE_BACKENDS)),
)
OPTIONS_BY_NAME: Dict[str, EngineOption] = {o.name: o for o in ENGINE_OPTIONS}


def add_engine_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """One flag per :class:`EngineConfig` field (``--max-num-seqs``), defaults from the
    dataclasses; read them back with :meth:`EngineConfig.from_cli_args`. Returns ``parser``."""
    group = parser.add_argument_group("engine")
    for option in ENGINE_OPTIONS:
        default = option.default
        if isinstance(default, bool):
            group.add_argument(option.flag, dest=option.name, action=argparse.BooleanOptionalAction,
                               default=default, help=option.help)
            continue
        shown = "" if default is None else f" (default: {default})"  # None: the help says what
        group.add_argument(option.flag, dest=option.name, default=default, type=option.parse,
                           choices=option.choices, help=option.help + shown)
    return parser


__all__ = ["CacheConfig", "DEFAULT_DISK_CACHE_BYTES", "DEFAULT_SEGMENT_CACHE_BYTES", "DTYPES", "ENGINE_OPTIONS",
           "EngineConfig", "EngineOption", "KernelConfig", "ModelConfig", "PICConfig", "SchedulerConfig", "SegmentParallelConfig", "add_engine_args",
           "parse_bytes", "parse_devices", "parse_optional_int", "parse_optional_str", "parse_seam"]
