"""RLEF (Gehring et al. 2025): a competitive-programming dialog of up to `max_turns` answers.

Each answer's code runs on the problem's public tests; on failure the model reads the feedback and tries
again; the dialog stops early when the public tests pass. The last answer is judged on public + private
tests (the private ones are never shown). Task rewards: `rewards.solved` (+1) when that final answer passes
everything, `rewards.failed` (-1) when it fails any test, `rewards.no_code` (-0.2) for any answer without a
valid ```python block, 0 for an intermediate answer with code.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable, Mapping, Sequence

from executor.extract import extract_code
from executor.feedback import MODES, NO_CODE, RETRY, feedback_text
from executor.testing import (WRONG_RESULT_EXIT, AssertTest, Limits, Test, TestResult, TestRunCache, limits_for_problem,
                              run_tests)
from models.chat import Message
from rljax.envs.base import ProblemError, StepResult, require_fields

PROMPT = ("Provide a Python solution for the following competitive programming question: {description}\n\n"
          "Write the whole program in one ```python code block. It reads the input from standard input and "
          "prints the answer to standard output.")
PYTHON3 = 3  # CodeContests' language code of Python 3 solutions


@dataclasses.dataclass(frozen=True)
class RLEFRewards:
    solved: float = 1.0
    failed: float = -1.0
    no_code: float = -0.2
    intermediate: float = 0.0


@dataclasses.dataclass(frozen=True)
class CodeProblem:
    name: str
    description: str
    public_tests: tuple[Test, ...] | tuple[AssertTest, ...]
    private_tests: tuple[Test, ...] | tuple[AssertTest, ...]
    limits: Limits


TEST_KINDS = ("stdio", "assert")
_EXAMPLE_CHECK = """__rljax_got = {call}
print(repr(__rljax_got))
def __rljax_same(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 1e-6
    return a == b
if not __rljax_same(__rljax_got, {expected}):
    raise SystemExit(%d)
""" % WRONG_RESULT_EXIT


def _assert_tests(public: tuple[Test, ...], private: tuple[Test, ...], entry_point: str
                  ) -> tuple[tuple[AssertTest, ...], tuple[AssertTest, ...]]:
    """Assertion-test rows (HumanEval): a public test's input is a call and its output the expected value (a
    Python literal); a private test's input is test code defining `check`, run as `check(entry_point)`."""
    shown = tuple(AssertTest(_EXAMPLE_CHECK.format(call=t.input, expected=t.output), None, t.input, t.output)
                  for t in public)
    return shown, tuple(AssertTest(t.input, entry_point) for t in private)


def _tests(row: Mapping[str, Any], field: str, name: str) -> tuple[Test, ...]:
    value = row.get(field)
    if value is None:
        return ()
    if not isinstance(value, Mapping) or "input" not in value or "output" not in value:
        raise ProblemError(f"RLEF problem {name!r}: {field} must be {{'input': [...], 'output': [...]}}")
    inputs, outputs = list(value["input"]), list(value["output"])
    if len(inputs) != len(outputs):
        raise ProblemError(f"RLEF problem {name!r}: {field} has {len(inputs)} inputs but {len(outputs)} outputs")
    return tuple(Test(str(i), str(o)) for i, o in zip(inputs, outputs))


def parse_problem(row: Mapping[str, Any], default_limits: Limits = Limits(),
                  use_problem_limits: bool = True) -> CodeProblem:
    """A CodeContests-schema row as a `CodeProblem`; a row without public or private tests is refused.

    `test_kind` "assert" (HumanEval rows, with `entry_point`) makes assertion tests of the same fields; such a
    row may lack public tests (no docstring example): its first answer is then judged on the private tests.
    """
    require_fields(row, ("name", "description", "public_tests", "private_tests"), "RLEF")
    name = str(row["name"])
    public, private = _tests(row, "public_tests", name), _tests(row, "private_tests", name)
    kind = row.get("test_kind", "stdio")
    if kind not in TEST_KINDS:
        raise ProblemError(f"RLEF problem {name!r}: test_kind {kind!r} is not one of {list(TEST_KINDS)}")
    if kind == "assert":
        if not private or not row.get("entry_point"):
            raise ProblemError(f"RLEF problem {name!r}: assertion tests need private tests and an entry_point")
        limits = limits_for_problem(row, default_limits) if use_problem_limits else default_limits
        return CodeProblem(name, str(row["description"]), *_assert_tests(public, private, str(row["entry_point"])),
                           limits)
    if not public:
        raise ProblemError(f"RLEF problem {name!r}: no public tests (the feedback turns need them)")
    if not private:
        raise ProblemError(f"RLEF problem {name!r}: no private tests (the final answer is judged on them)")
    limits = limits_for_problem(row, default_limits) if use_problem_limits else default_limits
    return CodeProblem(name, str(row["description"]), public, private, limits)


class RLEFEpisode:
    def __init__(self, env: "RLEFEnv", problem: CodeProblem):
        self.env = env
        self.problem = problem
        self.turn = 0
        self.last_status = ""
        self.messages: list[Message] = [{"role": "user", "content": env.prompt.format(
            description=problem.description.strip())}]

    def step(self, answer: str) -> StepResult:
        env, problem = self.env, self.problem
        if self.turn >= env.max_turns:
            raise RuntimeError(f"RLEF episode {problem.name!r}: already ended after {self.turn} answers")
        self.turn += 1
        self.messages.append({"role": "assistant", "content": answer})
        last = self.turn >= env.max_turns
        code = env.code_extractor(answer)
        info: dict[str, Any] = {"turn": self.turn, "has_code": code is not None}
        if code is None:
            result = StepResult(env.rewards.no_code, last, None if last else env.no_code_feedback(), "no_code", info)
        else:
            public = env.run_tests(code, problem.public_tests, problem.limits)
            info["public_passed"] = sum(r.passed for r in public)
            info["public_statuses"] = [r.status for r in public]
            if all(r.passed for r in public):
                private = env.run_tests(code, problem.private_tests, problem.limits)
                info["private_passed"] = sum(r.passed for r in private)
                solved = all(r.passed for r in private)
                result = StepResult(env.rewards.solved if solved else env.rewards.failed, True, None,
                                    "solved" if solved else "failed_private", info)
            elif last:
                result = StepResult(env.rewards.failed, True, None, "failed_public", info)
            else:
                result = StepResult(env.rewards.intermediate, False, env.failure_feedback(code, problem, public),
                                    "retry", info)
        result.info["solved"] = result.status == "solved"
        self.last_status = result.status
        if not result.done:
            self.messages.append({"role": "user", "content": result.feedback})
        return result

    def end_early(self, status: str) -> StepResult:
        """The last answer (which failed its public tests or had no code) becomes the final one; its reward
        replaces that answer's intermediate reward."""
        reward = self.env.rewards.no_code if self.last_status == "no_code" else self.env.rewards.failed
        self.turn = self.env.max_turns
        return StepResult(reward, True, None, status, {"turn": self.turn, "solved": False})


class RLEFEnv:
    """RLEF's environment. `feedback_mode` full | none | unrelated (the paper's ablations); `unrelated` runs
    the answer on the public tests of another problem from `unrelated_problems` and shows those failures."""

    def __init__(self, max_turns: int = 3, rewards: RLEFRewards = RLEFRewards(), feedback_mode: str = "full",
                 default_limits: Limits = Limits(), use_problem_limits: bool = True, prompt: str = PROMPT,
                 code_extractor: Callable[[str], str | None] = extract_code,
                 unrelated_problems: Sequence[Mapping[str, Any]] = (), feedback_max_chars: int = 1000,
                 feedback_max_tests: int = 10, test_cache_chars: int = 0):
        if max_turns < 1:
            raise ValueError(f"RLEFEnv.max_turns must be >= 1, got {max_turns}")
        if feedback_mode not in MODES:
            raise ValueError(f"RLEFEnv.feedback_mode {feedback_mode!r}: expected one of {MODES}")
        if "{description}" not in prompt:
            raise ValueError("RLEFEnv.prompt must contain '{description}'")
        self.max_turns = max_turns
        self.rewards = rewards
        self.feedback_mode = feedback_mode
        self.default_limits = default_limits
        self.use_problem_limits = use_problem_limits
        self.prompt = prompt
        self.code_extractor = code_extractor
        self.feedback_max_chars = feedback_max_chars
        self.feedback_max_tests = feedback_max_tests
        self.unrelated = [self.parse(p) for p in unrelated_problems]
        # test_cache_chars > 0: a program already run on the same tests gets its stored results (TestRunCache)
        self.test_runs = TestRunCache(test_cache_chars) if test_cache_chars > 0 else None
        if feedback_mode == "unrelated" and len(self.unrelated) < 2:
            raise ValueError("RLEFEnv: feedback_mode 'unrelated' needs at least 2 unrelated_problems")

    def run_tests(self, code: str, tests: Sequence[Test | AssertTest], limits: Limits) -> list[TestResult]:
        """`executor.testing.run_tests`, through the cache when there is one."""
        return run_tests(code, tests, limits) if self.test_runs is None else self.test_runs.run(code, tests, limits)

    def parse(self, row: Mapping[str, Any]) -> CodeProblem:
        return parse_problem(row, self.default_limits, self.use_problem_limits)

    def open(self, problem: CodeProblem) -> RLEFEpisode:
        return RLEFEpisode(self, problem)

    def reset(self, row: Mapping[str, Any]) -> RLEFEpisode:
        return self.open(self.parse(row))

    def demonstration(self, row: Mapping[str, Any]) -> str | None:
        """The row's `demonstration` text if it has one, else its first Python 3 reference solution (the
        CodeContests `solutions` field, language 3) in a ```python block; None when it has neither."""
        if isinstance(row.get("demonstration"), str):
            return row["demonstration"]
        solutions = row.get("solutions")
        if not isinstance(solutions, Mapping):
            return None
        for language, code in zip(solutions.get("language", ()), solutions.get("solution", ())):
            if language == PYTHON3 and isinstance(code, str) and code.strip():
                return f"```python\n{code.strip()}\n```"
        return None

    def no_code_feedback(self) -> str:
        return RETRY if self.feedback_mode == "none" else f"{NO_CODE}\n{RETRY}"

    def failure_feedback(self, code: str, problem: CodeProblem, public: list[TestResult]) -> str:
        if self.feedback_mode == "unrelated":
            other = self._unrelated_for(problem)
            public = self.run_tests(code, other.public_tests, other.limits)
            if all(r.passed for r in public):
                return RETRY
        return feedback_text(public, self.feedback_mode, self.feedback_max_chars, self.feedback_max_tests)

    def _unrelated_for(self, problem: CodeProblem) -> CodeProblem:
        """A fixed other problem per problem name (deterministic across runs and hosts)."""
        candidates = [p for p in self.unrelated if p.name != problem.name]
        digest = int(hashlib.sha256(problem.name.encode()).hexdigest(), 16)
        return candidates[digest % len(candidates)]
