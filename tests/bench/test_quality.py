"""`hypic bench quality` end to end on tiny random checkpoints (CPU, seconds)."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
import torch

from hypic.bench.quality import parse_args, parse_tasks, run_bounds, run_quality
from hypic.bench.quality_report import format_table, plot_results, summarize
from hypic.bench.quality_run import (
    Configuration, EncodedRequest, PromptEncoder, RequestRecord, encode_requests, expand_configurations, group_requests,
    parse_modes, parse_seam_specs, parse_seams, run_task,
)
from hypic.data import SuiteConfig, extended_vocabulary, generate_suite
from hypic.entrypoints.cli import main
from tests.bench._checkpoints import write_byte_level_checkpoint, write_word_level_checkpoint

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "longbench_fixture.jsonl"
RESULT_KEYS = {"task", "mode", "seam", "cold_policy", "n", "score", "gap_to_full", "cached_tokens_mean",
               "live_tokens_mean", "same_as_full", "prefix_hit_tokens_mean", "seam_min_tokens", "seam_max_tokens",
               "seam_tokens_mean", "score_ci95", "gap_ci95"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def word_model(tmp_path_factory):
    return write_word_level_checkpoint(tmp_path_factory.mktemp("word") / "ckpt")


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):
    return write_byte_level_checkpoint(tmp_path_factory.mktemp("byte") / "ckpt")


@pytest.fixture(scope="module")
def suite_run(word_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    argv = ["bench", "quality", "--model", str(word_model), "--num-requests", "3", "--modes", "full_recompute,hypic",
            "--seams", "1.0,8", "--cold-policies", "inline,standalone", "--min-docs", "2", "--max-docs", "3",
            "--device", "cpu", "--json", str(out / "q.json"), "--plot", str(out / "q.png"),
            "--records", str(out / "q.jsonl"), "--no-progress"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(argv)
    return code, out, printed.getvalue()


def test_cli_end_to_end_writes_table_json_and_plot(suite_run):
    code, out, printed = suite_run
    assert code == 0
    payload = json.loads((out / "q.json").read_text())
    assert set(payload) == {"model", "config", "command", "commit", "torch", "results"}
    results = payload["results"]
    # full_recompute once per task; hypic per (seam, policy): 1 + 2 * 2 configurations.
    assert len(results) == 3 * 5
    for row in results:
        assert set(row) == RESULT_KEYS
        assert row["n"] == 3 and 0.0 <= row["score"] <= 100.0
        assert row["live_tokens_mean"] > 0
    assert {r["task"] for r in results} == {"single_hop", "two_hop", "summary"}
    full = [r for r in results if r["mode"] == "full_recompute"]
    assert all(r["seam"] is None and r["cold_policy"] is None and r["gap_to_full"] == 0.0 for r in full)
    assert {(r["seam"], r["cold_policy"]) for r in results if r["mode"] == "hypic"} == {
        (1.0, "inline"), (1.0, "standalone"), (8, "inline"), (8, "standalone")}
    # Summary requests 0 and 1 share a document: the second one hits with a seam of 8.
    hit = [r for r in results if r["task"] == "summary" and r["mode"] == "hypic" and r["seam"] == 8]
    assert all(r["cached_tokens_mean"] > 0 for r in hit)
    # The table has a row per result and the gap column.
    lines = printed.splitlines()
    assert lines[0].split()[:9] == ["task", "mode", "seam", "cold", "n", "score", "±95%", "gap", "±95%"]
    assert sum(1 for line in lines if line.startswith(("single_hop", "two_hop", "summary"))) == 15
    png = (out / "q.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def test_seam_covering_every_document_equals_full_recompute(suite_run):
    _, out, _ = suite_run
    rows = [json.loads(line) for line in (out / "q.jsonl").read_text().splitlines()]
    full = {r["request_id"]: r for r in rows if r["mode"] == "full_recompute"}
    covered = [r for r in rows if r["mode"] == "hypic" and r["seam"] == 1.0]
    assert len(full) == 9 and len(covered) == 18
    for r in covered:
        ref = full[r["request_id"]]
        assert r["prediction"] == ref["prediction"] and r["score"] == ref["score"]
        assert r["cached_tokens"] == 0 and r["live_tokens"] == ref["prompt_tokens"]
    results = json.loads((out / "q.json").read_text())["results"]
    for r in results:
        if r["mode"] == "hypic" and r["seam"] == 1.0:
            assert r["gap_to_full"] == 0.0


def test_batching_keeps_hits_and_predictions_of_sequential_runs(word_model):
    requests = generate_suite(SuiteConfig("summary", min_docs=2, max_docs=3), 5)
    encoder = PromptEncoder(word_model, 672)
    encoded = encode_requests(encoder, requests)
    config = Configuration("hypic", 4, "inline")
    kw = dict(max_tokens=4, device="cpu", dtype="float32", seed=0)
    one = run_task(word_model, config, encoded, batch_size=1, **kw)
    many = run_task(word_model, config, encoded, batch_size=5, **kw)
    assert [r.cached_tokens for r in one] == [r.cached_tokens for r in many]
    assert [r.live_tokens for r in one] == [r.live_tokens for r in many]
    assert [r.prediction for r in one] == [r.prediction for r in many]
    assert sum(r.cached_tokens for r in one) > 0


def _fake(doc_ids):
    return EncodedRequest(request=None, segments=tuple((d,) for d in doc_ids) + ((99,),), answer_tokens=1)


def test_group_requests_never_batches_a_shared_new_document():
    reqs = [_fake([1, 2]), _fake([3]), _fake([2, 4]), _fake([1, 4]), _fake([5])]
    groups = group_requests(reqs, "hypic", batch_size=8)
    # [1,2]+[3]; [2,4] re-reads 2, new in the first group; [1,4] re-reads 4, new in the second.
    assert [len(g) for g in groups] == [2, 1, 2]
    assert [len(g) for g in group_requests(reqs, "full_recompute", 2)] == [2, 2, 1]
    # prefix_cache units are chains of leading documents: [1, 2] and [1, 4] share only [1].
    assert [len(g) for g in group_requests([_fake([1, 2]), _fake([1, 4])], "prefix_cache", 8)] == [1, 1]
    assert [len(g) for g in group_requests([_fake([1, 2]), _fake([2, 1])], "prefix_cache", 8)] == [2]
    with pytest.raises(ValueError, match="batch_size"):
        group_requests(reqs, "hypic", 0)


def test_configurations_and_parsers():
    configs = expand_configurations(("full_recompute", "addition", "hypic"), (0, 8), ("inline", "standalone"))
    assert [c.label for c in configs] == [
        "full_recompute", "addition inline", "addition standalone", "hypic w=0 inline",
        "hypic w=0 standalone", "hypic w=8 inline", "hypic w=8 standalone"]
    assert parse_seams("0, 1,8,0.5") == (0, 1, 8, 0.5)
    assert parse_modes("transition_rope_recompute,hypic") == ("hypic",)
    with pytest.raises(ValueError, match="seam"):
        parse_seams("1.5")
    with pytest.raises(ValueError, match="fixed seam"):
        Configuration("addition", 8, "inline")


def test_unknown_mode_and_task_are_clear_errors(word_model, capsys):
    base = ["bench", "quality", "--model", str(word_model), "--no-progress"]
    assert main(base + ["--modes", "full_recompute,bogus"]) == 2
    err = capsys.readouterr().err
    assert "unknown mode 'bogus'" in err and "hypic" in err
    assert main(base + ["--tasks", "single_hop,trivia"]) == 2
    err = capsys.readouterr().err
    assert "unknown task 'trivia'" in err and "two_hop" in err
    with pytest.raises(ValueError, match="cold polic"):
        run_quality(parse_args(["--model", str(word_model), "--cold-policies", "lukewarm"]))
    with pytest.raises(ValueError, match="unknown task"):
        parse_tasks("summary,nope")


def test_longbench_file_runs_on_a_byte_level_checkpoint(byte_model, tmp_path):
    args = parse_args(["--model", str(byte_model), "--longbench", str(FIXTURE), "--modes", "full_recompute,hypic",
                       "--seams", "2", "--cold-policies", "inline", "--device", "cpu", "--no-progress",
                       "--json", str(tmp_path / "lb.json")])
    run = run_quality(args)
    tasks = {"hotpotqa", "2wikimqa", "multi_news", "gov_report", "longbench"}
    assert {r.task for r in run.results} == tasks
    assert len(run.results) == 2 * len(tasks) and all(r.n == 1 for r in run.results)
    assert all(0.0 <= r.score <= 100.0 for r in run.results)
    hotpot = [r for _, c, rs in run.records for r in rs if r.request_id == "hp-001"]
    assert len(hotpot) == 2 and all(r.prompt_tokens > 20 for r in hotpot)
    assert "hotpotqa" in format_table(run.results)


def test_text_the_tokenizer_cannot_read_is_refused(word_model, byte_model):
    # The word-level suite tokenizer maps LongBench prose to <unk>.
    args = parse_args(["--model", str(word_model), "--longbench", str(FIXTURE), "--modes", "full_recompute",
                       "--no-progress"])
    with pytest.raises(ValueError, match="<unk>"):
        run_quality(args)
    # A tokenizer that does not have the suites' words as tokens (a byte-level BPE) is refused.
    args = parse_args(["--model", str(byte_model), "--num-requests", "1", "--modes", "full_recompute",
                       "--no-progress"])
    with pytest.raises(ValueError, match="does not cover the synthetic suites"):
        run_quality(args)


def test_embedded_tiny_model_is_scored_on_the_suites():
    """The embedded model is trained on the suites: its tokenizer passes the coverage check, and it
    answers held-out single-hop questions (a model that never saw the suites scores ~0)."""
    args = parse_args(["--model", "tiny", "--tasks", "single_hop", "--num-requests", "6", "--modes",
                       "full_recompute", "--min-docs", "2", "--max-docs", "3", "--device", "cpu",
                       "--dtype", "float32", "--no-progress"])
    run = run_quality(args)
    (result,) = run.results
    assert result.task == "single_hop" and result.n == 6 and result.score >= 50.0


def test_tokenizer_missing_suite_words_is_refused(tmp_path):
    """The embedded model's files with a tokenizer that lacks the city names: refused before any run."""
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers

    from hypic.assets import TINY_MODEL_DIR
    from hypic.data.vocab import CITIES, SPECIAL_TOKENS, vocabulary

    for name in ("config.json", "tokenizer_config.json"):
        shutil.copy(TINY_MODEL_DIR / name, tmp_path / name)
    kept = [w for w in vocabulary() if w not in set(CITIES)]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(kept)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.save(str(tmp_path / "tokenizer.json"))
    args = parse_args(["--model", str(tmp_path), "--tasks", "single_hop", "--num-requests", "3", "--modes",
                       "full_recompute", "--device", "cpu", "--no-progress"])
    with pytest.raises(ValueError, match="does not cover the synthetic suites") as info:
        run_quality(args)
    assert any(city in str(info.value) for city in CITIES)


def test_bos_is_its_own_leading_segment(word_model, byte_model):
    base = ["--model", str(word_model), "--tasks", "single_hop", "--num-requests", "2", "--modes", "hypic",
            "--seams", "8", "--cold-policies", "inline", "--min-docs", "2", "--max-docs", "2", "--device", "cpu",
            "--no-progress"]
    plain = run_quality(parse_args(base))
    with_bos = run_quality(parse_args(base + ["--bos"]))
    assert with_bos.config["bos"] and not plain.config["bos"]
    (_, _, plain_records), = plain.records
    (_, _, bos_records), = with_bos.records
    assert [r.prompt_tokens + 1 for r in plain_records] == [r.prompt_tokens for r in bos_records]
    requests = generate_suite(SuiteConfig("single_hop", min_docs=2, max_docs=2), 1)
    encoder = PromptEncoder(word_model, 672)
    encoded = encode_requests(encoder, requests, encoder.bos_token_id())
    assert encoded[0].segments[0] == (encoder.bos_token_id(),) and len(encoded[0].segments) == 4
    with pytest.raises(ValueError, match="bos_token"):
        PromptEncoder(byte_model, 304).bos_token_id()


def _record(task, score, cached, live, request_id="r", prediction="p"):
    return RequestRecord(task=task, request_id=request_id, prediction=prediction, score=score,
                         prompt_tokens=cached + live, cached_tokens=cached, live_tokens=live, prefix_hit_tokens=0)


def test_summarize_means_and_gap_sign(tmp_path):
    full = Configuration("full_recompute", None, None)
    add = Configuration("addition", 0, "inline")
    hyp = Configuration("hypic", 8, "inline")
    frac = Configuration("hypic", 0.5, "inline")
    runs = [
        ("a", full, (_record("a", 100.0, 0, 40), _record("a", 50.0, 0, 60, "r2"))),
        ("a", add, (_record("a", 0.0, 30, 10), _record("a", 50.0, 50, 10))),
        ("a", hyp, (_record("a", 100.0, 20, 20), _record("a", 40.0, 40, 20, "r2", prediction="q"))),
        ("a", frac, (_record("a", 75.0, 10, 30), _record("a", 50.0, 10, 50))),
        ("b", hyp, (_record("b", 10.0, 0, 5),)),
    ]
    results = summarize(runs)
    by = {(r.task, r.mode, r.seam): r for r in results}
    assert by[("a", "full_recompute", None)].score == 75.0
    assert by[("a", "addition", 0)].gap_to_full == 50.0  # points lost relative to full recompute
    assert by[("a", "hypic", 8)].gap_to_full == pytest.approx(5.0)
    assert by[("a", "hypic", 8)].cached_tokens_mean == 30.0 and by[("a", "hypic", 8)].live_tokens_mean == 20.0
    assert by[("b", "hypic", 8)].gap_to_full is None  # no full_recompute run for task b
    # outputs equal to full recompute's, request by request ("r2" of hypic answered otherwise)
    assert by[("a", "hypic", 8)].same_as_full == 1 and by[("a", "full_recompute", None)].same_as_full == 2
    assert by[("b", "hypic", 8)].same_as_full is None
    # 95% intervals: of the scores (100, 40), and paired of the differences to full recompute (0, 10)
    assert by[("a", "hypic", 8)].score_ci95 == pytest.approx(1.96 * math.sqrt(1800 / 2))
    assert by[("a", "hypic", 8)].gap_ci95 == pytest.approx(1.96 * math.sqrt(50 / 2))
    assert by[("b", "hypic", 8)].score_ci95 is None and by[("b", "hypic", 8)].gap_ci95 is None
    table = format_table(results)
    assert "+50.00" in table and "+5.00" in table
    plot_results(str(tmp_path / "p.png"), results)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def _run_cli(argv):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(argv)
    assert code == 0
    return printed.getvalue()


def test_split_runs_merge_into_the_single_run_table(suite_run, word_model, tmp_path):
    """What a device call does: one process per part of the table, then --merge."""
    _, out, _ = suite_run
    common = ["bench", "quality", "--model", str(word_model), "--num-requests", "3", "--min-docs", "2",
              "--max-docs", "3", "--device", "cpu", "--no-progress"]
    _run_cli(common + ["--modes", "full_recompute", "--json", str(tmp_path / "a.json")])
    _run_cli(common + ["--modes", "hypic", "--seams", "1.0,8", "--cold-policies", "inline,standalone",
                       "--json", str(tmp_path / "b.json")])
    for part in ("a", "b"):
        assert json.loads((tmp_path / f"{part}.json").read_text())["config"]["complete"] is True
    printed = _run_cli(["bench", "quality", "--merge", str(tmp_path / "b.json"), str(tmp_path / "a.json"),
                        "--json", str(tmp_path / "m.json"), "--plot", str(tmp_path / "m.png")])
    merged = json.loads((tmp_path / "m.json").read_text())
    single = json.loads((out / "q.json").read_text())
    key = lambda r: (r["task"], r["mode"], str(r["seam"]), str(r["cold_policy"]))  # noqa: E731
    assert sorted(map(key, merged["results"])) == sorted(map(key, single["results"]))
    by_cell = {key(r): r for r in single["results"]}
    for row in merged["results"]:
        # a merge cannot compare outputs across files: same_as_full and the paired gap interval are
        # kept as each file had them
        want = dict(by_cell[key(row)])
        if row["mode"] != "full_recompute":
            want["same_as_full"] = want["gap_ci95"] = None
        assert row == want
    assert merged["config"]["complete"] is True and merged["config"]["incomplete_files"] == []
    assert "gap" in printed.splitlines()[0]
    # A cell present twice, or files about different requests, are refused.
    other = json.loads((tmp_path / "b.json").read_text())
    other["config"]["seed"] = 7
    (tmp_path / "c.json").write_text(json.dumps(other))
    for files, message in (("aa", "appears in more than one file"), ("ac", "has seed = 7")):
        errors = io.StringIO()
        with contextlib.redirect_stderr(errors):
            code = main(["bench", "quality", "--merge", *(str(tmp_path / f"{f}.json") for f in files)])
        assert code != 0 and message in errors.getvalue()


def test_partial_json_is_written_after_each_cell(word_model, tmp_path, monkeypatch):
    """A run killed part-way leaves the finished cells on disk, marked incomplete, with their provenance."""
    import hypic.bench.quality as quality

    calls = []
    real = quality.run_task

    def run_then_maybe_die(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt  # the third cell never finishes
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(quality, "run_task", run_then_maybe_die)
    args = parse_args(["--model", str(word_model), "--num-requests", "2", "--modes", "full_recompute,addition",
                       "--cold-policies", "inline", "--tasks", "single_hop,summary", "--min-docs", "2",
                       "--max-docs", "2", "--device", "cpu", "--no-progress", "--json", str(tmp_path / "p.json")])
    with pytest.raises(KeyboardInterrupt):
        run_quality(args)
    payload = json.loads((tmp_path / "p.json").read_text())
    assert payload["config"]["complete"] is False and "commit" in payload and "torch" in payload
    assert [(r["task"], r["mode"]) for r in payload["results"]] == [
        ("single_hop", "full_recompute"), ("summary", "full_recompute")]


def test_order_lookup_is_an_opt_in_task():
    assert parse_tasks("order_lookup,single_hop") == ("order_lookup", "single_hop")
    from hypic.data.suites import TASKS

    assert "order_lookup" not in TASKS  # the default table: tasks the embedded model was trained on


def test_long_tasks_run_with_their_bounds_and_need_the_extended_vocabulary(tmp_path):
    model = write_word_level_checkpoint(tmp_path / "long", vocab=extended_vocabulary())
    small = ["--min-docs", "3", "--max-docs", "4", "--min-context-tokens", "150", "--max-context-tokens", "300",
             "--pool-size", "32", "--device", "cpu", "--no-progress", "--num-requests", "2"]
    args = parse_args(["--model", str(model), "--tasks", "doc_order,counting", "--modes", "full_recompute,addition",
                       "--cold-policies", "standalone", *small])
    run = run_quality(args)
    assert [(r.task, r.mode) for r in run.results] == [
        ("doc_order", "full_recompute"), ("doc_order", "addition"), ("counting", "full_recompute"),
        ("counting", "addition")]
    bounds = run.config["suite_bounds"]
    assert set(bounds) == {"doc_order", "counting"}
    assert all(b["oracle"] == 100.0 and 0 <= b["order_blind_bound"] < 100 for b in bounds.values())
    assert run.config["min_context_tokens"] == 150
    with pytest.raises(ValueError, match="extended vocabulary"):
        run_quality(parse_args(["--model", "tiny", "--tasks", "multi_key", "--modes", "full_recompute", *small]))


def test_seam_floor_and_cap_are_configurations_of_their_own(word_model):
    specs = parse_seam_specs("8, 0.1:8, 0.1:8:12")
    assert [s.label for s in specs] == ["8", "0.1:8", "0.1:8:12"]
    with pytest.raises(ValueError, match="floor and cap"):
        parse_seam_specs("0.1:x")
    configs = expand_configurations(("addition", "hypic"), specs, ("standalone",))
    assert [(c.mode, c.seam, c.seam_min_tokens, c.seam_max_tokens) for c in configs] == [
        ("addition", 0, 0, None), ("hypic", 8, 0, None), ("hypic", 0.1, 8, None), ("hypic", 0.1, 8, 12)]
    requests = generate_suite(SuiteConfig(task="single_hop", min_docs=3, max_docs=3, min_doc_tokens=100,
                                          max_doc_tokens=200, pool_size=8), 1)
    (encoded,) = encode_requests(PromptEncoder(word_model, 800), requests)
    documents = [len(s) for s in encoded.segments[:-1]]
    expected = {8: [8, 8, 8], 0.1: [max(8, math.ceil(0.1 * n)) for n in documents]}
    for config in configs[1:]:
        (record,) = run_task(word_model, config, [encoded], max_tokens=1, device="cpu", dtype="float32", seed=0,
                             batch_size=1)
        windows = [min(w, config.seam_max_tokens or w) for w in expected[config.seam]]
        # cold under standalone: the standalone pass over every document, then seams and the query
        assert record.live_tokens == sum(documents) + sum(windows) + len(encoded.segments[-1]), config


def test_bounds_only_runs_no_model_and_records_its_command(tmp_path):
    small = ["--min-docs", "3", "--max-docs", "4", "--min-context-tokens", "150", "--max-context-tokens", "300",
             "--pool-size", "32", "--num-requests", "3"]
    out = tmp_path / "bounds.json"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(["bench", "quality", "--bounds-only", "--model", "no-such-model", "--tasks", "doc_order",
                     *small, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["command"].endswith(f"--json {out}") and "commit" in report
    bound = report["suite_bounds"]["doc_order"]
    assert bound["oracle"] == 100.0 and 0 <= bound["order_blind_bound"] < 100
    assert "order-blind bound" in printed.getvalue()
    with pytest.raises(ValueError, match="long tasks"):
        run_bounds(parse_args(["--bounds-only", "--tasks", "single_hop", *small]))
