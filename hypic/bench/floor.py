"""FLOP and byte counts of one planned prefill, and the time floor they imply on a device.

``floor_s = max(flops / peak_flops, bytes / peak_bytes_per_s)`` with the device's peaks
(:func:`device_peaks`: H200 790e12 bf16 FLOP/s and 4.3e12 B/s measured). Both counts are lower bounds of the work of the *live* part of a request:

FLOPs (:func:`hypic.bench.flops.flop_model`): dense projections and the linear layers' recurrence
per live token, attention per (live query, visible key) pair, the LM head for the one row whose logits are
computed. A live query at absolute position ``p`` sees every earlier position and itself: ``p + 1``
pairs (cached keys included, they are attended to). A segment prefilled **standalone** (the
``standalone`` cold policy) runs alone at position 0: ``L`` live tokens and ``L (L + 1) / 2`` pairs,
no logits.

Bytes (each counted once; activations that stay in cache/registers and the GDN state traffic of
the recurrence are not counted, so it is a floor):

* **weights read**: every forward reads each weight it uses once: all non-expert parameters; of
  the routed experts, the expected number touched by ``T`` tokens under uniform routing,
  ``E * (1 - (1 - k / E) ** T)`` per MoE layer (all 256 experts once T is a few hundred); of the
  embedding only the ``T`` rows looked up. Element size = the model's dtype (2 bytes in bf16).
  The standalone pre-pass is a second forward and reads the weights again.
* **cached entries read**: the exact bytes (``SegmentEntry.nbytes``) of every store entry the plan
  reuses (segment summaries + conv tails, where the family has a conv, + body K/V); for ``prefix_cache`` the K/V of every
  checkpoint of the prefix and the linear (+ conv) state of the last one only.
* **KV written**: K and V of every live token at every full-attention layer (the request's decode
  cache), in the model dtype.
* **entries written**: the exact bytes of the entries the prefill inserts into the store
  (measured by the benchmark's counting store), which for standalone segments are also read back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Tuple

import torch

from hypic.bench.flops import flop_model
from hypic.models.spec import LINEAR_ATTENTION, ModelSpec
from hypic.pic.plan import RequestPlan

H200_PEAK_FLOPS = 790e12
H200_PEAK_BYTES_PER_S = 4.3e12
# The H100 (SXM) is the same GH100 chip at the same clocks as the H200, so the same bf16 rate; its
# HBM3 is the datasheet's 3.35 TB/s (not measured here: the H200's measured 4.3 is 90% of its 4.8).
H100_PEAK_BYTES_PER_S = 3.35e12
_DEVICE_PEAKS = (("H200", H200_PEAK_FLOPS, H200_PEAK_BYTES_PER_S), ("H100", H200_PEAK_FLOPS, H100_PEAK_BYTES_PER_S))


def device_peaks(device_name: str) -> Tuple[float, float]:
    """``(bf16 FLOP/s, bytes/s)`` that floors on ``device_name`` (``torch.cuda.get_device_name``)
    are taken against; the H200's for any other device (a CPU run's floors are then the H200's,
    as its report's ``peak_*`` fields say)."""
    for key, flops, bytes_per_s in _DEVICE_PEAKS:
        if key in device_name:
            return flops, bytes_per_s
    return H200_PEAK_FLOPS, H200_PEAK_BYTES_PER_S


@dataclass(frozen=True)
class WorkCount:
    flops: float
    bytes: float
    live_tokens: int  # main pass + standalone pre-pass

    def floor_s(self, peak_flops: float = H200_PEAK_FLOPS,
                peak_bytes_per_s: float = H200_PEAK_BYTES_PER_S) -> float:
        if peak_flops <= 0 or peak_bytes_per_s <= 0:
            raise ValueError("peak_flops and peak_bytes_per_s must be > 0")
        return max(self.flops / peak_flops, self.bytes / peak_bytes_per_s)


def live_positions(plan: RequestPlan) -> Iterable[Tuple[int, int]]:
    """``(start, num_tokens)`` of every live range of the plan's main pass (absolute positions)."""
    for s in plan.spans:
        if s.live_end > 0:
            yield s.start, s.live_end


def visible_pairs(plan: RequestPlan) -> int:
    """Sum over live queries of the keys each sees (``p + 1`` at absolute position ``p``)."""
    total = 0
    for start, n in live_positions(plan):
        # sum_{p=start}^{start+n-1} (p + 1)
        total += n * start + n * (n + 1) // 2
    return total


class WorkModel:
    """FLOP/byte model of one model (spec + parameter sizes)."""

    def __init__(self, spec: ModelSpec, model: torch.nn.Module):
        self.spec = spec
        self.flops = flop_model(spec)
        self.param_bytes = 0  # everything but routed experts and the embedding
        self.expert_bytes_per_layer = 0.0  # one routed expert's weights, summed over MoE layers
        self.embedding_row_bytes = 0
        num_moe = sum(1 for m in spec.moe_layers if m)
        expert_total = 0
        self.dtype_bytes = 2
        embedding = model.model.input_embeddings().weight
        for name, p in model.named_parameters():
            nbytes = p.numel() * p.element_size()
            if p is embedding:  # embed_tokens, or Ring-linear's word_embeddings
                self.embedding_row_bytes = p.shape[1] * p.element_size()
                self.dtype_bytes = p.element_size()
            elif ".mlp.experts." in name:
                expert_total += nbytes
            else:
                self.param_bytes += nbytes
        # one expert's bytes in one MoE layer (all layers have the same expert shapes)
        self.expert_bytes = expert_total / (num_moe * spec.num_experts) if num_moe and spec.num_experts else 0.0
        self.num_moe_layers = num_moe
        num_attn = sum(1 for t in spec.layer_types if t != LINEAR_ATTENTION)
        self.kv_bytes_per_token = 2 * num_attn * spec.num_key_value_heads * spec.head_dim * self.dtype_bytes

    def weight_bytes(self, num_tokens: int) -> float:
        """Bytes of weights one forward over ``num_tokens`` tokens reads."""
        if num_tokens <= 0:
            return 0.0
        e, k = self.spec.num_experts, self.spec.num_experts_per_tok
        touched = e * (1.0 - (1.0 - k / e) ** num_tokens) if e else 0.0
        return (self.param_bytes + self.num_moe_layers * touched * self.expert_bytes
                + num_tokens * self.embedding_row_bytes)

    def count(self, plan: RequestPlan, written_entry_bytes: int = 0, reread_entry_bytes: int = 0) -> WorkCount:
        """Work of prefilling ``plan`` (which must still hold its handles). ``written_entry_bytes``:
        entries the prefill inserted; ``reread_entry_bytes``: those of them the same prefill reads
        back (standalone entries)."""
        if written_entry_bytes < 0 or reread_entry_bytes < 0:
            raise ValueError("written_entry_bytes and reread_entry_bytes must be >= 0")
        main_live = plan.live_tokens
        flops = self.flops.prefill(main_live, visible_pairs(plan), logits_rows=1)
        nbytes = self.weight_bytes(main_live) + main_live * self.kv_bytes_per_token
        resume = plan.resume_handle
        for h in plan.prefix_handles:
            # every checkpoint's K/V is attended to, but only the last one's linear state is read
            # (the resume point)
            nbytes += h.entry.nbytes if h is resume else sum(a.nbytes for a in h.entry.attention.values())
        for h in plan.handles:
            nbytes += h.entry.nbytes
        nbytes += written_entry_bytes + reread_entry_bytes
        standalone = [len(plan.prompt.segments[i]) for i in plan.standalone_segments]
        sa_tokens = sum(standalone)
        if sa_tokens:
            flops += self.flops.prefill(sa_tokens, sum(n * (n + 1) // 2 for n in standalone), logits_rows=0)
            nbytes += self.weight_bytes(sa_tokens) + sa_tokens * self.kv_bytes_per_token
        return WorkCount(float(flops), float(nbytes), main_live + sa_tokens)
