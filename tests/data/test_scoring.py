import pytest

from hypic.data.request import Request
from hypic.data.scoring import (
    best_score, exact_match, lcs_length, normalize_answer, rouge_l, score_request, token_f1,
)


def test_normalize():
    assert normalize_answer("The  Cat, sat!") == "cat sat"
    assert normalize_answer("An apple") == "apple"


def test_exact_match():
    assert exact_match("Paris.", "paris") == 100.0
    assert exact_match("the paris", "Paris") == 100.0
    assert exact_match("paris france", "paris") == 0.0


def test_token_f1_known_values():
    # pred 3 tokens, ref 2 tokens, 2 common: P = 2/3, R = 1 -> F1 = 0.8
    assert token_f1("red blue green", "blue red") == pytest.approx(80.0)
    assert token_f1("x", "y") == 0.0
    assert token_f1("", "") == 100.0
    assert token_f1("", "y") == 0.0


def test_lcs_and_rouge_l_order_sensitive():
    assert lcs_length("a b c d".split(), "a c b d".split()) == 3
    # same bag, reversed order: LCS 1 of 4 -> F1 = 25, while token F1 is 100.
    assert rouge_l("w x y z", "z y x w") == pytest.approx(25.0)
    assert token_f1("w x y z", "z y x w") == pytest.approx(100.0)
    assert rouge_l("w x y z", "w x y z") == 100.0
    # pred "w x" vs ref "w x y z": P = 1, R = 0.5 -> 66.67
    assert rouge_l("w x", "w x y z") == pytest.approx(200 / 3)


def test_best_score_and_request():
    assert best_score("exact_match", "b", ["a", "b"]) == 100.0
    with pytest.raises(ValueError, match="metric"):
        best_score("bleu", "a", ["a"])
    with pytest.raises(ValueError, match="references"):
        best_score("exact_match", "a", "a")
    req = Request(documents=("d",), query="q", answers=("u v",), task="t", metric="rouge_l", doc_ids=("1",))
    assert score_request(req, "u v") == 100.0
    assert score_request(req, "v u") == pytest.approx(50.0)
