"""``hypic bench deviation``: where a cached request's activations deviate from full recompute.

    hypic bench deviation --model tiny --device cpu --tasks single_hop,two_hop,summary --num-requests 24 \\
        --seams 0,2,4,8,16,32 --cold-policies standalone,inline,canonical --json dev.json --plot dev.png

For every suite request and every (cold policy, seam) it serves the request twice on a fresh store:
once to write its entries (``standalone`` / ``canonical``: the request itself; ``inline``: a *donor*,
the same documents in another seeded order, whose context the entries then carry), then again
from those entries, recording the second forward. The activations that request is made of are
*spliced* (:func:`hypic.bench.deviation_capture.splice`): live rows (seam windows, query) from its
own forward, every reused body's rows from the forward that wrote the entry, re-computed here by a
plain full forward of that writer (the segment alone at position 0, or the donor prompt). They are
compared with one full-recompute forward of the request, per token:

* relative L2 error of the residual stream after each layer, of the full-attention layers' K, V
  (pre-RoPE: re-rotation is exact) and attention outputs, and of the final hidden state;
* KL(full || spliced) of the next-token distribution at each position;
* the attention the last prompt token pays to each offset of the reused segments, per
  full-attention layer, spliced and full (the attention-sink claim: the first tokens of a segment
  prefilled alone act as sinks);

aggregated by **token offset inside a reused segment** (segments after the first; the first starts at
position 0 in every run), plus per request the answer distribution's KL and top-1 agreement at the
last prompt token. Deviation is a property of the model and its cached entries, not of decoding.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from hypic.bench.common import provenance, write_report
from hypic.bench.deviation_capture import ATTENTION_FIELDS, ActivationRecorder, Activations, plain_forward, splice
from hypic.bench.deviation_report import format_table, plot_deviation
from hypic.bench.quality import ALL_SUITE_TASKS, parse_tasks, suite_requests
from hypic.bench.quality_run import PromptEncoder, encode_requests, parse_cold_policies, parse_seams
from hypic.data.suites import TASKS
from hypic.ops.rope import apply_rotary
from hypic.pic.modes import COLD_INLINE, COLD_POLICIES, seam_tokens

HELP = ("where cached (spliced) activations deviate from full recompute, by layer and by token offset "
        "inside reused segments, per cold policy and seam")
DEFAULT_SEAMS = "0,2,4,8,16,32"
# Offsets inside a reused segment: one bin per token up to 8, then widening bins. (low, high) tokens.
OFFSET_BINS: Tuple[Tuple[int, Optional[int]], ...] = (
    (0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 12), (12, 16), (16, 32), (32, 64),
    (64, 128), (128, None))


def bin_label(low: int, high: Optional[int]) -> str:
    if high is None:
        return f"{low}+"
    return str(low) if high == low + 1 else f"{low}-{high - 1}"


def offset_bin(offset: int) -> int:
    for i, (low, high) in enumerate(OFFSET_BINS):
        if offset >= low and (high is None or offset < high):
            return i
    raise ValueError(f"offset: {offset} < 0")


class Accumulator:
    """Sums and counts per (metric, offset bin)."""

    def __init__(self) -> None:
        self.sums: Dict[str, List[float]] = {}
        self.counts: Dict[str, List[int]] = {}

    def add(self, metric: str, bins: torch.Tensor, values: torch.Tensor) -> None:
        sums = self.sums.setdefault(metric, [0.0] * len(OFFSET_BINS))
        counts = self.counts.setdefault(metric, [0] * len(OFFSET_BINS))
        total = torch.zeros(len(OFFSET_BINS), dtype=torch.float64).index_add_(0, bins, values.double())
        count = torch.bincount(bins, minlength=len(OFFSET_BINS))
        for i in range(len(OFFSET_BINS)):
            sums[i] += float(total[i])
            counts[i] += int(count[i])

    def means(self) -> Dict[str, List[Optional[float]]]:
        return {m: [s / c if c else None for s, c in zip(self.sums[m], self.counts[m])] for m in self.sums}


@dataclass
class RequestTokens:
    segments: Tuple[Tuple[int, ...], ...]  # documents, then the query
    request_id: str

    @property
    def documents(self) -> Tuple[Tuple[int, ...], ...]:
        return self.segments[:-1]

    @property
    def flat(self) -> List[int]:
        return [t for s in self.segments for t in s]


def relative_error(spliced: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """Per row: ||spliced - full|| / ||full||."""
    a, b = spliced.flatten(1).double(), full.flatten(1).double()
    return (a - b).norm(dim=1) / b.norm(dim=1).clamp_min(1e-30)


def donor_order(num_documents: int, request_id: str) -> List[int]:
    """A seeded reordering of the documents that differs from the request's own order (2 or more)."""
    order = list(range(num_documents))
    random.Random(f"donor|{request_id}").shuffle(order)
    if num_documents > 1 and order == sorted(order):
        order = order[1:] + order[:1]
    return order


class DeviationRun:
    """One engine and the recorder. No prefix cache (a checkpoint would make the second run exact) and
    no CUDA graphs (a replayed graph runs no module hooks)."""

    def __init__(self, model: str, device: str, dtype: str, seed: int) -> None:
        from hypic.engine.engine import LLMEngine

        self.engine = LLMEngine(model, device=device, dtype=dtype, seed=seed, enable_prefix_caching=False,
                                segment_cache_bytes=None, max_num_seqs=1, enforce_eager=True)
        self.model, self.spec = self.engine.model, self.engine.spec
        self.recorder = ActivationRecorder(self.model, self.spec.layer_types)
        self.attention_layers = self.recorder.attention_layers
        self.rotary = self.model.model.rotary(self.engine.device)

    def forward(self, token_ids: Sequence[int]) -> Activations:
        return plain_forward(self.model, self.spec, self.recorder, token_ids, self.engine.device, self.engine.dtype)

    def serve(self, segments: Sequence[Sequence[int]], policy: str, seam, record: bool) -> Optional[Activations]:
        """One request through the engine (hypic mode); its prefill forward when ``record``."""
        from hypic.engine.sampling import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=1)
        self.engine.add_request({"segments": [list(s) for s in segments]}, params, mode="hypic", seam=seam,
                                cold_policy=policy)
        self.recorder.enabled = record
        try:
            while self.engine.has_unfinished_requests():
                self.engine.step()
        finally:
            self.recorder.enabled = False
        forwards = self.recorder.take()
        if record and len(forwards) != 1:
            raise RuntimeError(f"expected the cached request to run one forward, recorded {len(forwards)}")
        return forwards[0] if record else None

    def logits(self, final: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            weight = self.model.output_weight().float()
            return F.linear(self.model.model.norm(final.to(self.engine.dtype)).float(), weight)

    def last_token_attention(self, acts: Activations, layer: int) -> torch.Tensor:
        """Attention weights ``[N]`` (mean over heads) of the last position over every position, from
        pre-RoPE q and K rotated to their positions (as serving re-rotates cached K)."""
        positions = acts.positions
        cos, sin = self.rotary.cos_sin(positions)
        k = apply_rotary(acts.k[layer], cos, sin)  # [N, Hkv, D]
        q = apply_rotary(acts.q[layer][-1:], cos[-1:], sin[-1:])[0]  # [Hq, D]
        group = q.shape[0] // k.shape[1]
        scores = torch.einsum("hd,nhd->hn", q.double(), k.repeat_interleave(group, dim=1).double())
        return torch.softmax(scores * q.shape[-1] ** -0.5, dim=-1).mean(0)


def measure_request(run: DeviationRun, tokens: RequestTokens, configurations, accumulators, answers) -> None:
    """Every configuration on one request; adds to ``accumulators[(policy, seam)]`` and ``answers``."""
    docs = tokens.documents
    lengths = [len(d) for d in docs]
    starts = [sum(lengths[:i]) for i in range(len(docs))]
    n = sum(lengths) + len(tokens.segments[-1])
    full = run.forward(tokens.flat)
    full_logits = run.logits(full.final)
    full_logp = torch.log_softmax(full_logits, dim=-1)
    alone = [run.forward(d) for d in docs]
    order = donor_order(len(docs), tokens.request_id)
    donor = run.forward([t for i in order for t in docs[i]])
    donor_start = {i: sum(lengths[j] for j in order[:k]) for k, i in enumerate(order)}
    donor_bodies = [donor.rows(torch.arange(donor_start[i], donor_start[i] + lengths[i])) for i in range(len(docs))]
    # offset bins of the positions in reused segments after the first
    positions = torch.cat([torch.arange(s, s + l) for s, l in zip(starts[1:], lengths[1:])])
    bins = torch.tensor([offset_bin(o) for s, l in zip(starts[1:], lengths[1:]) for o in range(l)])
    full_mass = {layer: run.last_token_attention(full, layer) for layer in run.attention_layers}
    for policy, seam in configurations:
        run.engine.store.clear()
        if policy == COLD_INLINE:
            run.serve([docs[i] for i in order] + [tokens.segments[-1]], policy, seam, record=False)
            bodies = donor_bodies
        else:
            run.serve(tokens.segments, policy, seam, record=False)
            bodies = alone
        live = run.serve(tokens.segments, policy, seam, record=True)
        run.engine.store.clear()
        spliced = splice(live, bodies, starts, lengths, n)
        acc = accumulators.setdefault((policy, seam), Accumulator())
        for layer, tensor in spliced.hidden.items():
            acc.add(f"hidden/L{layer}", bins, relative_error(tensor, full.hidden[layer])[positions])
        for name in ATTENTION_FIELDS[1:]:
            for layer, tensor in getattr(spliced, name).items():
                acc.add(f"{name}/L{layer}", bins, relative_error(tensor, getattr(full, name)[layer])[positions])
        logits = run.logits(spliced.final)
        logp = torch.log_softmax(logits, dim=-1)
        acc.add("final", bins, relative_error(spliced.final, full.final)[positions])
        kl = (full_logp.exp() * (full_logp - logp)).sum(-1)
        acc.add("logits_kl", bins, kl[positions])
        for layer in run.attention_layers:
            mass = run.last_token_attention(spliced, layer)
            acc.add(f"mass_spliced/L{layer}", bins, mass[positions])
            acc.add(f"mass_full/L{layer}", bins, full_mass[layer][positions])
        seam_live = sum(seam_tokens(seam, l) for l in lengths)
        answers.setdefault((policy, seam), []).append({
            "request_id": tokens.request_id, "kl_last": float(kl[-1]),
            "top1_agrees": bool(int(logits[-1].argmax()) == int(full_logits[-1].argmax())),
            "final_rel_err_query": float(relative_error(spliced.final, full.final)[sum(lengths):].mean()),
            "seam_live_tokens": seam_live,
        })


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny", help="checkpoint folder or 'tiny' (embedded model)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float64")
    parser.add_argument("--seed", type=int, default=0, help="suite seed (and engine seed)")
    parser.add_argument("--tasks", default=",".join(TASKS),
                        help=f"comma-separated suite tasks among {','.join(ALL_SUITE_TASKS)}")
    parser.add_argument("--num-requests", type=int, default=8, help="requests per task")
    parser.add_argument("--split", default="held_out", choices=["held_out", "train"])
    parser.add_argument("--min-docs", type=int, default=None, help="suite override: fewest documents per request")
    parser.add_argument("--max-docs", type=int, default=None, help="suite override: most documents per request")
    parser.add_argument("--min-context-tokens", type=int, default=None, help="long tasks: fewest document tokens")
    parser.add_argument("--max-context-tokens", type=int, default=None, help="long tasks: most document tokens")
    parser.add_argument("--pool-size", type=int, default=None, help="long tasks: documents in the pool")
    parser.add_argument("--seams", default=DEFAULT_SEAMS, help=f"seam widths (default {DEFAULT_SEAMS})")
    parser.add_argument("--cold-policies", default=",".join(COLD_POLICIES), help="among " + ",".join(COLD_POLICIES))
    parser.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plot", default=None, metavar="FILE.png", help="plot deviation against offset")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    if not isinstance(args.num_requests, int) or args.num_requests < 1:
        raise ValueError(f"num_requests: must be an int >= 1, got {args.num_requests!r}")
    seams = parse_seams(args.seams)
    policies = parse_cold_policies(args.cold_policies)
    configurations = [(p, s) for p in policies for s in seams]
    tasks = parse_tasks(args.tasks)
    runner = DeviationRun(args.model, args.device, args.dtype, args.seed)
    encoder = PromptEncoder(runner.engine.model_path, runner.spec.vocab_size)
    from tqdm.auto import tqdm

    per_task = {}
    for task in tasks:
        requests = suite_requests(args, task)
        encoder.check_word_level(requests)
        accumulators: Dict[tuple, Accumulator] = {}
        answers: Dict[tuple, list] = {}
        for e in tqdm(encode_requests(encoder, requests), desc=f"deviation {task}", disable=args.no_progress):
            measure_request(runner, RequestTokens(e.segments, e.request.request_id), configurations, accumulators,
                            answers)
        per_task[task] = (accumulators, answers)
    runner.recorder.close()
    report = build_report(args, runner, per_task, configurations)
    print(format_table(report))
    if args.json:
        write_report(args.json, report)
        print(f"wrote {args.json}")
    if args.plot:
        plot_deviation(args.plot, report)
        print(f"wrote {args.plot}")
    return 0


def build_report(args, runner: DeviationRun, per_task: dict, configurations) -> dict:
    rows = []
    for task, (accumulators, answers) in per_task.items():
        for policy, seam in configurations:
            acc, outcomes = accumulators[(policy, seam)], answers[(policy, seam)]
            rows.append({
                "task": task, "cold_policy": policy, "seam": seam, "n": len(outcomes),
                "kl_last_mean": sum(o["kl_last"] for o in outcomes) / len(outcomes),
                "top1_agreement": sum(o["top1_agrees"] for o in outcomes) / len(outcomes),
                "final_rel_err_query_mean": sum(o["final_rel_err_query"] for o in outcomes) / len(outcomes),
                "seam_live_tokens_mean": sum(o["seam_live_tokens"] for o in outcomes) / len(outcomes),
                "by_offset": acc.means(), "counts": acc.counts,
            })
    return {
        "model": args.model, "device": str(runner.engine.device), "dtype": str(runner.engine.dtype),
        "attention_layers": runner.attention_layers, "num_layers": runner.spec.num_layers,
        "offset_bins": [bin_label(low, high) for low, high in OFFSET_BINS],
        "config": {"tasks": list(per_task), "num_requests": args.num_requests, "seed": args.seed,
                   "split": args.split, "min_docs": args.min_docs, "max_docs": args.max_docs},
        **provenance(args), "rows": rows,
    }
