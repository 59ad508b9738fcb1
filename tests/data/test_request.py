import pytest

from hypic.data.request import PIC_SEP, Request


def _req(**overrides):
    fields = dict(documents=("a b", "c d"), query="q ?", answers=("x",), task="t", metric="exact_match",
                  doc_ids=("1", "2"))
    fields.update(overrides)
    return Request(**fields)


def test_prompt_and_plain_text():
    r = _req()
    assert r.prompt() == f"a b{PIC_SEP}c d{PIC_SEP}q ?"
    assert r.plain_text() == "a b c d q ?"
    assert r.prompt().replace(PIC_SEP, r.joiner) == r.plain_text()
    assert r.segments() == ("a b", "c d", "q ?")


@pytest.mark.parametrize("overrides, field", [
    (dict(documents=()), "documents"),
    (dict(documents=("a", f"b{PIC_SEP}c")), "documents"),
    (dict(query=" "), "query"),
    (dict(answers=()), "answers"),
    (dict(metric="bleu"), "metric"),
    (dict(doc_ids=("1",)), "doc_ids"),
])
def test_validation(overrides, field):
    with pytest.raises(ValueError, match=field):
        _req(**overrides)
