"""SWE-RL (Wei et al. 2025): one answer per issue, scored against the developers' patch; no execution.

The prompt holds the issue text and the full contents of the given files, and asks for reasoning in
<think>...</think> then search/replace edits in <solution>...</solution>. The reward is
`executor.compute_reward`: -1 when the answer is malformed, else the difflib ratio between the patch the
edits produce and the oracle patch ("similarity"), or 1/0 on exact match ("exact_match").
"""
from __future__ import annotations

import difflib
import re
from typing import Any, Callable, Mapping, Sequence

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


def prompt_messages(instance: Mapping[str, Any]) -> list[Message]:
    """The dialog an instance opens with: one user message."""
    return [{"role": "user", "content": render_prompt(instance["problem_statement"], instance["code_context"])}]


def prompt_token_counter(codec: Any) -> Callable[[Mapping[str, Any]], int]:
    """instance -> the length in tokens of its prompt as a run sees it (the codec's chat template and
    generation prompt included); `rljax mine --max-prompt-tokens` filters with it."""
    return lambda instance: len(codec.prompt_ids(prompt_messages(instance)))


def _block(path: str, search: Sequence[str], replace: Sequence[str]) -> str:
    return (f"```python\n### {path}\n<<<<<<< SEARCH\n{''.join(search)[:-1]}\n=======\n{''.join(replace)[:-1]}\n"
            ">>>>>>> REPLACE\n```")


def _occurrences(text: str, part: str) -> int:
    """How many times `part` occurs in `text`, overlapping ones included."""
    count, start = 0, text.find(part)
    while start >= 0:
        count, start = count + 1, text.find(part, start + 1)
    return count


def _full_lines(text: str) -> list[str]:
    """The lines of `text`, each ending in a newline (the last one too)."""
    return [line if line.endswith("\n") else line + "\n" for line in text.splitlines(keepends=True)]


def _file_blocks(path: str, old: str, new: str, single: bool = False) -> list[str]:
    """Search/replace blocks turning `old` into `new`: one per changed run of lines (`single`: one for all),
    widened by whole lines of context until its search text is unique in the file and neither side is empty;
    runs whose widened blocks overlap are merged."""
    if not old:
        return [_block(path, ["\n"], [new if new.endswith("\n") else new + "\n"])]
    a, b = _full_lines(old), _full_lines(new)

    def widen(i1: int, i2: int, j1: int, j2: int) -> tuple[int, int, int, int]:
        while not (i2 > i1 and j2 > j1 and _occurrences("\n" + old, "\n" + "".join(a[i1:i2])[:-1]) == 1):
            if i1 == 0 and i2 == len(a):
                break
            if i1 > 0:
                i1, j1 = i1 - 1, j1 - 1
            if i2 < len(a):
                i2, j2 = i2 + 1, j2 + 1
        return i1, i2, j1, j2

    runs = [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in
            difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if tag != "equal"]
    if single and runs:
        runs = [(runs[0][0], runs[-1][1], runs[0][2], runs[-1][3])]
    hunks: list[tuple[int, int, int, int]] = []
    for run in runs:
        hunk = widen(*run)
        while hunks and hunk[0] < hunks[-1][1]:  # overlaps the previous block: one block for both
            previous = hunks.pop()
            hunk = widen(previous[0], hunk[1], previous[2], hunk[3])
        hunks.append(hunk)
    return [_block(path, a[i1:i2], b[j1:j2]) for i1, i2, j1, j2 in hunks]


def _answer(blocks: Sequence[str], thought: str) -> str:
    return f"<think>\n{thought}\n</think>\n<solution>\n" + "\n".join(blocks) + "\n</solution>"


_DEFINITION = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _enclosing_definition(lines: Sequence[str], i: int) -> str | None:
    """The `def`/`class` whose body holds line i (or that line's own definition), by indentation."""
    match = _DEFINITION.match(lines[i])
    if match:
        return match.group(1)
    indent = _indent(lines[i]) if lines[i].strip() else 1 << 30
    for line in reversed(lines[:i]):
        if not line.strip() or _indent(line) >= indent:
            continue
        match = _DEFINITION.match(line)
        if match:
            return match.group(1)
        indent = _indent(line)  # an enclosing statement (if, for, ...): look further out
    return None


def changed_definitions(old: str, new: str) -> list[str]:
    """Names of the innermost functions or classes whose lines `old` -> `new` changes, in file order, without
    repeats; a change outside any definition adds none."""
    a, b = _full_lines(old), _full_lines(new)
    names: list[str] = []
    if not a:  # a new file: no definition of the old one encloses the change
        return names
    for tag, i1, _, _, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        name = _enclosing_definition(a, min(i1, len(a) - 1))
        if name and name not in names:
            names.append(name)
    return names


def localizing_thought(instance: Mapping[str, Any]) -> str:
    """Reasoning that locates the oracle change: which definitions of which files it edits."""
    context, oracle = dict(instance["code_context"]), dict(instance["oracle_new_content"])
    places = []
    for path in sorted(p for p in oracle if context.get(p, "") != oracle[p]):
        names = changed_definitions(context.get(path, ""), oracle[path])
        places.append(f"{', '.join(f'`{n}`' for n in names)} in {path}" if names else path)
    return f"The issue is about {' and '.join(places)}. The edit below fixes the wrong line there."


def oracle_answer(instance: Mapping[str, Any], thought: str | None = None) -> str:
    """An answer in the paper's format whose edits reproduce the oracle patch exactly (reward 1.0 under both
    variants), with `thought` (default: `localizing_thought`) as its reasoning: the supervised warm-up's
    demonstration, a scripted policy for end-to-end tests and a check that an instance is solvable. Raises
    ValueError when no such answer exists (e.g. the oracle deletes a whole file)."""
    context, oracle = dict(instance["code_context"]), dict(instance["oracle_new_content"])
    thought = localizing_thought(instance) if thought is None else thought
    changed = [path for path in sorted(oracle) if context.get(path, "") != oracle[path]]
    for single in (False, True):  # one block per changed run; else one block per file
        blocks = [block for path in changed for block in _file_blocks(path, context.get(path, ""), oracle[path],
                                                                     single)]
        answer = _answer(blocks, thought)
        if blocks and compute_reward(context, oracle, answer, "exact_match")[0] == 1.0:
            return answer
    raise ValueError(f"SWE-RL instance {instance.get('instance_id')!r}: its oracle change cannot be written "
                     "as search/replace edits that reproduce it exactly")


class SWERLEpisode:
    def __init__(self, env: "SWERLEnv", instance: Mapping[str, Any]):
        self.env = env
        self.instance = instance
        self.turn = 0
        self.messages: list[Message] = prompt_messages(instance)

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
        """The instance itself, once its fields are checked: file maps of str -> str in valid UTF-8, a
        non-empty context, and an oracle that changes something."""
        require_fields(instance, ("instance_id", "problem_statement", "code_context", "oracle_new_content"), "SWE-RL")
        name = instance["instance_id"]
        if not isinstance(instance["problem_statement"], str) or not instance["problem_statement"].strip():
            raise ProblemError(f"SWE-RL problem {name!r}: problem_statement must be non-empty text")
        for field in ("code_context", "oracle_new_content"):
            value = instance[field]
            if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in value.items()):
                raise ProblemError(f"SWE-RL problem {name!r}: {field} must map paths to file contents (str -> str)")
            for path, text in value.items():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as err:
                    raise ProblemError(f"SWE-RL problem {name!r}: {field}[{path!r}] is not valid UTF-8 text "
                                       f"({err.reason} at character {err.start})") from None
        if not instance["code_context"]:
            raise ProblemError(f"SWE-RL problem {name!r}: code_context is empty")
        if not any(instance["code_context"].get(p, "") != new for p, new in instance["oracle_new_content"].items()):
            raise ProblemError(f"SWE-RL problem {name!r}: oracle_new_content is empty or changes no file (nothing "
                               "to compare an answer with)")
        return instance

    def open(self, instance: Mapping[str, Any]) -> SWERLEpisode:
        return SWERLEpisode(self, instance)

    def reset(self, instance: Mapping[str, Any]) -> SWERLEpisode:
        return self.open(self.parse(instance))

    def demonstration(self, instance: Mapping[str, Any]) -> str:
        """The oracle edits in the paper's format (`oracle_answer`); ValueError when they cannot be written."""
        return oracle_answer(instance)
