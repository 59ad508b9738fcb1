import pytest

from hypic.data.language import BASE_DOCUMENT_TOKENS
from hypic.data.suites import TASKS, SuiteConfig, generate_suite
from hypic.data.training import (
    CURRICULUM, CurriculumStage, TrainingSample, TrainingStream, encode_request, stage_by_name,
)
from hypic.data.vocab import build_tokenizer, special_token_ids, vocabulary


def test_encode_request_matches_tokenizer_and_marks_answer():
    vocab, tok, ids = vocabulary(), build_tokenizer(), special_token_ids()
    for task in TASKS:
        (req,) = generate_suite(SuiteConfig(task=task, min_docs=2, max_docs=3, pool_size=8,
                                            min_doc_tokens=40, max_doc_tokens=60), 1)
        sample = encode_request(req, vocab, add_bos=True)
        answer_ids = tok.encode(req.answers[0]).ids
        assert list(sample.input_ids) == [ids["<bos>"]] + tok.encode(req.plain_text()).ids + answer_ids + [ids["<eos>"]]
        marked = [i for i, m in zip(sample.input_ids, sample.answer_mask) if m]
        assert marked == answer_ids + [ids["<eos>"]]
        # The mask is a suffix: answer tokens come last.
        first = sample.answer_mask.index(True)
        assert all(sample.answer_mask[first:]) and not any(sample.answer_mask[:first])
        no_bos = encode_request(req, vocab, add_bos=False)
        assert no_bos.input_ids == sample.input_ids[1:]


def test_stream_follows_stage_shape():
    stage = CURRICULUM[1]
    stream = TrainingStream(stage, seed=0)
    tasks = set()
    for _ in range(40):
        r = stream.next_request()
        tasks.add(r.task)
        if r.task not in ("copy", "recall"):
            assert stage.min_docs <= r.num_documents <= stage.max_docs
            assert all(stage.min_doc_tokens <= len(d.split()) <= stage.max_doc_tokens for d in r.documents)
    assert tasks <= {t for t, _ in stage.task_weights} and len(tasks) >= 2
    bos = [s.input_ids[0] == special_token_ids()["<bos>"] for s in TrainingStream(stage, seed=1).take(40)]
    assert 0 < sum(bos) < 40


def test_first_stage_is_fact_only():
    stage = CURRICULUM[0]
    assert stage.max_doc_tokens == BASE_DOCUMENT_TOKENS
    for r in (TrainingStream(stage, seed=2).next_request() for _ in range(5)):
        assert r.num_documents <= 3


def test_curriculum_validation_and_lookup():
    assert stage_by_name("full") == len(CURRICULUM) - 1
    with pytest.raises(ValueError, match="name"):
        stage_by_name("nope")
    with pytest.raises(ValueError, match="task_weights"):
        CurriculumStage("x", (("qa", 1.0),), 1, 2, 40, 60, None, 0)
    with pytest.raises(ValueError, match="max_steps"):
        CurriculumStage("x", (("copy", 1.0),), 1, 2, 40, 60, 0.9, 10, 5)
    with pytest.raises(ValueError, match="advance_accuracy"):
        CurriculumStage("x", (("copy", 1.0),), 1, 2, 40, 60, 1.5, 0)
    with pytest.raises(ValueError, match="answer_mask"):
        TrainingSample(input_ids=(1, 2), answer_mask=(False, False), task="copy")
