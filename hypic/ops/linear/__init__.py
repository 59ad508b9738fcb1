"""Linear-attention state algebra: one module per family (forward, decode, summarize), the
structured affine summaries of token spans (``summary``) and the scans along chains of them
(``scan``). Each public function is the pure PyTorch reference and calls its GPU fast path
(``fla_paths``, ``triton_scan``) when an explicit check on its input tensors (CUDA, a dtype and
shape the kernels take) says the kernels take them."""

from .scan import scan_chain
from .summary import (
    DenseSummary,
    DiagonalSummary,
    ScalarSummary,
    apply_summary,
    compose,
    identity_summary,
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
