"""Statistics, the printed table and the plots of ``hypic bench ttft``."""

from __future__ import annotations

import json
import math
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

REQUIRED_RESULT_KEYS = (
    "case", "mode", "prompt_tokens", "segment_tokens", "num_requests",
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "live_tokens_mean", "floor_ms",
)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between order statistics
    (numpy's default): rank ``q / 100 * (n - 1)`` in the sorted values."""
    if not isinstance(q, (int, float)) or isinstance(q, bool) or not 0 <= q <= 100:
        raise ValueError(f"q: expected a number in [0, 100], got {q!r}")
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ValueError("values: need at least one value")
    if any(math.isnan(x) for x in xs):
        raise ValueError("values: NaN in the input")
    rank = q / 100.0 * (len(xs) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def mean(values: Sequence[float]) -> float:
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("values: need at least one value")
    return sum(xs) / len(xs)


def row_label(row: Dict) -> str:
    """Mode name, with the cold policy when it is not the default ``inline``."""
    cp = row.get("cold_policy", "inline")
    return row["mode"] if cp == "inline" else f"{row['mode']}/{cp}"


def _fmt(v, spec: str) -> str:
    if v is None:
        return "-"
    return format(v, spec)


def format_table(results: Sequence[Dict]) -> str:
    head = (f"{'case':8s} {'mode':26s} {'prompt':>7s} {'seg':>5s} {'n':>3s} {'p50 ms':>9s} {'p90 ms':>9s} "
            f"{'p99 ms':>9s} {'live':>8s} {'floor ms':>9s} {'x floor':>8s} {'hit':>5s}  note")
    lines = [head, "-" * len(head)]
    for r in results:
        ratio = None
        if r.get("ttft_p50_ms") is not None and r.get("floor_ms"):
            ratio = r["ttft_p50_ms"] / r["floor_ms"]
        note = []
        if r.get("summary_overhead") is not None:
            note.append(f"summary overhead {r['summary_overhead']:+.1%}")
        if r.get("speedup_vs_full_recompute") is not None:
            note.append(f"{r['speedup_vs_full_recompute']:.2f}x vs full")
        if r.get("speedup_vs_prefix_cache") is not None:
            note.append(f"{r['speedup_vs_prefix_cache']:.2f}x vs prefix_cache")
        if r.get("store_evictions"):
            note.append(f"{r['store_evictions']} evicted")
        if r.get("store_skipped_writes"):
            note.append(f"{r['store_skipped_writes']} not stored (budget)")
        if r.get("error"):
            note.append("ERROR " + r["error"].strip().splitlines()[-1][:60])
        lines.append(
            f"{r['case']:8s} {row_label(r):26s} {r['prompt_tokens']:7d} {r['segment_tokens']:5d} "
            f"{r['num_requests']:3d} {_fmt(r.get('ttft_p50_ms'), '9.2f')} {_fmt(r.get('ttft_p90_ms'), '9.2f')} "
            f"{_fmt(r.get('ttft_p99_ms'), '9.2f')} {_fmt(r.get('live_tokens_mean'), '8.0f')} "
            f"{_fmt(r.get('floor_ms'), '9.4f')} {_fmt(ratio, '8.1f')} {_fmt(r.get('token_hit_rate'), '5.2f')}  "
            + "; ".join(note)
        )
    return "\n".join(lines)


def write_plots(results: Sequence[Dict], plot_dir: str, title: Optional[str] = None) -> List[str]:
    """One PNG per case: TTFT p50 against prompt length, a line per mode and segment size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(plot_dir, exist_ok=True)
    paths = []
    cases = sorted({r["case"] for r in results})
    styles = ["-", "--", ":", "-."]
    for case in cases:
        rows = [r for r in results if r["case"] == case and r.get("ttft_p50_ms") is not None]
        if not rows:
            continue
        seg_sizes = sorted({r["segment_tokens"] for r in rows})
        fig, ax = plt.subplots(figsize=(9, 5))
        colors = plt.get_cmap("tab10").colors
        # colour = mode, line style = segment size
        for i, label in enumerate(sorted({row_label(r) for r in rows})):
            for j, seg in enumerate(seg_sizes):
                pts = sorted((r["prompt_tokens"], r["ttft_p50_ms"]) for r in rows
                             if row_label(r) == label and r["segment_tokens"] == seg)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], styles[j % len(styles)], marker="o",
                            color=colors[i % len(colors)], label=f"{label} (seg {seg})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("TTFT p50 (ms)")
        ax.set_title(f"{case}" + (f" - {title}" if title else ""))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        path = os.path.join(plot_dir, f"ttft_{case}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
               "gb": 1000**3, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def parse_bytes(text: str) -> Optional[int]:
    """'none' -> None; '123', '32GiB', '500MB', '2g' -> bytes."""
    t = text.strip().lower()
    if t in ("none", "unlimited"):
        return None
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?)\s*([a-z]*)", t)
    if m is None or m.group(2) not in _SIZE_UNITS:
        raise ValueError(f"--store-bytes: cannot parse {text!r} (e.g. 32GiB, 500MB, 1000000, none)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def write_json(path: str, report: Dict) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, path)


def merge_reports(reports: Sequence[Dict]) -> Dict:
    """One report from several runs (e.g. one per device call): results concatenated in order, a
    later run's row replacing an earlier one with the same (case, mode, cold_policy, P, S); the
    skipped points of every run, less those another run measured. Each row keeps the ``command``
    and ``commit`` of the run that measured it (where that run recorded them)."""
    if not reports:
        raise ValueError("merge: no reports given")
    for key in ("device", "model"):
        values = {r.get(key) for r in reports}
        if len(values) != 1:
            raise ValueError(f"merge: the reports differ in {key!r}: {sorted(map(str, values))}")
    rows: Dict[Tuple, Dict] = {}
    for r in reports:
        for row in r["results"]:
            row = dict(row)
            for key in ("command", "commit"):
                if r.get(key) is not None:
                    row.setdefault(key, r[key])
            rows[(row["case"], row["mode"], row.get("cold_policy", "inline"), row["prompt_tokens"],
                  row["segment_tokens"])] = row
    out = dict(reports[-1])
    out["results"] = list(rows.values())
    # a point skipped by one run and measured by another is not skipped
    measured = {(row["case"], row["prompt_tokens"], row["segment_tokens"]) for row in out["results"]}
    out["skipped"] = [s for r in reports for s in r.get("skipped", [])
                      if (s["case"], s["prompt_tokens"], s["segment_tokens"]) not in measured]
    # a merged report's configs are a list already: kept flat, one per run
    out["config"] = [c for r in reports
                     for c in (r["config"] if isinstance(r.get("config"), list) else [r.get("config")])
                     if c is not None]
    return out
