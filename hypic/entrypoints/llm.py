"""Offline API: ``hypic.LLM(model=...).generate(prompts, sampling_params)`` as in vLLM."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any, Sequence

from hypic.config import EngineConfig
from hypic.engine.engine import LLMEngine
from hypic.engine.outputs import RequestOutput
from hypic.engine.sampling import SamplingParams
from hypic.pic.segments import PIC_SEP, build_segmented_prompt, split_chat_template

Prompt = str | list[int] | dict


class LLM:
    """Generate completions for a batch of prompts with continuous batching.

    >>> llm = LLM(model="tiny", seed=0)  # trained on hypic.data's suites: prompts in their vocabulary
    >>> out = llm.generate(["<sep> this passage is about kolton . kolton lives in santon . <sep> question : "
    ...                     "where does kolton live ? answer :", "the mentor of kolton is"],
    ...                    SamplingParams(temperature=0, max_tokens=8))
    >>> out[0].outputs[0].text, out[0].outputs[0].finish_reason, out[0].metrics.ttft

    Keywords: every field of :class:`~hypic.config.EngineConfig` by its flat name
    (:data:`hypic.config.ENGINE_OPTIONS`: model, dtype, device, seed, load_format, max_model_len,
    pic_mode, seam, seam_min_tokens, seam_max_tokens, pic_segment_min_tokens, cold_policy,
    max_num_batched_tokens, max_num_seqs, segment_cache_bytes, host_cache_bytes, enable_prefix_caching,
    prefix_block_tokens, segment_cache_dir, disk_cache_bytes, segment_workers, segment_devices,
    segment_assignment, segment_group_tokens, segment_start_timeout_s, segment_reply_timeout_s,
    enforce_eager, moe_backend), or an ``EngineConfig`` as the only argument. ``pic_mode`` None: segment
    caching, in mode hypic, only for prompts that carry segments (``<<PIC_SEP>>`` text or
    ``{"segments": [...]}``); a mode name applies to every prompt.
    """

    def __init__(self, model: str | Path | EngineConfig = "tiny", **kwargs: Any) -> None:
        self.llm_engine = LLMEngine(model, **kwargs)
        self._request_counter = 0
        # One generate() at a time: the engine is stepped by the calling thread, so concurrent
        # callers would step each other's requests and race on the scheduler's queues. Several
        # threads are served one after another (hypic.engine.async_engine multiplexes instead).
        self._generate_lock = threading.Lock()

    def shutdown(self) -> None:
        """Stop the engine's segment workers (``segment_workers > 1``) and write what is queued
        for the segment store's disk tier (``segment_cache_dir``); idempotent."""
        self.llm_engine.shutdown()

    def segment_cache_stats(self):
        """Segment-store counters (hits, misses, bytes per tier, evictions, ...)."""
        return self.llm_engine.segment_cache_stats()

    def reset_prefix_cache(self) -> int:
        """Drop every cached entry no running request holds: prefix-cache checkpoints and
        segment entries, in every tier, the disk tier's files too (the server's ``/flush_cache``).
        Returns how many were dropped. Waits for a ``generate`` running in another thread."""
        with self._generate_lock:
            return self.llm_engine.store.clear()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        pic_mode: str | None = None,
        seam: int | float | None = None,
        cold_policy: str | None = None,
        cache_salt: str | None = None,
    ) -> list[RequestOutput]:
        """One :class:`RequestOutput` per prompt, in prompt order. Safe to call from several
        threads on one LLM (calls run one after another).

        prompts: a string, a list of token ids, a vLLM-style dict (``{"prompt": ...}`` or
        ``{"prompt_token_ids": ...}``), or a list of any of these.
        sampling_params: one for all prompts, or a list with one per prompt (default:
        ``SamplingParams()``). Every prompt is validated before any runs: a bad one raises
        ValueError naming its index and nothing is generated. A prompt with segments is text with
        ``<<PIC_SEP>>`` between them or ``{"segments": [seg, ..., query]}``; ``pic_mode``, ``seam``
        and ``cold_policy`` override the engine's segment-caching settings for this call.
        ``cache_salt``: the tenant of every prompt of the call (a dict prompt may carry its own
        ``"cache_salt"`` instead): cache entries written under one salt never serve another.
        """
        prompt_list = _normalize_prompts(prompts)
        params_list = _normalize_params(sampling_params, len(prompt_list))
        with self._generate_lock:
            return self._generate(prompt_list, params_list, use_tqdm, pic_mode, seam, cold_policy, cache_salt)

    def _generate(self, prompt_list, params_list, use_tqdm, pic_mode, seam, cold_policy,
                  cache_salt) -> list[RequestOutput]:
        engine = self.llm_engine
        groups: list[tuple[str, list[str]]] = []  # per prompt: its id and its completions' requests
        request_ids: list[str] = []
        try:
            for i, (prompt, params) in enumerate(zip(prompt_list, params_list)):
                parent_id = f"gen-{self._request_counter}"
                self._request_counter += 1
                children = [parent_id] if params.n == 1 else [f"{parent_id}-{k}" for k in range(params.n)]
                for k, request_id in enumerate(children):
                    try:
                        # completions 1..n-1 may start after completion 0 (LLMEngine.add_request)
                        engine.add_request(prompt, _completion_params(params, k), request_id=request_id,
                                           mode=pic_mode, seam=seam, cold_policy=cold_policy, cache_salt=cache_salt,
                                           start_after=children[0] if k else None)
                    except ValueError as e:
                        raise ValueError(f"prompt {i}: {e}") from e
                    request_ids.append(request_id)
                groups.append((parent_id, children))
        except ValueError:
            for request_id in request_ids:  # leave the engine as we found it
                engine.abort_request(request_id)
            raise
        finished = dict(zip(request_ids, self._run_engine(request_ids, use_tqdm)))
        return [_merge(parent_id, [finished[c] for c in children]) for parent_id, children in groups]

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        cache_salt: str | None = None,
    ) -> list[RequestOutput]:
        """Apply the checkpoint's chat template to one conversation (a list of messages) or a
        list of conversations, then :meth:`generate` (``cache_salt`` as there)."""
        tokenizer = self.get_tokenizer()
        if tokenizer is None:
            raise ValueError("chat needs a tokenizer, and this model folder has none")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        conversations = messages if isinstance(messages[0], list) else [messages]
        prompts = [chat_prompt(tokenizer, c, add_generation_prompt) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, cache_salt=cache_salt)

    def _run_engine(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        pending = set(request_ids)
        finished: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm and len(request_ids) > 1:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(request_ids), desc="Generating", unit="req", dynamic_ncols=True)
        try:
            while pending:
                for output in engine.step():
                    if output.finished and output.request_id in pending:
                        pending.discard(output.request_id)
                        finished[output.request_id] = output
                        if bar is not None:
                            bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            for request_id in pending:  # interrupted: do not leave orphans in the engine
                engine.abort_request(request_id)
        return [finished[r] for r in request_ids]


def _completion_params(params: SamplingParams, index: int) -> SamplingParams:
    """The settings of completion ``index`` of ``params.n``: one completion, seeded seed + index."""
    if params.n == 1:
        return params
    return dataclasses.replace(params, n=1, seed=None if params.seed is None else params.seed + index)


def _merge(request_id: str, outputs: list[RequestOutput]) -> RequestOutput:
    """One prompt's RequestOutput from its completions' (vLLM's shape: ``outputs[k].index == k``);
    timings are the first completion's, generated tokens the sum."""
    if len(outputs) == 1:
        return outputs[0]
    first = outputs[0]
    completions = [dataclasses.replace(o.outputs[0], index=k) for k, o in enumerate(outputs)]
    metrics = dataclasses.replace(first.metrics, generation_tokens=sum(o.metrics.generation_tokens for o in outputs))
    return RequestOutput(request_id=request_id, prompt=first.prompt, prompt_token_ids=first.prompt_token_ids,
                         outputs=completions, finished=all(o.finished for o in outputs), metrics=metrics)


def chat_prompt(tokenizer, conversation: list[dict[str, Any]], add_generation_prompt: bool = True):
    """The prompt of a templated conversation: token ids, or, when the last message's content
    holds ``<<PIC_SEP>>`` segments, ``{"segments": [...]}`` whose segments keep the tokens they
    have anywhere else: the template text before the content is its own first segment, the text
    after it (end of turn, assistant header) is appended to the query."""

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    last = conversation[-1] if conversation and isinstance(conversation[-1], dict) else {}
    content = last.get("content")
    if not (isinstance(content, str) and PIC_SEP in content):
        return encode(tokenizer.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt))

    def render(text: str) -> str:
        turn = dict(last, content=text)
        return tokenizer.apply_chat_template(conversation[:-1] + [turn], add_generation_prompt=add_generation_prompt)

    parts = split_chat_template(render, encode)
    segmented = build_segmented_prompt(content, encode=encode, template=parts)
    return {"segments": [list(seg) for seg in segmented.segments] + [list(segmented.query)]}


def _is_token_ids(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and bool(x) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in x
    )


def _normalize_prompts(prompts) -> list[Prompt]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if _is_token_ids(prompts):
        return [list(prompts)]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a str, a list of str, token ids, or a list of token-id lists (non-empty)")
    out: list[Prompt] = []
    for i, p in enumerate(prompts):
        if isinstance(p, (str, dict)):
            out.append(p)
        elif _is_token_ids(p):
            out.append(list(p))
        else:
            raise ValueError(f"prompt {i}: must be a str, a dict or a non-empty list of token ids, got {p!r:.80}")
    return out


def _normalize_params(sampling_params, num_prompts: int) -> list[SamplingParams]:
    if sampling_params is None:
        return [SamplingParams()] * num_prompts
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * num_prompts
    params = list(sampling_params)
    if len(params) != num_prompts:
        raise ValueError(f"sampling_params has {len(params)} entries for {num_prompts} prompts")
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise ValueError(f"sampling_params[{i}] must be SamplingParams, got {type(p).__name__}")
    return params
