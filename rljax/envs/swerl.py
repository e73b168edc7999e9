"""SWE-RL (Wei et al. 2025): one answer per issue, scored against the developers' patch; no execution.

The prompt holds the issue text and the full contents of the given files, and asks for reasoning in
<think>...</think> then search/replace edits in <solution>...</solution>. The reward is
`executor.compute_reward`: -1 when the answer is malformed, else the difflib ratio between the patch the
edits produce and the oracle patch ("similarity"), or 1/0 on exact match ("exact_match").
"""
from __future__ import annotations

from typing import Any, Mapping

from executor.swe_reward import VARIANTS, compute_reward
from models.chat import Message
from rljax.envs.base import ProblemError, StepResult, require_fields

EDIT_FORMAT = """```python
### path/to/file.py
<<<<<<< SEARCH
lines copied exactly from the file
=======
the lines that replace them
>>>>>>> REPLACE
```"""

INSTRUCTIONS = (
    "Find the cause of the issue in the files above and fix it. First reason about the problem inside "
    "<think> and </think>. Then give the fix inside <solution> and </solution> as one or more edit blocks of "
    "this form:\n\n" + EDIT_FORMAT + "\n\nThe SEARCH part must match a contiguous run of lines of that file "
    "exactly, indentation included; several blocks may edit the same file.")


def render_prompt(issue: str, files: Mapping[str, str]) -> str:
    shown = "\n\n".join(f"--- {path}\n```python\n{content.rstrip()}\n```" for path, content in sorted(files.items()))
    return f"We have the following issue in our repository:\n\n{issue.strip()}\n\nThe relevant files:\n\n" \
           f"{shown}\n\n{INSTRUCTIONS}"


class SWERLEpisode:
    def __init__(self, env: "SWERLEnv", instance: Mapping[str, Any]):
        self.env = env
        self.instance = instance
        self.turn = 0
        self.messages: list[Message] = [{"role": "user", "content": render_prompt(
            instance["problem_statement"], instance["code_context"])}]

    def step(self, answer: str) -> StepResult:
        if self.turn:
            raise RuntimeError(f"SWE-RL episode {self.instance['instance_id']!r}: it has a single turn")
        self.turn = 1
        self.messages.append({"role": "assistant", "content": answer})
        reward, meta = compute_reward(dict(self.instance["code_context"]), dict(self.instance["oracle_new_content"]),
                                      answer, self.env.reward_variant)
        status = f"malformed_{meta['error_kind']}" if "error" in meta else (
            "exact" if reward == 1.0 else "edited")
        return StepResult(reward, True, None, status, {"solved": status == "exact", **(
            {"error": meta["error"]} if "error" in meta else {})})

    def end_early(self, status: str) -> StepResult:
        raise RuntimeError("SWE-RL episodes have a single turn; there is nothing to end early")


class SWERLEnv:
    max_turns = 1

    def __init__(self, reward_variant: str = "similarity"):
        if reward_variant not in VARIANTS:
            raise ValueError(f"SWERLEnv.reward_variant {reward_variant!r}: expected one of {VARIANTS}")
        self.reward_variant = reward_variant

    def parse(self, instance: Mapping[str, Any]) -> Mapping[str, Any]:
        """The instance itself, once its fields are checked."""
        require_fields(instance, ("instance_id", "problem_statement", "code_context", "oracle_new_content"), "SWE-RL")
        for field in ("code_context", "oracle_new_content"):
            value = instance[field]
            if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in value.items()):
                raise ProblemError(f"SWE-RL problem {instance['instance_id']!r}: {field} must map paths to file "
                                   "contents (str -> str)")
        if not instance["code_context"]:
            raise ProblemError(f"SWE-RL problem {instance['instance_id']!r}: code_context is empty")
        return instance

    def open(self, instance: Mapping[str, Any]) -> SWERLEpisode:
        return SWERLEpisode(self, instance)

    def reset(self, instance: Mapping[str, Any]) -> SWERLEpisode:
        return self.open(self.parse(instance))
