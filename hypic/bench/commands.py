"""The ``hypic bench`` subcommands: name -> (help, add_arguments, run). ``add_arguments(parser)``
declares a subcommand's options; ``run(args)`` returns its exit code (None = 0)."""

from __future__ import annotations

import argparse
from typing import Callable, Dict, NamedTuple, Optional

from hypic.bench import (deviation, kernels, op_count, parallel_sampling, prefix_spacing, profile, quality,
                         segment_parallel, serve, small_segments, ttft)


class BenchCommand(NamedTuple):
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], Optional[int]]


BENCH_COMMANDS: Dict[str, BenchCommand] = {
    "ttft": BenchCommand(ttft.HELP, ttft.add_arguments, ttft.run),
    "quality": BenchCommand(quality.HELP, quality.add_arguments, quality.run),
    "deviation": BenchCommand(deviation.HELP, deviation.add_arguments, deviation.run),
    "kernels": BenchCommand(kernels.HELP, kernels.add_arguments, kernels.run),
    "profile": BenchCommand(profile.HELP, profile.add_arguments, profile.run),
    "op-count": BenchCommand(op_count.HELP, op_count.add_arguments, op_count.run),
    "segment-parallel": BenchCommand(segment_parallel.HELP, segment_parallel.add_arguments, segment_parallel.run),
    "serve": BenchCommand(serve.HELP, serve.add_arguments, serve.run),
    "small-segments": BenchCommand(small_segments.HELP, small_segments.add_arguments, small_segments.run),
    "prefix-spacing": BenchCommand(prefix_spacing.HELP, prefix_spacing.add_arguments, prefix_spacing.run),
    "parallel-sampling": BenchCommand(parallel_sampling.HELP, parallel_sampling.add_arguments, parallel_sampling.run),
}
