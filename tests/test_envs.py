"""RLEF and SWE-RL environments: exact rewards, turn logic, feedback text, bad problems."""
from __future__ import annotations

import pytest

from executor.feedback import HEADER, NO_CODE, RETRY
from rljax.envs import ProblemError, RLEFEnv, RLEFRewards, SWERLEnv

SUM = {"name": "sum", "description": "Read two integers and print their sum.",
       "public_tests": {"input": ["1 2\n", "5 5\n"], "output": ["3\n", "10\n"]},
       "private_tests": {"input": ["100 23\n", "-4 4\n"], "output": ["123\n", "0\n"]},
       "time_limit": {"seconds": 2, "nanos": 0}, "memory_limit_bytes": 256 * 2**20}
ECHO = {"name": "echo", "description": "Print the input.", "public_tests": {"input": ["7\n"], "output": ["7\n"]},
        "private_tests": {"input": ["8\n"], "output": ["8\n"]}}

RIGHT = "Here:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"
WRONG = "```python\na, b = map(int, input().split())\nprint(a - b)\n```"
PUBLIC_ONLY = "```python\ns = input()\nprint({'1 2': 3, '5 5': 10}[s])\n```"  # passes public, fails private
NO_CODE_ANSWER = "I would add the numbers."


def test_solved_in_one_turn_gets_plus_one_and_stops():
    episode = RLEFEnv().reset(SUM)
    assert "Provide a Python solution for the following competitive programming question" in \
        episode.messages[0]["content"]
    result = episode.step(RIGHT)
    assert (result.reward, result.done, result.status, result.info["solved"]) == (1.0, True, "solved", True)
    assert [m["role"] for m in episode.messages] == ["user", "assistant"]


def test_three_turns_with_feedback_then_failure():
    episode = RLEFEnv(max_turns=3).reset(SUM)
    first = episode.step(WRONG)
    assert (first.reward, first.done, first.status) == (0.0, False, "retry")
    assert first.feedback.startswith(HEADER) and first.feedback.endswith(RETRY)
    assert "input '1 2' failed: Expected output '3' but got '-1'" in first.feedback
    second = episode.step(NO_CODE_ANSWER)
    assert (second.reward, second.done, second.status) == (-0.2, False, "no_code")
    assert second.feedback == f"{NO_CODE}\n{RETRY}"
    third = episode.step(WRONG)
    assert (third.reward, third.done, third.status) == (-1.0, True, "failed_public")
    assert [m["role"] for m in episode.messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    with pytest.raises(RuntimeError, match="already ended"):
        episode.step(RIGHT)


def test_public_pass_stops_early_and_private_decides():
    episode = RLEFEnv().reset(SUM)
    result = episode.step(PUBLIC_ONLY)
    assert (result.reward, result.done, result.status) == (-1.0, True, "failed_private")
    assert result.info["public_passed"] == 2 and result.info["private_passed"] == 0


def test_final_answer_without_code_and_custom_rewards():
    env = RLEFEnv(max_turns=1, rewards=RLEFRewards(solved=2.0, failed=-3.0, no_code=-0.5))
    assert env.reset(SUM).step(NO_CODE_ANSWER).reward == -0.5
    assert env.reset(SUM).step(WRONG).reward == -3.0
    assert env.reset(SUM).step(RIGHT).reward == 2.0


def test_feedback_modes_none_and_unrelated():
    none = RLEFEnv(feedback_mode="none").reset(SUM).step(WRONG)
    assert none.feedback == RETRY
    env = RLEFEnv(feedback_mode="unrelated", unrelated_problems=[SUM, ECHO])
    unrelated = env.reset(SUM).step(WRONG)
    assert "input '7' failed" in unrelated.feedback and "1 2" not in unrelated.feedback  # echo's test, not sum's
    with pytest.raises(ValueError, match="unrelated"):
        RLEFEnv(feedback_mode="unrelated")


def test_timeout_and_limits_from_the_problem():
    slow = "```python\nwhile True:\n    pass\n```"
    row = dict(SUM, time_limit={"seconds": 0, "nanos": 300_000_000})
    result = RLEFEnv().reset(row).step(slow)
    assert result.status == "retry" and "Execution took too long." in result.feedback


@pytest.mark.parametrize("change, message", [
    ({"public_tests": {"input": [], "output": []}}, "no public tests"),
    ({"private_tests": None}, "no private tests"),
    ({"public_tests": {"input": ["1"], "output": []}}, "1 inputs but 0 outputs"),
    ({"public_tests": ["1"]}, "public_tests must be"),
])
def test_bad_problems_are_refused_with_one_line(change, message):
    with pytest.raises(ProblemError, match=message):
        RLEFEnv().reset(dict(SUM, **change))
    row = dict(SUM)
    del row["description"]
    with pytest.raises(ProblemError, match=r"'sum': missing field\(s\) \['description'\]"):
        RLEFEnv().reset(row)


INSTANCE = {"instance_id": "demo-1", "problem_statement": "add() subtracts instead of adding",
            "code_context": {"calc.py": "def add(a, b):\n    return a - b\n"},
            "oracle_new_content": {"calc.py": "def add(a, b):\n    return a + b\n"}}
ORACLE_ANSWER = ("<think>the operator is wrong</think>\n<solution>\n```python\n### calc.py\n<<<<<<< SEARCH\n"
                 "    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n```\n</solution>")


def test_swerl_prompt_rewards_and_variants():
    episode = SWERLEnv().reset(INSTANCE)
    prompt = episode.messages[0]["content"]
    assert "add() subtracts" in prompt and "--- calc.py" in prompt and "return a - b" in prompt
    assert "<think>" in prompt and "<solution>" in prompt and "<<<<<<< SEARCH" in prompt
    oracle = episode.step(ORACLE_ANSWER)
    assert (oracle.reward, oracle.done, oracle.status) == (1.0, True, "exact")
    malformed = SWERLEnv().reset(INSTANCE).step("no tags here")
    assert malformed.reward == -1.0 and malformed.status.startswith("malformed_")
    near = ORACLE_ANSWER.replace("return a + b", "return a + b + 0")
    similar = SWERLEnv().reset(INSTANCE).step(near)
    assert 0.5 < similar.reward < 1.0 and similar.status == "edited"
    assert SWERLEnv("exact_match").reset(INSTANCE).step(near).reward == 0.0
    with pytest.raises(ValueError, match="reward_variant"):
        SWERLEnv("bleu")
    with pytest.raises(ProblemError, match="code_context must map"):
        SWERLEnv().reset(dict(INSTANCE, code_context={"calc.py": 3}))


def test_end_early_makes_the_last_answer_final():
    episode = RLEFEnv().reset(SUM)
    episode.step(WRONG)
    cut = episode.end_early("context_full")
    assert (cut.reward, cut.done, cut.status) == (-1.0, True, "context_full")
    episode = RLEFEnv().reset(SUM)
    episode.step(NO_CODE_ANSWER)
    assert episode.end_early("context_full").reward == -0.2


def test_oracle_answer_reproduces_random_line_edits_exactly():
    """Edits of repeated lines need context to be unique; overlapping blocks merge; only a file of blank lines
    (before or after) may be impossible to write as search/replace blocks: every blank line matches."""
    import random

    from executor.swe_reward import compute_reward
    from rljax.envs.swerl import oracle_answer

    rng = random.Random(0)
    solved = 0
    for _ in range(400):
        old = [rng.choice(["a", "b", "x = 1", "    return y", ""]) + "\n" for _ in range(rng.randint(1, 10))]
        new = list(old)
        for _ in range(rng.randint(1, 3)):
            k = rng.randrange(len(new) + 1)
            op = rng.random()
            if op < 0.4 and new:
                new[min(k, len(new) - 1)] = rng.choice(["z", "b", ""]) + "\n"
            elif op < 0.7:
                new.insert(k, rng.choice(["w", "a"]) + "\n")
            elif new:
                del new[min(k, len(new) - 1)]
        before, after = "".join(old), "".join(new)
        if before == after:
            continue
        instance = {"instance_id": "t", "code_context": {"f.py": before}, "oracle_new_content": {"f.py": after}}
        try:
            answer = oracle_answer(instance)
        except ValueError as err:
            assert "cannot be written" in str(err) and not (before.strip() and after.strip()), (before, after)
            continue
        reward, _ = compute_reward({"f.py": before}, {"f.py": after}, answer, "exact_match")
        assert reward == 1.0, (before, after)
        solved += 1
    assert solved > 300


def test_the_demonstration_thought_names_the_changed_definitions():
    from rljax.envs.swerl import changed_definitions, localizing_thought

    old = ("import os\n\nclass Box:\n    def size(self):\n        return 1\n\n    def name(self):\n"
           "        return 'b'\n\nasync def load(path):\n    def inner():\n        return 2\n    return inner()\n")
    new = old.replace("return 1", "return 2").replace("return 2\n    return", "return 3\n    return") \
        .replace("import os", "import sys")
    assert changed_definitions(old, new) == ["size", "inner"]  # innermost definition; the import has none
    assert changed_definitions(old, new.replace("load(path)", "load(path, mode)")) == ["size", "load", "inner"]
    instance = {"code_context": {"b.py": old, "a.py": "x = 1\n"},
                "oracle_new_content": {"b.py": new, "a.py": "x = 2\n"}}
    assert localizing_thought(instance) == ("The issue is about a.py and `size`, `inner` in b.py. The edit below "
                                            "fixes the wrong line there.")


def test_swerl_rows_without_oracle_change_or_with_invalid_text_are_refused():
    env = SWERLEnv()
    with pytest.raises(ProblemError, match="changes no file"):
        env.parse(dict(INSTANCE, oracle_new_content=dict(INSTANCE["code_context"])))
    with pytest.raises(ProblemError, match=r"code_context\['calc.py'\] is not valid UTF-8"):
        env.parse(dict(INSTANCE, code_context={"calc.py": "x = '\udcff'\n"}))
    with pytest.raises(ProblemError, match="problem_statement must be non-empty"):
        env.parse(dict(INSTANCE, problem_statement="  "))
