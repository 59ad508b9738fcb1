"""``hypic bench serve``: the workload, the metric definitions, the rate search, and a run against a
real ``hypic serve tiny`` process on 127.0.0.1 (bounded: a few seconds)."""

import asyncio
import json
import math
import shlex
import statistics
from pathlib import Path

import pytest
import torch

httpx = pytest.importorskip("httpx")

from hypic.assets import resolve_model_path
from hypic.bench.rag_trace import chunk
from hypic.bench.serve_client import RequestResult, encode_body, run_schedule, wait_idle
from hypic.bench.serve_metrics import parse_goodput, point_metrics, steady_state
from hypic.bench.serve import config_from_args
from hypic.bench.serve_report import sustainable_rate
from hypic.bench.serve_run import RateSearch, ServeBenchConfig, point_sizes
from hypic.bench.serve_server import LaunchedServer, engine_flags
from hypic.bench.serve_trace import (build_trace, corpus_fit, default_word_vocabulary, poisson_arrivals_s,
                                     request_body, request_stream, text_token_range)
from hypic.config import EngineConfig
from hypic.engine.tokenizer import Tokenizer
from hypic.entrypoints.cli import build_parser, main
from hypic.models.config import load_spec
from hypic.pic.segments import PIC_SEP
from hypic.runner.pic_runner import entry_nbytes

# tiny sizes: prompts of ~150 tokens in 16-token segments, 3-6 output tokens
TRACE = ["--prompt-tokens", "160", "--segment-tokens", "16", "--doc-tokens", "16,48", "--system-tokens", "16",
         "--query-tokens", "4,8", "--output-tokens", "3,6"]


def small_trace(vocab_size=665, first_token_id=5, **kw):
    args = dict(first_token_id=first_token_id, doc_tokens=(16, 48), system_tokens=16, query_tokens=(4, 8),
                zipf_exponent=1.0, corpus_factor=4.0, num_documents=0, seed=0)
    args.update(kw)
    return build_trace(vocab_size, 160, 16, **args)


# ---- workload ------------------------------------------------------------------------------------


def test_poisson_arrivals_are_seeded_with_the_rate_as_mean():
    a = poisson_arrivals_s(4000, 8.0, "s")
    assert a == poisson_arrivals_s(4000, 8.0, "s") and a != poisson_arrivals_s(4000, 8.0, "t")
    assert a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:]))
    gaps = [y - x for x, y in zip(a, a[1:])]
    assert statistics.fmean(gaps) == pytest.approx(1 / 8.0, rel=0.05)
    assert statistics.pstdev(gaps) == pytest.approx(1 / 8.0, rel=0.08)  # exponential: std = mean
    assert poisson_arrivals_s(3, math.inf, "s") == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        poisson_arrivals_s(3, 0.0, "s")


def test_requests_carry_seeded_output_lengths_and_both_wire_forms_send_the_same_prompt():
    trace = small_trace()
    reqs = request_stream(trace, 30, "x", 3, 6)
    assert reqs == request_stream(trace, 30, "x", 3, 6)
    assert {r.output_tokens for r in reqs} <= set(range(3, 7)) and len({r.output_tokens for r in reqs}) > 1
    words = default_word_vocabulary()
    assert text_token_range(words) == (5, 665)
    tokenizer = Tokenizer(resolve_model_path("tiny"))
    for r in reqs[:5]:
        tokens = request_body(r, "tokens", model="m")
        assert tokens["segments"][:-1] == [list(s) for s in r.segments] and tokens["segments"][-1] == list(r.query)
        assert tokens["max_tokens"] == r.output_tokens and tokens["ignore_eos"] and tokens["return_token_ids"]
        assert tokens["stream"] and tokens["stream_options"] == {"include_usage": True}
        text = request_body(r, "text", model="m", words=words)
        pieces = text["prompt"].split(PIC_SEP)
        # on the tiny model's word-level tokenizer the text is exactly the token ids
        assert [tokenizer.encode(p) for p in pieces] == tokens["segments"]
        assert "segments" not in text and "return_token_ids" not in text


def test_corpus_fit_counts_entry_bytes_and_the_popular_documents_that_fit():
    trace = small_trace()
    spec = load_spec(str(resolve_model_path("tiny")))
    seam = 8

    def doc_bytes(tokens):
        return sum(entry_nbytes(spec, torch.float32, len(c) - min(seam, len(c)), False) for c in chunk(tokens, 16))

    system, docs = doc_bytes(trace.system_prompt), [doc_bytes(d) for d in trace.documents]
    budget = system + docs[0] + docs[1]  # room for the two most popular documents exactly
    fit = corpus_fit(trace, spec, torch.float32, seam, {"small": budget, "all": None})
    assert fit["corpus_entry_bytes"] == system + sum(docs)
    assert fit["corpus_entries"] == sum(len(chunk(d, 16)) for d in (trace.system_prompt, *trace.documents))
    small = fit["budgets"]["small"]
    assert small["fits_bytes_fraction"] == pytest.approx(budget / (system + sum(docs)))
    weights = trace.popularity
    assert small["fits_popularity_fraction"] == pytest.approx((weights[0] + weights[1]) / sum(weights))
    assert fit["budgets"]["all"] == {"budget_bytes": None, "fits_bytes_fraction": 1.0, "fits_popularity_fraction": 1.0}


# ---- metrics -------------------------------------------------------------------------------------


def result(i, start, ttft, gaps, tokens=None, success=True, error=""):
    r = RequestResult(i, start, start_s=start, success=success, error=error)
    if success:
        r.ttft_s, r.itl_s = ttft, list(gaps)
        r.latency_s = ttft + sum(gaps)
        r.output_tokens = len(gaps) + 1 if tokens is None else tokens
        r.prompt_tokens = 100
    return r


def test_point_metrics_follow_vllm_definitions():
    results = [result(0, 0.0, 0.2, [0.1, 0.1, 0.1]), result(1, 0.5, 1.5, [0.05]),
               result(2, 1.0, None, [], success=False, error="HTTP 503: full")]
    m = point_metrics(results, [4, 2, 3], [100, 100, 100], goodput_ms={"ttft": 1000.0}, ttft_slo_ms=1000.0,
                      slo_attainment=0.9)
    assert (m["completed"], m["failed"], m["num_requests"]) == (2, 1, 3)
    assert m["duration_s"] == pytest.approx(2.05)  # first send 0.0 .. last completion 0.5 + 1.55
    assert m["request_throughput"] == pytest.approx(2 / 2.05)
    assert m["request_goodput"] == pytest.approx(1 / 2.05)  # the 1.5 s TTFT misses the SLO
    assert m["total_output_tokens"] == 6 and m["output_throughput"] == pytest.approx(6 / 2.05)
    assert m["total_token_throughput"] == pytest.approx(206 / 2.05)
    assert m["mean_ttft_ms"] == pytest.approx(850) and m["median_ttft_ms"] == pytest.approx(850)
    assert m["p99_ttft_ms"] == pytest.approx(200 + 0.99 * 1300)
    # TPOT per request: (E2EL - TTFT) / (tokens - 1) = 100 ms and 50 ms
    assert m["mean_tpot_ms"] == pytest.approx(75)
    assert sorted([m["median_itl_ms"], m["mean_itl_ms"]]) == pytest.approx([87.5, 100])  # 100, 100, 100, 50
    assert m["median_e2el_ms"] == pytest.approx((500 + 1550) / 2)
    assert m["ttft_slo_attainment"] == pytest.approx(1 / 3)  # a failure counts as a miss
    assert m["ttft_median_all_ms"] == pytest.approx(1500)  # the failure counts as late
    assert m["errors"] == {"HTTP 503: full": 1} and not m["meets_slo"]
    assert m["output_tokens_mismatch"] == 0 and m["expected_output_tokens"] == 6
    assert parse_goodput(["ttft:1000", "e2el:20000"]) == {"ttft": 1000.0, "e2el": 20000.0}
    with pytest.raises(ValueError):
        parse_goodput(["itl:5"])


def test_steady_state_flags_a_growing_queue():
    calm = [result(i, i * 0.1, 0.05 + 0.01 * (i % 3), [0.01]) for i in range(20)]
    assert steady_state(calm, 1000.0)["steady"]
    growing = [result(i, i * 0.1, 0.05 + 0.2 * i, [0.01]) for i in range(20)]
    out = steady_state(growing, 1000.0)
    assert not out["steady"] and out["ttft_drift_ratio"] > 1.5
    # a relative climb of a few ms is noise, not a queue
    small = [result(i, i * 0.1, 0.010 + 0.002 * i, [0.01]) for i in range(20)]
    assert steady_state(small, 1000.0)["steady"]


def test_rate_search_brackets_the_capacity():
    config = ServeBenchConfig(modes=("m",), prompt_tokens=(8,), bisect_steps=3)
    for capacity in (0.3, 2.5, 11.0):
        search = RateSearch(config, 1.0)
        while search.next_rate is not None and len(search.tried) < 20:
            search.record(search.next_rate, search.next_rate <= capacity)
        assert search.passing is not None and search.failing is not None
        assert search.passing <= capacity < search.failing
        assert search.failing / search.passing <= 2 ** (1 / 4) * 1.1  # doubled, then three bisections
    # a pass above a failure is noise: the bracket stays below the lowest failure
    noisy = RateSearch(config, 1.0)
    for rate, ok in ((1.0, True), (2.0, True), (4.0, False), (2.8, False)):
        assert noisy.next_rate == rate
        noisy.record(rate, ok)
    assert (noisy.passing, noisy.failing) == (2.0, 2.8) and noisy.next_rate == 2.4
    noisy.record(2.4, True)
    noisy.record(noisy.next_rate, False)  # 2.6
    noisy.record(3.5, True)  # above the failures: not a pass that counts
    assert (noisy.passing, noisy.failing) == (2.4, 2.6)
    ladder = RateSearch(ServeBenchConfig(modes=("m",), prompt_tokens=(8,), request_rates=(4.0, 1.0, 2.0)), 99.0)
    seen = []
    while ladder.next_rate is not None:
        seen.append(ladder.next_rate)
        ladder.record(ladder.next_rate, False)
    assert seen == [1.0, 2.0, 4.0]
    assert point_sizes(ServeBenchConfig(modes=("m",), prompt_tokens=(8,), warmup_s=2, measure_s=10,
                                        min_requests=16), 3.0) == (6, 30)


def test_sustainable_rate_is_conservative():
    points = [{"request_rate_rps": r, "ok": ok} for r, ok in ((1, True), (2, True), (4, False), (8, True))]
    assert sustainable_rate(points, "ok") == (2, 4, False)
    assert sustainable_rate(points[:2], "ok") == (2, None, True)
    assert sustainable_rate(points[2:3], "ok") == (None, 4, True)


def test_engine_flags_rebuild_the_same_engine_config():
    argv = ["bench", "serve", "--device", "cpu", "--dtype", "float32", "--max-num-seqs", "7", "--seam", "0.5",
            "--segment-cache-bytes", "1GiB", "--host-cache-bytes", "2GiB", "--enforce-eager",
            "--max-model-len", "4096"]
    args = build_parser().parse_args(argv)
    flags = engine_flags(args)
    served = build_parser().parse_args(["serve", "tiny", *flags])
    served.model = served.model_tag
    assert EngineConfig.from_cli_args(served) == EngineConfig.from_cli_args(args)
    assert "--pic-mode" not in flags and "--model" not in flags


# ---- against a real server ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    # 16-token segments: cached only below the default pic_segment_min_tokens
    args = build_parser().parse_args(["bench", "serve", "--device", "cpu", "--pic-segment-min-tokens", "0"])
    log = str(tmp_path_factory.mktemp("serve") / "server.log")
    with LaunchedServer("hypic", args, log, start_timeout_s=120) as server:
        yield server


def test_bench_serve_against_a_live_server(tiny_server, tmp_path):
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--base-url", tiny_server.base_url, "--modes", "tiny-hypic", *TRACE,
            "--prompt-form", "text", "--request-rates", "3", "--warmup-s", "1", "--measure-s", "2",
            "--min-requests", "6", "--calibration-requests", "2", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["command"] == "python3 -m hypic " + " ".join(argv) and "commit" in report
    (row,) = report["results"]
    samples = row["samples"]
    measured = [s for s in samples if s["measured"]]
    assert len(samples) == row["warmup_requests"] + row["num_requests"] and len(measured) == row["num_requests"]
    assert row["num_requests"] >= 6 and row["completed"] + row["failed"] == row["num_requests"]
    assert row["failed"] == 0 and row["cancelled"] == 0
    # ignore_eos: every request generated exactly the max_tokens it asked for
    assert row["output_tokens_mismatch"] == 0
    assert row["total_output_tokens"] == sum(s["max_tokens"] for s in measured) == row["expected_output_tokens"]
    assert all(s["output_tokens"] == s["max_tokens"] for s in samples)
    # the text form on tiny is the trace's tokens: the server counted the trace's prompt lengths
    trace = small_trace()
    assert [s["prompt_tokens"] for s in measured] == [
        r.prompt_tokens for r in request_stream(trace, len(samples), "rate-3", 3, 6)][row["warmup_requests"]:]
    for key in ("request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_itl_ms",
                "p99_e2el_ms", "max_output_tokens_per_s", "ttft_slo_attainment"):
        assert row[key] is not None and row[key] >= 0, key
    assert row["median_ttft_ms"] <= row["p90_ttft_ms"] <= row["p99_ttft_ms"]
    assert row["total_input_tokens"] == sum(s["prompt_tokens"] for s in measured)
    # the server's counters moved by at least the measured requests' tokens (warm-up ones come on top)
    server = row["server_metrics"]
    assert server["store_device_bytes"] >= server["store_device_bytes_before"] > 0  # the corpus warm-up filled it
    assert server["generation_tokens"] == sum(s["output_tokens"] for s in samples)
    assert server["prompt_tokens"] == sum(s["prompt_tokens"] for s in samples)
    assert server["segment_hit_tokens"] == sum(s["segment_hit_tokens"] for s in samples) > 0
    assert 0 < row["segment_hit_rate"] < 1 and row["prefix_hit_rate"] == 0
    (summary,) = report["summary"]
    assert summary["mode"] == "tiny-hypic" and summary["rates_rps"] == [3.0]
    (target,) = report["targets"]
    trace_info = target["traces"][0]
    assert trace_info["corpus_warmup"]["failed"] == 0 and trace_info["calibration"]["idle_ttft_ms"] > 0
    (corpus,) = report["corpus"]
    assert corpus["corpus_documents"] == len(trace.documents)
    assert corpus["budgets"]["device"]["fits_bytes_fraction"] == 1.0


def test_calibration_only_measures_the_idle_all_hit_ttft(tiny_server, tmp_path):
    """--max-points 0: the corpus warm-up, then one request at a time (the server-side TTFT that
    the offline `hypic bench ttft` all-hit case is compared with); every document is in every
    request, so after the warm-up each is all-hit."""
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--base-url", tiny_server.base_url, "--modes", "tiny-hypic", "--prompt-tokens", "136",
            "--segment-tokens", "32", "--doc-tokens", "32,32", "--system-tokens", "0", "--query-tokens", "8,8",
            "--output-tokens", "2,2", "--num-documents", "4", "--zipf", "0", "--calibration-requests", "3",
            "--max-points", "0", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["results"] == []  # no rate point
    calibration = report["targets"][0]["traces"][0]["calibration"]
    assert calibration["failed"] == 0 and len(calibration["ttft_ms"]) == 3
    assert 0 < calibration["idle_ttft_ms"] <= calibration["idle_ttft_p90_ms"]
    # beside a long cold prompt: requests one at a time while it prefills, against the idle TTFT
    argv += ["--beside-long-tokens", "600", "--json", str(tmp_path / "beside.json")]
    assert main(argv) == 0
    beside = json.loads((tmp_path / "beside.json").read_text())["targets"][0]["traces"][0]["beside_long"]
    assert beside["long_prompt_tokens"] == 616 and beside["long_ttft_ms"] > 0 and beside["failed"] == 0
    assert beside["requests"] == len(beside["ttft_ms"]) >= 1
    assert beside["ratio_to_idle"] == pytest.approx(beside["ttft_p50_ms"] / beside["idle_ttft_ms"])
    with pytest.raises(ValueError, match="--max-points >= 0"):
        config_from_args(build_parser().parse_args(["bench", "serve", "--max-points", "-1"]))


def test_requests_still_running_at_the_drain_timeout_fail_and_are_aborted(tiny_server):
    trace = small_trace()
    (req,) = request_stream(trace, 1, "long", 3, 6)
    body = {**request_body(req, "tokens", model=tiny_server.served_model_name), "max_tokens": 400}
    results = asyncio.run(run_schedule(tiny_server.base_url, [encode_body(body)] * 2, [0.0, 0.0],
                                       drain_timeout_s=0.3))
    assert [r.success for r in results] == [False, False]
    assert all(r.error.startswith("cancelled") for r in results)
    assert wait_idle(tiny_server.base_url, timeout_s=20)  # the server aborted both


def test_the_h200_plan_parses_into_a_valid_run():
    """Every line of benchmarks/plans/serve_h200.plan is a valid `hypic bench serve` command whose
    launched servers get the full-size model's engine options."""
    from hypic.bench.serve import config_from_args

    plan = Path(__file__).resolve().parents[2] / "benchmarks" / "plans" / "serve_h200.plan"
    lines = [line for line in plan.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert lines
    for line in lines:
        argv = shlex.split(line.replace("$OUT", "/tmp/out"))
        assert argv[:3] == ["python3", "-m", "hypic"]
        args = build_parser().parse_args(argv[3:])
        config = config_from_args(args)
        assert config.modes == ("hypic", "prefix_cache") and config.prompt_tokens == (8192, 32768)
        flags = engine_flags(args)
        assert flags[flags.index("--load-format") + 1] == "dummy" and "--device" in flags
        assert args.dummy_config and Path(plan.parents[2] / args.dummy_config).is_file()
