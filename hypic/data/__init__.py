"""Synthetic multi-document suites (short: ``suites``; long, order-sensitive: ``long_suites``),
training data, scoring, and the LongBench-format loader."""

from .request import PIC_SEP, Request
from .vocab import build_tokenizer, save_tokenizer, vocabulary, SPECIAL_TOKENS
from .language import HELD_OUT_MODULUS, is_held_out_fact
from .suites import SUITE_TASKS, TASKS, SuiteConfig, DocumentPool, generate_suite, fresh_request
from .scoring import exact_match, token_f1, rouge_l, normalize_answer, best_score, score_request
from .longbench import load_longbench, split_context, request_from_row
from .training import CURRICULUM, CurriculumStage, TrainingSample, TrainingStream, encode_request
from .long_vocab import extended_vocabulary
from .long_suites import LONG_TASKS, LongSuiteConfig, generate_long_suite, fresh_long_request
from .long_oracle import oracle_score, order_blind_bound, solve

__all__ = [
    "PIC_SEP", "Request", "build_tokenizer", "save_tokenizer", "vocabulary", "SPECIAL_TOKENS",
    "HELD_OUT_MODULUS", "is_held_out_fact", "TASKS", "SUITE_TASKS", "SuiteConfig", "DocumentPool", "generate_suite",
    "fresh_request", "exact_match", "token_f1", "rouge_l", "normalize_answer", "best_score",
    "score_request", "load_longbench", "split_context", "request_from_row", "CURRICULUM",
    "CurriculumStage", "TrainingSample", "TrainingStream", "encode_request", "extended_vocabulary", "LONG_TASKS",
    "LongSuiteConfig", "generate_long_suite", "fresh_long_request", "oracle_score", "order_blind_bound", "solve",
]
