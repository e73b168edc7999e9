"""Token-level dialogs for rollouts: the first prompt's ids, an answer's text, and the ids that continue a
dialog after an answer (its end-of-turn when the answer was cut, the feedback turn, the next assistant header).

The rollout trains on exactly the ids the sampler consumed, so a dialog is never re-tokenized as a whole.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from models.chat import Message
from models.tokenizer import Tokenizer


class DialogCodec(Protocol):
    stop_ids: tuple[int, ...]  # ids that end an answer (EOS / end-of-turn)

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The dialog so far, ending with the assistant's generation prompt."""

    def answer_text(self, token_ids: Sequence[int]) -> str:
        """What the assistant wrote, without special tokens."""

    def answer_ids(self, text: str) -> list[int]:
        """A written answer's ids as the sampler would have produced them, ending with the stop id."""

    def continuation_ids(self, answer_ended: bool, feedback: str) -> list[int]:
        """Ids after an answer: its end-of-turn if it was cut (`answer_ended` False), the user's feedback turn,
        and the next generation prompt."""


class ChatCodec:
    """A chat model's codec, from its tokenizer's chat template."""

    def __init__(self, tokenizer: Tokenizer):
        if tokenizer.chat_template is None:
            raise ValueError("ChatCodec: the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.template = tokenizer.chat_template
        self.stop_ids = tuple(tokenizer.eos_ids)
        self._end_ids = tokenizer.encode(self.template.end_of_turn)

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        return self.tokenizer.encode_dialog(messages, add_generation_prompt=True)[0]

    def answer_text(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special=True)

    def answer_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text) + [self.stop_ids[0]]

    def continuation_ids(self, answer_ended: bool, feedback: str) -> list[int]:
        ids = [] if answer_ended else list(self._end_ids)
        return ids + self.tokenizer.encode(self.template.next_turn({"role": "user", "content": feedback}))
