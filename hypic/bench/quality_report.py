"""Aggregating quality-bench records: the result rows, the text table, the JSON file and the plot."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Dict, Optional, Sequence, Tuple

from hypic.bench.quality_run import ALL_MODES, Configuration, RequestRecord, seam_label


@dataclass(frozen=True)
class QualityResult:
    """One (task, configuration) cell. ``score`` is the mean per-request score (0-100);
    ``gap_to_full`` = full_recompute's score minus this score (points lost; None when
    full_recompute was not run); ``same_as_full``: the requests whose output equals
    full_recompute's on the same request (None likewise). ``score_ci95`` and ``gap_ci95``: half
    widths of 95% confidence intervals (normal approximation; the gap's over the per-request
    differences to full_recompute on the same requests, a paired interval). ``seam_tokens_mean``:
    the seam windows of a request's documents, the live tokens its reuse costs beyond the query."""

    task: str
    mode: str
    seam: Optional[float]
    cold_policy: Optional[str]
    n: int
    score: float
    gap_to_full: Optional[float]
    cached_tokens_mean: float
    live_tokens_mean: float
    same_as_full: Optional[int] = None
    prefix_hit_tokens_mean: float = 0.0
    seam_min_tokens: int = 0
    seam_max_tokens: Optional[int] = None
    seam_tokens_mean: float = 0.0
    score_ci95: Optional[float] = None
    gap_ci95: Optional[float] = None

    def as_dict(self) -> dict:
        return asdict(self)


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else float("nan")


def ci95(values: Sequence[float]) -> Optional[float]:
    """Half width of the normal-approximation 95% interval of the mean of ``values``."""
    if len(values) < 2:
        return None
    mean = _mean(values)
    variance = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return 1.96 * math.sqrt(variance / len(values))


def summarize(
    runs: Sequence[Tuple[str, Configuration, Sequence[RequestRecord]]]
) -> Tuple[QualityResult, ...]:
    """``runs``: (task, configuration, records) triples in run order -> one result per triple."""
    full: Dict[str, float] = {}
    full_predictions: Dict[str, Dict[str, str]] = {}
    full_scores: Dict[str, Dict[str, float]] = {}
    for task, config, records in runs:
        if config.mode == "full_recompute" and records:
            full[task] = _mean([r.score for r in records])
            full_predictions[task] = {r.request_id: r.prediction for r in records}
            full_scores[task] = {r.request_id: r.score for r in records}
    results = []
    for task, config, records in runs:
        score = _mean([r.score for r in records])
        gap = full[task] - score if task in full and records else None
        same = gap_ci = None
        if task in full_predictions:
            same = sum(full_predictions[task].get(r.request_id) == r.prediction for r in records)
            paired = [full_scores[task][r.request_id] - r.score for r in records if r.request_id in full_scores[task]]
            gap_ci = ci95(paired)
        results.append(QualityResult(
            task=task, mode=config.mode, seam=config.seam, cold_policy=config.cold_policy, n=len(records),
            score=score, gap_to_full=gap,
            cached_tokens_mean=_mean([r.cached_tokens for r in records]),
            live_tokens_mean=_mean([r.live_tokens for r in records]),
            same_as_full=same, prefix_hit_tokens_mean=_mean([r.prefix_hit_tokens for r in records]),
            seam_min_tokens=config.seam_min_tokens, seam_max_tokens=config.seam_max_tokens,
            seam_tokens_mean=_mean([r.seam_tokens for r in records]), score_ci95=ci95([r.score for r in records]),
            gap_ci95=gap_ci,
        ))
    return tuple(results)


def format_table(results: Sequence[QualityResult]) -> str:
    """A fixed-width text table, one row per (task, configuration)."""
    header = ("task", "mode", "seam", "cold", "n", "score", "±95%", "gap", "±95%", "same", "cached", "prefix", "live",
              "seam tokens")
    rows = []
    for r in results:
        rows.append((
            r.task, r.mode, seam_label(r.seam, r.seam_min_tokens, r.seam_max_tokens), r.cold_policy or "-", str(r.n),
            f"{r.score:.2f}", "-" if r.score_ci95 is None else f"{r.score_ci95:.2f}",
            "-" if r.gap_to_full is None else f"{r.gap_to_full:+.2f}",
            "-" if r.gap_ci95 is None else f"{r.gap_ci95:.2f}",
            "-" if r.same_as_full is None else str(r.same_as_full),
            f"{r.cached_tokens_mean:.1f}", f"{r.prefix_hit_tokens_mean:.1f}", f"{r.live_tokens_mean:.1f}",
            f"{r.seam_tokens_mean:.1f}",
        ))
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) if i < 4 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    lines.append("score: mean per-request score (0-100); gap: full_recompute score - score (points lost; ±95%: "
                 "paired over the same requests); same: outputs equal to full_recompute's; cached / prefix / live: "
                 "mean prompt tokens reused from segment entries / from prefix-cache checkpoints / computed per "
                 "request (cold segments' standalone passes included); seam tokens: the documents' seam windows")
    return "\n".join(lines)


def write_json(path: str, model: str, config: dict, results: Sequence[QualityResult],
               provenance: Optional[dict] = None) -> None:
    """``provenance``: the command and commit that produced the results (top-level keys)."""
    payload = {"model": model, "config": config, **(provenance or {}), "results": [r.as_dict() for r in results]}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2, allow_nan=False, default=_json_default)
        handle.write("\n")


# Config fields that must agree for rows of several runs to share one table: same requests, same
# decoding. Modes, seams and cold policies may differ (that is what a split run splits).
_MERGE_KEYS = ("source", "split", "num_requests", "seed", "dtype", "min_docs", "max_docs", "max_tokens", "bos",
               "decoding", "store_warming", "min_context_tokens", "max_context_tokens", "pool_size")


def merge_json_files(paths: Sequence[str]) -> Tuple[str, dict, Tuple[QualityResult, ...]]:
    """Rows of several ``--json`` files (e.g. one process per task and cold policy) as one table.

    Every file must name the same model and agree on :data:`_MERGE_KEYS` for the tasks they share;
    a (task, mode, seam, cold policy) cell may appear in one file only. ``gap_to_full`` is recomputed
    from the merged ``full_recompute`` rows; ``gap_ci95`` (paired, per request) is kept from its own
    file, and is None where that file had no ``full_recompute`` row of the task. Files left
    ``"complete": false`` by a killed run are merged with what they hold, and the merged config says
    which were incomplete.
    """
    if not paths:
        raise ValueError("merge: give at least one JSON file")
    model = None
    base: Optional[dict] = None
    rows: Dict[tuple, dict] = {}
    incomplete = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            payload = json.load(handle)
        if not isinstance(payload, dict) or not {"model", "config", "results"} <= set(payload):
            raise ValueError(f"merge: {path} is not a quality-bench JSON file (needs model, config, results)")
        if model is None:
            model, base = payload["model"], dict(payload["config"])
            base["num_requests"] = dict(base.get("num_requests", {}))
            base["max_tokens"] = dict(base.get("max_tokens", {}))
        elif payload["model"] != model:
            raise ValueError(f"merge: {path} is for model {payload['model']!r}, the first file for {model!r}")
        cfg = payload["config"]
        for key in _MERGE_KEYS:
            mine, theirs = base.get(key), cfg.get(key)
            if isinstance(mine, dict) and isinstance(theirs, dict):
                for task, value in theirs.items():
                    if mine.setdefault(task, value) != value:
                        raise ValueError(f"merge: {path} has {key}[{task}] = {value!r}, an earlier file {mine[task]!r}")
            elif mine != theirs:
                raise ValueError(f"merge: {path} has {key} = {theirs!r}, the first file {mine!r}")
        if not cfg.get("complete", True):
            incomplete.append(str(path))
        for row in payload["results"]:
            cell = (row["task"], row["mode"], row["seam"], row["cold_policy"], row.get("seam_min_tokens", 0),
                    row.get("seam_max_tokens"))
            if cell in rows:
                raise ValueError(f"merge: cell {cell} appears in more than one file (again in {path})")
            rows[cell] = row
    full = {r["task"]: r["score"] for r in rows.values() if r["mode"] == "full_recompute"}
    tasks = list(dict.fromkeys(r["task"] for r in rows.values()))

    def order(r: dict) -> tuple:  # task as first seen, then mode, cold policy and seam
        seam = -1.0 if r["seam"] is None else float(r["seam"])
        mode = ALL_MODES.index(r["mode"]) if r["mode"] in ALL_MODES else len(ALL_MODES)
        return (tasks.index(r["task"]), mode, r["cold_policy"] or "", seam, r.get("seam_min_tokens", 0),
                r.get("seam_max_tokens") or 0)

    results = []
    for row in sorted(rows.values(), key=order):
        gap = full[row["task"]] - row["score"] if row["task"] in full else None
        results.append(QualityResult(**{**row, "gap_to_full": gap}))
    config = {**base, "tasks": tasks, "merged_from": [str(p) for p in paths], "incomplete_files": incomplete,
              "complete": not incomplete}
    for key in ("modes", "seams", "cold_policies"):
        config.pop(key, None)
    return model, config, tuple(results)


def _json_default(value):
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def plot_results(path: str, results: Sequence[QualityResult], title: str = "") -> None:
    """Score against seam width ``w`` (tokens) for hypic, one panel per task, one line per cold
    policy; horizontal lines for full_recompute and addition. Fractional seams and seams with a
    floor or cap (a share of each segment, not a token count) have no place on a token axis and are
    left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r.task for r in results))
    if not tasks:
        raise ValueError("results: nothing to plot")
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        mine = [r for r in results if r.task == task]
        hypic = [r for r in mine if r.mode == "hypic" and isinstance(r.seam, int) and not r.seam_min_tokens
                 and r.seam_max_tokens is None]
        widths = sorted({r.seam for r in hypic})
        for policy in dict.fromkeys(r.cold_policy for r in hypic):
            points = sorted((r.seam, r.score) for r in hypic if r.cold_policy == policy)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"hypic ({policy})")
        for r in mine:
            if r.mode == "full_recompute":
                ax.axhline(r.score, color="black", linestyle="-", linewidth=1, label="full_recompute")
            elif r.mode == "addition":
                ax.axhline(r.score, color="tab:red", linestyle=":" if r.cold_policy == "standalone" else "--",
                           linewidth=1, label=f"addition ({r.cold_policy})")
        if widths and widths[0] == 0:
            ax.set_xscale("symlog", linthresh=1)
        elif widths:
            ax.set_xscale("log", base=2)
        if widths:
            ax.set_xticks(widths)
            ax.set_xticklabels([str(w) for w in widths])
            ax.set_xlim(widths[0] - 0.25 if widths[0] == 0 else widths[0] / 1.3, widths[-1] * 1.3 + 0.25)
        ax.set_xlabel("seam width w (tokens)")
        ax.set_ylabel("score (0-100)")
        ax.set_title(task)
        ax.set_ylim(-2, 102)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

