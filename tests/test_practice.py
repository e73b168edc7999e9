"""The practice problems (rljax.data.practice): reference solutions pass through the sandbox, a protocol-breaking
answer fails, train and held-out families are disjoint, and the shipped file is reproducible from its seed."""
import json

import pytest

from rljax.data.practice import PRACTICE_PROBLEMS, SEED, generate, practice_problems, verify
from rljax.envs import RLEFEnv


def _shipped() -> list[dict]:
    return [json.loads(line) for line in PRACTICE_PROBLEMS.read_text().splitlines()]


def test_the_shipped_file_is_the_generator_output_for_its_seed():
    assert generate(SEED) == _shipped()
    assert generate(SEED + 1) != _shipped()


def test_sizes_and_disjoint_families():
    train, heldout = practice_problems("train"), practice_problems("heldout")
    assert len(train) >= 300 and len(heldout) >= 40
    train_families, heldout_families = {r["family"] for r in train}, {r["family"] for r in heldout}
    assert len(train_families) >= 20 and len(heldout_families) >= 10
    assert not train_families & heldout_families
    rows = train + heldout
    assert len({r["name"] for r in rows}) == len(rows) and len({r["description"] for r in rows}) == len(rows)
    assert all(len(r["public_tests"]["input"]) >= 1 and len(r["private_tests"]["input"]) >= 3 for r in rows)
    with pytest.raises(ValueError, match="split 'test'"):
        practice_problems("test")


def test_every_reference_solution_passes_its_tests_in_the_sandbox():
    assert verify(_shipped()) == []


def test_a_wrong_reference_is_caught():
    row = dict(practice_problems("heldout")[0])
    row["solutions"] = {"language": [3], "solution": ["print(input())\n"]}
    assert verify([row]) == [row["name"]]


def test_answers_that_prompt_or_decorate_fail_the_public_tests():
    """The 135M model's habits: prompting in input() and decorating the answer. Both must fail."""
    env = RLEFEnv(max_turns=1)
    for row in practice_problems("heldout")[:12]:
        solution = row["solutions"]["solution"][0]
        right = env.reset(row).step(f"```python\n{solution}```")
        prompting = env.reset(row).step(f"```python\nprint('Enter the input:')\n{solution}```")
        decorated = env.reset(row).step("```python\n" + solution.replace("print(", "print('Answer:', ", 1) + "```")
        assert (right.status, prompting.status, decorated.status) == ("solved", "failed_public", "failed_public"), \
            row["name"]
