"""The `hypic` command line: generate on the tiny model (the README's first command included),
errors, and the bench registry."""

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hypic.assets.make_seeded_tiny import write_tiny_model
from hypic.entrypoints import cli

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_generate_prints_text_and_stats(capsys):
    code = cli.main([
        "generate", "--model", "tiny", "--prompt", "the mentor of kolton is", "--prompt", "a",
        "--max-tokens", "5", "--temperature", "0", "--ignore-eos", "--device", "cpu", "--dtype", "float32",
    ])
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("=== prompt:") == 2 and "'the mentor of kolton is'" in out
    assert out.count("finish_reason=length") == 2 and "output_tokens=5" in out
    assert "ttft=" in out and "tok/s" in out and "dtype=float32" in out


def test_generate_sampling_options(capsys):
    args = ["generate", "--prompt", "it was a", "--max-tokens", "6", "--temperature", "0.8", "--top-p", "0.9",
            "--top-k", "20", "--seed", "5", "--ignore-eos", "--device", "cpu"]
    assert cli.main(args) == 0
    first = capsys.readouterr().out
    assert cli.main(args) == 0
    second = capsys.readouterr().out
    text = lambda s: s.split("\n")[1]  # noqa: E731 - the completion line
    assert text(first) == text(second)  # seeded
    assert len(text(first).split()) >= 3  # words of the suite vocabulary, not <unk>s dropped on decode


def test_generate_penalty_options(capsys):
    base = ["generate", "--prompt", "the mentor of kolton is", "--max-tokens", "8", "--ignore-eos", "--device", "cpu"]
    assert cli.main(base) == 0
    plain = capsys.readouterr().out.split("\n")[1]
    assert cli.main(base + ["--presence-penalty", "2", "--frequency-penalty", "2", "--repetition-penalty", "10",
                            "--min-tokens", "8", "--min-p", "0.1"]) == 0
    penalised = capsys.readouterr().out.split("\n")[1]
    assert penalised != plain and len(set(penalised.split())) > len(set(plain.split()))
    assert cli.main(base + ["--presence-penalty", "5"]) == 2
    assert "presence_penalty" in capsys.readouterr().err


def test_generate_chat(capsys, tmp_path):
    # The trained tiny model has no chat template: a message, exit status 2.
    assert cli.main(["generate", "--prompt", "a", "--chat", "--max-tokens", "2", "--device", "cpu"]) == 2
    assert "no chat template" in capsys.readouterr().err
    # A model with one (the seeded test model, ChatML) wraps each prompt as a user turn.
    write_tiny_model(tmp_path)
    args = ["generate", "--model", str(tmp_path), "--prompt", "hi", "--max-tokens", "3", "--temperature", "0.8",
            "--seed", "5", "--chat", "--ignore-eos", "--device", "cpu"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "output_tokens=3" in out
    # the prompt is the templated user turn and assistant header, not the bare "hi"
    from hypic.engine.tokenizer import Tokenizer

    templated = Tokenizer(tmp_path).encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert f"prompt_tokens={len(templated)} " in out and len(templated) > len(Tokenizer(tmp_path).encode("hi"))


def _readme_first_command():
    """The argument list of the README's first `hypic generate` command (Quick start)."""
    for line in README.read_text().splitlines():
        if "hypic generate" in line:
            return shlex.split(line.split("&& hypic ", 1)[1])
    raise AssertionError("README.md has no `hypic generate` command")


def _expected_answer(prompt):
    """The answer of a single-hop suite question, read from the prompt's own documents."""
    facts = {"live": "{} lives in (\\w+) \\.", "job": "{} works as a (\\w+) \\."}
    question = re.search(r"question : (?:where does (\w+) (live)|what is the (job) of (\w+)) \?", prompt)
    assert question, prompt
    subject = question.group(1) or question.group(4)
    relation = question.group(2) or question.group(3)
    return re.search(facts[relation].format(subject), prompt).group(1)


def test_readme_first_command_hits_the_segment_cache_and_answers(capsys):
    """The README's first command as written (default device and dtype): the second prompt has the
    same <<PIC_SEP>> segments in another order, reports cached tokens, and both answers are right."""
    argv = _readme_first_command()
    assert argv[0] == "generate" and "tiny" in argv
    prompts = [argv[i + 1] for i, a in enumerate(argv) if a == "--prompt"]
    assert len(prompts) == 2
    first, second = (p.split("<<PIC_SEP>>") for p in prompts)
    assert sorted(first[:-1]) == sorted(second[:-1]) and first[:-1] != second[:-1]  # reordered documents
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    cached = [int(n) for n in re.findall(r"cached_tokens=(\d+)", out)]
    assert cached[0] == 0 and cached[1] > 0
    completions = [block.split("\n")[1] for block in out.split("=== prompt:")[1:]]
    assert completions == [_expected_answer(p) for p in prompts]
    assert out.count("finish_reason=stop") == 2


def test_errors_are_messages_not_tracebacks(capsys):
    assert cli.main(["generate", "--model", "/no/such/model", "--prompt", "x"]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert cli.main(["generate", "--prompt", "a", "--top-p", "0", "--device", "cpu"]) == 2
    assert "top_p" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["generate"])  # --prompt is required
    with pytest.raises(SystemExit):
        cli.main([])


def test_bench_subcommands_come_from_the_given_registry():
    seen = {}

    def add_arguments(parser):
        parser.add_argument("--n", type=int, default=1)

    def run(args):
        seen["n"] = args.n
        seen["argv"] = args.argv
        return 0

    commands = {"unit-test-bench": cli.BenchCommand("a test benchmark", add_arguments, run)}
    assert cli.main(["bench", "unit-test-bench", "--n", "7"], bench_commands=commands) == 0
    assert seen == {"n": 7, "argv": ["bench", "unit-test-bench", "--n", "7"]}
    with pytest.raises(SystemExit):
        cli.main(["bench", "ttft"], bench_commands=commands)  # only the given registry


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


def test_generate_takes_every_engine_option():
    """``hypic generate`` has one flag per EngineConfig field and builds the engine from them."""
    from hypic.config import ENGINE_OPTIONS, EngineConfig

    parser = cli.build_parser()
    args = parser.parse_args(["generate", "--prompt", "x", "--max-num-seqs", "3", "--enforce-eager",
                              "--segment-cache-bytes", "64MiB", "--pic-mode", "transition"])
    assert all(hasattr(args, o.name) for o in ENGINE_OPTIONS)
    config = EngineConfig.from_cli_args(args)
    assert config == EngineConfig.from_kwargs(max_num_seqs=3, enforce_eager=True, segment_cache_bytes=64 << 20,
                                              pic_mode="transition")


def test_generate_cache_salt_keeps_tenants_apart_across_runs(capsys, tmp_path):
    """Three runs on one --segment-cache-dir: the second, under another --cache-salt, finds
    nothing of the first; the third, under the first's salt, finds its prefix and segments."""
    segmented = ("<sep> this passage is about divur . divur owns a snake . divur lives in santon .<<PIC_SEP>>"
                 "<sep> this passage is about fevun . fevun works as a teacher .<<PIC_SEP>>"
                 "<sep> question : where does divur live ? answer :")
    plain = "<sep> this passage is about kolton . kolton lives in rilwick . " * 3 + "<sep> question : where does kolton live ?"
    base = ["generate", "--model", "tiny", "--prompt", segmented, "--prompt", plain, "--max-tokens", "3",
            "--temperature", "0", "--device", "cpu", "--prefix-block-tokens", "16",
            "--segment-cache-dir", str(tmp_path)]

    def run(salt):
        assert cli.main(base + ["--cache-salt", salt]) == 0
        out = capsys.readouterr().out
        hits = [(int(c), int(p)) for c, p in re.findall(r"cached_tokens=(\d+) prefix_hit_tokens=(\d+)", out)]
        texts = re.findall(r"=== prompt: .*\n(.*)\n", out)
        return hits, texts

    first, text_a = run("tenant-a")
    other, text_b = run("tenant-b")
    again, text_c = run("tenant-a")
    assert first == other == [(0, 0), (0, 0)]
    assert all(p > 0 for _, p in again) and text_a == text_b == text_c


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_serve_stops_on_a_signal_without_a_traceback(sig):
    """Ctrl-C (or a service manager's SIGTERM) ends `hypic serve` gracefully: exit code 0, the
    drain logged, no traceback."""
    import os
    import signal
    import socket
    import time
    import urllib.request

    pytest.importorskip("uvicorn")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(README.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "hypic", "serve", "tiny", "--device", "cpu", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the server did not start within 120 s"
            time.sleep(0.2)
        proc.send_signal(getattr(signal, sig))
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "Application shutdown complete" in out, out
