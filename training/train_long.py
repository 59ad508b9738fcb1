#!/usr/bin/env python3
"""Train the long-context embedded model (Qwen3.5 layout, 12 layers, 3 linear : 1 full) on the long suites.

The recipe (shape, curriculum, batches) is :mod:`long_recipe`; the checkpoint format and the export
:mod:`long_checkpoint`. Like ``train_tiny.py`` it runs transformers' ``Qwen3_5ForCausalLM`` with fla
and causal-conv1d hidden (their GDN backward refuses to run with the H200 image's Triton), bf16
autocast on CUDA, fp32 master weights, an LM loss on every token plus a loss on the answer tokens.

A run spans device calls of at most ~9 minutes; each call continues exactly where the last stopped::

    python3 training/train_long.py --out training/runs/long --max-minutes 8      # every call
    python3 training/train_long.py --out training/runs/long --export-only hypic/assets/long   # ship it

``--out`` holding a checkpoint resumes from it: weights, optimiser state, step, curriculum stage, the
stage's next batch index and the window that advances stages. Batches are a pure function of (seed,
stage, batch index), so the resumed run draws what the uninterrupted run would have drawn (on the
CPU a resumed run equals an uninterrupted one bit for bit; tests/training/test_train_long.py).

The optimiser is Adafactor (torch.optim.Adafactor: factored second moments, no first moment) by
default: its state is a few hundred KB, so the whole checkpoint (35 MB) travels with a device call;
``--optimizer adamw`` keeps 70 MB of moments, which only a machine kept warm between calls holds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from typing import Dict, List, Optional, Sequence

_SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(_SCRIPT_DIR)
for _path in (_REPO_ROOT, _SCRIPT_DIR):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import torch  # noqa: E402

from hypic.data.long_suites import LongSuiteConfig, generate_long_suite  # noqa: E402
from hypic.data.long_vocab import extended_vocabulary  # noqa: E402
from hypic.data.training import encode_request  # noqa: E402
from hypic.data.vocab import PAD_TOKEN, special_token_ids  # noqa: E402
from long_checkpoint import (  # noqa: E402
    checkpoint_recipe, export_model, has_checkpoint, load_checkpoint, save_checkpoint,
)
from long_recipe import (  # noqa: E402
    LONG_CURRICULUM, LONG_SHAPE, SMOKE_CURRICULUM, SMOKE_SHAPE, LongStage, check_curriculum, eval_requests,
    stage_batch, stage_batch_size,
)
from tiny_model import build_config  # noqa: E402
from train_tiny import (  # noqa: E402
    Logger, add_shared_arguments, collate, count_parameters, evaluate, finish_args, learning_rate, prepare_torch,
    should_advance, task_accuracy, train_step,
)

LOG_FILE = "train_log.jsonl"


class StageBatches(torch.utils.data.IterableDataset):
    """Batches ``start, start + 1, ...`` of one stage; worker w of W makes ``start + w + k W`` and the
    DataLoader hands them out round-robin, so the order is the index order for any W."""

    def __init__(self, seed: int, stage_index: int, stage: LongStage, start: int, batch_size: int):
        self.seed, self.stage_index, self.stage = seed, stage_index, stage
        self.start, self.batch_size = start, batch_size

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        vocab = extended_vocabulary()
        pad_id = special_token_ids()[PAD_TOKEN]
        index = self.start + worker
        while True:
            samples = stage_batch(self.seed, self.stage_index, self.stage, index, vocab, self.batch_size)
            batch = collate(samples, pad_id)
            batch["tasks"] = [s.task for s in samples]
            yield batch
            index += workers


def make_loader(args, stages, state) -> "torch.utils.data.DataLoader":
    stage = stages[state["stage"]]
    dataset = StageBatches(args.seed, state["stage"], stage, state["stage_batch"],
                           stage_batch_size(stage, args.batch_tokens, args.max_batch))
    return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=args.workers,
                                       prefetch_factor=4 if args.workers > 0 else None,
                                       pin_memory=args.device.startswith("cuda"))


def make_optimizer(model, args):
    """Adafactor (default) or AdamW. Groups: matrices with weight decay; the embedding without; vectors
    (norm gains, GDN decay parameters) without, and under Adafactor with a floor of 0.1 on the scale
    of their steps: Adafactor scales a step by the parameter's RMS (at least eps[1]), and the
    zero-centred norm gains start at 0."""
    matrices, embedding, vectors = [], [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (vectors if param.ndim < 2 else embedding if "embed" in name else matrices).append(param)
    if args.optimizer == "adafactor":
        groups = [{"params": matrices, "weight_decay": args.weight_decay}, {"params": embedding, "weight_decay": 0.0},
                  {"params": vectors, "weight_decay": 0.0, "eps": (None, 0.1)}]
        return torch.optim.Adafactor(groups, lr=args.lr, foreach=False)
    groups = [{"params": matrices, "weight_decay": args.weight_decay}, {"params": embedding, "weight_decay": 0.0},
              {"params": vectors, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=args.device.startswith("cuda"))


def build_eval_sets(args, stages, stage_index: int) -> Dict[str, list]:
    """Held-out sets: the current stage's shape (``stage/<task>``) and, with ``--eval-full``, the
    evaluation suites' shape (``heldout/<task>``, 16-64 documents of 4-8k tokens; small with --smoke)."""
    vocab = extended_vocabulary()
    stage = stages[stage_index]
    sets = {f"stage/{task}": [encode_request(r, vocab, add_bos=False) for r in requests]
            for task, requests in eval_requests(stage, args.eval_requests, args.eval_seed).items()}
    if args.eval_full:
        shape = dict(min_docs=3, max_docs=4, min_context_tokens=120, max_context_tokens=240, pool_size=16) \
            if args.smoke else {}
        for task in ("multi_key", "variable_tracking", "doc_order", "counting"):
            config = LongSuiteConfig(task=task, seed=args.eval_seed, **shape)
            sets[f"heldout/{task}"] = [encode_request(r, vocab, add_bos=False)
                                       for r in generate_long_suite(config, args.eval_requests)]
    return sets


def parse_args(argv: Optional[Sequence[str]] = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shared_arguments(p)
    p.add_argument("--out", required=True, help="checkpoint folder: resumed from when it holds one, written")
    p.add_argument("--export", default=None, help="also write the shippable model folder (bf16) here at the end")
    p.add_argument("--export-only", default=None, metavar="DIR",
                   help="write the shippable model folder of --out's checkpoint to DIR; no training, no evaluation")
    p.add_argument("--max-minutes", type=float, default=8.5, help="wall-clock budget of this call")
    p.add_argument("--max-steps", type=int, default=None, help="stop at this global step")
    p.add_argument("--total-steps", type=int, default=40000, help="length of the cosine schedule over all calls")
    p.add_argument("--optimizer", choices=["adafactor", "adamw"], default="adafactor")
    p.add_argument("--lr", type=float, default=None, help="peak lr (default 1e-2 Adafactor, 1e-3 AdamW)")
    p.add_argument("--batch-tokens", type=int, default=65536, help="padded tokens per batch (at a stage's longest)")
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-requests", type=int, default=32, help="held-out requests per eval set")
    p.add_argument("--save-every", type=int, default=500)
    p.add_argument("--smoke", action="store_true", help="the smoke shape and curriculum, small batches (CPU tests)")
    args = p.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if args.lr is None:
        args.lr = 1e-2 if args.optimizer == "adafactor" else 1e-3
    if args.smoke:
        args.batch_tokens = min(args.batch_tokens, 512)
        args.max_batch = min(args.max_batch, 4)
        args.eval_requests = min(args.eval_requests, 2)
        args.warmup_steps = min(args.warmup_steps, 2)
        args.total_steps = min(args.total_steps, 20)
        args.threads = 1 if args.threads is None else args.threads
    finish_args(args, ("eval_requests",))
    return args


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    args = parse_args(argv)
    start_time = time.time()
    prepare_torch(args)
    from transformers import Qwen3_5ForCausalLM

    shape, stages = (SMOKE_SHAPE, SMOKE_CURRICULUM) if args.smoke else (LONG_SHAPE, LONG_CURRICULUM)
    check_curriculum(stages)
    vocab = extended_vocabulary()
    torch.manual_seed(args.seed)  # the initial weights
    model = Qwen3_5ForCausalLM(build_config(shape, len(vocab))).to(args.device)
    model.train()
    optimizer = make_optimizer(model, args)
    recipe = {"shape": shape.__dict__, "curriculum": [s.name for s in stages], "optimizer": args.optimizer,
              "seed": args.seed, "vocab_size": len(vocab)}
    state: Dict = {"step": 0, "stage": 0, "stage_step": 0, "stage_batch": 0, "tokens": 0, "calls": 0, "window": []}
    resumed = has_checkpoint(args.out)
    if resumed:
        saved = checkpoint_recipe(args.out)
        if saved != recipe:
            raise ValueError(f"--out {args.out}: its checkpoint was made by another recipe ({saved}; this run's is "
                             f"{recipe}: --smoke, --optimizer and --seed must be those of the run that made it)")
        state = load_checkpoint(model, optimizer, args.out)
    if args.export_only:
        if not resumed:
            raise ValueError(f"--export-only: {args.out} holds no checkpoint")
        export_model(model, args.export_only, vocab)
        return {"state": {k: v for k, v in state.items() if k != "window"}, "eval": {}, "resumed": True}
    state["recipe"] = recipe
    state["calls"] += 1
    os.makedirs(args.out, exist_ok=True)
    log = Logger(os.path.join(args.out, LOG_FILE), args.quiet)
    log({"event": "start", "params": count_parameters(model), "device": args.device, "step": state["step"],
         "resumed": resumed, "stage": stages[state["stage"]].name, "call": state["calls"]})
    window: deque = deque(((t, bool(ok)) for t, ok in state["window"]), maxlen=args.advance_window)
    stage = stages[state["stage"]]
    eval_sets = build_eval_sets(args, stages, state["stage"])
    batches = iter(make_loader(args, stages, state))
    sums = {"loss": 0.0, "answer_loss": 0.0, "n": 0, "tokens": 0}
    last_log = time.time()
    step_times: deque = deque(maxlen=20)

    def save() -> None:
        save_checkpoint(model, optimizer, {**state, "window": [list(w) for w in window]}, args.out)

    while args.max_steps is None or state["step"] < args.max_steps:
        mean_step = sum(step_times) / len(step_times) if step_times else 0.0
        if time.time() - start_time + 3 * mean_step + 30.0 > args.max_minutes * 60.0:
            break  # room for the final evaluation and save
        t0 = time.time()
        batch = next(batches)
        lr = learning_rate(state["step"], args)
        loss, _, answer_loss, exact, grad_norm = train_step(model, optimizer, batch, lr, args)
        tokens = int(batch["valid"].sum())
        state["step"] += 1
        state["stage_step"] += 1
        state["stage_batch"] += 1
        state["tokens"] += tokens
        window.extend(zip(batch["tasks"], exact.tolist()))
        sums["loss"] += float(loss.detach())
        sums["answer_loss"] += float(answer_loss.detach())
        sums["n"] += 1
        sums["tokens"] += tokens
        step_times.append(time.time() - t0)
        if state["step"] % args.log_every == 0 or args.smoke:
            now = time.time()
            log({"event": "train", "step": state["step"], "stage": stage.name, "lr": lr,
                 "loss": sums["loss"] / sums["n"], "answer_loss": sums["answer_loss"] / sums["n"],
                 "answer_em_by_task": task_accuracy(window), "grad_norm": float(grad_norm),
                 "batch": int(batch["input_ids"].shape[0]), "tokens_per_s": sums["tokens"] / max(1e-9, now - last_log),
                 "elapsed_s": now - start_time})
            sums = {"loss": 0.0, "answer_loss": 0.0, "n": 0, "tokens": 0}
            last_log = now
        if state["step"] % args.eval_every == 0:
            log({"event": "eval", "step": state["step"], "stage": stage.name, **evaluate(model, eval_sets, args)})
        if state["stage"] + 1 < len(stages) and should_advance(stage, state["stage_step"], window, args):
            state.update(stage=state["stage"] + 1, stage_step=0, stage_batch=0)
            stage = stages[state["stage"]]
            window.clear()
            log({"event": "stage", "step": state["step"], "stage": stage.name})
            eval_sets = build_eval_sets(args, stages, state["stage"])
            batches = iter(make_loader(args, stages, state))
        if state["step"] % args.save_every == 0:
            save()
    final_eval = evaluate(model, eval_sets, args)
    log({"event": "eval", "step": state["step"], "stage": stage.name, **final_eval})
    save()
    if args.export:
        export_model(model, args.export, vocab)
    log({"event": "end", "step": state["step"], "stage": stage.name, "elapsed_s": time.time() - start_time})
    return {"state": {k: v for k, v in state.items() if k != "window"}, "eval": final_eval, "resumed": resumed}


if __name__ == "__main__":
    main()
