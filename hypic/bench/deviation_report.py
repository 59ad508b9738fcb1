"""``hypic bench deviation``'s text tables and plot, from its report (``deviation.build_report``)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

# Coarse offset groups of the text table: (label, fine bin labels merged into it).
COARSE_BINS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("0", ("0",)), ("1", ("1",)), ("2", ("2",)), ("3", ("3",)), ("4-7", ("4", "5", "6", "7")),
    ("8-15", ("8-11", "12-15")), ("16-31", ("16-31",)), ("32-63", ("32-63",)), ("64+", ("64-127", "128+")))


def weighted(rows: Sequence[dict], metric: str, bins: Sequence[int]) -> Optional[float]:
    """Count-weighted mean of ``metric`` over the fine offset bins ``bins`` of ``rows``."""
    total = count = 0.0
    for r in rows:
        for i in bins:
            c = r["counts"].get(metric, [0] * (i + 1))[i]
            if c:
                total += r["by_offset"][metric][i] * c
                count += c
    return total / count if count else None


def merged(row: dict, metric: str, labels: Sequence[str], groups: Sequence[Sequence[str]]) -> List[Optional[float]]:
    """``metric`` of one row over each group of fine offset bins."""
    return [weighted([row], metric, [labels.index(label) for label in group]) for group in groups]


def pooled(report: dict, policy: str, seam, metric: str) -> List[Optional[float]]:
    """``metric`` by fine offset bin over every task of the report."""
    rows = [r for r in report["rows"] if r["cold_policy"] == policy and r["seam"] == seam]
    return [weighted(rows, metric, [i]) for i in range(len(report["offset_bins"]))]


def _fmt(value: Optional[float], digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int) -> List[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    just = [str.ljust if i < left else str.rjust for i in range(len(header))]
    lines = ["  ".join(j(h, w) for j, h, w in zip(just, header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(j(c, w) for j, c, w in zip(just, row, widths)) for row in rows]
    return lines


def profile_metrics(report: dict) -> List[str]:
    """The metrics of the offset tables: per full-attention layer K, V, attention output and the
    attention mass (spliced, full) of the last prompt token; the last layer's residual, the final
    hidden state and the logits' KL."""
    out = []
    for layer in report["attention_layers"]:
        out += [f"k/L{layer}", f"v/L{layer}", f"attn/L{layer}", f"mass_spliced/L{layer}", f"mass_full/L{layer}"]
    return out + [f"hidden/L{report['num_layers'] - 1}", "final", "logits_kl"]


def format_table(report: dict) -> str:
    lines = ["Last prompt token (the answer's first token) against full recompute:"]
    rows = [(r["task"], r["cold_policy"], str(r["seam"]), str(r["n"]), f"{r['seam_live_tokens_mean']:.1f}",
             f"{r['kl_last_mean']:.4f}", f"{100 * r['top1_agreement']:.1f}", f"{r['final_rel_err_query_mean']:.4f}")
            for r in report["rows"]]
    lines += _table(("task", "cold", "seam", "n", "seam tokens", "KL", "top-1 %", "final err (query)"), rows, 3)
    labels = report["offset_bins"]
    groups = [g for _, g in COARSE_BINS]
    for task in report["config"]["tasks"]:
        for policy in dict.fromkeys(r["cold_policy"] for r in report["rows"]):
            mine = [r for r in report["rows"] if r["task"] == task and r["cold_policy"] == policy]
            row = min(mine, key=lambda r: float(r["seam"]))  # the smallest seam: the entries as written
            lines.append("")
            lines.append(f"{task}, {policy} entries, seam {row['seam']}: mean per token by offset inside a reused "
                         "segment (relative L2 error; mass = attention of the last prompt token; KL in nats)")
            table = [[metric] + [_fmt(v) for v in merged(row, metric, labels, groups)]
                     for metric in profile_metrics(report) if metric in row["by_offset"]]
            lines += _table(["metric"] + [label for label, _ in COARSE_BINS], table, 1)
    return "\n".join(lines)


def plot_deviation(path: str, report: dict) -> None:
    """Per cold policy (columns): the last full-attention layer's attention-output error, the final
    hidden state's error, the logits' KL and the attention mass of the last prompt token by offset
    (rows), one line per seam, pooled over the report's tasks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = report["offset_bins"]
    policies = list(dict.fromkeys(r["cold_policy"] for r in report["rows"]))
    seams = list(dict.fromkeys(r["seam"] for r in report["rows"]))
    last = report["attention_layers"][-1]
    metrics: Dict[str, str] = {f"attn/L{last}": f"attention output error, layer {last}", "final": "final hidden error",
                               "logits_kl": "KL(full || spliced), nats", f"mass_spliced/L{last}":
                               f"last token's attention, layer {last}"}
    fig, axes = plt.subplots(len(metrics), len(policies), figsize=(4.6 * len(policies), 2.9 * len(metrics)),
                             squeeze=False)
    x = list(range(len(labels)))
    for col, policy in enumerate(policies):
        for row, (metric, title) in enumerate(metrics.items()):
            ax = axes[row][col]
            for seam in seams:
                values = pooled(report, policy, seam, metric)
                ax.plot(x, [float("nan") if v is None else v for v in values], marker="o", markersize=3,
                        label=f"w={seam}")
            if metric.startswith("mass_spliced"):
                full = pooled(report, policy, seams[0], metric.replace("spliced", "full"))
                ax.plot(x, [float("nan") if v is None else v for v in full], color="black", linestyle="--",
                        label="full recompute")
            ax.set_yscale("log")
            ax.set_xticks(x)
            ax.set_xticklabels(labels, rotation=60, fontsize=6)
            ax.set_title(f"{policy}: {title}", fontsize=8)
            ax.grid(True, alpha=0.3)
            if row == 0 and col == 0 or metric.startswith("mass_spliced"):
                ax.legend(fontsize=6)
        axes[-1][col].set_xlabel("offset inside a reused segment (tokens)")
    fig.suptitle(f"{report['model']}: spliced vs full recompute ({', '.join(report['config']['tasks'])})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
