"""Test helpers: small entries with a summary-like frozen dataclass payload."""

from dataclasses import dataclass

import torch

from hypic.pic.keys import Keyer, KeyNamespace
from hypic.pic.payload import AttentionLayerCache, LinearLayerCache, SegmentEntry


@dataclass(frozen=True, eq=False)
class FakeSummary:
    """Mimics the contract of hypic.ops.linear.summary: a frozen dataclass with nbytes and to()."""

    transition: torch.Tensor
    state: torch.Tensor

    @property
    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in (self.transition, self.state))

    def to(self, device):
        return FakeSummary(self.transition.to(device), self.state.to(device))


def keyer(hash_fn=None, model_id="tiny", dtype="float32"):
    ns = KeyNamespace(model_id, dtype)
    return Keyer(ns) if hash_fn is None else Keyer(ns, hash_fn)


def make_entry(key, *, seed=0, hv=2, kdim=3, vdim=4, width=3, hkv=1, head_dim=4, origin=0):
    """An entry with one linear layer (0) and one full-attention layer (1); values from seed."""
    g = torch.Generator().manual_seed(seed)
    body = key.num_tokens - key.body_start
    summary = FakeSummary(torch.randn(1, hv, kdim, kdim, generator=g),
                          torch.randn(1, hv, kdim, vdim, generator=g))
    conv_tail = torch.randn(5, width, generator=g)
    k = torch.randn(body, hkv, head_dim, generator=g)
    v = torch.randn(body, hkv, head_dim, generator=g)
    return SegmentEntry(
        key,
        linear={0: LinearLayerCache(summary, conv_tail)},
        attention={1: AttentionLayerCache(k, v)},
        origin_position=origin,
        metadata={"seed": seed},
    )


def entry_nbytes(hv=2, kdim=3, vdim=4, width=3, body=1, hkv=1, head_dim=4):
    """Bytes of make_entry's payload, computed by hand (fp32 = 4 bytes)."""
    return 4 * (hv * kdim * kdim + hv * kdim * vdim + 5 * width + 2 * body * hkv * head_dim)
