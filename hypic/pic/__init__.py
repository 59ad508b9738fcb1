"""Position-independent caching: prompt segments, store keys, the segment store, modes and plans."""

from hypic.pic.keys import Keyer, KeyNamespace, StoreKey, sha256_digest
from hypic.pic.modes import (
    COLD_POLICIES,
    MODES,
    ModeSpec,
    PICConfig,
    RequestPolicy,
    get_mode,
    seam_tokens,
)
from hypic.pic.payload import (
    AttentionLayerCache,
    LinearLayerCache,
    LinearStateCheckpoint,
    SegmentEntry,
    payload_equal,
    payload_nbytes,
)
from hypic.pic.persist import load_entries, save_entries
from hypic.pic.plan import (
    ENTRY_FROM_STANDALONE,
    ENTRY_FROM_STORE,
    RequestPlan,
    Span,
    SpanKind,
    plan_request,
)
from hypic.pic.segments import (
    PIC_SEP,
    ChatTemplateParts,
    SegmentedPrompt,
    build_segmented_prompt,
    split_chat_template,
    split_text_prompt,
)
from hypic.pic.store import SegmentHandle, SegmentStore, StoreStats

__all__ = [
    "AttentionLayerCache",
    "COLD_POLICIES",
    "ChatTemplateParts",
    "ENTRY_FROM_STANDALONE",
    "ENTRY_FROM_STORE",
    "KeyNamespace",
    "Keyer",
    "LinearLayerCache",
    "LinearStateCheckpoint",
    "MODES",
    "ModeSpec",
    "PICConfig",
    "PIC_SEP",
    "RequestPlan",
    "RequestPolicy",
    "SegmentEntry",
    "SegmentHandle",
    "SegmentStore",
    "SegmentedPrompt",
    "Span",
    "SpanKind",
    "StoreKey",
    "StoreStats",
    "build_segmented_prompt",
    "get_mode",
    "load_entries",
    "payload_equal",
    "payload_nbytes",
    "plan_request",
    "save_entries",
    "seam_tokens",
    "sha256_digest",
    "split_chat_template",
    "split_text_prompt",
]
