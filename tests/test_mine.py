"""`rljax mine` on a repository built here with real git commits: exact instances and filter counts."""
import json
import subprocess

import pytest

from rljax.cli import main
from rljax.data.mine import GitError, MineOptions, mine_repository, split_by_date
from rljax.envs import SWERLEnv


def _git(repo, *args, author="Dev <dev@example.com>"):
    name, email = author[:-1].split(" <")
    env = {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_COMMITTER_NAME": name,
           "GIT_COMMITTER_EMAIL": email, "GIT_AUTHOR_DATE": "2026-01-01T00:00:00", "HOME": str(repo),
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def _commit(repo, files, message, author="Dev <dev@example.com>"):
    for path, content in files.items():
        target = repo / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message, author=author)
    return _git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture()
def repo(tmp_path):
    repo = tmp_path / "calc"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _commit(repo, {"calc/ops.py": "def add(a, b):\n    return a - b\n", "calc/util.py": "X = 1\n",
                   "README.md": "calc\n"}, "Initial import")
    fix = _commit(repo, {"calc/ops.py": "def add(a, b):\n    return a + b\n"}, "Fix add returning the difference\n\nFixes #12.")
    _commit(repo, {"calc/util.py": "X = 2\n"}, "Bump X", author="dependabot[bot] <bot@github.com>")
    _commit(repo, {"calc/big.py": "".join(f"V{i} = {i}\n" for i in range(600))}, "Fix: add the big table")
    _commit(repo, {"README.md": "calc, fixed typo\n"}, "Fix a typo in the README")
    _commit(repo, {"calc/ops.py": "def add(a, b):\n    return a + b\n\n\ndef neg(a):\n    return -a\n"},
            "Add neg")
    _commit(repo, {"calc/vendor/six.py": "PY3 = True\n"}, "Fix the vendored six")
    _commit(repo, {f"calc/m{i}.py": f"M = {i}\n" for i in range(6)}, "Fix module constants")
    # a merged branch that fixes a crash, through a merge commit
    _git(repo, "checkout", "-q", "-b", "fix-div")
    _commit(repo, {"calc/div.py": "def div(a, b):\n    return a / b if b else 0\n"}, "Handle division by zero")
    _git(repo, "checkout", "-q", "main")
    _git(repo, "merge", "-q", "--no-ff", "-m", "Merge pull request #14 from dev/fix-div\n\nFix crash on zero",
         "fix-div")
    _git(repo, "checkout", "-q", "-b", "docs")
    _commit(repo, {"docs/usage.md": "use add\n"}, "Document add")
    _git(repo, "checkout", "-q", "main")
    _git(repo, "merge", "-q", "--no-ff", "-m", "Merge pull request #15 from dev/docs\n\nFix the docs", "docs")
    return repo, fix


def test_mine_yields_exactly_the_fix_instances_and_filter_counts(repo):
    repo, fix = repo
    instances, report = mine_repository(repo, MineOptions(max_diff_lines=500))
    assert [i["instance_id"] for i in instances][0] == f"calc-{fix[:12]}"
    assert len(instances) == 2
    first, merged = instances
    assert first["problem_statement"].startswith("Fix add returning the difference") and first["issue_refs"] == ["#12"]
    assert first["code_context"] == {"calc/ops.py": "def add(a, b):\n    return a - b\n", "calc/util.py": "X = 1\n"}
    assert first["oracle_new_content"] == {"calc/ops.py": "def add(a, b):\n    return a + b\n"}
    assert "Handle division by zero" in merged["problem_statement"] and merged["issue_refs"] == ["#14"]
    assert merged["code_context"]["calc/div.py"] == ""  # a new file
    assert report.candidates == 10 and report.kept == 2
    assert dict(report.skipped) == {"root_commit": 1, "bot": 1, "huge_diff": 1, "non_python": 1, "not_a_fix": 1,
                                    "no_code_change": 1, "vendored_or_generated": 1, "too_many_files": 1}
    assert "2 instances" in report.summary()


def test_the_oracle_patch_of_a_mined_instance_scores_one(repo):
    repo, _ = repo
    instance = mine_repository(repo)[0][0]
    blocks = "".join(f"```python\n### {path}\n<<<<<<< SEARCH\n{instance['code_context'][path].rstrip()}\n=======\n"
                     f"{new.rstrip()}\n>>>>>>> REPLACE\n```\n" for path, new in instance["oracle_new_content"].items())
    answer = f"<think>add subtracts</think>\n<solution>\n{blocks}</solution>"
    result = SWERLEnv().reset(instance).step(answer)
    assert (result.reward, result.status) == (1.0, "exact")


def test_mine_cli_writes_jsonl_and_refuses_a_non_git_path(repo, tmp_path, capsys):
    repo, _ = repo
    out = tmp_path / "out" / "instances.jsonl"
    assert main(["mine", "--repo", str(repo), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and "2 instances" in capsys.readouterr().out
    plain = tmp_path / "plain"
    plain.mkdir()
    assert main(["mine", "--repo", str(plain), "--out", str(out)]) == 1
    assert capsys.readouterr().err.strip() == f"rljax mine: error: {plain}: not a git repository"
    with pytest.raises(GitError, match="no such directory"):
        mine_repository(tmp_path / "missing")


def test_context_files_follow_imports_then_the_directory(tmp_path):
    repo = tmp_path / "pkg"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _commit(repo, {"pkg/__init__.py": "", "pkg/a.py": "A = 1\n", "pkg/b.py": "B = 2\n", "lib/deep.py": "D = 3\n",
                   "pkg/use.py": "from .b import B\nfrom lib import deep\n\n\ndef f():\n    return B\n"}, "Initial")
    _commit(repo, {"pkg/use.py": "from .b import B\nfrom lib import deep\n\n\ndef f():\n    return B + 1\n"},
            "Fix f off by one")
    by_imports = mine_repository(repo, MineOptions(context_files=3))[0][0]
    assert list(by_imports["code_context"]) == ["pkg/use.py", "pkg/b.py", "lib/deep.py", "pkg/__init__.py"]
    by_directory = mine_repository(repo, MineOptions(context_files=3, context_pick="directory"))[0][0]
    assert list(by_directory["code_context"]) == ["pkg/use.py", "pkg/__init__.py", "pkg/a.py", "pkg/b.py"]
    with pytest.raises(ValueError, match="context_pick 'random'"):
        MineOptions(context_pick="random")


def test_token_budget_drops_context_files_first_then_the_instance(repo):
    repo, _ = repo
    count = lambda instance: sum(len(text) for text in instance["code_context"].values())  # noqa: E731
    full = mine_repository(repo, MineOptions(context_files=1))[0][0]
    assert count(full) == len("def add(a, b):\n    return a - b\n") + len("X = 1\n")
    squeezed = mine_repository(repo, MineOptions(context_files=1, max_prompt_tokens=count(full) - 1), count)
    assert list(squeezed[0][0]["code_context"]) == ["calc/ops.py"]
    kept, report = mine_repository(repo, MineOptions(context_files=1, max_prompt_tokens=5), count)
    assert [i["code_context"] for i in kept] == [{"calc/div.py": ""}]  # only the new file's instance fits
    assert report.skipped["over_token_budget"] == 1
    with pytest.raises(ValueError, match="needs a prompt_tokens counter"):
        mine_repository(repo, MineOptions(max_prompt_tokens=5))


def test_files_that_are_not_utf8_are_a_counted_skip(tmp_path):
    repo = tmp_path / "latin"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _commit(repo, {"m.py": "X = 1\n"}, "Initial")
    (repo / "m.py").write_bytes("X = 'caf\u00e9'\n".encode("latin-1"))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "Fix the accent")
    instances, report = mine_repository(repo)
    assert instances == [] and report.skipped["not_utf8"] == 1 and "1 not_utf8" in report.summary()


def test_split_by_date_and_the_cli(repo, tmp_path, capsys):
    repo, _ = repo
    later = tmp_path / "later.jsonl"
    out = tmp_path / "early.jsonl"
    assert main(["mine", "--repo", str(repo), "--out", str(out), "--split-date", "2026-01-01",
                 "--test-out", str(later)]) == 0  # every commit of the fixture is dated 2026-01-01
    assert out.read_text() == "" and len(later.read_text().splitlines()) == 2
    assert "wrote 0 before 2026-01-01" in capsys.readouterr().out
    instances = mine_repository(repo)[0]
    assert split_by_date(instances, "2026-01-02") == (instances, [])
    with pytest.raises(ValueError, match="split date 'soon': expected an ISO date"):
        split_by_date(instances, "soon")
    assert main(["mine", "--repo", str(repo), "--out", str(out), "--split-date", "2026-01-01"]) == 1
    assert "--split-date and --test-out go together" in capsys.readouterr().err
    assert main(["mine", "--repo", str(repo), "--out", str(out), "--max-prompt-tokens", "100"]) == 1
    assert "needs --tokenizer" in capsys.readouterr().err
