import json
import os

import numpy as np
import pytest
import torch

from hypic.bench.ttft import ALL_MODES, DEFAULT_CASES, TtftConfig, parse_bytes
from hypic.bench.ttft_report import REQUIRED_RESULT_KEYS, format_table, percentile
from hypic.entrypoints.cli import main
from tests.runner.pic_helpers import TINY_CONFIG

P, S, Q, SEAM = 64, 16, 16, 4  # 4 segments of 16 + a 16-token question


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model's ops are far too small for intra-op threads; on a shared 2-core machine
    they only add contention (6x slower measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_config_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("ttft") / "tiny.json"
    path.write_text(json.dumps(TINY_CONFIG))
    return str(path)


def _args(config_path, out_dir, *extra):
    return ["bench", "ttft", "--dummy-config", config_path, "--load-format", "dummy", "--device", "cpu",
            "--prompt-tokens", str(P), "--segment-tokens", str(S), "--num-requests", "2",
            "--cold-requests", "1", "--query-tokens", str(Q), "--doc-tokens", "8,16", "--system-tokens", "8",
            "--rag-query-tokens", "2,4", "--no-progress", "--no-device-warmup",
            "--json", os.path.join(out_dir, "ttft.json"), *extra]


@pytest.fixture(scope="module")
def report(tiny_config_path, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ttft_out"))
    assert main(_args(tiny_config_path, out, "--plot-dir", os.path.join(out, "plots"), "--seam", str(SEAM))) == 0
    with open(os.path.join(out, "ttft.json")) as f:
        data = json.load(f)
    data["_out"] = out
    return data


def test_percentile_matches_numpy_and_hand_values():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0
    rng = np.random.default_rng(0)
    xs = rng.exponential(size=37).tolist()
    for q in (0, 10, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_parse_bytes():
    assert parse_bytes("none") is None
    assert parse_bytes("1000") == 1000
    assert parse_bytes("32GiB") == 32 << 30
    assert parse_bytes("1.5mb") == 1_500_000
    for bad in ("-1", "12 parsecs", "GiB"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_config_errors():
    with pytest.raises(ValueError, match="unknown mode"):
        TtftConfig(modes=("hypic", "magic"))
    with pytest.raises(ValueError, match="unknown case"):
        TtftConfig(cases=("warm",))
    with pytest.raises(ValueError):
        TtftConfig(modes=("hypic", "transition_rope_recompute"))  # the alias repeats hypic
    with pytest.raises(ValueError):
        TtftConfig(prompt_tokens=(256,), segment_tokens=(512,))
    with pytest.raises(ValueError):
        TtftConfig(num_requests=0)


def test_cli_rejects_unknown_mode_before_loading(tiny_config_path, tmp_path, capsys):
    assert main(_args(tiny_config_path, str(tmp_path), "--modes", "hypic,bogus")) == 2
    assert "unknown mode 'bogus'" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "ttft.json")


def test_json_schema_all_cases_and_modes(report):
    assert set(report) >= {"device", "model", "results"}
    assert report["model"] == "tiny-dummy" and report["device"].startswith("cpu")
    rows = report["results"]
    assert not [r for r in rows if "error" in r]
    keys = {(r["case"], r["mode"], r["cold_policy"]) for r in rows}
    expected = {(c, m, "inline") for c in DEFAULT_CASES for m in ALL_MODES} | {("cold", "hypic", "standalone")}
    assert keys == expected and len(rows) == len(expected)
    for r in rows:
        for k in REQUIRED_RESULT_KEYS:
            assert k in r, k
        assert r["prompt_tokens"] == P and r["segment_tokens"] == S
        assert r["num_requests"] == (1 if r["case"] == "cold" else 2)
        assert 0 < r["ttft_p50_ms"] <= r["ttft_p90_ms"] <= r["ttft_p99_ms"]
        samples = r["ttft_samples_ms"]
        assert len(samples) == r["num_requests"] and min(samples) <= r["ttft_p50_ms"] <= r["ttft_p99_ms"] <= max(samples)
        assert r["floor_ms"] > 0 and r["flops"] > 0 and r["bytes"] > 0
        assert r["floor_ms"] == pytest.approx(max(r["flops"] / 790e12, r["bytes"] / 4.3e12) * 1e3)
        assert r["store_evictions"] == 0
        assert r["first_request_ms"] > 0  # the last warm-up request, timed apart
    plots = os.listdir(os.path.join(report["_out"], "plots"))
    assert sorted(plots) == ["ttft_all_hit.png", "ttft_cold.png", "ttft_rag.png"]
    assert "summary overhead" in format_table(rows)


def _row(report, case, mode, cold_policy="inline"):
    (row,) = [r for r in report["results"]
              if r["case"] == case and r["mode"] == mode and r["cold_policy"] == cold_policy]
    return row


def test_cold_case(report):
    n = P // S
    for mode in ALL_MODES:  # nothing is cached: every token is live
        row = _row(report, "cold", mode)
        assert row["live_tokens_mean"] == n * S + Q and row["token_hit_rate"] == 0.0
    hypic = _row(report, "cold", "hypic")
    full = _row(report, "cold", "full_recompute")
    assert hypic["summary_overhead"] == pytest.approx(
        (hypic["ttft_p50_ms"] - full["ttft_p50_ms"]) / full["ttft_p50_ms"])
    sa = _row(report, "cold", "hypic", "standalone")
    assert sa["live_tokens_mean"] == n * SEAM + Q and sa["standalone_tokens_mean"] == n * S
    assert sa["speedup_vs_full_recompute"] == pytest.approx(full["ttft_p50_ms"] / sa["ttft_p50_ms"])
    assert hypic["store_bytes_per_cached_token"] > 0
    # the linear layers' share of the entries (tiny config: 2 linear layers, dense T [4, 16, 16],
    # S [4, 16, 16], conv tails [128, 3], fp32; bodies of S - SEAM tokens) beside the model's K/V
    words = 2 * (4 * 16 * 16 * 2 + 128 * 3)
    assert hypic["store_linear_bytes_per_cached_token"] == pytest.approx(4 * words / (S - SEAM))
    assert hypic["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4
    assert full["store_linear_bytes_per_cached_token"] is None


def test_all_hit_live_tokens(report):
    n = P // S
    assert _row(report, "all_hit", "hypic")["live_tokens_mean"] == n * SEAM + Q
    for mode in ("addition", "transition", "transition_rope"):
        row = _row(report, "all_hit", mode)
        assert row["live_tokens_mean"] == Q and row["hit_rate"] == 1.0
        assert row["token_hit_rate"] == pytest.approx(n * S / (n * S + Q))
    assert _row(report, "all_hit", "full_recompute")["live_tokens_mean"] == n * S + Q
    assert _row(report, "all_hit", "full_recompute")["hit_rate"] is None
    # prefix caching hits only on shared prefixes: never fewer live tokens than the query
    assert Q <= _row(report, "all_hit", "prefix_cache")["live_tokens_mean"] <= n * S + Q


@pytest.mark.parametrize("case", ["all_hit", "rag"])
def test_cached_cases_carry_the_speedup_over_prefix_caching(report, case):
    base = _row(report, case, "prefix_cache")
    assert "speedup_vs_prefix_cache" not in base
    for mode in ALL_MODES:
        if mode != "prefix_cache":
            row = _row(report, case, mode)
            assert row["speedup_vs_prefix_cache"] == pytest.approx(base["ttft_p50_ms"] / row["ttft_p50_ms"])
    for row in report["results"]:
        if row["case"] == "cold":
            assert "speedup_vs_prefix_cache" not in row
    rows = [r for r in report["results"] if r["case"] == case]
    assert "x vs prefix_cache" in format_table(rows)


def test_rag_after_warmup(report):
    hypic = _row(report, "rag", "hypic")
    full = _row(report, "rag", "full_recompute")
    assert hypic["hit_rate"] == 1.0  # the warm-up cached every document
    assert hypic["live_tokens_mean"] < full["live_tokens_mean"] == full["prompt_tokens_mean"]
    assert full["prompt_tokens_mean"] <= P
    assert _row(report, "rag", "transition")["live_tokens_mean"] < hypic["live_tokens_mean"]
    assert hypic["corpus_documents"] > 0 and hypic["warmup_requests"] > 0


def test_plain_repeat_finds_all_but_the_last_token(tiny_config_path, tmp_path):
    """The repeated plain prompt (no segments): every mode with a store resumes from the prefix
    cache at its last token; full recompute computes all of it."""
    args = _args(tiny_config_path, str(tmp_path), "--cases", "plain_repeat", "--modes",
                 "full_recompute,prefix_cache,hypic", "--prefix-block-tokens", "16")
    assert main(args) == 0
    with open(tmp_path / "ttft.json") as f:
        rows = {r["mode"]: r for r in json.load(f)["results"]}
    assert set(rows) == {"full_recompute", "prefix_cache", "hypic"} and not [r for r in rows.values() if "error" in r]
    assert rows["full_recompute"]["live_tokens_mean"] == P and rows["full_recompute"]["token_hit_rate"] == 0
    for mode in ("prefix_cache", "hypic"):
        assert rows[mode]["live_tokens_mean"] == 1 and rows[mode]["token_hit_rate"] == pytest.approx((P - 1) / P)
        assert rows[mode]["store_entries"] == P // 16  # the spine at 16, 32, 48 and the prompt's end, 63
    assert rows["hypic"]["speedup_vs_prefix_cache"] > 0


def test_store_budget_limits_reported(tiny_config_path, tmp_path):
    args = _args(tiny_config_path, str(tmp_path), "--cases", "all_hit", "--modes", "hypic", "--store-bytes", "1")
    assert main(args) == 0
    with open(tmp_path / "ttft.json") as f:
        (row,) = json.load(f)["results"]
    # a 1-byte store holds nothing: the runner records no entry (and so evicts none)
    assert row["store_skipped_writes"] > 0 and row["store_entries"] == 0
    assert row["store_budget_bytes"] == 1
    assert row["live_tokens_mean"] == P // S * S + Q  # nothing survived the budget: all live


def test_time_budget_skips_points(tiny_config_path, tmp_path):
    args = _args(tiny_config_path, str(tmp_path), "--max-seconds", "1e-9")
    assert main(args) == 0
    with open(tmp_path / "ttft.json") as f:
        data = json.load(f)
    assert data["results"] == []
    assert {(s["case"], s["prompt_tokens"], s["segment_tokens"]) for s in data["skipped"]} == {
        (c, P, S) for c in DEFAULT_CASES}


def test_merge_reports(report, tmp_path):
    a, b = dict(report), dict(report)
    a.pop("_out"), b.pop("_out")
    replaced = dict(b["results"][0], ttft_p50_ms=123.0)
    extra = dict(b["results"][1], prompt_tokens=2 * P)
    b["results"] = [replaced, extra]
    a["skipped"] = [{"case": extra["case"], "prompt_tokens": 2 * P, "segment_tokens": S, "reason": "budget"},
                    {"case": "cold", "prompt_tokens": 4 * P, "segment_tokens": S, "reason": "budget"}]
    paths = []
    for name, rep in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps(rep))
        paths.append(str(tmp_path / name))
    out = str(tmp_path / "merged.json")
    assert main(["bench", "ttft", "--merge-json", *paths, "--json", out]) == 0
    with open(out) as f:
        merged_report = json.load(f)
    merged = merged_report["results"]
    # b measured the point a skipped: only a's other skipped point stays
    assert [sk["prompt_tokens"] for sk in merged_report["skipped"]] == [4 * P]
    assert len(merged) == len(a["results"]) + 1
    # each row keeps the command and commit of the run that measured it
    assert b["command"].startswith("python3 -m hypic bench ttft")
    made_by = {"command": b["command"], "commit": b["commit"]}
    assert [r for r in merged if r["ttft_p50_ms"] == 123.0] == [dict(replaced, **made_by)]
    assert dict(extra, **made_by) in merged
    assert merged_report["command"].startswith("python3 -m hypic bench ttft --merge-json")
    c = dict(a, model="other")
    (tmp_path / "c.json").write_text(json.dumps(c))
    assert main(["bench", "ttft", "--merge-json", paths[0], str(tmp_path / "c.json"), "--json", out]) == 2
