"""benchmarks/device_run.sh: runs every line of a plan under $OUT, logs each, counts failures."""

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_plan_lines_run_in_order_and_a_failure_does_not_stop_the_rest(tmp_path):
    plan = tmp_path / "smoke.plan"
    plan.write_text("# comment\n\n"
                    "python3 -m hypic bench kernels --op scan --device cpu --size tiny --repeats 1 --json $OUT/k.json\n"
                    "false\n"
                    "echo done > $OUT/last.txt\n")
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out))
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_run.sh"), str(plan), "120"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr  # one failed line
    assert (out / "k.json").is_file() and (out / "last.txt").read_text() == "done\n"
    log = (out / "logs" / "run.txt").read_text()
    assert "step 1 rc=0" in log and "step 2 rc=1" in log and "step 3 rc=0" in log and "3 steps, 1 failed" in log
    assert sorted(p.name for p in (out / "logs").glob("step*.txt")) == ["step1.txt", "step2.txt", "step3.txt"]


def test_a_range_of_steps_runs_only_those_lines(tmp_path):
    plan = tmp_path / "parts.plan"
    plan.write_text("# comment\necho one > $OUT/1.txt\n\necho two > $OUT/2.txt\necho three > $OUT/3.txt\n")
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out))
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_run.sh"), str(plan), "60", "2-3"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in out.glob("*.txt")) == ["2.txt", "3.txt"]
    assert "2 steps, 0 failed" in (out / "logs" / "run.txt").read_text()
    bad = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_run.sh"), str(plan), "60", "x"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2


def test_more_than_eight_files_come_back_as_one_archive(tmp_path):
    # a device call returns at most 8 files from $OUT: 7 here and the 2 logs make 9
    plan = tmp_path / "many.plan"
    plan.write_text("mkdir -p $OUT/sub && for i in 1 2 3 4 5 6 7; do echo $i > $OUT/sub/$i.txt; done\n")
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out))
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_run.sh"), str(plan), "60"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [p.name for p in out.iterdir()] == ["out.tgz"]
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "xzf", str(out / "out.tgz"), "-C", str(unpacked)], check=True)
    assert (unpacked / "sub" / "7.txt").read_text() == "7\n"
    assert "1 steps, 0 failed" in (unpacked / "logs" / "run.txt").read_text()
    plan.write_text("echo 1 > $OUT/one.txt\n")
    few = tmp_path / "few"
    subprocess.run(["bash", str(ROOT / "benchmarks" / "device_run.sh"), str(plan), "60"],
                   env=dict(os.environ, OUT=str(few)), capture_output=True, text=True, timeout=60)
    assert (few / "one.txt").is_file() and not (few / "out.tgz").exists()


def test_the_call_budget_cuts_a_step_and_skips_what_no_longer_fits(tmp_path):
    # budget 37 s: the first step's limit is cut from 60 to 37 - 15 = 22 s (less the runner's start);
    # after its 3 s the second step would have under 19 s, under 20: skipped, and counted in the exit code
    plan = tmp_path / "slow.plan"
    plan.write_text("sleep 3\necho late > $OUT/late.txt\n")
    out = tmp_path / "out"
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_run.sh"), str(plan), "60", "1-2", "37"],
                            env=dict(os.environ, OUT=str(out)), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    log = (out / "logs" / "run.txt").read_text()
    limit = int(re.search(r"step 1 rc=0 \d+s \(limit (\d+)s\)", log).group(1))
    assert 10 <= limit <= 22, log  # 22 less what the runner's own start took
    assert "step 2 skipped" in log and "1 steps, 0 failed, 1 skipped" in log, log
    assert not (out / "late.txt").exists()
    bad = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_run.sh"), str(plan), "60", "1", "soon"],
                         env=dict(os.environ, OUT=str(out)), capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "CALL_BUDGET_S" in bad.stderr
