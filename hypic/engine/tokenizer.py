"""Tokenizer and chat template of a Hugging Face checkpoint folder.

Reads ``tokenizer.json`` with the ``tokenizers`` library (no transformers needed), the chat
template from ``chat_template.jinja`` or ``tokenizer_config.json`` (rendered with jinja2 in a
sandbox, like transformers does), and the end-of-sequence ids from ``generation_config.json``,
``config.json`` (or its ``text_config``) and the tokenizer's ``eos_token``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def _token_content(value: Any) -> str | None:
    # tokenizer_config.json writes special tokens as strings or AddedToken dicts.
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return list(value)
    raise ValueError(f"eos_token_id must be an int or a list of ints, got {value!r}")


class Tokenizer:
    """encode / decode / apply_chat_template for one checkpoint folder."""

    def __init__(self, folder: str | Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"tokenizer: {folder} has no tokenizer.json")
        self.folder = folder
        self._tok = HFTokenizer.from_file(str(path))
        config = _read_json(folder / "tokenizer_config.json")
        template_file = folder / "chat_template.jinja"
        if template_file.is_file():
            self.chat_template: str | None = template_file.read_text(encoding="utf-8")
        else:
            template = config.get("chat_template")
            if isinstance(template, list):  # named templates: [{name, template}, ...]
                named = {t.get("name"): t.get("template") for t in template}
                template = named.get("default")
            self.chat_template = template if isinstance(template, str) else None
        self.bos_token = _token_content(config.get("bos_token"))
        self.eos_token = _token_content(config.get("eos_token"))
        self.pad_token = _token_content(config.get("pad_token"))
        self.special_token_ids = frozenset(
            self._tok.token_to_id(t.content)
            for t in self._tok.get_added_tokens_decoder().values()
            if t.special
        )
        self.eos_token_ids = tuple(self._find_eos_ids(folder))
        self.bos_token_id = self.token_to_id(self.bos_token) if self.bos_token else None
        self.pad_token_id = self.token_to_id(self.pad_token) if self.pad_token else None

    def _find_eos_ids(self, folder: Path) -> list[int]:
        ids: list[int] = []
        generation = _read_json(folder / "generation_config.json")
        model_config = _read_json(folder / "config.json")
        text_config = model_config.get("text_config") or {}
        for value in (
            generation.get("eos_token_id"),
            model_config.get("eos_token_id"),
            text_config.get("eos_token_id"),
        ):
            ids.extend(_as_id_list(value))
        if self.eos_token is not None:
            eos = self._tok.token_to_id(self.eos_token)
            if eos is not None:
                ids.append(eos)
        return list(dict.fromkeys(ids))  # de-duplicated, first-seen order

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        template_vars: dict[str, Any] | None = None,
    ) -> str:
        """Render ``messages`` ([{"role", "content"}, ...]) with the checkpoint's template.

        ``template_vars`` are extra variables for the template (e.g. ``enable_thinking``).
        """
        if self.chat_template is None:
            raise ValueError(
                f"tokenizer at {self.folder} has no chat template "
                "(neither chat_template.jinja nor tokenizer_config.json['chat_template'])"
            )
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in messages
        ):
            raise ValueError("messages must be a list of dicts with 'role' and 'content'")
        template = _compile_template(self.chat_template)
        variables = dict(template_vars or {})
        variables.update(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )
        return template.render(**variables)


_TEMPLATE_CACHE: dict[str, Any] = {}


def _compile_template(source: str):
    """Compile with the conventions of HF chat templates: sandboxed, trim/lstrip blocks, loop
    controls, ``raise_exception`` and a non-ASCII-escaping ``tojson``."""
    if source in _TEMPLATE_CACHE:
        return _TEMPLATE_CACHE[source]
    try:
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ValueError("rendering a chat template needs jinja2: pip install jinja2") from e

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        import datetime

        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    template = env.from_string(source)
    _TEMPLATE_CACHE[source] = template
    return template
