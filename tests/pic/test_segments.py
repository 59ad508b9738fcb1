import pytest

from hypic.pic.segments import (
    PIC_SEP,
    ChatTemplateParts,
    SegmentedPrompt,
    build_segmented_prompt,
    split_chat_template,
    split_text_prompt,
)


def encode(text):
    # Character-level stand-in for a tokeniser: deterministic and context-free per piece.
    return [ord(c) for c in text]


def test_split_text_prompt_keeps_text_verbatim():
    pieces = split_text_prompt(f"sys {PIC_SEP} doc one{PIC_SEP}question?")
    assert pieces == ("sys ", " doc one", "question?")
    assert split_text_prompt("just a query") == ("just a query",)


@pytest.mark.parametrize(
    "text, match",
    [
        (f"a{PIC_SEP}{PIC_SEP}q", "segment 1 is empty"),
        (f"{PIC_SEP}a{PIC_SEP}q", "segment 0 is empty"),
        (f"{PIC_SEP}{PIC_SEP}", "is only separators"),
        (f" {PIC_SEP} ", "is only separators"),
        ("", "prompt is empty"),
        (f"doc{PIC_SEP}", "query is empty"),
    ],
)
def test_split_text_prompt_errors(text, match):
    with pytest.raises(ValueError, match=match):
        split_text_prompt(text)


def test_build_from_text_tokenises_each_segment_alone():
    p = build_segmented_prompt(f"ab{PIC_SEP}cd{PIC_SEP}q", encode=encode)
    assert p.segments == ((97, 98), (99, 100))
    assert p.query == (113,)
    assert p.num_tokens == 5
    assert p.token_ids == (97, 98, 99, 100, 113)
    assert p.segment_starts == (0, 2, 4)


def test_same_segment_same_tokens_anywhere():
    a = build_segmented_prompt(f"x{PIC_SEP}doc{PIC_SEP}q1", encode=encode)
    b = build_segmented_prompt(f"doc{PIC_SEP}yy{PIC_SEP}q2", encode=encode)
    assert a.segments[1] == b.segments[0]


def test_structured_prompt_mixes_text_and_ids():
    p = build_segmented_prompt([[5, 6, 7], "ab", [9]], encode=encode, vocab_size=200)
    assert p.segments == ((5, 6, 7), (97, 98))
    assert p.query == (9,)
    p2 = build_segmented_prompt([[1, 2], [3]])  # ids only: no tokeniser needed
    assert p2.segments == ((1, 2),) and p2.query == (3,)


@pytest.mark.parametrize(
    "prompt, match",
    [
        ([[1], [], [2]], "segment 1 is empty"),
        ([[1], []], "query is empty"),
        ([], "segment list is empty"),
        ([[1], "text"], "no encode function"),
        ([[1, -2], [3]], "negative"),
        ([[1, 300], [3]], "out of range"),
        ([[1, 2.0], [3]], "must be ints"),
        ([[True], [3]], "must be ints"),
        (42, "expected str or a list"),
    ],
)
def test_structured_prompt_errors(prompt, match):
    with pytest.raises(ValueError, match=match):
        build_segmented_prompt(prompt, vocab_size=256)


def test_segment_encoding_to_nothing_is_an_error():
    with pytest.raises(ValueError, match="encodes to 0 tokens"):
        build_segmented_prompt(f"abc{PIC_SEP}q", encode=lambda s: [] if s == "abc" else [1])


def test_segmented_prompt_validates_directly():
    with pytest.raises(ValueError, match="query is empty"):
        SegmentedPrompt(segments=((1,),), query=())
    with pytest.raises(ValueError, match=r"segments\[0\] is empty"):
        SegmentedPrompt(segments=((),), query=(1,))


def render(content):
    return f"<s>[sys]<u>{content}</u><a>"


def test_chat_template_prefix_own_segment_and_suffix_on_query():
    parts = split_chat_template(render, encode)
    assert parts.prefix_ids == tuple(encode("<s>[sys]<u>"))
    assert parts.suffix_ids == tuple(encode("</u><a>"))
    p = build_segmented_prompt(f"doc{PIC_SEP}q", encode=encode, template=parts)
    assert p.segments == (tuple(encode("<s>[sys]<u>")), tuple(encode("doc")))
    assert p.query == tuple(encode("q</u><a>"))
    # Token-level wrapping reproduces the rendered text exactly: no seam is broken.
    assert p.token_ids == tuple(encode(render("docq")))


def test_chat_template_merge_first():
    parts = split_chat_template(render, encode, prefix_policy="merge_first")
    p = build_segmented_prompt(f"doc{PIC_SEP}e{PIC_SEP}q", encode=encode, template=parts)
    assert p.segments[0] == tuple(encode("<s>[sys]<u>doc"))
    assert p.segments[1] == tuple(encode("e"))
    # Without segments the prefix still goes first (as its own segment).
    p2 = build_segmented_prompt("q", encode=encode, template=parts)
    assert p2.segments == (tuple(encode("<s>[sys]<u>")),)


def test_chat_template_errors():
    with pytest.raises(ValueError, match="exactly once"):
        split_chat_template(lambda c: c + c, encode)
    with pytest.raises(ValueError, match="prefix_policy"):
        ChatTemplateParts(prefix_policy="somewhere")
    with pytest.raises(ValueError, match="ChatTemplateParts"):
        build_segmented_prompt([[1], [2]], template=("a", "b"))


def test_token_ids_accept_integer_tensors_and_reject_others():
    import numpy as np
    import torch

    p = build_segmented_prompt([torch.tensor([1, 2]), np.array([3], dtype=np.int32), [4]])
    assert p.segments == ((1, 2), (3,)) and p.query == (4,)
    assert all(type(t) is int for t in p.token_ids)
    with pytest.raises(ValueError, match="must be ints"):
        build_segmented_prompt([torch.tensor([1.0]), [4]])
    with pytest.raises(ValueError, match="sequence of token ids"):
        SegmentedPrompt(segments=("ab",), query=(1,))


def test_plain_int_tuples_are_kept_and_everything_else_checked():
    import numpy as np

    seg = tuple(range(300, 812))
    prompt = SegmentedPrompt(segments=(seg,), query=(1, 2))
    assert prompt.segments[0] is seg  # kept, not copied: the key memo can match it by identity
    mixed = (1, np.int64(2), 3)  # a numpy scalar among ints: checked and converted to plain ints
    out = SegmentedPrompt(segments=(mixed,), query=(1,)).segments[0]
    assert out == (1, 2, 3) and out is not mixed and all(type(t) is int for t in out)
    for bad, match in [((1, True), "must be ints"), ((1, -1), "negative"), ((2.0,), "must be ints")]:
        with pytest.raises(ValueError, match=match):
            SegmentedPrompt(segments=(bad,), query=(1,))
    with pytest.raises(ValueError, match="out of range"):
        build_segmented_prompt([(1, 5), (1,)], vocab_size=5)
