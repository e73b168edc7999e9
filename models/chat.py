"""Chat templates (Llama 3, Llama 3.1, ChatML/SmolLM2) rendered in Python, with the assistant's spans.

Rendering returns the text and the character spans the assistant wrote (its content plus the end-of-turn
token it must learn to emit), so a dialog can be tokenized once and the assistant mask read off the offsets.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

Message = dict[str, str]
ROLES = ("system", "user", "assistant")


class ChatTemplateError(ValueError):
    """A dialog or template rljax cannot render."""


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """One chat format. `family` is chatml | llama3 | llama3_1."""

    family: str
    default_system: str | None = None  # ChatML (SmolLM2) inserts this when the dialog has no system turn
    date_string: str = "26 Jul 2024"  # Llama 3.1 system header

    @property
    def end_of_turn(self) -> str:
        return "<|im_end|>" if self.family == "chatml" else "<|eot_id|>"

    @property
    def generation_prompt(self) -> str:
        return self._header("assistant")

    def _header(self, role: str) -> str:
        if self.family == "chatml":
            return f"<|im_start|>{role}\n"
        return f"<|start_header_id|>{role}<|end_header_id|>\n\n"

    def _content(self, text: str) -> str:
        return text if self.family == "chatml" else text.strip()

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False
               ) -> tuple[str, list[tuple[int, int]]]:
        """Text of the dialog and the [start, end) character spans of assistant-written text."""
        validate_messages(messages)
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        length = 0

        def emit(text: str, assistant: bool = False) -> None:
            nonlocal length
            if assistant:
                spans.append((length, length + len(text)))
            parts.append(text)
            length += len(text)

        messages = list(messages)
        if self.family == "chatml":
            if self.default_system is not None and messages and messages[0]["role"] != "system":
                emit(f"<|im_start|>system\n{self.default_system}<|im_end|>\n")
        elif self.family == "llama3":
            emit("<|begin_of_text|>")
        elif self.family == "llama3_1":
            system = ""
            if messages and messages[0]["role"] == "system":
                system, messages = messages[0]["content"].strip(), messages[1:]
            emit("<|begin_of_text|>" + self._header("system") + "Cutting Knowledge Date: December 2023\n"
                 f"Today Date: {self.date_string}\n\n{system}<|eot_id|>")
        else:
            raise ChatTemplateError(f"unknown chat template family {self.family!r}")
        for message in messages:
            emit(self._header(message["role"]))
            body = self._content(message["content"]) + self.end_of_turn
            emit(body, assistant=message["role"] == "assistant")
            if self.family == "chatml":
                emit("\n")
        if add_generation_prompt:
            emit(self.generation_prompt)
        return "".join(parts), spans

    def next_turn(self, message: Message, add_generation_prompt: bool = True) -> str:
        """The text that follows a turn's end-of-turn token: one more message, then the generation prompt.

        `render(dialog, True) + answer + end_of_turn + next_turn(m)` equals `render(dialog + [answer, m], True)`,
        which is how a dialog grows from its KV cache without being re-rendered.
        """
        validate_messages([message])
        sep = "\n" if self.family == "chatml" else ""
        text = sep + self._header(message["role"]) + self._content(message["content"]) + self.end_of_turn
        if add_generation_prompt:
            text += sep + self.generation_prompt
        return text

    def to_dict(self) -> dict[str, str | None]:
        return dataclasses.asdict(self)


def validate_messages(messages: Sequence[Message]) -> None:
    if not messages:
        raise ChatTemplateError("dialog is empty: expected at least one message")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) - {"role", "content"} or "role" not in message:
            raise ChatTemplateError(f"message {i}: expected {{'role': ..., 'content': ...}}, got {message!r}")
        if message["role"] not in ROLES:
            raise ChatTemplateError(f"message {i}: role {message['role']!r} is not one of {ROLES}")
        if not isinstance(message.get("content"), str):
            raise ChatTemplateError(f"message {i}: content must be a string, got {type(message.get('content'))}")


def template_from_jinja(jinja: str | None) -> ChatTemplate:
    """Recognise a Hugging Face / GGUF jinja chat template as one of the families rljax renders."""
    if not jinja:
        raise ChatTemplateError("the tokenizer has no chat template; expected ChatML or Llama 3 style")
    if "<|im_start|>" in jinja:
        found = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", jinja, flags=re.S)
        return ChatTemplate("chatml", default_system=found.group(1) if found else None)
    if "Cutting Knowledge Date" in jinja:
        return ChatTemplate("llama3_1")
    if "<|start_header_id|>" in jinja:
        return ChatTemplate("llama3")
    raise ChatTemplateError("unrecognised chat template: expected ChatML (<|im_start|>) or Llama 3 "
                            "(<|start_header_id|>) markers")
