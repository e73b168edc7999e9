"""Problem sources: bundled demo problems, CodeContests parquet shards, HumanEval through the real executor."""
import pytest

from executor.pool import ExecutorPool
from executor.testing import run_tests
from rljax.data import bundled_problems, load_code_contests, load_humaneval
from rljax.data.humaneval import WRONG_EXAMPLES, docstring_examples, humaneval_row
from rljax.envs import RLEFEnv


def _block(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}```\n"


def test_every_bundled_problem_is_solved_by_its_reference_and_failed_by_a_wrong_answer():
    rows = bundled_problems()
    assert len(rows) >= 30 and len({r["name"] for r in rows}) == len(rows)
    env = RLEFEnv()

    def judge(row):
        right = env.reset(row).step(_block(row["solutions"]["solution"][0]))
        wrong = env.reset(row).step(_block("print(42)\n"))
        return row["name"], right.status, right.reward, wrong.status

    with ExecutorPool() as pool:
        results = [f.result() for f in [pool.submit(judge, row) for row in rows]]
    assert [(n, s, r) for n, s, r, _ in results if s != "solved" or r != 1.0] == []
    assert all(w == "retry" for *_, w in results)  # 42 is no problem's public answer


def _write_shard(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tests = pa.struct([("input", pa.list_(pa.string())), ("output", pa.list_(pa.string()))])
    schema = pa.schema([("name", pa.string()), ("description", pa.string()), ("public_tests", tests),
                        ("private_tests", tests), ("generated_tests", tests), ("source", pa.int64()),
                        ("difficulty", pa.int64()), ("solutions", pa.struct([("language", pa.list_(pa.int64())),
                                                                              ("solution", pa.list_(pa.string()))])),
                        ("time_limit", pa.struct([("seconds", pa.int64()), ("nanos", pa.int64())])),
                        ("memory_limit_bytes", pa.int64())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def _cc_row(name, public, private, generated=((), ())):
    return {"name": name, "description": f"Echo the number ({name}).", "source": 2, "difficulty": 7,
            "public_tests": {"input": list(public[0]), "output": list(public[1])},
            "private_tests": {"input": list(private[0]), "output": list(private[1])},
            "generated_tests": {"input": list(generated[0]), "output": list(generated[1])},
            "solutions": {"language": [3], "solution": ["print(input())"]},
            "time_limit": {"seconds": 1, "nanos": 500_000_000}, "memory_limit_bytes": 128 * 2**20}


def test_code_contests_shards_are_filtered_as_rlef_does_and_counted(tmp_path):
    echo = (["1\n"], ["1\n"])
    _write_shard(tmp_path / "train-00000-of-00002.parquet",
                 [_cc_row("ok_a", echo, (["2\n"], ["2\n"]), (["3\n"], ["4\n"])), _cc_row("no_public", ([], []), echo)])
    _write_shard(tmp_path / "train-00001-of-00002.parquet",
                 [_cc_row("no_private", echo, ([], [])), _cc_row("ok_b", echo, (["5\n"], ["5\n"])),
                  {**_cc_row("no_tests_field", echo, echo), "private_tests": None}])
    rows, report = load_code_contests(tmp_path)
    assert [r["name"] for r in rows] == ["ok_a", "ok_b"]
    assert (report.read, report.kept) == (5, 2)
    assert dict(report.dropped) == {"no public tests": 1, "no private tests": 1, "missing private_tests": 1}
    assert "dropped 3" in report.summary()
    env = RLEFEnv()
    problem = env.parse(rows[0])
    assert problem.limits.time_limit_s == 1.5 and problem.limits.memory_limit_mb == 128
    assert env.reset(rows[0]).step(_block("print(input())\n")).reward == 1.0
    # generated tests as private: ok_a's generated test expects 4 for input 3, so echo now fails privately
    strict, _ = load_code_contests(str(tmp_path / "*.parquet"), generated_as_private=True)
    assert len(strict[0]["private_tests"]["input"]) == 2
    assert env.reset(strict[0]).step(_block("print(input())\n")).status == "failed_private"


def test_code_contests_bad_shards_fail_with_one_line(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ValueError, match=r"CodeContests shard .*bad.parquet: not a readable parquet file"):
        load_code_contests(tmp_path)
    with pytest.raises(FileNotFoundError, match="no parquet shards"):
        load_code_contests(str(tmp_path / "missing-*.parquet"))


def test_humaneval_canonical_solutions_pass_public_and_private_and_a_corrupted_one_fails():
    rows = load_humaneval()
    assert len(rows) == 164
    env = RLEFEnv(prompt="{description}")

    def judge(row):
        problem = env.parse(row)
        code = row["prompt"] + row["canonical_solution"]
        public = run_tests(code, problem.public_tests, problem.limits)
        private = run_tests(code, problem.private_tests, problem.limits)
        return row["name"], all(r.passed for r in public), all(r.passed for r in private), len(public)

    with ExecutorPool() as pool:
        results = [f.result() for f in [pool.submit(judge, row) for row in rows]]
    assert [n for n, pub, priv, _ in results if not (pub and priv)] == []
    assert sum(n > 0 for *_, n in results) >= 130 and sum(n for *_, n in results) >= 350

    row = rows[2]  # truncate_number: `>>> truncate_number(3.5)` / 0.5
    assert row["public_tests"] == {"input": ["truncate_number(3.5)"], "output": ["0.5"]}
    wrong = "```python\ndef truncate_number(number: float) -> float:\n    return number\n```"
    step = env.reset(row).step(wrong)
    assert step.status == "retry" and "truncate_number(3.5)" in step.feedback and "'0.5'" in step.feedback
    assert "but got '3.5'" in step.feedback
    off_by_one = "```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0 + (number > 9)\n```"
    assert env.reset(row).step(off_by_one).status == "failed_private"  # passes the example, fails check


def test_humaneval_example_parsing_and_the_known_wrong_examples():
    prompt = ('def f(x):\n    """Examples:\n    >>> f(2)\n    4\n    f(3) ==> 9\n    * f(1) => 1\n'
              '    f(abc) == 2\n    for f(5) = 25\n    """\n')
    assert docstring_examples(prompt, "f") == [("f(2)", "4"), ("f(3)", "9"), ("f(1)", "1"), ("f(5)", "25")]
    by_name = {r["name"]: r for r in load_humaneval()}
    for task, call in WRONG_EXAMPLES:  # still in the docstring (the list is not stale), but not a public test
        row = by_name[task]
        assert call in [c for c, _ in docstring_examples(row["prompt"], row["entry_point"])]
        assert call not in row["public_tests"]["input"]
    with pytest.raises(ValueError, match="missing field 'test'"):
        humaneval_row({"task_id": "X/1", "prompt": "", "entry_point": "f"})
