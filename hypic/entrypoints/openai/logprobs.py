"""OpenAI's log-probability objects built from the engine's per-token ``{token_id: Logprob}``.

Completions use the legacy shape (``tokens``, ``token_logprobs``, ``top_logprobs`` as
``{token: logprob}`` maps, ``text_offset``; with ``echo``, the prompt's tokens first, scored by
``SamplingParams.prompt_logprobs``); chat completions the ``content`` list of
``{token, logprob, bytes, top_logprobs}``. Both list the sampled token of every generated
position, in order, with its ``k`` most likely alternatives (``SamplingParams.logprobs``).
"""

from __future__ import annotations

from typing import Sequence

from hypic.engine.sampling import Logprob


def _text(token_id: int, logprob: Logprob) -> str:
    return logprob.decoded_token if logprob.decoded_token is not None else f"token_id:{token_id}"


def _top(entry: dict[int, Logprob], num_top: int) -> list[tuple[int, Logprob]]:
    """The ``num_top`` most likely tokens of one position, most likely first."""
    return sorted((item for item in entry.items() if item[1].rank <= num_top), key=lambda item: item[1].rank)


def completion_logprobs(entries: Sequence[dict[int, Logprob]], token_ids: Sequence[int], num_top: int,
                        text_offset: int = 0) -> dict:
    """The ``logprobs`` object of a completion choice (or of one streamed chunk, whose text
    starts ``text_offset`` characters into the completion)."""
    tokens, values, tops, offsets = [], [], [], []
    for token_id, entry in zip(token_ids, entries):
        chosen = entry[token_id]
        text = _text(token_id, chosen)
        tokens.append(text)
        values.append(chosen.logprob)
        top = {}
        for t, lp in _top(entry, num_top):
            top.setdefault(_text(t, lp), lp.logprob)
        tops.append(top)
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def prompt_logprobs(prompt_entries: Sequence[dict[int, Logprob] | None], prompt_ids: Sequence[int],
                    first_text: str, num_top: int) -> dict:
    """The prompt's part of an ``echo`` choice's ``logprobs``: its first token (which nothing
    scores) with null log-probabilities and the text ``first_text``, then the others as scored by
    ``SamplingParams.prompt_logprobs``. The completion's part continues at :func:`next_offset`."""
    body = completion_logprobs(prompt_entries[1:], prompt_ids[1:], num_top, len(first_text))
    return {"tokens": [first_text] + body["tokens"], "token_logprobs": [None] + body["token_logprobs"],
            "top_logprobs": [None] + body["top_logprobs"], "text_offset": [0] + body["text_offset"]}


def next_offset(body: dict, start: int = 0) -> int:
    """The text offset of the token after ``body``'s last (``start`` when it has none)."""
    return body["text_offset"][-1] + len(body["tokens"][-1]) if body["tokens"] else start


def joined(first: dict, second: dict | None) -> dict:
    """Two ``logprobs`` objects of consecutive tokens as one."""
    if second is None:
        return first
    return {key: first[key] + second[key] for key in first}


def chat_logprobs(entries: Sequence[dict[int, Logprob]], token_ids: Sequence[int], num_top: int) -> dict:
    """The ``logprobs`` object of a chat choice (or of one streamed chunk)."""

    def item(token_id: int, lp: Logprob) -> dict:
        text = _text(token_id, lp)
        return {"token": text, "logprob": lp.logprob, "bytes": list(text.encode("utf-8"))}

    content = []
    for token_id, entry in zip(token_ids, entries):
        row = item(token_id, entry[token_id])
        row["top_logprobs"] = [item(t, lp) for t, lp in _top(entry, num_top)]
        content.append(row)
    return {"content": content}
