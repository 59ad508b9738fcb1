import json
import os

import pytest

from hypic.data.longbench import load_longbench, request_from_row, split_context
from hypic.data.request import PIC_SEP
from hypic.data.scoring import score_request

FIXTURE = os.path.join(os.path.dirname(__file__), "longbench_fixture.jsonl")


def test_loads_fixture_rows_in_order():
    reqs = load_longbench(FIXTURE)
    assert [r.request_id for r in reqs] == ["hp-001", "hp-002", "mn-001", "gr-001", "line5"]
    assert [r.task for r in reqs] == ["hotpotqa", "2wikimqa", "multi_news", "gov_report", "longbench"]
    assert [r.metric for r in reqs] == ["token_f1", "token_f1", "rouge_l", "rouge_l", "token_f1"]
    assert reqs[4].answers == ("green",)
    assert reqs[1].answers == ("Ola Fenn", "Fenn")


def test_hotpot_contexts_split_into_passages():
    hp, wiki = load_longbench(FIXTURE, limit=2)
    assert hp.num_documents == 3
    assert [d.split("\n")[0] for d in hp.documents] == ["Passage 1:", "Passage 2:", "Passage 3:"]
    assert "Velmora" in hp.documents[1]
    # Text before the first header is its own segment.
    assert wiki.documents[0] == "Some preamble text that precedes the passages."
    assert wiki.num_documents == 3
    assert hp.query == "Question: Which city is the birthplace of the architect of the Lantern Hall?\nAnswer:"
    assert hp.prompt().count(PIC_SEP) == 3
    assert hp.prompt().replace(PIC_SEP, hp.joiner) == hp.plain_text()


def test_blank_lines_and_windows():
    reqs = load_longbench(FIXTURE)
    news, report = reqs[2], reqs[3]
    assert news.num_documents == 3  # a whitespace-only line counts as blank
    assert news.documents[1] == "Officials said the water would recede by Thursday."
    windows = split_context(json.loads(open(FIXTURE).readlines()[3])["context"], window_words=10)
    assert [len(w.split()) for w in windows] == [10, 10, 7]
    assert report.num_documents == 1  # 27 words, default 200-word windows
    assert score_request(news, news.answers[0]) == 100.0


def test_max_segments_merges_neighbours():
    context = "\n\n".join(f"p{i}" for i in range(7))
    assert split_context(context, max_segments=3) == ["p0\n\np1", "p2\n\np3", "p4\n\np5\n\np6"]
    assert split_context(context, split_mode="windows", window_words=4) == ["p0 p1 p2 p3", "p4 p5 p6"]


def test_row_validation():
    with pytest.raises(ValueError, match="answers"):
        request_from_row({"context": "a", "input": "b"})
    with pytest.raises(ValueError, match="answers"):
        request_from_row({"context": "a", "input": "b", "answers": []})
    with pytest.raises(ValueError, match="context"):
        request_from_row({"context": "  ", "input": "b", "answers": ["x"]})
    with pytest.raises(ValueError, match="split_mode"):
        split_context("a", split_mode="sentences")


def test_bad_json_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"context": "a", "input": "b", "answers": ["c"]}\n{not json\n')
    with pytest.raises(ValueError, match="line 2"):
        load_longbench(str(path))
