"""ForwardContext of a PIC forward: live tokens of many requests, cached bodies spliced in.

Per linear layer (architecture.md section 2): the state entering each live element is what its
request's chain (live elements and cached bodies' summaries, in prompt order) reaches there, and
the live elements run from those states. The reference forms (a) the zero-start summaries of all
live elements, (b) scans each chain, (c) runs a varlen forward from the scanned states; on CUDA
one call walks every chain (``gated_delta_chain_forward``; with store writes
``gated_delta_chain_forward_and_summarize``, which also forms the live summaries a segment entry
stores and the states a checkpoint stores). The short conv
runs over maximal runs of live elements, each warmed up from the true preceding tail (a cached
body's stored tail, the prefix checkpoint, or zeros).

A linear layer of a scalar-decay family (lightning attention: Ring-linear, MiniMax) has no conv
and a scalar T per head: the same chains run through ``simple_gla_chain_forward``, the cached
bodies' summaries given as stored (through the layout's address table where it has one) and,
where the layer's keys carry RoPE and the mode re-rotates, the RoPE tables of each body's shift,
with which the op moves S to the body's new position, ``S' = R(shift) S`` on the key axis
(:func:`hypic.ops.rope.rotate_summary_keys`); T, a scalar, commutes with the rotation. A cached
request's core is then one walk that reads nothing back to the host, graphed like the
gated-delta chain core.

Per full-attention layer: each request's keys are its prefix checkpoints' K, its live K and its
cached bodies' K (re-rotated by the shift between where the body was cached and where it now
sits, unless the mode keeps it as cached), gathered once into a packed varlen key set (one pass
over K and one over V on CUDA: :mod:`hypic.ops.kv_gather`); live queries attend by absolute
position.

What the runner needs afterwards (final states, conv tails, K/V, summaries of written elements)
is recorded per layer in :attr:`PicContext.records`.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Dict, List, Optional

import torch

from hypic.engine.context import ForwardContext
from hypic.graphs.layer_graphs import LayerReplays
from hypic.runner.layout import PackedLayout
from hypic.models.config import ModelSpec
from hypic.ops.attention import varlen_attention
from hypic.ops.conv import causal_conv1d, conv_tails
from hypic.ops.kv_gather import gather_kv
from hypic.ops.linear.gated_delta import (
    gated_delta_chain_forward,
    gated_delta_chain_forward_and_summarize,
    gated_delta_forward,
)
from hypic.ops.linear.checks import on_device
from hypic.ops.linear.low_rank import LowRankSummary, gated_delta_low_rank_summarize
from hypic.ops.linear.simple_gla import simple_gla_chain_forward, simple_gla_chain_walk_takes, simple_gla_forward
from hypic.ops.linear.summary import DenseSummary, ScalarSummary, SummaryTable


ROPE_CACHE_MAX_TOKENS = 8192  # live tokens up to which a template keeps the RoPE tables


class LinearRecord:
    """What one linear layer leaves behind for the runner."""

    def __init__(self) -> None:
        self.tails: Optional[torch.Tensor] = None  # [NT, D, W-1] conv inputs before each tail end (None: no conv)
        self.final_states: Optional[torch.Tensor] = None  # [B, HV, K, V]
        self.write_summaries = None  # one summary per segment write (or part of one): Dense or Scalar
        self.write_states: Optional[torch.Tensor] = None  # [NW, HV, K, V] state after each write
        self.low_rank_summaries: Optional[list] = None  # per factored segment write (layout.low_rank_writes)


class AttentionRecord:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys = keys  # [Tk, Hkv, D] every request's keys in position order (packed)
        self.values = values


class PicContext(ForwardContext):
    def __init__(self, spec: ModelSpec, layout: PackedLayout) -> None:
        self.spec = spec
        self.layout = layout
        self.records: Dict[int, object] = {}
        self._shift_cos_sin = None
        self._zero_tail: Optional[torch.Tensor] = None
        self._run_sources: Optional[list] = None  # per conv run: (entry, field) or None
        # linear layer -> its runs' initial conv states [R, D, W-1], every layer's made by one
        # stack at the first (_batched_run_tails); empty when they are stacked per layer
        self._batched_tails: Optional[Dict[int, torch.Tensor]] = None
        # Set by the runner when the linear cores may be replayed from per-forward graphs
        # (a cached request's few live tokens: hypic.graphs.layer_graphs).
        self.replays: Optional[LayerReplays] = None
        # Set by the runner for a forward with writes (hypic.runner.entry_writer.EntryWriter):
        # told when each layer's records are complete, it fills the store entries from them
        # (and hands a cold forward's layers the entries' rows to write their summaries into).
        self.writer = None
        # per body: RoPE shift of its summaries (False: none moves); made at the first layer
        self._body_shifts = None
        # ((key rotary, dtype), (cos, sin)) of the bodies' shifts (_body_rotation)
        self._rotations = None

    @property
    def positions(self) -> torch.Tensor:
        return self.layout.positions

    # -- short conv -----------------------------------------------------------------------------
    def _run_initial_conv_states(self, layer_idx: int, x: torch.Tensor, width: int) -> torch.Tensor:
        lay = self.layout
        zero = self._zero_tail
        if zero is None or zero.shape != (x.shape[1], width - 1) or zero.device != x.device:
            # one zero tail for every layer of the forward (it is only read)
            zero = self._zero_tail = torch.zeros(x.shape[1], width - 1, dtype=_state_dtype(x), device=x.device)
            self._batched_tails = None
        if self._run_sources is None:
            # Per run, once per forward: the entry its tail comes from and the field (every linear
            # layer walks the same runs; the lookups through the layout cost more host time than
            # the stack below).
            sources = []
            for kind, idx in lay.run_init:
                if kind == "body":
                    sources.append((lay.bodies[idx][1].entry, "conv_tail"))
                elif kind == "prefix":
                    sources.append((lay.requests[idx].prefix[-1], "conv_state"))
                else:
                    sources.append(None)
            self._run_sources = sources
        if self._batched_tails is None:
            self._batched_tails = _batched_run_tails(self._run_sources, self.spec.linear_layer_ids, zero) or {}
        batched = self._batched_tails.get(layer_idx)
        if batched is not None:
            return batched.to(x.dtype)
        tails = [zero if src is None else getattr(src[0].linear[layer_idx], src[1]) for src in self._run_sources]
        # One batched copy per layer rather than one small copy per run.
        return torch.stack(tails).to(x.dtype)

    def short_conv(self, layer_idx, x, weight, bias):
        init = self._run_initial_conv_states(layer_idx, x, weight.shape[1])
        rec = self.records.setdefault(layer_idx, LinearRecord())
        if self.replays is None:
            y, rec.tails = self._conv_core(x, weight, bias, init)
            return y
        # x: the row-wise phase's output buffer when those phases are graphs
        y, tails = self.replays.run("short_conv", self._conv_core, x, weight, bias, init,
                                    stable=(0,) if self.graphs is not None else ())
        rec.tails = tails.clone()  # the graph's buffer: the next layer's replay rewrites it
        return y

    def _conv_core(self, x, weight, bias, init):
        """The conv over the layout's runs and the tails recorded (a function of its inputs and
        the layout alone, so a graph of it serves every linear layer of the forward)."""
        lay = self.layout
        y, _ = causal_conv1d(x, weight, bias, cu_seqlens=lay.cu_runs, initial_state=init, activation="silu",
                             cu_seqlens_cpu=lay.cu_runs_cpu, output_final_state=False)
        # Tails: the last W-1 conv inputs before each recorded end (writes, then each request's
        # end), [N, D, W-1] contiguous: each write's tail is then a dense view, which the batched
        # copy of the store writes takes on its fast path.
        return y, conv_tails(x, init, lay.tail_index, _state_dtype(x))

    # -- linear attention -----------------------------------------------------------------------
    def _body_summaries(self, layer_idx: int, device: torch.device, dtype: torch.dtype):
        """The cached bodies' summaries in body order. The scan reads live and body elements
        through the layout's ``chain_source`` table, so nothing is copied into a chain: with the
        layout's address table the bodies are read where the store holds them; otherwise (a body
        not fp32 on the device, `addition` mode, which puts the identity in place of a body's T)
        one concatenation per field, converting a body only when it must."""
        lay = self.layout
        if lay.body_addresses is not None:
            # the GPU scan touches only the first item (its dtype and shape)
            summaries = _LazyItems(lay.bodies, lambda body: body[1].entry.linear[layer_idx].summary)
            return SummaryTable(summaries, lay.body_addresses[layer_idx])
        items = [body.entry.linear[layer_idx].summary for _, body in lay.bodies]
        if not any(lay.body_drop_transition_host) and any(isinstance(x, LowRankSummary) for x in items):
            if device.type == "cpu":
                # the reference scan applies factored bodies as they are (hypic.ops.linear.low_rank)
                return [x if isinstance(x, LowRankSummary) else x.unpacked() for x in items]
            # the GPU walk reads dense T: the factored bodies are formed for this forward
            dense = [x.dense() if isinstance(x, LowRankSummary) else x.unpacked() for x in items]
            return DenseSummary(torch.cat([on_device(x.transition, device, dtype) for x in dense]),
                                torch.cat([on_device(x.state, device, dtype) for x in dense]))
        eye = None
        transitions, states = [], []
        for idx, (_, body) in enumerate(lay.bodies):
            summ = body.entry.linear[layer_idx].summary
            if lay.body_drop_transition_host[idx]:
                if eye is None:
                    key_dim, num_heads = self.spec.linear_key_head_dim, self.spec.linear_num_value_heads
                    eye = torch.eye(key_dim, dtype=dtype, device=device).expand(1, num_heads, key_dim, key_dim)
                transitions.append(eye)
            else:
                transitions.append(on_device(summ.transition, device, dtype))
            states.append(on_device(summ.state, device, dtype))
        return DenseSummary(torch.cat(transitions), torch.cat(states))

    def _initial_states(self, layer_idx: int, v: torch.Tensor) -> Optional[torch.Tensor]:
        """Per request, the linear state its chain starts from: the last prefix checkpoint's, or
        zeros; None when no request has a prefix."""
        lay = self.layout
        if not any(lay.chain_has_prefix):
            return None
        num_heads, key_dim, value_dim = self.spec.linear_num_value_heads, self.spec.linear_key_head_dim, v.shape[-1]
        dtype = _state_dtype(v)
        zero = torch.zeros(num_heads, key_dim, value_dim, dtype=dtype, device=v.device)
        states = [req.prefix[-1].linear[layer_idx].state if req.prefix else zero for req in lay.requests]
        return torch.stack([on_device(s, v.device, dtype) for s in states])

    def linear_attention(self, layer_idx, q, k, v, g, beta):
        lay = self.layout
        init = self._initial_states(layer_idx, v)
        if lay.linear_one_run_per_request:
            # Nothing cached and nothing to record: a plain varlen forward over each request's
            # live tokens (a cold full_recompute prefill pays no summaries and no scan).
            o, final = gated_delta_forward(q, k, v, g, beta, cu_seqlens=lay.cu_live_per_request, initial_state=init,
                                           cu_seqlens_cpu=lay.cu_live_per_request_cpu)
            self.records.setdefault(layer_idx, LinearRecord()).final_states = final
            return o
        rec = self.records.setdefault(layer_idx, LinearRecord())
        bodies = self._body_summaries(layer_idx, v.device, _state_dtype(v)) if lay.bodies else None
        source = lay.chain_source if lay.bodies else None
        if not lay.writes:
            # Nothing to record but the final states: the live spans' summaries are never formed
            # (the GPU path fuses the scan with their state pass).
            if (self.replays is not None and q.is_cuda
                    and (bodies is None or getattr(bodies, "addresses", None) is not None)):
                addresses = None if bodies is None else bodies.addresses

                def core(q, k, v, g, beta, addresses, init):
                    # On CUDA the bodies are read through the address table alone (the table's
                    # items give only their dtype and shape), so one graph serves every layer,
                    # the layer's table an input. The CPU reference stacks the items: no graph.
                    table = None if addresses is None else SummaryTable(bodies.items, addresses)
                    return gated_delta_chain_forward(
                        q, k, v, g, beta, cu_seqlens=lay.cu_spans, cu_chains=lay.cu_chains, source=source,
                        bodies=table, initial_states=init, cu_seqlens_cpu=lay.cu_spans_cpu)

                o, final = self.replays.run("chain_forward", core, q, k, v, g, beta, addresses, init,
                                            stable=(0, 1, 2, 3, 4) if self.graphs is not None else ())
                rec.final_states = final.clone()  # the graph's buffer: the next replay rewrites it
                return o
            o, rec.final_states = gated_delta_chain_forward(
                q, k, v, g, beta, cu_seqlens=lay.cu_spans, cu_chains=lay.cu_chains, source=source, bodies=bodies,
                initial_states=init, cu_seqlens_cpu=lay.cu_spans_cpu)
            return o
        # A forward that writes to the store: one walk of every chain (live spans of any length
        # chunk by chunk on CUDA), the live spans' zero-start summaries beside it only when a
        # segment entry needs them, and only the states checkpoints read recorded.
        checkpoints = lay.num_checkpoint_records > 0
        # A cold forward's segment writes: the op writes their summaries straight into the store
        # entries' rows (hypic/runner/entry_writer.py), nothing copied after the forward. Not
        # with cached bodies: that forward's core may be a graph, replayed by every layer, and
        # its few written spans' rows are copied with the rest after the forward.
        targets = None
        if self.writer is not None and bodies is None and lay.any_segment_write:
            targets = self.writer.summary_targets(layer_idx, v.shape[1], k.shape[2], v.shape[2], v.device)

        def write_core(q, k, v, g, beta, bodies, init):
            return gated_delta_chain_forward_and_summarize(
                q, k, v, g, beta, cu_seqlens=lay.cu_spans, cu_chains=lay.cu_chains, source=source, bodies=bodies,
                initial_states=init, cu_seqlens_cpu=lay.cu_spans_cpu, summarize=lay.any_segment_write,
                # a cold prefill's writes are a run of spans: their summaries are then views
                summary_spans=lay.write_span_range if lay.write_span_range is not None else lay.write_spans,
                summary_spans_host=lay.write_spans_host if lay.any_segment_write else None,
                record_rows=lay.checkpoint_record_rows if checkpoints else None,
                num_records=lay.num_checkpoint_records if checkpoints else None, summary_out=targets)

        if (self.replays is not None and q.is_cuda and bodies is not None
                and getattr(bodies, "addresses", None) is not None):
            # A cached request with a few missed segments (a RAG request): its few live tokens
            # make the layer host-bound, as without writes, so the core is a graph too. Only with
            # cached bodies: a cold forward's summaries come from a side-stream launch
            # (hypic/ops/linear/_fla_chain.py), which is not captured. Its outputs are the graph's
            # buffers, rewritten by the next layer's replay: the records keep copies.
            def core(q, k, v, g, beta, addresses, init):
                return write_core(q, k, v, g, beta, SummaryTable(bodies.items, addresses), init)

            o, final, live, incoming = self.replays.run(
                "chain_forward_writes", core, q, k, v, g, beta, bodies.addresses, init,
                stable=(0, 1, 2, 3, 4) if self.graphs is not None else ())
            final = final.clone()
            live = None if live is None else live.cloned()
            incoming = None if incoming is None else incoming.clone()
        else:
            o, final, live, incoming = write_core(q, k, v, g, beta, bodies, init)
        if lay.low_rank_writes:  # short bodies stored factored (dense-T families only)
            rec.low_rank_summaries = self._low_rank_summaries(k, v, g, beta)
        self._record_writes(layer_idx, rec, final, live, incoming)
        return o

    def _record_writes(self, layer_idx: int, rec: LinearRecord, final: torch.Tensor, live, incoming) -> None:
        """A writing forward's linear-layer records: the final states, the written spans'
        summaries ``live`` (segment writes), the states after checkpoints (from the recorded
        ``incoming`` states), handed to the entry writer."""
        lay = self.layout
        rec.final_states = final
        # Only segment writes read the summaries (row i: write i's span; [K, K] T and [K, V] S,
        # 4 MiB per span and layer at 35B-A3B widths), so none are formed for checkpoints alone:
        # at 128k tokens in 512-token segments every span's would be 30 GiB (out of memory on the
        # H200).
        if lay.any_segment_write:
            rec.write_summaries = live
        # State after each checkpoint: the next element's incoming state, or the final.
        after = []
        for (b, _, _), row in zip(lay.writes, lay.write_after_checkpoint_rows):
            after.append(None if row is None else final[b] if row < 0 else incoming[row])
        if any(a is not None for a in after):
            zero = torch.zeros_like(final[0])
            rec.write_states = torch.stack([zero if a is None else a for a in after])
        if self.writer is not None:
            self.writer.linear_done(layer_idx, rec)

    # -- lightning attention (scalar decay, no conv) ----------------------------------------------
    def lightning_attention(self, layer_idx, q, k, v, log_decay, scale, key_rotary=None):
        lay = self.layout
        init = self._initial_states(layer_idx, v)
        rec = self.records.setdefault(layer_idx, LinearRecord())
        if lay.linear_one_run_per_request:
            # nothing cached and nothing to record: each request's live tokens are one run
            o, rec.final_states = simple_gla_forward(
                q, k, v, g_gamma=log_decay, cu_seqlens=lay.cu_live_per_request, initial_state=init, scale=scale,
                cu_seqlens_cpu=lay.cu_live_per_request_cpu)
            return o
        dtype = _state_dtype(v)
        bodies = self._scalar_bodies(layer_idx, v.device, dtype) if lay.bodies else None
        # per body, the RoPE tables of its shift where the layer's keys carry RoPE: the op uses
        # the bodies' S rotated (on CUDA on load, read in place), T a scalar unchanged
        rotation = self._body_rotation(key_rotary, v.device, dtype) if key_rotary is not None and lay.bodies else None
        source = lay.chain_source if lay.bodies else None
        if (not lay.writes and self.replays is not None
                and (bodies is None or getattr(bodies, "addresses", None) is not None)
                and simple_gla_chain_walk_takes(q, k, v, g_gamma=log_decay, cu_seqlens=lay.cu_spans,
                                                cu_seqlens_cpu=lay.cu_spans_cpu, initial_states=init,
                                                bodies=bodies)):
            # A cached request's seams and question: the op is one walk that reads the bodies
            # through the layer's address table alone and nothing back to the host, so one graph
            # serves every layer, the layer's decay, table and rotation its inputs (as the
            # gated-delta chain forward above). Its scale is the model's: one graph per value.
            items = None if bodies is None else bodies.items

            def core(q, k, v, log_decay, addresses, cos, sin, init):
                table = None if addresses is None else SummaryTable(items, addresses)
                o, final, _, _ = simple_gla_chain_forward(
                    q, k, v, g_gamma=log_decay, cu_seqlens=lay.cu_spans, cu_chains=lay.cu_chains, source=source,
                    bodies=table, initial_states=init, scale=scale, cu_seqlens_cpu=lay.cu_spans_cpu,
                    body_rotation=None if cos is None else (cos, sin))
                return o, final

            cos, sin = (None, None) if rotation is None else rotation
            o, final = self.replays.run(f"lightning_chain_{scale!r}", core, q, k, v, log_decay,
                                        None if bodies is None else bodies.addresses, cos, sin, init,
                                        stable=(0, 1, 2) if self.graphs is not None else ())
            rec.final_states = final.clone()  # the graph's buffer: the next replay rewrites it
            return o
        checkpoints = lay.num_checkpoint_records > 0
        spans = None
        if lay.any_segment_write:
            spans = lay.write_span_range if lay.write_span_range is not None else lay.write_spans
        o, final, live, incoming = simple_gla_chain_forward(
            q, k, v, g_gamma=log_decay, cu_seqlens=lay.cu_spans, cu_chains=lay.cu_chains,
            source=source, bodies=bodies, initial_states=init, scale=scale,
            cu_seqlens_cpu=lay.cu_spans_cpu, summarize=lay.any_segment_write, summary_spans=spans,
            record_rows=lay.checkpoint_record_rows if checkpoints else None,
            num_records=lay.num_checkpoint_records if checkpoints else None, body_rotation=rotation)
        if not lay.writes:
            rec.final_states = final
            return o
        self._record_writes(layer_idx, rec, final, live, incoming)
        return o

    def _scalar_bodies(self, layer_idx: int, device: torch.device, dtype: torch.dtype):
        """The cached bodies' scalar summaries in body order, as stored: read in place through
        the layout's address table when it has one, else stacked (converted where they must be),
        with T dropped (the identity, log decay 0) in ``addition`` mode."""
        lay = self.layout
        if lay.body_addresses is not None:
            summaries = _LazyItems(lay.bodies, lambda body: body[1].entry.linear[layer_idx].summary)
            return SummaryTable(summaries, lay.body_addresses[layer_idx])
        decays, states = [], []
        for idx, (_, body) in enumerate(lay.bodies):
            summ = body.entry.linear[layer_idx].summary
            decay = on_device(summ.log_decay, device, dtype)
            decays.append(torch.zeros_like(decay) if lay.body_drop_transition_host[idx] else decay)
            states.append(on_device(summ.state, device, dtype))
        return ScalarSummary(torch.cat(decays), torch.cat(states))

    def _body_rotation(self, key_rotary, device: torch.device, dtype: torch.dtype):
        """``(cos, sin) [num bodies, rotary_dim]``: the RoPE tables of each body's shift
        (:meth:`_shifts`) for keys rotated by ``key_rotary``, or None when no body moves; made
        once per forward (every such layer of a model rotates its keys alike)."""
        shifts = self._shifts(device)
        if shifts is None:
            return None
        key = (key_rotary, dtype)
        if self._rotations is None or self._rotations[0] != key:
            self._rotations = (key, key_rotary.cos_sin(shifts, dtype=dtype))
        return self._rotations[1]

    def _shifts(self, device: torch.device) -> Optional[torch.Tensor]:
        """Per body, the positions its summaries move by (its segment's start now minus where
        its entry was made; 0 where the request keeps cached positions), or None when every
        shift is 0: the same for every layer of the forward, made once (sent with a pinned,
        asynchronous copy: a pageable one waits for the device to drain its queue)."""
        if self._body_shifts is None:
            lay = self.layout
            shifts = [body.segment_start - body.entry.origin_position if lay.requests[b].rerotate_keys else 0
                      for b, body in lay.bodies]
            self._body_shifts = False
            if any(shifts):
                host = torch.tensor(shifts, dtype=torch.long)
                host = host.pin_memory() if device.type == "cuda" else host
                self._body_shifts = host.to(device, non_blocking=True)
        return None if self._body_shifts is False else self._body_shifts

    def _low_rank_summaries(self, k, v, g, beta):
        """The factored summaries of the layout's factored segment writes, from their bodies'
        token rows (one batched pass, :func:`gated_delta_low_rank_summarize`)."""
        lay = self.layout
        rows_cpu = torch.cat([torch.arange(a, z) for _, a, z in lay.low_rank_writes])
        bounds = [0]
        for _, a, z in lay.low_rank_writes:
            bounds.append(bounds[-1] + z - a)
        rows = rows_cpu.to(k.device)
        return gated_delta_low_rank_summarize(k.index_select(0, rows), v.index_select(0, rows),
                                              g.index_select(0, rows), beta.index_select(0, rows),
                                              cu_seqlens=torch.tensor(bounds, dtype=torch.long, device=k.device))

    # -- full attention -------------------------------------------------------------------------
    def attention(self, layer_idx, q, k, v, scale, rotary):
        lay = self.layout
        if lay.cached_pieces:
            cos = sin = None
            if lay.any_rerotate:
                # RoPE composes: R(p + d) = R(d) R(p), so rotating cached K by its piece's shift d
                # moves it. One [P, rotary_dim] table, the same in every attention layer.
                if self._shift_cos_sin is None:
                    self._shift_cos_sin = rotary.cos_sin(lay.cached_shift)
                cos, sin = self._shift_cos_sin
            # One pass on CUDA: the pieces are read where the store holds them (through the
            # layout's address table), rotated on the way and written packed (hypic/ops/kv_gather.py);
            # the per-piece sequences below are only iterated by the reference.
            keys, values = gather_kv(
                k, v, _LazyItems(lay.cached_pieces, lambda e: e.attention[layer_idx].key),
                _LazyItems(lay.cached_pieces, lambda e: e.attention[layer_idx].value), lay.cu_cached,
                lay.key_index, shift_cos=cos, shift_sin=sin, table=lay.piece_table(layer_idx))
        else:
            keys = k.index_select(0, lay.key_index)
            values = v.index_select(0, lay.key_index)
        self.records[layer_idx] = AttentionRecord(keys, values)
        if self.writer is not None:
            self.writer.attention_done(layer_idx, self.records[layer_idx])
        return varlen_attention(
            q, keys, values,
            cu_seqlens_q=lay.cu_live_per_request, cu_seqlens_k=lay.cu_keys,
            positions_q=lay.positions, positions_k=lay.positions_k, scale=scale,
            index_causal=lay.index_causal, max_seqlen_q=lay.max_live_per_request,
            max_seqlen_k=lay.max_keys_per_request, layout_key=lay,
            cu_seqlens_q_host=lay.cu_live_host, cu_seqlens_k_host=lay.cu_keys_host,
            keys_by_position=lay.keys_by_position,
        )

    def select_logits_rows(self, hidden):
        return hidden.index_select(0, self.layout.logits_rows)

    def rope_cos_sin(self, rotary, positions, dtype):
        """The model's RoPE tables, kept with the layout's template (``geometry_cache``): every
        layout of one geometry has the same positions, so a cached request's later forwards skip
        the ~10 ops of computing them (~0.1 ms of host time before layer 0 on this repository's
        CPU; ~10 kernel launches on a GPU). Only for the layout's own positions and up to
        :data:`ROPE_CACHE_MAX_TOKENS` live tokens (a template of a long cold prompt would keep
        megabytes of device memory for a forward that is GPU-bound anyway). The tables are only
        read (copied into a row-wise graph's static inputs, or read by the rotation), never
        written, so one forward's use cannot change another's."""
        cache = self.layout.geometry_cache
        if cache is None or positions is not self.layout.positions or positions.shape[0] > ROPE_CACHE_MAX_TOKENS:
            return super().rope_cos_sin(rotary, positions, dtype)
        key = ("rope", rotary, dtype, positions.device)
        tables = cache.get(key)
        if tables is None:
            tables = cache[key] = super().rope_cos_sin(rotary, positions, dtype)
        return tables


class _LazyItems(Sequence):
    """``[get(item) for item in items]``, each looked up on access: one layer's K, V or summaries
    of a layout's cached entries. The GPU kernels read the entries through the layout's address
    tables and touch at most the first item, so no per-entry Python loop runs per layer."""

    def __init__(self, items, get) -> None:
        self._items = items
        self._get = get

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._get(self._items[i])


# Above this the runs' initial conv states are stacked per layer instead (the batched tensor holds
# every linear layer's at once: 30 layers x 65 runs x 8192 channels x 3 fp32 is 192 MiB).
MAX_BATCHED_TAIL_BYTES = 256 << 20

# Per store entry: its linear layers' conv tails (or checkpoint conv states) as one [NL, D, W-1]
# tensor, where the runner wrote them as the rows of one buffer (remember_tail_rows). Taking such
# a view at read time would cost a tensor op per entry per forward.
_ENTRY_TAILS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def remember_tail_rows(entry, field: str, layer_ids: Sequence[int], rows: Sequence[torch.Tensor],
                       buffer: torch.Tensor) -> None:
    """Note that ``entry``'s ``field`` of each of ``layer_ids`` (``rows``, in that order) are the
    rows of ``buffer``, so that a forward stacks the entry's tails of every layer at once."""
    if (buffer.dim() < 1 or buffer.shape[0] != len(rows) or not buffer.is_contiguous() or not rows
            or tuple(buffer.shape[1:]) != tuple(rows[0].shape)):
        return
    step = rows[0].numel() * rows[0].element_size()
    if any(t.data_ptr() != buffer.data_ptr() + i * step for i, t in enumerate(rows)):
        return
    _ENTRY_TAILS[entry] = ((field, tuple(layer_ids)), buffer)


def _batched_run_tails(sources, layer_ids: Sequence[int], zero: torch.Tensor) -> Optional[Dict[int, torch.Tensor]]:
    """linear layer -> ``[R, D, W-1]`` initial conv state of each run (``sources``: per run
    ``(entry, field)`` or None for zeros), every layer's from one stack: the host then pays one
    stack of R tensors per forward instead of one per linear layer, each of which touched every
    run's entry (~25 us per layer on a warm CPU, 150+ us with the caches cold after a layer's
    kernels). None when that does not apply as is (an entry whose tails are not one buffer's rows
    or of another shape, dtype or device, over :data:`MAX_BATCHED_TAIL_BYTES`): each layer then
    stacks its own, as before."""
    if not layer_ids or not sources:
        return None
    num_bytes = len(layer_ids) * len(sources) * zero.numel() * zero.element_size()
    if num_bytes > MAX_BATCHED_TAIL_BYTES:
        return None
    want = tuple(layer_ids)
    zeros = None
    per_run = []
    for src in sources:
        if src is None:
            if zeros is None:
                zeros = zero.expand(len(layer_ids), *zero.shape)
            per_run.append(zeros)
            continue
        hit = _ENTRY_TAILS.get(src[0])
        if hit is None or hit[0] != (src[1], want):
            return None
        tails = hit[1]
        if tails.shape[1:] != zero.shape or tails.dtype != zero.dtype or tails.device != zero.device:
            return None
        per_run.append(tails)
    stacked = torch.stack(per_run, dim=1)  # [NL, R, D, W-1]: each layer's rows contiguous
    return dict(zip(layer_ids, stacked.unbind(0)))


def _state_dtype(x: torch.Tensor) -> torch.dtype:
    """Recurrent and conv states are fp32 (fp64 for an fp64 model, which the exactness tests use)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


__all__: List[str] = ["PicContext", "LinearRecord", "AttentionRecord"]
