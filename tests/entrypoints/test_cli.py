"""The `hypic` command line: generate on the tiny model, errors, and the bench registry."""

import argparse
import subprocess
import sys

import pytest
import torch

from hypic.entrypoints import cli


@pytest.fixture(autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_generate_prints_text_and_stats(capsys):
    code = cli.main([
        "generate", "--model", "tiny", "--prompt", "Hello there", "--prompt", "a",
        "--max-tokens", "5", "--temperature", "0", "--ignore-eos", "--device", "cpu", "--dtype", "float32",
    ])
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("=== prompt:") == 2 and "'Hello there'" in out
    assert out.count("finish_reason=length") == 2 and "output_tokens=5" in out
    assert "ttft=" in out and "tok/s" in out and "dtype=float32" in out


def test_generate_sampling_options_and_chat(capsys):
    args = ["generate", "--prompt", "hi", "--max-tokens", "3", "--temperature", "0.8", "--top-p", "0.9",
            "--top-k", "20", "--seed", "5", "--chat", "--device", "cpu"]
    assert cli.main(args) == 0
    first = capsys.readouterr().out
    assert cli.main(args) == 0
    second = capsys.readouterr().out
    text = lambda s: s.split("\n")[1]  # noqa: E731 - the completion line
    assert text(first) == text(second)  # seeded


def test_errors_are_messages_not_tracebacks(capsys):
    assert cli.main(["generate", "--model", "/no/such/model", "--prompt", "x"]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert cli.main(["generate", "--prompt", "x", "--top-p", "0", "--device", "cpu"]) == 2
    assert "top_p" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["generate"])  # --prompt is required
    with pytest.raises(SystemExit):
        cli.main([])


def test_bench_registry():
    seen = {}

    def add_arguments(parser):
        parser.add_argument("--n", type=int, default=1)

    def run(args):
        seen["n"] = args.n
        return 0

    command = cli.BenchCommand("unit-test-bench", "a test benchmark", add_arguments, run)
    cli.register_bench_command(command)
    try:
        cli.register_bench_command(command)  # same object again: fine
        with pytest.raises(ValueError, match="already registered"):
            cli.register_bench_command(cli.BenchCommand("unit-test-bench", "other", add_arguments, run))
        assert cli.main(["bench", "unit-test-bench", "--n", "7"]) == 0
        assert seen == {"n": 7}
        assert "unit-test-bench" in cli.bench_commands()
    finally:
        cli._BENCH_COMMANDS.pop("unit-test-bench", None)


def test_parser_has_generate_and_bench():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"generate", "bench"} <= set(sub.choices)


def test_module_entry_point_help():
    result = subprocess.run(
        [sys.executable, "-m", "hypic.entrypoints.cli", "generate", "--help"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0
    for flag in ["--model", "--prompt", "--max-tokens", "--temperature", "--top-p", "--top-k", "--seed", "--dtype", "--device"]:
        assert flag in result.stdout
