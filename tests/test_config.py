"""Tests of hypic/config.py: validation of every field, flat keywords, CLI flags one-to-one."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

from hypic.config import (ENGINE_OPTIONS, SECTIONS, CacheConfig, EngineConfig, KernelConfig, ModelConfig,
                          PICConfig, SchedulerConfig, SegmentParallelConfig, add_engine_args, parse_bytes)

# Per flat option: a value its dataclass rejects, and what the error must name.
INVALID = {
    "model": ("", "model"),
    "dtype": ("int8", "dtype"),
    "device": ("gpu:x", "device"),
    "seed": (-1, "seed"),
    "load_format": ("pt", "load_format"),
    "max_model_len": (0, "max_model_len"),
    "pic_mode": ("fast", "mode"),
    "seam": (-2, "seam"),
    "seam_min_tokens": (-1, "seam_min_tokens"),
    "seam_max_tokens": (-1, "seam_max_tokens"),
    "cold_policy": ("lukewarm", "cold_policy"),
    "max_num_batched_tokens": (0, "max_num_batched_tokens"),
    "max_num_seqs": (True, "max_num_seqs"),
    "segment_cache_bytes": (-1, "segment_cache_bytes"),
    "host_cache_bytes": (None, "host_cache_bytes"),
    "enable_prefix_caching": (1, "enable_prefix_caching"),
    "prefix_block_tokens": (0, "prefix_block_tokens"),
    "segment_cache_dir": ("", "segment_cache_dir"),
    "disk_cache_bytes": (-1, "disk_cache_bytes"),
    "pic_segment_min_tokens": (-1, "segment_min_tokens"),
    "segment_workers": (0, "num_workers"),
    "segment_devices": (("cpu", "cpu"), "devices"),
    "segment_assignment": ("random", "assignment"),
    "segment_group_tokens": (0, "group_tokens"),
    "segment_start_timeout_s": (0, "start_timeout_s"),
    "segment_reply_timeout_s": (-1.0, "reply_timeout_s"),
    "enforce_eager": ("yes", "enforce_eager"),
    "moe_backend": ("triton", "moe_backend"),
}

# Per flat option: a valid value other than its default, and how it is written on the command line.
OTHER = {
    "model": ("tiny2", "tiny2"),
    "dtype": ("bfloat16", "bfloat16"),
    "device": ("cpu", "cpu"),
    "seed": (3, "3"),
    "load_format": ("dummy", "dummy"),
    "max_model_len": (128, "128"),
    "pic_mode": ("prefix_cache", "prefix_cache"),
    "seam": (0.25, "0.25"),
    "seam_min_tokens": (4, "4"),
    "seam_max_tokens": (64, "64"),
    "cold_policy": ("standalone", "standalone"),
    "max_num_batched_tokens": (512, "512"),
    "max_num_seqs": (4, "4"),
    "segment_cache_bytes": (None, "none"),
    "host_cache_bytes": (1 << 30, "1GiB"),
    "enable_prefix_caching": (False, None),
    "prefix_block_tokens": (128, "128"),
    "segment_cache_dir": ("/tmp/hypic-cache", "/tmp/hypic-cache"),
    "disk_cache_bytes": (1 << 30, "1GiB"),
    "pic_segment_min_tokens": (32, "32"),
    "segment_workers": (2, "2"),
    "segment_devices": (("cpu", "cpu"), "cpu,cpu"),
    "segment_assignment": ("round_robin", "round_robin"),
    "segment_group_tokens": (None, "none"),
    "segment_start_timeout_s": (30.0, "30"),
    "segment_reply_timeout_s": (5.0, "5"),
    "enforce_eager": (True, None),
    "moe_backend": ("torch", "torch"),
}


def test_every_field_of_every_part_has_exactly_one_option():
    fields = {(section, f.name) for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    options = [(o.section, o.field) for o in ENGINE_OPTIONS]
    assert len(options) == len(set(options)) and set(options) == fields
    assert {f.name for f in dataclasses.fields(EngineConfig)} == set(SECTIONS)
    names = [o.name for o in ENGINE_OPTIONS]
    assert len(names) == len(set(names))
    assert set(INVALID) == set(names) and set(OTHER) == set(names)  # a new field needs its cases here


@pytest.mark.parametrize("name", list(INVALID))
def test_every_field_is_validated_with_an_error_naming_it(name):
    value, match = INVALID[name]
    kwargs = {"segment_workers": 3} if name == "segment_devices" else {}  # two devices for three workers
    with pytest.raises(ValueError, match=match):
        EngineConfig.from_kwargs(**kwargs, **{name: value})


def test_errors_name_the_allowed_values():
    with pytest.raises(ValueError, match="safetensors, dummy"):
        ModelConfig(load_format="pt")
    with pytest.raises(ValueError, match="inline, standalone, canonical"):
        PICConfig(cold_policy="warm")
    with pytest.raises(ValueError, match="auto, float32"):
        ModelConfig(dtype=torch.int8)
    with pytest.raises(ValueError, match="ModelConfig"):
        EngineConfig(model="tiny")


def test_defaults():
    config = EngineConfig()
    assert config.model == ModelConfig() and config.pic == PICConfig() and config.cache == CacheConfig()
    assert config.scheduler == SchedulerConfig() and config.parallel == SegmentParallelConfig()
    assert config.kernel == KernelConfig(enforce_eager=False, moe_backend="auto")  # CUDA graphs on by default
    assert EngineConfig.from_kwargs() == config
    assert config.pic.mode is None and not config.pic.every_prompt


def test_from_kwargs_round_trip():
    kwargs = {name: value for name, (value, _) in OTHER.items()}
    config = EngineConfig.from_kwargs(**kwargs)
    assert config.to_kwargs() == kwargs
    assert EngineConfig.from_kwargs(**config.to_kwargs()) == config
    assert config.parallel.num_workers == 2 and config.kernel.enforce_eager and config.pic.every_prompt
    with pytest.raises(ValueError, match="valid: model, dtype"):
        EngineConfig.from_kwargs(max_num_seq=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model.seed = 1


def test_cli_flags_are_one_to_one_with_the_fields():
    parser = add_engine_args(argparse.ArgumentParser())
    flags = {a.dest: a.option_strings for a in parser._actions if a.dest != "help"}
    assert set(flags) == {o.name for o in ENGINE_OPTIONS}
    for option in ENGINE_OPTIONS:
        assert option.flag in flags[option.name]
        assert option.flag == "--" + option.name.replace("_", "-")
    assert EngineConfig.from_cli_args(parser.parse_args([])) == EngineConfig()
    argv = []
    for name, (value, text) in OTHER.items():
        flag = "--" + name.replace("_", "-")
        argv += ([flag] if value else ["--no-" + flag[2:]]) if text is None else [flag, text]
    args = parser.parse_args(argv)
    assert EngineConfig.from_cli_args(args).to_kwargs() == {name: value for name, (value, _) in OTHER.items()}
    assert EngineConfig.from_cli_args(parser.parse_args(["--seam", "4"])).pic.seam == 4


def test_byte_counts():
    assert parse_bytes("8GiB") == 8 << 30 and parse_bytes("512M") == 512 << 20 and parse_bytes("100") == 100
    assert parse_bytes("none") is None
    with pytest.raises(argparse.ArgumentTypeError):
        parse_bytes("8 gigabytes")
