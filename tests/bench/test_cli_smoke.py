"""Every ``hypic bench`` subcommand, end to end at tiny sizes on the CPU: it runs, writes its JSON
with the keys its readers use, and records the command and commit that made it. A subcommand
added to the registry without a run here fails ``test_every_subcommand_has_a_smoke_run``."""

import json

import pytest

from hypic.bench.commands import BENCH_COMMANDS
from hypic.entrypoints.cli import main
from tests.runner.pic_helpers import TINY_CONFIG

pytestmark = [
    pytest.mark.usefixtures("single_thread_torch"),
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]


def _dummy(config_path):
    return ["--dummy-config", config_path, "--load-format", "dummy", "--device", "cpu"]


# subcommand -> (arguments before --json, keys its JSON must have, keys of each row, the rows' key)
SMOKE = {
    "ttft": (lambda cfg: [*_dummy(cfg), "--modes", "prefix_cache,hypic", "--cases", "all_hit", "--prompt-tokens", "32",
                          "--segment-tokens", "16", "--query-tokens", "4", "--num-requests", "1", "--no-progress",
                          "--no-device-warmup"],
             {"device", "model", "config", "results"}, {"case", "mode", "ttft_p50_ms", "floor_ms"}, "results"),
    "quality": (lambda cfg: ["--model", "tiny", "--device", "cpu", "--num-requests", "2", "--tasks", "single_hop",
                             "--modes", "full_recompute,hypic", "--seams", "8", "--cold-policies", "inline",
                             "--no-progress"],
                {"model", "config", "results"}, {"task", "mode", "score"}, "results"),
    "deviation": (lambda cfg: ["--model", "tiny", "--device", "cpu", "--num-requests", "1", "--tasks", "single_hop",
                               "--min-docs", "2", "--max-docs", "2", "--seams", "0,8", "--cold-policies", "standalone",
                               "--no-progress"],
                  {"model", "offset_bins", "attention_layers", "rows"},
                  {"task", "cold_policy", "seam", "kl_last_mean", "top1_agreement", "by_offset", "counts"}, "rows"),
    "kernels": (lambda cfg: ["--op", "all", "--device", "cpu", "--size", "tiny", "--repeats", "1"],
                {"device", "size", "rows"}, {"op", "case", "ms", "rel_err", "max_abs_err"}, "rows"),
    "profile": (lambda cfg: [*_dummy(cfg), "--prompt-tokens", "32", "--segment-tokens", "16", "--query-tokens", "4",
                             "--repeats", "1", "--top", "5"],
                {"device", "model", "mode", "timeline", "kernels", "table", "profiled_ttft_ms"},
                {"name", "calls", "ms"}, "kernels"),
    "op-count": (lambda cfg: [*_dummy(cfg), "--segments", "2,4", "--segment-tokens", "8", "--query-tokens", "3"],
                 {"device", "model", "rows", "flat_in_segments"},
                 {"cached_segments", "ops_by_area", "ops_outside_kernels"}, "rows"),
    "segment-parallel": (lambda cfg: ["--model", "tiny", "--device", "cpu", "--workers", "1", "--traces",
                                      "2x8,2x4-12", "--query-tokens", "4", "--requests", "1", "--warmup", "1"],
                         {"device", "results"},
                         {"trace", "mode", "workers", "assignment", "ttft_p50_ms", "scatter_ms_p50", "combine_ms_p50",
                          "speedup_vs_full_recompute"}, "results"),
    # launches `hypic serve` itself (one mode) on dummy weights without a tokenizer, as on the GPU:
    # token-id prompts of ~80 tokens, streamed chunks that carry token ids and no text
    "serve": (lambda cfg: [*_dummy(cfg), "--modes", "hypic", "--prompt-tokens", "80", "--segment-tokens", "16",
                           "--doc-tokens", "16,32", "--system-tokens", "8", "--query-tokens", "4,4",
                           "--output-tokens", "2,3", "--request-rates", "4", "--warmup-s", "0", "--measure-s", "1",
                           "--min-requests", "3", "--calibration-requests", "1", "--no-corpus-warmup"],
              {"model", "config", "corpus", "targets", "results", "summary"},
              {"mode", "request_rate_rps", "completed", "failed", "request_throughput", "request_goodput",
               "output_throughput", "total_token_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
               "median_itl_ms", "median_e2el_ms", "meets_slo"}, "results"),
    "small-segments": (lambda cfg: ["--model", "tiny", "--device", "cpu", "--prompt-tokens", "48",
                                    "--segment-tokens", "9,24", "--min-tokens", "0,default", "--query-tokens", "4",
                                    "--repeats", "1"],
                       {"device", "model", "rows"},
                       {"segment_tokens", "min_tokens", "full_recompute_ms", "cold_ratio", "warm_ratio", "bytes_ratio",
                        "cold_equal"}, "rows"),
    "prefix-spacing": (lambda cfg: ["--model", "tiny", "--device", "cpu", "--block-tokens", "64,default",
                                    "--systems", "1", "--followers", "1", "--repeats", "1", "--chats", "1",
                                    "--turns", "2"],
                       {"device", "model", "rows"},
                       {"block_tokens", "shared_hit_fraction", "repeat_hit_fraction", "chat_hit_fraction",
                        "bytes_ratio", "hit_ttft_ms"}, "rows"),
    "parallel-sampling": (lambda cfg: ["--model", "tiny", "--device", "cpu", "--prompt-tokens", "40",
                                       "--segment-tokens", "16", "--query-tokens", "4", "--n", "1,2",
                                       "--max-tokens", "2", "--repeats", "1"],
                          {"device", "model", "rows"},
                          {"prompt", "n", "submission", "wall_ms", "ratio_to_n1", "prefix_checkpoint_hits",
                           "segment_hits"}, "rows"),
}


def _serve_counts_add_up(report):
    # without a tokenizer the chunks carry no text: the token ids must still time and count every token
    for row in report["results"]:
        assert row["completed"] == row["num_requests"] and row["failed"] == 0
        assert row["output_tokens_mismatch"] == 0 and row["total_output_tokens"] == row["expected_output_tokens"]
        assert row["median_itl_ms"] is not None and row["median_ttft_ms"] < row["median_e2el_ms"]


def _n_resumes_from_completion_0(report):
    # SamplingParams(n=2) of a plain prompt: completion 1 resumes from completion 0's checkpoints;
    # two separate requests start together and both prefill
    rows = {(r["prompt"], r["n"], r["submission"]): r for r in report["rows"]}
    assert rows["plain", 2, "n"]["prefix_checkpoint_hits"] >= 1
    assert rows["plain", 2, "separate"]["prefix_checkpoint_hits"] == 0


# invariants a subcommand's JSON must hold beyond its keys
CHECKS = {"serve": _serve_counts_add_up, "parallel-sampling": _n_resumes_from_completion_0}


@pytest.fixture(scope="module")
def tiny_config_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench_smoke") / "tiny.json"
    path.write_text(json.dumps(TINY_CONFIG))
    return str(path)


def test_every_subcommand_has_a_smoke_run():
    assert set(SMOKE) == set(BENCH_COMMANDS)


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_subcommand_runs_and_writes_its_json(name, tiny_config_path, tmp_path):
    args, top_keys, row_keys, rows_key = SMOKE[name]
    out = tmp_path / f"{name}.json"
    argv = ["bench", name, *args(tiny_config_path), "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert top_keys <= set(report)
    assert report["rows" if rows_key == "rows" else rows_key]
    for row in report[rows_key]:
        assert row_keys <= set(row), (name, sorted(row))
    assert report["command"] == "python3 -m hypic " + " ".join(argv)
    assert "commit" in report
    CHECKS.get(name, lambda report: None)(report)
