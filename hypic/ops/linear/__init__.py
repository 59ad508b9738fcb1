"""Linear-attention state algebra: one module per family (forward, decode, summarize) and the
structured affine summaries of token spans (``summary``). CPU reference in PyTorch; CUDA tensors
are routed to ``fla_paths`` (imported lazily) when it provides the same function."""

from .summary import (
    DenseSummary,
    DiagonalSummary,
    ScalarSummary,
    apply_summary,
    compose,
    identity_summary,
    scan_chain,
)

__all__ = [
    "DenseSummary",
    "DiagonalSummary",
    "ScalarSummary",
    "apply_summary",
    "compose",
    "identity_summary",
    "scan_chain",
]
