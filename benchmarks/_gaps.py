"""Where a GPU sits idle during one request: the gaps between its kernels in a torch.profiler
trace, each with the host code that was running then (shared by the GPU benchmark scripts).

A request whose wall time exceeds both its GPU time and its host time loses the difference in
such gaps: at its start (plan, layout, first launches) and wherever the host falls behind."""

from __future__ import annotations

from typing import Dict, List


def _hypic_frame(stack: List[str]) -> str:
    """The innermost frame of hypic's own code in a profiler stack (``file(line): function``)."""
    for frame in stack or []:
        if "/hypic/" in frame and "/site-packages/" not in frame:
            return frame.split("/hypic/", 1)[1]
    return (stack or ["?"])[0]


def gpu_gaps(prof, min_gap_us: float = 50.0, top: int = 15) -> Dict[str, object]:
    """Idle stretches of the device in ``prof`` (a finished ``torch.profiler.profile`` run with CPU
    and CUDA activities; ``with_stack=True`` names the hypic line behind each gap).

    Returns milliseconds: ``span_ms`` (first host op to last kernel end), ``busy_ms`` (union of
    kernel and copy intervals), ``lead_ms`` (first host op to first kernel), ``idle_ms`` (span -
    busy), and the ``top`` longest gaps of at least ``min_gap_us`` with the host op running at
    their start."""
    from torch.autograd import DeviceType

    events = prof.events()
    device = sorted((e.time_range.start, e.time_range.end) for e in events
                    if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start)
    host = [e for e in events if e.device_type == DeviceType.CPU and e.time_range.end > e.time_range.start]
    if not device or not host:
        return {"error": "no device or host events in the trace"}
    t0 = min(e.time_range.start for e in host)
    busy, gaps = 0.0, []
    cur_start, cur_end = device[0]
    for start, end in device[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            if start - cur_end >= min_gap_us:
                gaps.append((cur_end, start))
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    span = cur_end - t0

    def running_at(t: float) -> str:
        inside = [e for e in host if e.time_range.start <= t <= e.time_range.end]
        if not inside:
            return "-"
        inside.sort(key=lambda e: e.time_range.end - e.time_range.start)
        # runtime calls (cudaLaunchKernel, ...) carry no Python stack: the line comes from the
        # innermost op around them that does
        framed = [e for e in inside if any("/hypic/" in f for f in (getattr(e, "stack", None) or []))]
        where = _hypic_frame(framed[0].stack) if framed else "?"
        return f"{inside[0].name} @ {where}"

    gaps.sort(key=lambda g: g[0] - g[1])
    return {
        "span_ms": span / 1e3, "busy_ms": busy / 1e3, "idle_ms": (span - busy) / 1e3,
        "lead_ms": (device[0][0] - t0) / 1e3, "num_gaps": len(gaps),
        "gaps_ms_total": sum(b - a for a, b in gaps) / 1e3,
        "gaps": [{"at_ms": (a - t0) / 1e3, "ms": (b - a) / 1e3, "host": running_at(a)} for a, b in gaps[:top]],
    }


def gaps_text(summary: Dict[str, object]) -> str:
    if "error" in summary:
        return str(summary["error"])
    lines = [f"span {summary['span_ms']:.2f} ms, GPU busy {summary['busy_ms']:.2f}, idle {summary['idle_ms']:.2f} "
             f"(before the first kernel {summary['lead_ms']:.2f}; {summary['num_gaps']} gaps >= 50 us, "
             f"{summary['gaps_ms_total']:.2f} ms)"]
    for g in summary["gaps"]:
        lines.append(f"  at {g['at_ms']:8.2f} ms  {g['ms']:6.2f} ms  {g['host']}")
    return "\n".join(lines)
