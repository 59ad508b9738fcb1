"""Run a Triton kernel check on the CPU through ``TRITON_INTERPRET=1`` (shared by the kernel tests).

The interpreter must be switched on before Triton is imported, so the check runs in a fresh
subprocess; its script prints one number (the worst relative error), which is returned."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


SKIP_ENV = "HYPIC_SKIP_INTERPRETER"


def interpreted_error(script: str, *args: str) -> float:
    """Run ``script`` under the interpreter with ``args`` as its ``sys.argv[1:]`` (skip when
    Triton is missing, fail on an error) and return the last number it printed. ``HYPIC_SKIP_INTERPRETER=1`` skips instead: the device
    scripts set it, so that their few minutes go to the CUDA tests (each interpreter check is a
    fresh process, and CI runs them all on the CPU)."""
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1")
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO_ROOT, env=env, capture_output=True,
                         text=True)
    if out.returncode != 0:
        pytest.fail(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])
