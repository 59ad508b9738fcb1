"""Compare the TTFT that `hypic bench serve` and AIPerf measured on one schedule (run.sh).

Per run: requests, failures, TTFT mean / p50 / p90 / p99 (linear interpolation), and how late each
request was sent against its scheduled offset from the first request (send lag). Per pair of runs:
the differences of those statistics, the median of the per-request TTFT differences (request i is
the same prompt at the same instant in every run), and the two-sample Kolmogorov-Smirnov distance
with its asymptotic p-value. The runs of one tool give the noise floor the cross-tool differences
are read against: per statistic, the verdict is "within noise" when the median absolute
difference over the cross-tool pairs is no larger than the largest absolute difference between
two runs of one tool.

    python3 benchmarks/serve_crosscheck/compare.py --ours A.json B.json --aiperf A/profile_export.jsonl \
        B/profile_export.jsonl [--json OUT.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hypic.bench.ttft_report import percentile  # noqa: E402


def load_ours(path: str) -> dict:
    """TTFT (ms, None for a failure) and send lag (ms) per request, in schedule order."""
    report = json.loads(Path(path).read_text())
    (row,) = [r for r in report["results"] if "samples" in r]
    samples = row["samples"]
    first = samples[0]
    return {"ttft_ms": [s["ttft_ms"] if s["success"] else None for s in samples],
            "send_lag_ms": [((s["start_s"] - first["start_s"]) - (s["scheduled_s"] - first["scheduled_s"])) * 1e3
                            for s in samples],
            "command": report["command"], "commit": report["commit"]}


def load_aiperf(path: str, schedule_ms: list) -> dict:
    """The same from AIPerf's per-request export (session_num is the schedule line)."""
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    by_index = {r["metadata"]["session_num"]: r for r in records}
    if sorted(by_index) != list(range(len(schedule_ms))):
        raise ValueError(f"{path}: {len(by_index)} records for a schedule of {len(schedule_ms)}")
    t0 = by_index[0]["metadata"]["request_start_ns"]
    ttft, lag = [], []
    for i, at_ms in enumerate(schedule_ms):
        r = by_index[i]
        ok = "error" not in r or r["error"] is None
        ttft.append(r["metrics"]["time_to_first_token"]["value"] if ok else None)
        lag.append((r["metadata"]["request_start_ns"] - t0) / 1e6 - (at_ms - schedule_ms[0]))
    summary_path = Path(path).with_name("profile_export_aiperf.json")  # AIPerf's own summary beside it
    info = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return {"ttft_ms": ttft, "send_lag_ms": lag, "command": info.get("run_info", {}).get("cli_command"),
            "aiperf_version": info.get("aiperf_version")}


def summary(run: dict) -> dict:
    ok = [t for t in run["ttft_ms"] if t is not None]
    return {"requests": len(run["ttft_ms"]), "failed": len(run["ttft_ms"]) - len(ok),
            "ttft_mean_ms": statistics.fmean(ok), "ttft_p50_ms": percentile(ok, 50),
            "ttft_p90_ms": percentile(ok, 90), "ttft_p99_ms": percentile(ok, 99),
            "send_lag_p50_ms": percentile(run["send_lag_ms"], 50),
            "send_lag_max_ms": max(run["send_lag_ms"])}


def ks(a: list, b: list) -> tuple:
    """Two-sample Kolmogorov-Smirnov distance and its asymptotic p-value."""
    a, b = sorted(a), sorted(b)
    d, i, j = 0.0, 0, 0
    for x in sorted(set(a + b)):
        while i < len(a) and a[i] <= x:
            i += 1
        while j < len(b) and b[j] <= x:
            j += 1
        d = max(d, abs(i / len(a) - j / len(b)))
    n = len(a) * len(b) / (len(a) + len(b))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return d, min(1.0, max(0.0, p))


def compare(x: dict, y: dict) -> dict:
    sx, sy = summary(x), summary(y)
    both = [(a, b) for a, b in zip(x["ttft_ms"], y["ttft_ms"]) if a is not None and b is not None]
    d, p = ks([t for t in x["ttft_ms"] if t is not None], [t for t in y["ttft_ms"] if t is not None])
    out = {f"{k}_diff_ms": sy[k] - sx[k] for k in ("ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms")}
    out.update({"paired_median_diff_ms": statistics.median(b - a for a, b in both),
                "paired_median_abs_diff_ms": statistics.median(abs(b - a) for a, b in both),
                "ks_distance": d, "ks_p_value": p})
    return out


def _tool(run_name: str) -> str:
    return run_name.rsplit("_", 1)[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ours", nargs="+", required=True)
    p.add_argument("--aiperf", nargs="+", required=True)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    runs = {f"hypic_bench_{k}": load_ours(path) for k, path in enumerate(args.ours, 1)}
    first = json.loads(Path(args.ours[0]).read_text())
    (row,) = [r for r in first["results"] if "samples" in r]
    schedule_ms = [round(s["scheduled_s"] * 1e3) for s in row["samples"]]
    runs.update({f"aiperf_{k}": load_aiperf(path, schedule_ms) for k, path in enumerate(args.aiperf, 1)})
    table = {name: summary(run) for name, run in runs.items()}
    pairs = {f"{x} -> {y}": compare(runs[x], runs[y]) for x, y in itertools.combinations(runs, 2)}
    print(f"{'run':16s} {'n':>4s} {'fail':>4s} {'mean':>8s} {'p50':>8s} {'p90':>8s} {'p99':>8s} "
          f"{'send lag p50':>12s} {'max':>8s}   (ms)")
    for name, s in table.items():
        print(f"{name:16s} {s['requests']:4d} {s['failed']:4d} {s['ttft_mean_ms']:8.1f} {s['ttft_p50_ms']:8.1f} "
              f"{s['ttft_p90_ms']:8.1f} {s['ttft_p99_ms']:8.1f} {s['send_lag_p50_ms']:12.2f} "
              f"{s['send_lag_max_ms']:8.2f}")
    print()
    print(f"{'pair':34s} {'d mean':>8s} {'d p50':>8s} {'d p90':>8s} {'d p99':>8s} {'paired med':>10s} "
          f"{'|paired|':>9s} {'KS D':>6s} {'KS p':>6s}")
    for name, c in pairs.items():
        print(f"{name:34s} {c['ttft_mean_ms_diff_ms']:8.1f} {c['ttft_p50_ms_diff_ms']:8.1f} "
              f"{c['ttft_p90_ms_diff_ms']:8.1f} {c['ttft_p99_ms_diff_ms']:8.1f} {c['paired_median_diff_ms']:10.1f} "
              f"{c['paired_median_abs_diff_ms']:9.1f} {c['ks_distance']:6.3f} {c['ks_p_value']:6.3f}")
    verdicts = {}
    print()
    print(f"{'statistic':18s} {'same tool max |d|':>18s} {'cross-tool median |d|':>22s} {'max |d|':>8s}  verdict")
    for key in ("ttft_mean_ms_diff_ms", "ttft_p50_ms_diff_ms", "ttft_p90_ms_diff_ms", "ttft_p99_ms_diff_ms",
                "ks_distance"):
        same = [abs(pairs[f"{x} -> {y}"][key]) for x, y in itertools.combinations(runs, 2) if _tool(x) == _tool(y)]
        cross = [abs(pairs[f"{x} -> {y}"][key]) for x, y in itertools.combinations(runs, 2) if _tool(x) != _tool(y)]
        within = statistics.median(cross) <= max(same)
        verdicts[key] = {"same_tool_max_abs": max(same), "cross_tool_median_abs": statistics.median(cross),
                         "cross_tool_max_abs": max(cross), "within_noise": within}
        print(f"{key.replace('_diff_ms', ''):18s} {max(same):18.3f} {statistics.median(cross):22.3f} "
              f"{max(cross):8.3f}  {'within noise' if within else 'OUTSIDE noise'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": table, "pairs": pairs, "verdicts": verdicts,
                                               "ours_command": first["command"],
                                               "ours_commit": first["commit"],
                                               "commands": {k: r.get("command") for k, r in runs.items()},
                                               "aiperf_version": next((r["aiperf_version"] for r in runs.values()
                                                                       if r.get("aiperf_version")), None),
                                               "ttft_ms": {k: r["ttft_ms"] for k, r in runs.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
