"""The summary, printed table and plots of ``hypic bench serve``.

Sustainable QPS of a (mode, trace): the highest measured arrival rate that meets the SLO
(``meets_slo``: at least ``--slo-attainment`` of the measured requests completed with TTFT <= the
SLO, and the point steady) below the lowest measured rate that does not; a rate that passes above
a failing one is not counted (noise, not capacity), and ``monotone`` says whether that happened.
The p50 definition (``meets_slo_p50``: median TTFT, failures counted as late, <= the SLO) is
summarised the same way.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple


def sustainable_rate(points: Sequence[Dict], key: str) -> Tuple[Optional[float], Optional[float], bool]:
    """``(highest passing rate below the lowest failing one, lowest failing rate, monotone)``;
    None where no point passed / none failed."""
    failing = [p["request_rate_rps"] for p in points if not p[key]]
    ceiling = min(failing) if failing else None
    passing = [p["request_rate_rps"] for p in points if p[key]]
    below = [r for r in passing if ceiling is None or r < ceiling]
    monotone = len(below) == len(passing)
    return (max(below) if below else None), ceiling, monotone


def _max(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return max(values) if values else None


def summarize(rows: Sequence[Dict], modes: Sequence[str], prompt_tokens: Sequence[int]) -> List[Dict]:
    """One entry per (mode, trace) with its sustainable rates and peak throughputs, and per trace
    the ratio of each mode's to ``prefix_cache``'s where both ran."""
    out = []
    for p in prompt_tokens:
        by_mode = {}
        for mode in modes:
            points = [r for r in rows if r["mode"] == mode and r["prompt_tokens"] == p and "error" not in r]
            if not points:
                continue
            rate, ceiling, monotone = sustainable_rate(points, "meets_slo")
            rate_p50, ceiling_p50, monotone_p50 = sustainable_rate(points, "meets_slo_p50")
            entry = {
                "mode": mode, "prompt_tokens": p, "num_points": len(points),
                "rates_rps": sorted(r["request_rate_rps"] for r in points),
                "sustainable_rate_rps": rate, "lowest_failing_rate_rps": ceiling, "monotone": monotone,
                "sustainable_rate_p50_rps": rate_p50, "lowest_failing_rate_p50_rps": ceiling_p50,
                "monotone_p50": monotone_p50,
                "peak_output_throughput": _max(r["output_throughput"] for r in points),
                "peak_max_output_tokens_per_s": _max(r["max_output_tokens_per_s"] for r in points),
                "peak_request_goodput": _max(r["request_goodput"] for r in points),
                "failed_below_saturation": sum(r["failed"] for r in points if r["meets_slo"]),
            }
            by_mode[mode] = entry
            out.append(entry)
        base = by_mode.get("prefix_cache")
        if base is None:
            continue
        for mode, entry in by_mode.items():
            if mode == "prefix_cache":
                continue
            for key, ratio in (("sustainable_rate_rps", "sustainable_rate_vs_prefix_cache"),
                               ("sustainable_rate_p50_rps", "sustainable_rate_p50_vs_prefix_cache"),
                               ("peak_output_throughput", "peak_output_throughput_vs_prefix_cache")):
                entry[ratio] = entry[key] / base[key] if entry[key] and base[key] else None
    return out


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(rows: Sequence[Dict], summary: Sequence[Dict]) -> str:
    head = (f"{'mode':14s} {'prompt':>6s} {'rate':>7s} {'done':>5s} {'fail':>4s} {'req/s':>6s} {'good/s':>6s} "
            f"{'out tok/s':>9s} {'TTFT p50':>9s} {'p90':>8s} {'p99':>8s} {'TPOT p50':>8s} {'ITL p50':>8s} "
            f"{'E2EL p50':>9s} {'in SLO':>6s} {'seg hit':>7s} {'pfx hit':>7s}  note")
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['mode']:14s} {r['prompt_tokens']:6d} {_fmt(r.get('request_rate_rps'), '7.3g')}  "
                         f"ERROR {r['error'].strip().splitlines()[-1][:80]}")
            continue
        note = []
        if not r["steady"]:
            note.append(f"unsteady (TTFT drift x{_fmt(r['ttft_drift_ratio'], '.1f')})")
        if r["output_tokens_mismatch"]:
            note.append(f"{r['output_tokens_mismatch']} short outputs")
        note.append("meets SLO" if r["meets_slo"] else "misses SLO")
        lines.append(
            f"{r['mode']:14s} {r['prompt_tokens']:6d} {r['request_rate_rps']:7.3g} {r['completed']:5d} "
            f"{r['failed']:4d} {_fmt(r['request_throughput'], '6.2f')} {_fmt(r['request_goodput'], '6.2f')} "
            f"{_fmt(r['output_throughput'], '9.1f')} {_fmt(r['median_ttft_ms'], '9.1f')} "
            f"{_fmt(r['p90_ttft_ms'], '8.1f')} {_fmt(r['p99_ttft_ms'], '8.1f')} {_fmt(r['median_tpot_ms'], '8.2f')} "
            f"{_fmt(r['median_itl_ms'], '8.2f')} {_fmt(r['median_e2el_ms'], '9.1f')} "
            f"{_fmt(r['ttft_slo_attainment'], '6.0%')} {_fmt(r['segment_hit_rate'], '7.1%')} "
            f"{_fmt(r['prefix_hit_rate'], '7.1%')}  " + "; ".join(note))
    lines.append("")
    for s in summary:
        ratios = [f"{k.replace('_vs_prefix_cache', '')} x{s[k]:.2f} vs prefix_cache"
                  for k in ("sustainable_rate_vs_prefix_cache", "peak_output_throughput_vs_prefix_cache")
                  if s.get(k) is not None]
        lines.append(
            f"{s['mode']:14s} {s['prompt_tokens']:6d}: sustainable {_fmt(s['sustainable_rate_rps'], '.3g')} req/s "
            f"(next tried {_fmt(s['lowest_failing_rate_rps'], '.3g')}), p50 definition "
            f"{_fmt(s['sustainable_rate_p50_rps'], '.3g')} req/s, peak output "
            f"{_fmt(s['peak_output_throughput'], '.1f')} tok/s" + ("" if s["monotone"] else ", NOT monotone")
            + ("; " + "; ".join(ratios) if ratios else ""))
    return "\n".join(lines)


def write_plots(rows: Sequence[Dict], plot_dir: str, title: str = "") -> List[str]:
    """``serve_ttft.png`` (TTFT p50 / p90 / p99 against arrival rate, a colour per mode, a panel per
    prompt length, the SLO as a line) and ``serve_goodput.png`` (request goodput against arrival
    rate, with the offered rate as the ideal)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "error" not in r]
    if not rows:
        return []
    os.makedirs(plot_dir, exist_ok=True)
    sizes = sorted({r["prompt_tokens"] for r in rows})
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    colors = plt.get_cmap("tab10").colors
    paths = []
    for name, draw in (("serve_ttft.png", _draw_ttft), ("serve_goodput.png", _draw_goodput)):
        fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.5), squeeze=False)
        for ax, p in zip(axes[0], sizes):
            for i, mode in enumerate(modes):
                pts = sorted((r for r in rows if r["mode"] == mode and r["prompt_tokens"] == p),
                             key=lambda r: r["request_rate_rps"])
                if pts:
                    draw(ax, pts, mode, colors[i % len(colors)])
            ax.set_xlabel("arrival rate (req/s, Poisson)")
            ax.set_title(f"{p}-token prompts" + (f" - {title}" if title else ""), fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(plot_dir, name)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def _draw_ttft(ax, pts: Sequence[Dict], mode: str, color) -> None:
    rates = [r["request_rate_rps"] for r in pts]
    for key, style in (("median_ttft_ms", "-"), ("p90_ttft_ms", "--"), ("p99_ttft_ms", ":")):
        ax.plot(rates, [r[key] for r in pts], style, marker="o", color=color, label=f"{mode} {key.split('_')[0]}")
    slo = pts[0].get("slo_ttft_ms")
    if slo:
        ax.axhline(slo, color="grey", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("TTFT (ms)")


def _draw_goodput(ax, pts: Sequence[Dict], mode: str, color) -> None:
    rates = [r["request_rate_rps"] for r in pts]
    ax.plot(rates, [r["request_goodput"] or 0.0 for r in pts], "-", marker="o", color=color, label=mode)
    top = max(rates)
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8)
    ax.set_ylabel("request goodput (req/s within the SLO)")
