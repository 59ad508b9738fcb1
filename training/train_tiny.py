#!/usr/bin/env python3
"""Train hypic's embedded tiny hybrid model (Qwen3.5 architecture) on the synthetic suites.

An ordinary causal LM on full, unsegmented sequences (no PIC-aware training), through transformers'
``Qwen3_5ForCausalLM`` in PyTorch. The fla GDN backward does not run on the H200 image (Triton 3.6),
so fla and causal-conv1d are hidden from transformers before it is imported: it then uses its own
differentiable torch chunked gated-delta rule (``--allow-fla`` lifts this).

Training runs across several calls (each <= ~9 minutes); every call saves a Hugging Face checkpoint
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json) plus ``trainer_state.json``
(step, curriculum stage) and the AdamW moments, and the next call continues with ``--resume``::

    python training/train_tiny.py --out ckpt --max-minutes 8.5                 # first call
    python training/train_tiny.py --resume ckpt --out ckpt --max-minutes 8.5   # each later call

Logs are JSON lines (stdout and ``<out>/train_log.jsonl``): training lines with loss / lm_loss /
answer_loss / answer_em, and eval lines with held-out exact match per task (teacher-forced argmax at
the answer positions: all answer tokens and ``<eos>`` right, which equals greedy-decoding exact match).
``--smoke`` runs a few steps of a tiny model on CPU (the test suite uses it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections import deque
from typing import Dict, List, Optional, Sequence, Tuple

_SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(_SCRIPT_DIR)
for _path in (_REPO_ROOT, _SCRIPT_DIR):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hypic.data.language import BASE_DOCUMENT_TOKENS  # noqa: E402
from hypic.data.suites import SuiteConfig, fresh_request, generate_suite  # noqa: E402
from hypic.data.training import (  # noqa: E402
    CURRICULUM, CurriculumStage, TrainingSample, TrainingStream, encode_request, stage_by_name,
)
from hypic.data.vocab import PAD_TOKEN, special_token_ids, vocabulary  # noqa: E402
from tiny_checkpoint import (  # noqa: E402
    SAVE_DTYPES, STATE_FILE, load_optimizer_state, save_checkpoint,
)
from tiny_model import TINY_SMOKE_SHAPE, ModelShape, build_config  # noqa: E402

LOG_FILE = "train_log.jsonl"


def hide_fla() -> None:
    """Make transformers fall back to its torch GDN / conv paths (must run before importing it)."""
    for name in ("fla", "causal_conv1d"):
        if name not in sys.modules:
            sys.modules[name] = None  # an import of a None entry raises ImportError


# ----------------------------------------------------------------------------- model
def count_parameters(model) -> int:
    """Distinct parameters (tied embedding counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


# ----------------------------------------------------------------------------- batches
def collate(samples: Sequence[TrainingSample], pad_id: int) -> Dict[str, torch.Tensor]:
    """Right-pad to the longest sample. Causal attention and causal recurrences make right padding
    invisible to the real tokens, so no attention mask is needed; padding is masked from the loss."""
    if not samples:
        raise ValueError("samples: empty batch")
    length = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), length), pad_id, dtype=torch.long)
    answer = torch.zeros((len(samples), length), dtype=torch.bool)
    valid = torch.zeros((len(samples), length), dtype=torch.bool)
    for row, s in enumerate(samples):
        n = len(s.input_ids)
        ids[row, :n] = torch.tensor(s.input_ids, dtype=torch.long)
        answer[row, :n] = torch.tensor(s.answer_mask, dtype=torch.bool)
        valid[row, :n] = True
    return {"input_ids": ids, "answer_mask": answer, "valid": valid}


def take_batch(stream: TrainingStream, batch_tokens: int, max_batch: int,
               first: Optional[TrainingSample] = None) -> Tuple[List[TrainingSample], TrainingSample]:
    """Samples until the padded size (count x longest) would pass ``batch_tokens`` (at least one).

    Returns the batch and the sample that did not fit; pass it as ``first`` of the next batch, so
    long samples are not dropped more often than short ones (no length bias in the stream).
    """
    samples = [first if first is not None else stream.next_sample()]
    longest = len(samples[0].input_ids)
    while True:
        candidate = stream.next_sample()
        new_longest = max(longest, len(candidate.input_ids))
        if len(samples) >= max_batch or (len(samples) + 1) * new_longest > batch_tokens:
            return samples, candidate
        samples.append(candidate)
        longest = new_longest


class BatchDataset(torch.utils.data.IterableDataset):
    """Endless batches of one stage; each DataLoader worker gets its own stream seed."""

    def __init__(self, stage: CurriculumStage, seed: int, batch_tokens: int, max_batch: int):
        self.stage, self.seed, self.batch_tokens, self.max_batch = stage, seed, batch_tokens, max_batch

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        stream = TrainingStream(self.stage, seed=self.seed * 1009 + worker)
        pad_id = special_token_ids()[PAD_TOKEN]
        leftover = None
        while True:
            samples, leftover = take_batch(stream, self.batch_tokens, self.max_batch, leftover)
            batch = collate(samples, pad_id)
            batch["tasks"] = [s.task for s in samples]
            yield batch


def make_loader(stage: CurriculumStage, seed: int, args) -> "torch.utils.data.DataLoader":
    dataset = BatchDataset(stage, seed, args.batch_tokens, args.max_batch)
    workers = args.workers
    return torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=workers,
        prefetch_factor=4 if workers > 0 else None, persistent_workers=False,
        pin_memory=args.device.startswith("cuda"),
    )


# ----------------------------------------------------------------------------- loss / metrics
def losses(model, batch: Dict[str, torch.Tensor], device: str, answer_weight: float, autocast: bool):
    """(total loss, lm loss, answer loss, per-sample answer exact match [B] bool)."""
    ids = batch["input_ids"].to(device, non_blocking=True)
    answer = batch["answer_mask"].to(device, non_blocking=True)[:, 1:]
    valid = batch["valid"].to(device, non_blocking=True)[:, 1:]
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids).logits
    logits = logits[:, :-1].float()
    targets = ids[:, 1:]
    token_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    token_loss = token_loss.view_as(targets)
    lm_loss = (token_loss * valid).sum() / valid.sum().clamp(min=1)
    answer_loss = (token_loss * answer).sum() / answer.sum().clamp(min=1)
    total = lm_loss + answer_weight * answer_loss
    with torch.no_grad():
        wrong = (logits.argmax(-1) != targets) & answer
        exact = ~wrong.any(dim=1)
    return total, lm_loss, answer_loss, exact


@torch.no_grad()
def evaluate(model, eval_sets: Dict[str, List[TrainingSample]], args) -> Dict[str, float]:
    """Teacher-forced exact match (0-100) per eval set: every answer token and <eos> is the argmax."""
    model.eval()
    pad_id = special_token_ids()[PAD_TOKEN]
    results = {}
    for name, samples in eval_sets.items():
        correct = 0
        ordered = sorted(samples, key=lambda s: len(s.input_ids))
        start = 0
        while start < len(ordered):
            # Group by length so padding stays small; at most args.batch_tokens padded tokens.
            end = start + 1
            while end < len(ordered) and (end - start + 1) * len(ordered[end].input_ids) <= args.batch_tokens \
                    and end - start < args.max_batch:
                end += 1
            batch = collate(ordered[start:end], pad_id)
            _, _, _, exact = losses(model, batch, args.device, 0.0, args.autocast)
            correct += int(exact.sum())
            start = end
        results[name] = 100.0 * correct / max(1, len(samples))
    model.train()
    return results


def build_eval_sets(args, stage: CurriculumStage) -> Dict[str, List[TrainingSample]]:
    """Held-out requests: the evaluation shape (suites) and the current stage's shape (fresh docs)."""
    vocab = vocabulary()
    sets: Dict[str, List[TrainingSample]] = {}
    if args.smoke:
        shape = dict(min_docs=2, max_docs=3, min_doc_tokens=BASE_DOCUMENT_TOKENS,
                     max_doc_tokens=BASE_DOCUMENT_TOKENS + 8, pool_size=8)
    else:
        shape = dict(min_docs=4, max_docs=16, min_doc_tokens=64, max_doc_tokens=256, pool_size=128)
    for task in ("single_hop", "two_hop", "summary") if args.eval_full else ():
        config = SuiteConfig(task=task, split="held_out", seed=args.eval_seed, **shape)
        requests = generate_suite(config, args.eval_requests)
        sets[f"heldout/{task}"] = [encode_request(r, vocab, add_bos=False) for r in requests]
    rng = random.Random(f"stage-eval|{stage.name}|{args.eval_seed}")
    for task, _ in stage.task_weights:
        samples = []
        for i in range(args.eval_requests):
            docs = rng.randint(max(stage.min_docs, 2 if task == "two_hop" else 1), max(stage.max_docs, 2))
            request = fresh_request(rng, task, docs, stage.min_doc_tokens, stage.max_doc_tokens, split="held_out")
            samples.append(encode_request(request, vocab, add_bos=False))
        sets[f"stage/{task}"] = samples
    return sets


def should_advance(stage: CurriculumStage, stage_step: int, window, args) -> bool:
    """True once each task of the stage has >= 32 samples in the window and exact match >=
    ``stage.advance_accuracy`` (after ``min_steps``), or once ``max_steps`` were spent in the stage."""
    if stage.max_steps is not None and stage_step >= stage.max_steps:
        return True
    if stage.advance_accuracy is None or stage_step < stage.min_steps:
        return False
    if len(window) < min(args.advance_window, 256):
        return False
    counts: Dict[str, int] = {}
    for task, _ in window:
        counts[task] = counts.get(task, 0) + 1
    accuracy = task_accuracy(window)
    tasks = [task for task, _ in stage.task_weights]
    return all(counts.get(t, 0) >= 32 and accuracy[t] >= 100.0 * stage.advance_accuracy for t in tasks)


def task_accuracy(window) -> Dict[str, float]:
    """Exact match (0-100) per task over the (task, correct) pairs of the running window."""
    totals: Dict[str, List[int]] = {}
    for task, ok in window:
        entry = totals.setdefault(task, [0, 0])
        entry[0] += int(ok)
        entry[1] += 1
    return {task: 100.0 * right / count for task, (right, count) in sorted(totals.items())}


# ----------------------------------------------------------------------------- schedule / state
def learning_rate(step: int, args) -> float:
    """Linear warm-up to --lr, then cosine decay to --min-lr-ratio x lr at --total-steps."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    progress = min(1.0, (step - args.warmup_steps) / max(1, args.total_steps - args.warmup_steps))
    floor = args.lr * args.min_lr_ratio
    return floor + 0.5 * (args.lr - floor) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model, args):
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        # No decay on norms, biases, embeddings and the GDN decay parameters (A_log, dt_bias).
        if param.ndim < 2 or "embed" in name or "A_log" in name or "dt_bias" in name:
            no_decay.append(param)
        else:
            decay.append(param)
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = args.device.startswith("cuda")
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


class Logger:
    def __init__(self, path: Optional[str], quiet: bool):
        self.path, self.quiet = path, quiet

    def __call__(self, record: Dict) -> None:
        line = json.dumps(record, sort_keys=True)
        if not self.quiet:
            print(line, flush=True)
        if self.path:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")


# ----------------------------------------------------------------------------- main
def add_shared_arguments(p: argparse.ArgumentParser) -> None:
    """The options every trainer takes with the same meaning and default."""
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=500)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--answer-weight", type=float, default=1.0, help="extra loss weight on answer tokens")
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--eval-seed", type=int, default=1000)
    p.add_argument("--no-eval-full", dest="eval_full", action="store_false",
                   help="skip the evaluation-shape sets (heldout/*), keep the stage-shape ones (stage/*)")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--advance-window", type=int, default=1024,
                   help="training samples in the running answer exact match that advances stages")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:n]")
    p.add_argument("--workers", type=int, default=None, help="data-loading processes (default: 6 on GPU, 0 on CPU)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's; 1 with --smoke)")
    p.add_argument("--allow-fla", action="store_true", help="let transformers use fla kernels if installed")
    p.add_argument("--quiet", action="store_true", help="do not echo log lines to stdout")


def prepare_torch(args) -> None:
    """Before transformers is imported: fla / causal_conv1d hidden (unless --allow-fla), the threads."""
    if not args.allow_fla:
        hide_fla()
    if args.threads is not None:
        torch.set_num_threads(args.threads)


def parse_args(argv: Optional[Sequence[str]] = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shared_arguments(p)
    p.add_argument("--out", required=True, help="checkpoint folder to write (may equal --resume)")
    p.add_argument("--resume", default=None, help="checkpoint folder to continue from")
    p.add_argument("--max-minutes", type=float, default=8.5, help="wall-clock budget of this call")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many global steps")
    p.add_argument("--total-steps", type=int, default=30000, help="length of the cosine schedule")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-tokens", type=int, default=65536, help="padded tokens per batch")
    p.add_argument("--save-dtype", choices=sorted(SAVE_DTYPES), default="bfloat16",
                   help="dtype of stored weights and moments (bf16 keeps every file under 16 MiB)")
    p.add_argument("--no-optimizer-state", action="store_true",
                   help="do not store AdamW moments (smaller checkpoint; a resume re-warms the lr)")
    p.add_argument("--rewarmup-steps", type=int, default=100,
                   help="lr ramp after resuming without optimizer moments")
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-requests", type=int, default=128, help="held-out requests per eval set")
    p.add_argument("--save-every", type=int, default=1000)
    p.add_argument("--stage", default=None, help="force a curriculum stage by name")
    p.add_argument("--hidden-size", type=int, default=None)
    p.add_argument("--num-layers", type=int, default=None)
    p.add_argument("--smoke", action="store_true", help="tiny model, tiny batches, 3 steps, CPU")
    args = p.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if args.smoke:
        args.batch_tokens = min(args.batch_tokens, 256)
        args.max_batch = min(args.max_batch, 4)
        args.max_steps = 3 if args.max_steps is None else args.max_steps
        args.eval_requests = min(args.eval_requests, 2)
        args.eval_every = min(args.eval_every, 2)
        args.warmup_steps = min(args.warmup_steps, 2)
        args.total_steps = min(args.total_steps, 10)
    if args.smoke and args.threads is None:
        args.threads = 1  # tiny ops: threading only adds overhead, and CI shares its cores
    finish_args(args, ("rewarmup_steps",))
    return args


def finish_args(args, positive: Sequence[str] = ()) -> None:
    """What every trainer's arguments share: data workers (6 on a GPU, none on the CPU), bf16
    autocast on a GPU, and the counts that must be >= 1 (``positive`` names more)."""
    if args.workers is None:
        args.workers = 6 if args.device.startswith("cuda") else 0
    args.autocast = args.device.startswith("cuda")
    for name in ("batch_tokens", "max_batch", "eval_every", "save_every", "log_every", "total_steps",
                 "warmup_steps", "advance_window", *positive):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be >= 1")


def train_step(model, optimizer, batch: Dict[str, torch.Tensor], lr: float, args):
    """One optimiser step at learning rate ``lr``: (loss, lm_loss, answer_loss, exact, grad_norm)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss, lm_loss, answer_loss, exact = losses(model, batch, args.device, args.answer_weight, args.autocast)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    optimizer.step()
    return loss, lm_loss, answer_loss, exact, grad_norm


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    args = parse_args(argv)
    start_time = time.time()
    prepare_torch(args)
    from transformers import Qwen3_5ForCausalLM

    torch.manual_seed(args.seed)
    vocab = vocabulary()
    os.makedirs(args.out, exist_ok=True)
    log = Logger(os.path.join(args.out, LOG_FILE), args.quiet)

    state: Dict = {"step": 0, "stage": 0, "stage_step": 0, "tokens": 0, "calls": 0}
    if args.resume:
        model = Qwen3_5ForCausalLM.from_pretrained(args.resume, dtype=torch.float32)
        if model.config.vocab_size != len(vocab):
            raise ValueError(f"--resume: checkpoint vocabulary {model.config.vocab_size} != {len(vocab)}")
    else:
        shape = TINY_SMOKE_SHAPE if args.smoke else ModelShape()
        overrides = {k: v for k, v in (("hidden_size", args.hidden_size), ("num_layers", args.num_layers)) if v}
        if overrides:
            shape = ModelShape(**{**shape.__dict__, **overrides})
        model = Qwen3_5ForCausalLM(build_config(shape, len(vocab)))
    model.to(args.device)
    model.train()
    optimizer = make_optimizer(model, args)
    optimizer_restored = False
    state_path = os.path.join(args.resume, STATE_FILE) if args.resume else None
    if state_path and os.path.exists(state_path):
        with open(state_path, encoding="utf-8") as handle:
            saved = json.load(handle)
        optimizer_restored = load_optimizer_state(model, optimizer, args.resume, float(saved.pop("adam_step", 0.0)))
        state.update(saved)
    # Without saved moments, AdamW restarts: ramp the learning rate up again over a short window.
    rewarm_from = None if optimizer_restored or not args.resume else state["step"]
    if args.stage is not None:
        forced = stage_by_name(args.stage)
        if forced != state["stage"]:
            state["stage"], state["stage_step"] = forced, 0
    state["calls"] += 1

    num_params = count_parameters(model)
    log({"event": "start", "params": num_params, "device": args.device, "step": state["step"],
         "optimizer_restored": optimizer_restored,
         "stage": CURRICULUM[state["stage"]].name, "layer_types": model.config.layer_types})

    stage = CURRICULUM[state["stage"]]
    eval_sets = build_eval_sets(args, stage)
    # A fresh data seed per call and stage, so a resumed run does not replay the same samples.
    loader_iter = iter(make_loader(stage, args.seed * 7919 + state["calls"] * 131 + state["stage"], args))
    window: deque = deque(maxlen=args.advance_window)
    sums = {"loss": 0.0, "lm_loss": 0.0, "answer_loss": 0.0, "n": 0, "tokens": 0}
    last_log = time.time()
    budget_s = args.max_minutes * 60.0
    step_times: deque = deque(maxlen=20)

    while True:
        if args.max_steps is not None and state["step"] >= args.max_steps:
            break
        # Leave room for a final eval + save (estimated as 3 steps + 20 s).
        mean_step = sum(step_times) / len(step_times) if step_times else 0.0
        if time.time() - start_time + 3 * mean_step + 20.0 > budget_s:
            break
        t0 = time.time()
        batch = next(loader_iter)
        lr = learning_rate(state["step"], args)
        if rewarm_from is not None:
            lr *= min(1.0, (state["step"] - rewarm_from + 1) / args.rewarmup_steps)
        loss, lm_loss, answer_loss, exact, grad_norm = train_step(model, optimizer, batch, lr, args)
        state["step"] += 1
        state["stage_step"] += 1
        num_tokens = int(batch["valid"].sum())
        state["tokens"] += num_tokens
        window.extend(zip(batch["tasks"], exact.tolist()))
        sums["loss"] += float(loss.detach())
        sums["lm_loss"] += float(lm_loss.detach())
        sums["answer_loss"] += float(answer_loss.detach())
        sums["n"] += 1
        sums["tokens"] += num_tokens
        step_times.append(time.time() - t0)
        running_em = sum(ok for _, ok in window) / max(1, len(window))

        if state["step"] % args.log_every == 0 or args.smoke:
            now = time.time()
            log({"event": "train", "step": state["step"], "stage": stage.name, "lr": lr,
                 "loss": sums["loss"] / sums["n"], "lm_loss": sums["lm_loss"] / sums["n"],
                 "answer_loss": sums["answer_loss"] / sums["n"], "answer_em": 100.0 * running_em,
                 "answer_em_by_task": task_accuracy(window),
                 "grad_norm": float(grad_norm), "batch": int(batch["input_ids"].shape[0]),
                 "tokens_per_s": sums["tokens"] / max(1e-9, now - last_log),
                 "elapsed_s": now - start_time})
            sums = {"loss": 0.0, "lm_loss": 0.0, "answer_loss": 0.0, "n": 0, "tokens": 0}
            last_log = now
        if state["step"] % args.eval_every == 0:
            log({"event": "eval", "step": state["step"], "stage": stage.name, **evaluate(model, eval_sets, args)})
        if state["step"] % args.save_every == 0:
            save_checkpoint(model, optimizer, state, args.out, args.save_dtype, not args.no_optimizer_state)
        # Curriculum: advance once every task of the stage is mostly right (or the stage ran too long).
        if state["stage"] + 1 < len(CURRICULUM) and should_advance(stage, state["stage_step"], window, args):
            state["stage"] += 1
            state["stage_step"] = 0
            stage = CURRICULUM[state["stage"]]
            window.clear()
            log({"event": "stage", "step": state["step"], "stage": stage.name})
            eval_sets = build_eval_sets(args, stage)
            loader_iter = iter(make_loader(stage, args.seed * 7919 + state["calls"] * 131 + state["stage"], args))

    final_eval = evaluate(model, eval_sets, args)
    log({"event": "eval", "step": state["step"], "stage": stage.name, **final_eval})
    save_checkpoint(model, optimizer, state, args.out, args.save_dtype, not args.no_optimizer_state)
    log({"event": "end", "step": state["step"], "stage": stage.name, "elapsed_s": time.time() - start_time})
    return {"state": dict(state), "eval": final_eval, "params": num_params, "optimizer_restored": optimizer_restored}


if __name__ == "__main__":
    main()
