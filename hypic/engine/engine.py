"""LLMEngine: requests in, tokens out. Each ``step()`` is schedule -> run -> postprocess.

* schedule: the :class:`~hypic.engine.scheduler.Scheduler` picks a prefill batch (bounded by a
  token budget, long prompts chunked) or a decode step over all running requests;
* run: the batch's live tokens are packed (no batch dimension), each request brings its own
  :class:`~hypic.engine.context.SequenceCache`, one forward computes logits only for the rows
  that sample, and :func:`~hypic.engine.sampling.sample` draws one token per request with the
  request's own generator;
* postprocess: tokens are appended, stop rules applied, finished requests release their cache.

Every input check happens in :meth:`LLMEngine.add_request`, before the request joins the queue,
so a bad request raises there (ValueError) and never reaches a batch shared with others.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path

import torch

from hypic.assets import resolve_model_path
from hypic.config import DTYPES, EngineConfig
from hypic.engine.context import PlainContext, SequenceCache
from hypic.engine.outputs import RequestOutput
from hypic.engine.pic_stages import own_cached_tokens, plan_stages, run_stage
from hypic.engine.request import PicState, Request
from hypic.engine.sampling import SamplingParams, needs_processing, process_logits, sample, token_logprobs
from hypic.engine.scheduler import ScheduledBatch, Scheduler
from hypic.engine.tokenizer import Tokenizer
from hypic.engine.fingerprint import model_fingerprint, store_fingerprint
from hypic.runner.layout_pieces import ChunkWindow, resume_entry
from hypic.runner.pic_runner import PicRunner
from hypic.runner.segment_parallel import start_segment_workers
from hypic.runner.segment_report import WorkerFault
from hypic.models.config import load_spec
from hypic.models.loader import load_model
from hypic.pic.disk_tier import DiskTier
from hypic.pic.keys import Keyer, KeyNamespace
from hypic.pic.modes import COLD_CANONICAL, get_mode
from hypic.pic.plan import plan_request, segment_keys
from hypic.pic.segments import PIC_SEP, SegmentedPrompt, build_segmented_prompt
from hypic.pic.store import SegmentStore, StoreStats


def resolve_device(device: str | torch.device | None) -> torch.device:
    """None / "auto" -> cuda when available, else cpu."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device {device!r} is not a valid torch device") from e
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """"auto" / None: float32 on CPU (the reference precision), bfloat16 on accelerators."""
    if dtype is None or dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype must be a floating dtype, got {dtype}")
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype {dtype!r} is not one of: auto, {', '.join(DTYPES)}")


@dataclass
class EngineStats:
    """Cumulative counters (tokens and steps) since the engine started."""

    num_prefill_steps: int = 0
    num_decode_steps: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    # Segment workers that failed a share (died, hung or raised; each logged) and the segments of
    # theirs the engine prefilled itself instead.
    num_segment_worker_faults: int = 0
    num_segments_recomputed: int = 0


class LLMEngine:
    """Continuous-batching generation over one model, configured by an
    :class:`~hypic.config.EngineConfig`.

    ``LLMEngine(config)``, or the flat options of :meth:`EngineConfig.from_kwargs
    <hypic.config.EngineConfig.from_kwargs>` as keywords (``LLMEngine("tiny", seed=0,
    max_num_seqs=8)``: a first positional argument that is not a config is the model). With
    segment workers (``segment_workers > 1``) cold standalone segments are spread over that many
    processes, each with a replica of the model on its own device
    (:mod:`hypic.runner.segment_parallel`), until :meth:`shutdown`; a worker that dies, hangs or
    raises costs no request (the engine prefills its segments itself) and is counted in
    :attr:`stats`.
    """

    def __init__(self, config: EngineConfig | str | Path | None = None, /, **kwargs) -> None:
        if isinstance(config, EngineConfig):
            if kwargs:
                raise ValueError(f"pass an EngineConfig or keyword options, not both (got {', '.join(kwargs)})")
        else:
            if config is not None:
                kwargs = {"model": config, **kwargs}
            config = EngineConfig.from_kwargs(**kwargs)
        self.config = config
        model_cfg, cache_cfg = config.model, config.cache
        seed, load_format = model_cfg.seed, model_cfg.load_format
        self.model_path = resolve_model_path(model_cfg.model)
        self.device = resolve_device(model_cfg.device)
        self.dtype = resolve_dtype(model_cfg.dtype, self.device)
        # Check cheap arguments against config.json before loading any weights.
        limit = load_spec(str(self.model_path)).max_position_embeddings
        max_model_len = limit if model_cfg.max_model_len is None else model_cfg.max_model_len
        if max_model_len > limit:
            raise ValueError(f"max_model_len must be an int in [1, {limit}] (max_position_embeddings), "
                             f"got {max_model_len!r}")
        self.max_model_len = max_model_len
        has_tokenizer = (self.model_path / "tokenizer.json").is_file()
        self.tokenizer = Tokenizer(self.model_path) if has_tokenizer else None
        self.spec, self.model = load_model(
            str(self.model_path), dtype=self.dtype, device=self.device, load_format=load_format, seed=seed,
            moe_backend=config.kernel.moe_backend,
        )
        eos_ids = self.tokenizer.eos_token_ids if self.tokenizer else self.spec.eos_token_ids
        self.eos_token_ids = tuple(eos_ids)
        self.scheduler = Scheduler(
            config.scheduler,
            max_model_len=max_model_len,
            eos_token_ids=self.eos_token_ids,
            detokenize=self.tokenizer.decode if self.tokenizer else None,
            lookup_prefix=self._lookup_prefix if cache_cfg.enable_prefix_caching else None,
            stage_pic=self._stage_pic,
        )
        # Seeds for requests without their own: drawn in arrival order, so a run is reproducible.
        self._seed_generator = torch.Generator().manual_seed(seed)
        self._request_counter = itertools.count()
        self.stats = EngineStats()
        # Position-independent caching: segmented prompts (PIC_SEP text, a list of segments, or
        # every prompt when the config names a mode) are planned against the segment store with
        # the ``pic`` defaults and prefilled in one step by the PIC runner; the rest takes the
        # plain path.
        self.pic = config.pic
        # keys name the model by its content (hypic.engine.fingerprint): entries persisted in a
        # segment_cache_dir stay valid wherever the checkpoint lives, and only for it
        model_id = model_fingerprint(self.model_path, load_format, seed)
        dtype_name = str(self.dtype).replace("torch.", "")
        self.keyer = Keyer(KeyNamespace(model_id, dtype_name))
        disk = None
        if cache_cfg.segment_cache_dir is not None:
            disk = DiskTier(str(cache_cfg.segment_cache_dir), cache_cfg.disk_cache_bytes,
                            store_fingerprint(model_id, dtype_name))
        self.store = SegmentStore(cache_cfg.segment_cache_bytes, cache_cfg.host_cache_bytes, device=self.device,
                                  disk=disk)
        enforce_eager = config.kernel.enforce_eager
        self.pic_runner = PicRunner(self.model, self.spec, self.store, self.device, self.dtype,
                                    enforce_eager=enforce_eager)
        # automatic prefix caching of every prompt (hypic.pic.prefix): its checkpoint spacing
        self.prefix_block_tokens = None
        if cache_cfg.enable_prefix_caching:
            self.prefix_block_tokens = (cache_cfg.prefix_block_tokens
                                        or self.pic_runner.default_prefix_block_tokens())
        elif config.pic.mode is not None and get_mode(config.pic.mode).uses_prefix_checkpoints:
            raise ValueError("pic_mode prefix_cache needs enable_prefix_caching")
        self.segment_workers = start_segment_workers(
            config.parallel, self.spec, model_dir=str(self.model_path), dtype=self.dtype, device=self.device,
            load_format=load_format, seed=seed, enforce_eager=enforce_eager,
            moe_backend=config.kernel.moe_backend, on_fault=self._on_segment_worker_fault)
        self.pic_runner.segment_parallel = self.segment_workers
        # CUDA graphs of the layers' row-wise phases for every batch size the scheduler can form
        # (GPU only; none under enforce_eager).
        self.pic_runner.capture_graphs(config.scheduler.max_num_batched_tokens)

    def shutdown(self) -> None:
        """Stop the segment workers (if any) and write what is queued for the segment store's
        disk tier; idempotent."""
        if self.segment_workers is not None:
            self.pic_runner.segment_parallel = None
            workers, self.segment_workers = self.segment_workers, None
            workers.close()
        self.store.close()

    @property
    def num_live_segment_workers(self) -> int:
        """Segment worker processes serving now (0 without segment parallelism)."""
        return len(self.segment_workers.live_ranks) if self.segment_workers is not None else 0

    def _on_segment_worker_fault(self, fault: WorkerFault) -> None:
        self.stats.num_segment_worker_faults += 1
        self.stats.num_segments_recomputed += fault.segments_recomputed

    # ---- requests --------------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | list[int] | list[str] | list[list[int]] | dict,
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        mode: str | None = None,
        seam: int | float | None = None,
        cold_policy: str | None = None,
        cache_salt: str | None = None,
        start_after: str | None = None,
    ) -> str:
        """Queue a request; returns its id. ``prompt``: text, token ids, or a vLLM-style dict
        ``{"prompt": text}`` / ``{"prompt_token_ids": ids}`` (either may carry ``"cache_salt"``);
        for segment caching also text with ``<<PIC_SEP>>`` between segments, a list of segments
        (strings or token-id lists, the last one the query) or ``{"segments": [...]}``. ``mode`` /
        ``seam`` / ``cold_policy`` override the engine's PIC settings for this request.
        ``cache_salt``: the tenant whose cache entries (segments, prefix checkpoints) the request
        may reuse and writes; entries of one salt never serve another. Raises ValueError for
        input that cannot be served (empty prompt or segment, token ids outside the vocabulary,
        prompt longer than max_model_len, prompt + max_tokens longer than max_model_len, unknown
        mode, ...).

        ``start_after``: the id of another completion of the same prompt (``n`` > 1): a prompt
        without segments then starts once that one has its first token, and resumes from the
        prefix-cache checkpoints its prefill wrote instead of prefilling the prompt again. Segmented
        prompts start at once (their concurrent completions share the cold segments' stages), as
        does any prompt without the prefix cache (docs/decisions.md, n > 1)."""
        if sampling_params is None:
            sampling_params = SamplingParams()
        if request_id is None:
            request_id = str(next(self._request_counter))
        if sampling_params.n != 1:
            raise ValueError(f"request {request_id}: LLMEngine runs one completion per request, got n="
                             f"{sampling_params.n} (LLM.generate and the server fan n out into n requests)")
        if sampling_params.logit_bias is not None and sampling_params.logit_bias[-1][0] >= self.spec.vocab_size:
            raise ValueError(f"request {request_id}: logit_bias names token {sampling_params.logit_bias[-1][0]}, "
                             f"outside the vocabulary [0, {self.spec.vocab_size})")
        if isinstance(prompt, dict) and "cache_salt" in prompt:
            if cache_salt is not None and cache_salt != prompt["cache_salt"]:
                raise ValueError(f"request {request_id}: two different cache_salt values (the prompt's and the call's)")
            cache_salt = prompt["cache_salt"]
            prompt = {k: v for k, v in prompt.items() if k != "cache_salt"}
        if isinstance(prompt, dict) and set(prompt) == {"prompt"} and isinstance(prompt["prompt"], str):
            prompt = prompt["prompt"]  # vLLM's TextPrompt: the text itself (its segments included)
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise ValueError(f"request {request_id}: cache_salt must be a non-empty string, got {cache_salt!r}")
        segmented = self._segmented_prompt(prompt, request_id, any(x is not None for x in (mode, seam, cold_policy)))
        if segmented is not None:
            policy = self.pic.resolve(mode=mode, seam=seam, cold_policy=cold_policy)
            prompt_text = prompt if isinstance(prompt, str) else None
            # keyed once (keying hashes every token): for the scheduler charge and the plan
            keys = (segment_keys(segmented, policy, self.keyer, cache_salt)
                    if policy.mode.uses_segment_store else None)
            pic = PicState(segmented, policy, self._expected_live_tokens(segmented, policy, keys),
                           tenant_salt=cache_salt, segment_keys=keys)
            if sampling_params.prompt_logprobs is not None:
                pic = None  # every token's logits are read: the segments' tokens prefilled in full
            request = Request(request_id, list(segmented.token_ids), sampling_params, prompt=prompt_text, pic=pic,
                              cache_salt=cache_salt)
        else:
            prompt_text, prompt_ids = self._prompt_token_ids(prompt, request_id)
            request = Request(request_id, prompt_ids, sampling_params, prompt=prompt_text, cache_salt=cache_salt)
        self.scheduler.check_request(request)
        room = self.max_model_len - request.num_prompt_tokens
        if sampling_params.max_tokens is None:
            if room < 1:
                raise ValueError(f"request {request_id}: the prompt has {request.num_prompt_tokens} tokens and "
                                 f"max_model_len={self.max_model_len} leaves no room for a generated token")
            sampling_params = dataclasses.replace(sampling_params, max_tokens=room)
            request.sampling_params = sampling_params
        elif sampling_params.max_tokens > room:
            # Refused rather than clamped: a request never decodes more than it asked for, nor
            # silently less (the server defaults an omitted max_tokens to the room left).
            raise ValueError(
                f"request {request_id}: max_tokens={sampling_params.max_tokens} does not fit: the prompt has "
                f"{request.num_prompt_tokens} tokens and max_model_len={self.max_model_len} leaves room for "
                f"{room} generated tokens"
            )
        if (start_after is not None and request.pic is None and self.prefix_block_tokens is not None
                and sampling_params.prompt_logprobs is None):
            sibling = self.scheduler.find(start_after)
            if sibling is not None and sibling.prompt_token_ids == request.prompt_token_ids:
                request.waits_for = sibling
        seed = sampling_params.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_generator))
        request.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.scheduler.add(request)
        return request_id

    def _segmented_prompt(self, prompt, request_id: str, overridden: bool) -> SegmentedPrompt | None:
        """The prompt's segments when it is a PIC request, else None (plain path)."""
        if isinstance(prompt, dict) and "segments" in prompt:
            pieces = prompt["segments"]
        elif isinstance(prompt, str) and (PIC_SEP in prompt or self.pic.every_prompt or overridden):
            pieces = prompt
        elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(p, (str, list, tuple)) for p in prompt):
            pieces = list(prompt)
        elif (self.pic.every_prompt or overridden) and not isinstance(prompt, dict):
            pieces = [self._prompt_token_ids(prompt, request_id)[1]]  # token ids: one query piece
        else:
            return None
        encode = self.tokenizer.encode if self.tokenizer is not None else None
        try:
            return build_segmented_prompt(pieces, encode=encode, vocab_size=self.spec.vocab_size)
        except ValueError as e:
            raise ValueError(f"request {request_id}: {e}") from None

    def _expected_live_tokens(self, prompt: SegmentedPrompt, policy, keys) -> int:
        """Scheduler charge of a PIC request: its tokens minus the bodies already stored (by
        their store ``keys``), plus the standalone pass over cold segments that writes canonical
        entries (``canonical``)."""
        if keys is None:
            return prompt.num_tokens
        canonical = policy.cold_policy == COLD_CANONICAL
        live = len(prompt.query)
        for seg, key in zip(prompt.segments, keys):
            w = policy.live_tokens(len(seg))
            hit = key is not None and key in self.store
            live += w if hit else len(seg)
            if canonical and not hit and w < len(seg):
                live += len(seg)
        return live

    def segment_cache_stats(self) -> StoreStats:
        """Segment-store counters: hits, misses, bytes per tier, evictions, spills, ..."""
        return self.store.stats()

    def _prompt_token_ids(self, prompt, request_id: str) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):  # vLLM's TextPrompt / TokensPrompt dicts
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                if isinstance(ids, str):
                    raise ValueError(f"request {request_id}: prompt_token_ids must be a list of ints")
                return prompt.get("prompt"), self._prompt_token_ids(ids, request_id)[1]
            if "prompt" in prompt:
                return self._prompt_token_ids(prompt["prompt"], request_id)
            raise ValueError(f"request {request_id}: a dict prompt needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"request {request_id}: text prompt but {self.model_path} has no tokenizer.json; pass token ids")
            ids = self.tokenizer.encode(prompt)
            text = prompt
        elif isinstance(prompt, (list, tuple)):
            ids, text = list(prompt), None
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise ValueError(f"request {request_id}: token-id prompt must be a list of ints")
        else:
            raise ValueError(f"request {request_id}: prompt must be a str or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise ValueError(f"request {request_id}: prompt is empty")
        vocab = self.spec.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"request {request_id}: token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        return text, ids

    def abort_request(self, request_id: str) -> bool:
        request = self.scheduler.abort(request_id)
        if request is None:
            return False
        request.cache = None
        self._release_prefix_plan(request)
        if request.pic_stages is not None:
            request.pic_stages.release()
        return True

    def _stage_pic(self, request: Request) -> None:
        """The scheduler's hook (first scheduling of a PIC request): its staged prefill where its
        cold segments exceed a step (:mod:`hypic.engine.pic_stages`)."""
        request.pic_stages = plan_stages(request.pic, self.store, self.scheduler.config.max_num_batched_tokens)

    def _lookup_prefix(self, request: Request) -> int:
        """The scheduler's hook (first scheduling of a request prefilled in chunks): the prefix
        cache's plan of the request's prompt, kept on the request for its chunks (holding the
        checkpoints it found until its first chunk has run); returns the tokens they cover."""
        prompt = SegmentedPrompt((), tuple(request.prompt_token_ids))
        plan = plan_request(prompt, self.pic.resolve(), store=self.store, keyer=self.keyer,
                            max_model_len=self.max_model_len, tenant_salt=request.cache_salt,
                            request_id=request.request_id, prefix_block_tokens=self.prefix_block_tokens)
        request.prefix_plan = plan
        request.metrics.prefix_hit_tokens = plan.prefix_tokens
        return plan.prefix_tokens

    @staticmethod
    def _release_prefix_plan(request: Request) -> None:
        if request.prefix_plan is not None:
            request.prefix_plan.release()
            request.prefix_plan = None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_unfinished_requests(self) -> int:
        return self.scheduler.num_unfinished

    # ---- the loop --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduled batch; returns an output for every request that got a token."""
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        token_ids, logprobs = self._run(batch)
        updated = self.scheduler.postprocess(batch, token_ids, logprobs)
        if batch.is_prefill:
            self.stats.num_prefill_steps += 1
            self.stats.num_prefill_tokens += batch.num_tokens
        else:
            self.stats.num_decode_steps += 1
            self.stats.num_decode_tokens += batch.num_tokens
        outputs = []
        for request in updated:
            if request.prefix_plan is not None and request.num_computed_tokens >= request.num_prompt_tokens:
                self._release_prefix_plan(request)  # prefilled: its checkpoints are written
            if request.is_finished:
                request.cache = None  # release the K/V and recurrent state now
            outputs.append(RequestOutput.from_request(request))
        return outputs

    @torch.inference_mode()
    def _run(self, batch: ScheduledBatch) -> tuple[list[int], list | None]:
        """The step's forward and sampling: one token per sampling request, and their
        ``{token_id: Logprob}`` where requested (None when no request of the batch asked).
        Prefills run through the PIC runner: segmented prompts (whole) and, with the prefix
        cache, every other prompt (chunk by chunk); the rest (decode steps, prefills without the
        prefix cache) through the plain context."""
        pic = [i for i, r in enumerate(batch.requests)
               if batch.is_prefill and (r.atomic_prefill or r.prefix_plan is not None)]
        plain = [i for i in range(len(batch.requests)) if i not in set(pic)]
        rows: dict[int, torch.Tensor] = {}
        if pic:
            rows.update(self._run_pic(batch, pic))
        if plain:
            rows.update(self._run_plain(batch, plain))
        sampling = [i for i, s in enumerate(batch.samples) if s]
        if not sampling:
            return [], None
        logits = torch.stack([rows[i] for i in sampling])
        requests = [batch.requests[i] for i in sampling]
        params = [r.sampling_params for r in requests]
        sample_logits = logits  # log-probabilities stay the raw distribution's (vLLM's default)
        if any(needs_processing(p) for p in params):
            sample_logits = process_logits(logits, params, [r.prompt_token_ids for r in requests],
                                           [r.output_token_ids for r in requests], self.eos_token_ids)
        tokens = sample(sample_logits, params, [r.generator for r in requests])
        asked = [j for j, r in enumerate(requests) if r.sampling_params.logprobs is not None]
        if not asked:
            return tokens.tolist(), None
        index = torch.tensor(asked, device=logits.device)
        rows_logprobs = token_logprobs(logits.index_select(0, index), tokens.index_select(0, index),
                                       [requests[j].sampling_params.logprobs for j in asked])
        logprobs: list = [None] * len(requests)
        for j, row in zip(asked, rows_logprobs):
            logprobs[j] = row
        return tokens.tolist(), logprobs

    def _run_plain(self, batch: ScheduledBatch, indices: list[int]) -> dict[int, torch.Tensor]:
        requests = [batch.requests[i] for i in indices]
        for request in requests:
            if request.cache is None:
                request.cache = SequenceCache.allocate(self.spec, self.device, self.dtype)
        input_ids: list[int] = []
        logits_rows: list[int] = []
        sampled: list[int] = []
        # (request, target token ids) of the rows that score prompt tokens (prompt_logprobs),
        # in logits_rows order before the sampled rows
        scored: list[tuple[Request, list[int]]] = []
        ends: dict[int, int] = {}
        for i, r in zip(indices, requests):
            base = len(input_ids)
            input_ids.extend(batch.token_ids(i))
            ends[i] = len(input_ids)
            if batch.is_prefill and r.prompt_logprobs is not None:
                # the row at position p scores prompt token p + 1
                start = batch.start_positions[i]
                end = min(start + batch.num_scheduled_tokens[i], r.num_prompt_tokens - 1)
                if end > start:
                    logits_rows.extend(range(base, base + end - start))
                    scored.append((r, r.prompt_token_ids[start + 1:end + 1]))
        num_scored = len(logits_rows)
        for i in indices:
            if batch.samples[i]:
                logits_rows.append(ends[i] - 1)
                sampled.append(i)
        for i, r in zip(indices, requests):
            if batch.start_positions[i] != r.cache.num_tokens:
                raise RuntimeError(f"request {r.request_id}: scheduled at {batch.start_positions[i]}, cache holds "
                                   f"{r.cache.num_tokens} tokens")
        # Positions continue each cache (the context's default), which lets attention run causal
        # by index.
        ctx = PlainContext(
            self.spec,
            [r.cache for r in requests],
            [batch.num_scheduled_tokens[i] for i in indices],
            logits_rows=torch.tensor(logits_rows, dtype=torch.long, device=self.device),
        )
        ctx.graphs = self.pic_runner.graphs  # one set of captured blocks for both paths
        logits = self.model(torch.tensor(input_ids, dtype=torch.long, device=self.device), ctx.positions, ctx)
        if scored:
            self._score_prompt(logits[:num_scored], scored)
        return dict(zip(sampled, logits[num_scored:]))

    def _score_prompt(self, logits: torch.Tensor, scored) -> None:
        """Append each scored request's prompt-token log-probabilities (``logits`` rows in order)."""
        targets = torch.tensor([t for _, ids in scored for t in ids], device=logits.device)
        num_top = [r.sampling_params.prompt_logprobs for r, ids in scored for _ in ids]
        rows = iter(token_logprobs(logits, targets, num_top))
        for request, ids in scored:
            request.prompt_logprobs.extend(self.scheduler.decoded(next(rows)) for _ in ids)

    def _run_pic(self, batch: ScheduledBatch, indices: list[int]) -> dict[int, torch.Tensor]:
        """One PIC-runner forward over the batch's requests ``indices``: segmented prompts
        planned and prefilled whole, chunks of prefix-cached prompts (their plan made when they
        were first scheduled) from where their previous chunk ended; before it, the stages of
        staged segmented prompts (:mod:`hypic.engine.pic_stages`: no forward of their own, no
        logits)."""
        for i in indices:
            stages = batch.requests[i].pic_stages
            if stages is not None and stages.next_count:  # the scheduler picked a stage
                run_stage(stages, self.pic_runner, self.store)
        indices = [i for i in indices if batch.samples[i] or not batch.requests[i].atomic_prefill]
        requests = [batch.requests[i] for i in indices]
        plans, windows, owned = [], [], []
        try:
            for i, r in zip(indices, requests):
                if r.atomic_prefill:
                    pic = r.pic
                    plan = plan_request(
                        pic.prompt, pic.policy, store=self.store, keyer=self.keyer,
                        max_model_len=self.max_model_len, tenant_salt=pic.tenant_salt,
                        request_id=r.request_id, segment_keys=pic.segment_keys,
                        prefix_block_tokens=self.prefix_block_tokens,
                    )
                    owned.append(plan)
                    windows.append(None)
                else:
                    plan = r.prefix_plan
                    start, end = batch.start_positions[i], batch.start_positions[i] + batch.num_scheduled_tokens[i]
                    resume = None
                    if start > plan.prefix_tokens:
                        resume = resume_entry(r.cache, self.spec, self.keyer.namespace, r.prompt_token_ids[:start])
                    windows.append(ChunkWindow(start, end, resume))
                plans.append(plan)
            results = self.pic_runner.prefill(plans, windows) if plans else []
        finally:
            for plan in owned:
                plan.release()
            for r in requests:
                if r.pic_stages is not None:  # its own forward ran (or failed): unpin its entries
                    r.pic_stages.release()
        out = {}
        for i, r, plan, window, res in zip(indices, requests, plans, windows, results):
            r.cache = res.cache
            if window is None:
                stages = r.pic_stages
                r.metrics.cached_tokens = own_cached_tokens(plan, stages)
                r.metrics.prefix_hit_tokens = plan.prefix_hit_tokens
                r.metrics.live_tokens = (plan.live_tokens + plan.standalone_tokens
                                         + (stages.standalone_tokens if stages is not None else 0))
            else:
                plan.release_prefix()  # its K/V is in the request's cache now
                r.metrics.live_tokens = (r.metrics.live_tokens or 0) + res.live_tokens
            if res.logits is not None:
                out[i] = res.logits
        return out
