"""The toy task of the tiny configs and the learning tests: print the number in the prompt.

Problems are real RLEF problems (public and private stdin/stdout tests, judged by the real sandbox); the
answer is a string of digits that the code builder turns into `print(<digits>)` ("07" does not parse: no valid
code, -0.2). `DigitCodec` is a 14-token vocabulary: digits 0-9, end-of-turn, user, assistant, and one token for
any run of other characters, so feedback such as "Expected output '7' but got '3'" keeps its digits.
"""
from __future__ import annotations

import ast
import re
from typing import Any, Sequence

from models.chat import Message

EOT, USER, ASSISTANT, OTHER = 10, 11, 12, 13
VOCAB_SIZE = 14
_RUNS = re.compile(r"\d|\D+")


class DigitCodec:
    stop_ids = (EOT,)

    def encode(self, text: str) -> list[int]:
        return [int(piece) if piece.isdigit() else OTHER for piece in _RUNS.findall(text)]

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        ids: list[int] = []
        for message in messages:
            ids += [ASSISTANT if message["role"] == "assistant" else USER] + self.encode(message["content"]) + [EOT]
        return ids + [ASSISTANT]

    def answer_text(self, token_ids: Sequence[int]) -> str:
        return "".join(str(i) if i < 10 else ("?" if i == OTHER else "") for i in token_ids)

    def answer_ids(self, text: str) -> list[int]:
        return self.encode(text) + [EOT]

    def continuation_ids(self, answer_ended: bool, feedback: str) -> list[int]:
        return ([] if answer_ended else [EOT]) + [USER] + self.encode(feedback) + [EOT, ASSISTANT]


def digits_program(answer: str) -> str | None:
    """`print(<answer>)` when the answer is a number literal Python accepts, else None (no valid code)."""
    if not answer.isdigit():
        return None
    code = f"print({answer})"
    try:
        ast.parse(code)
    except SyntaxError:
        return None
    return code


def toy_problems(count: int = 10, digits: int = 1) -> list[dict[str, Any]]:
    """`count` print-the-number problems (numbers with `digits` digits), in the CodeContests row schema."""
    low = 0 if digits == 1 else 10 ** (digits - 1)
    span = 10 ** digits - low
    numbers = [low + (i * 7 + 3) % span for i in range(count)]
    return [{"name": f"print-{n}-{i}", "description": str(n),
             "public_tests": {"input": [""], "output": [f"{n}\n"]}, "demonstration": str(n),
             "private_tests": {"input": ["ignored\n"], "output": [f"{n}\n"]}} for i, n in enumerate(numbers)]
