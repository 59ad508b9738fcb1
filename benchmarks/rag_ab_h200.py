"""RAG-trace TTFT of ``hypic`` under each value of an environment switch, interleaved in one
process (issue 6).

The TTFT bench runs a switch's values in separate processes, on which machine drift (~4 ms of an
all-hit request between H200 hosts) lands as if it were the switch's effect. Here the trace of
``hypic bench ttft --cases rag`` (same defaults: documents of 256-2048 tokens in 512-token
segments, Zipf popularity, a 256-token system prompt, 32-64-token questions) warms one store
until the corpus is cached, then each measured request runs once per value in turn (after a
round of other requests, not counted). Session 18 call 3 measured hypic's RAG requests 97.3 / 50.7 ms at 32k / 8k
against 87.9 / 45.5 in sessions 15-16 on other machines; ``--ab-env HYPIC_KEPT_LAYOUTS
--ab-values 4,0`` says whether keeping core graphs across layouts costs RAG anything.

    cd benchmarks && python3 rag_ab_h200.py --out OUT --ab-env HYPIC_KEPT_LAYOUTS --ab-values 4,0
    cd benchmarks && python3 rag_ab_h200.py --out OUT --ab-env HYPIC_WRITE_GRAPHS --ab-values 1,0 --force-misses 1

Writes OUT/rag_ab.json (per prompt size: TTFT samples and medians per value) and prints them;
``--profile`` also OUT/rag_ab_profile.txt (one request per value under the profiler), ``--timeline``
per-layer host and GPU times there (allhit_ab_h200.py's timeline, new layout graphs each time).
``--smoke``: CPU, the embedded tiny config, short prompts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from hypic.bench.floor import WorkModel  # noqa: E402
from hypic.bench.rag_trace import RagTrace, RagTraceConfig  # noqa: E402
from hypic.bench.ttft import parse_bytes  # noqa: E402
from hypic.bench.ttft_mode import ModeBench  # noqa: E402
from hypic.models.loader import build_dummy_model  # noqa: E402

from _timing import CaptureSets, env_vars  # noqa: E402  (benchmarks/, the script's folder)

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "..", "hypic", "models", "configs", "qwen3_5_35b_a3b.json")
TINY = os.path.join(HERE, "..", "hypic", "assets", "tiny", "config.json")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--prompts", default="32768,8192", help="target prompt tokens, comma-separated")
    ap.add_argument("--requests", type=int, default=8, help="measured requests per prompt size")
    ap.add_argument("--warmup-requests", type=int, default=2)
    ap.add_argument("--ab-env", default=None, help="one switch; its values from --ab-values")
    ap.add_argument("--ab-values", default="4,0")
    ap.add_argument("--ab-settings", default=None,
                    help="instead of --ab-env/--ab-values: settings separated by ';', each of space-separated "
                         "NAME=VALUE switches (an empty one: the defaults), e.g. "
                         "'HYPIC_CHAIN_FUSE_SEAMS=1;HYPIC_CHAIN_FUSE_SEAMS=0 HYPIC_KEPT_LAYOUTS=0'")
    ap.add_argument("--store-bytes", default=None,
                    help="device budget of the store (e.g. 36GiB, as the TTFT bench's command; default unlimited): "
                         "below the corpus's size, evictions leave misses that the measured requests write")
    ap.add_argument("--same-misses", action="store_true",
                    help="discard what each value's run wrote before the next value's, so that every value meets the "
                         "request's missed documents (for switches of forwards that write, e.g. HYPIC_WRITE_GRAPHS)")
    ap.add_argument("--force-misses", type=int, default=0,
                    help="before every run of a measured request, discard that many of its documents' segments "
                         "(every k-th, deterministically) so that each value's run recomputes and writes the same ones")
    ap.add_argument("--profile", action="store_true",
                    help="after the timed rounds, profile one more request under each value (its misses discarded "
                         "in between): kernel table and GPU idle gaps, to OUT/rag_ab_profile.txt")
    ap.add_argument("--timeline", action="store_true",
                    help="also, per value, the per-layer host/GPU timeline of one request repeated 3 times with "
                         "HYPIC_KEPT_LAYOUTS=0 (a new layout's graphs every time, as every RAG request's), to "
                         "OUT/rag_ab_profile.txt")
    ap.add_argument("--ab-capture", action="store_true",
                    help="the switches are read when CUDA graphs are captured (HYPIC_GRAPH_GLUE): each value gets "
                         "its own row-wise and core graphs, captured under it (_timing.CaptureSets)")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    device, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)
    with open(TINY if args.smoke else CONFIG) as f:
        spec, model = build_dummy_model(json.load(f), dtype=dtype, device=device, seed=0)
    work = WorkModel(spec, model)
    settings = parse_settings(args.ab_env, args.ab_values, args.ab_settings)
    values = list(settings)
    label = args.ab_env or "setting"
    res = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "env": label,
           "settings": settings, "rows": []}
    texts = []
    for prompt_tokens in (int(p) for p in args.prompts.split(",")):
        if args.smoke:
            config = RagTraceConfig(vocab_size=spec.vocab_size, prompt_tokens=min(prompt_tokens, 256),
                                    segment_tokens=32, doc_tokens_min=16, doc_tokens_max=64, system_tokens=16,
                                    query_tokens_min=4, query_tokens_max=8)
        else:
            config = RagTraceConfig(vocab_size=spec.vocab_size, prompt_tokens=prompt_tokens, segment_tokens=512)
        trace = RagTrace(config)
        bench = ModeBench(model, spec, work, device, dtype, "hypic", "inline", 8,
                          None if args.store_bytes is None else parse_bytes(args.store_bytes), f"rag-ab-{prompt_tokens}")
        for r in trace.warmup_requests(args.warmup_requests):
            bench.run(r.prompt)  # until every document is cached
        captures = CaptureSets(bench.runner)

        def setting(v, **extra):
            """Value v's switches (and its own graphs with --ab-capture) for a ``with`` block."""
            stack = contextlib.ExitStack()
            stack.enter_context(env_vars(**{**settings[v], **extra}))
            if args.ab_capture:
                stack.enter_context(captures.use(v))
            return stack
        samples = {v: [] for v in values}
        live = []
        # Round 0 (requests of their own stream) compiles what each value needs; round 1 is
        # timed. Each request runs once per value, in the given order: with
        # ``HYPIC_KEPT_LAYOUTS`` first among its values, its first run is the layout's first
        # forward (as every RAG request's is), and a value of 0 neither keeps nor remembers it.
        # What a run writes (its missed documents) is discarded before the next value's run
        # (with --same-misses), so that every value meets the request's misses, and its writes.
        writes = {v: [] for v in values}
        for stream in ("first", "measure"):
            for r, request in enumerate(trace.requests(args.requests, stream=stream)):
                # the values' order alternates: what a run's writes evict (a budgeted store)
                # falls on each value's runs alike
                order = values if r % 2 == 0 else values[::-1]
                for v in order:
                    force_misses(bench, request.prompt, args.force_misses)
                    with setting(v):
                        sample, added = run_noting_writes(bench, lambda: bench.run(request.prompt))
                    if args.same_misses and v != order[-1]:
                        for key in added:
                            bench.store.discard(key)
                    if stream == "measure":
                        samples[v].append(sample.ttft_s * 1e3)
                        live.append(sample.live_tokens)
                        writes[v].append(len(added))
        row = {"prompt_tokens": prompt_tokens, "requests": args.requests, "live_tokens_mean": statistics.mean(live),
               "same_misses": args.same_misses, "force_misses": args.force_misses, "entries_written": writes,
               "ttft_ms": samples, "ttft_p50_ms": {v: statistics.median(t) for v, t in samples.items()}}
        if args.timeline:
            from allhit_ab_h200 import timeline, timeline_text

            request = trace.requests(1, stream="timeline")[0]
            row["timeline"] = {}
            real_run = bench.run
            # every repeat meets the same forced misses (the first one's writes would hit after)
            bench.run = lambda prompt: (force_misses(bench, prompt, args.force_misses), real_run(prompt))[1]
            try:
                for v in values:
                    with setting(v, HYPIC_KEPT_LAYOUTS="0"):
                        row["timeline"][v] = timeline(bench, request.prompt, model, 3)
                    texts.append(f"== rag {prompt_tokens}, {label}={v}: timeline (new layout graphs each time) "
                                 f"==\n" + timeline_text(row["timeline"][v]))
                    print(texts[-1], flush=True)
            finally:
                del bench.run  # the instance attribute: the class method again
        if args.profile:
            texts += profile_values(bench, trace, label, settings, prompt_tokens, device, args.force_misses,
                                    setting)
        res["rows"].append(row)
        print(f"rag {prompt_tokens}: " + ", ".join(f"{label}={v} {row['ttft_p50_ms'][v]:.2f} ms" for v in values)
              + f" (live tokens {row['live_tokens_mean']:.0f}; entries written per request "
              + ", ".join(f"{v}: {statistics.mean(writes[v]):.2f}" for v in values) + ")", flush=True)
        bench.close()
        if device == "cuda":
            torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "rag_ab.json"), "w") as f:
        json.dump(res, f, indent=1)
    if texts:
        with open(os.path.join(args.out, "rag_ab_profile.txt"), "w") as f:
            f.write("\n\n".join(texts))


def parse_settings(env, values, settings):
    """``{label: {NAME: VALUE}}`` in order: each value of ``env`` (comma-separated ``values``), or
    each of ``settings`` (``;``-separated, each of space-separated ``NAME=VALUE``)."""
    if (env is None) == (settings is None):
        raise SystemExit("give either --ab-env (with --ab-values) or --ab-settings")
    if env is not None:
        return {v: {env: v} for v in values.split(",")}
    out = {}
    for item in settings.split(";"):
        pairs = item.split()
        bad = [p for p in pairs if "=" not in p or not p.split("=", 1)[0]]
        if bad:
            raise SystemExit(f"--ab-settings: {bad} are not NAME=VALUE")
        label = item.strip() or "defaults"
        if label in out:
            raise SystemExit(f"--ab-settings: {label!r} given twice")
        out[label] = dict(p.split("=", 1) for p in pairs)
    return out


def run_noting_writes(bench, run):
    """``(run(), the store keys it added)``: the entries a run of ``bench`` wrote."""
    before = set(bench.store.device_lru_order())
    out = run()
    return out, set(bench.store.device_lru_order()) - before


def force_misses(bench, prompt, count: int) -> int:
    """Discard ``count`` of ``prompt``'s cached segments (spread over its documents, the system
    prompt's first segment spared) from ``bench``'s store, so that the next run misses them:
    how many were dropped."""
    if count <= 0:
        return 0
    segments = prompt.segments[1:]
    step = max(1, len(segments) // count)
    dropped = 0
    for seg in segments[step - 1::step][:count]:
        w = bench.policy.seam_tokens(len(seg))
        if w < len(seg):
            dropped += bench.store.discard(bench.keyer.segment_key(seg, w))
    return dropped


def profile_values(bench, trace, name: str, settings, prompt_tokens: int, device: str,
                   misses: int, setting):
    """One request of a stream of its own, once per value (what a run wrote discarded before the
    next): the profiler's kernel table, then a second traced run's GPU idle gaps with the hypic
    line running at each. Under the profiler launches are slower: for where time goes, not TTFT."""
    from torch.profiler import ProfilerActivity, profile

    from _gaps import gaps_text, gpu_gaps

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    texts = []
    request = trace.requests(1, stream="profile")[0]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    for v in settings:
        for stacks in (False, True):
            force_misses(bench, request.prompt, misses)
            with setting(v), profile(activities=activities, with_stack=stacks) as prof:
                sample, added = run_noting_writes(bench, lambda: (bench.run(request.prompt), sync())[0])
            for key in added:
                bench.store.discard(key)
            head = (f"== rag {prompt_tokens}, {name}={v}: one request ({sample.live_tokens} live tokens, "
                    f"{len(added)} entries written)")
            if stacks:
                texts.append(head + ", GPU idle gaps ==\n" + gaps_text(gpu_gaps(prof)))
            else:
                texts.append(head + ", kernels ==\n" + prof.key_averages().table(
                    sort_by="cuda_time_total" if device == "cuda" else "cpu_time_total", row_limit=30,
                    max_name_column_width=60))
            print(texts[-1][:3000], flush=True)
    return texts


if __name__ == "__main__":
    main()
