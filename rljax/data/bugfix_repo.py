"""A git repository with a real history of bug fixes, built offline, and the SWE-RL instances mined from it.

`build_bugfix_repo` writes the `tallykit` library (rljax.data.bugfix_bank: six modules of small functions, one
bug in each function) and commits, one day apart, as a project would: the initial layout, one commit adding
each module (bugs included), a README change, a dependency bump by a bot, then one fix per commit whose
message is the issue: a title and the call that shows the bug, with what it returns and what it should
(computed by running both versions), and "Fixes #N". The four training modules are fixed first; after a gap
of 30 days (the split date) the two held-out modules are fixed, so the date split SWE-RL uses for evaluation
also separates the code areas. Author, dates and content are fixed, so the commit ids, and hence the mined
file, are the same on every machine.

`bugfix_instances` mines it with `rljax.data.mine` (the real filters count the non-fix commits) and splits it
at the split date; `tools/make_swerl_data.py` writes the shipped file.
"""
from __future__ import annotations

import dataclasses
import datetime
import random
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable

from rljax.data.bugfix_bank import BUGS, MODULE_DOCS, PACKAGE, TEST_MODULES, TRAIN_MODULES, Bug

SHIPPED = Path(__file__).parent / "bundled" / "swerl_practice.jsonl"
SPLITS = ("train", "test")
PROMPT_BUDGET = 2048  # tokens of SmolLM2's chat template: the shipped instances' prompt budget
CONTEXT_FILES = 1
START = datetime.datetime(2025, 1, 6, 9, 0, tzinfo=datetime.timezone.utc)
AUTHOR = ("Tally Maintainer", "maintainer@tallykit.example")
BOT = ("dependabot[bot]", "49699333+dependabot[bot]@users.noreply.github.com")
TITLES = ("{function}() gives a wrong result", "Wrong value from {module}.{function}",
          "{function} misbehaves for some inputs", "Unexpected output from {function}()")
BODIES = ("Calling `{call}` returns `{got}`, but it should return `{want}`.",
          "`{call}` gives `{got}`; I expected `{want}`.",
          "Expected `{call}` to be `{want}`, got `{got}` instead.",
          "With `{call}` I get `{got}`. The docstring says \"{doc}\", so the result should be `{want}`.")


@dataclasses.dataclass
class BugfixRepo:
    path: Path
    split_date: str  # ISO date of the first held-out fix
    fixes: list[str]  # function names in the order they were fixed


def _outcome(bug: Bug, buggy: bool) -> str:
    """repr of the example call's result with the correct (or buggy) function, or what it raised."""
    namespace: dict[str, Any] = {}
    for helper in BUGS:  # stats and grid import from arith and seqs: their correct versions
        if helper.module in ("arith", "seqs"):
            exec(helper.source, namespace)  # noqa: S102 - the bank's own code
    exec(bug.buggy_source if buggy else bug.source, namespace)  # noqa: S102
    try:
        return repr(eval(bug.example, namespace))  # noqa: S307
    except Exception as err:  # a buggy version may raise: the issue says so
        return f"raises {type(err).__name__}"


def issue_text(bug: Bug, number: int, rng: random.Random) -> str:
    """The fix commit's message: an issue title, the call that shows the bug, and the issue reference."""
    want, got = _outcome(bug, buggy=False), _outcome(bug, buggy=True)
    if want == got:
        raise ValueError(f"bugfix bank: {bug.module}.{bug.function}: {bug.example} gives {want} with and without "
                         "the bug")
    fields = {"function": bug.function, "module": bug.module, "call": bug.example, "want": want, "got": got,
              "doc": bug.doc}
    return (f"{rng.choice(TITLES).format(**fields)}\n\n{rng.choice(BODIES).format(**fields)}\n\n"
            f"Fixes #{number}.")


def module_text(module: str, fixed: set[str]) -> str:
    functions = [b.source if b.function in fixed else b.buggy_source for b in BUGS if b.module == module]
    return MODULE_DOCS[module] + "\n\n" + "\n\n".join(functions)


class _Committer:
    def __init__(self, path: Path):
        self.path, self.when = path, START

    def git(self, *args: str, author: tuple[str, str] = AUTHOR) -> str:
        stamp = self.when.isoformat()
        env = {"GIT_AUTHOR_NAME": author[0], "GIT_AUTHOR_EMAIL": author[1], "GIT_COMMITTER_NAME": AUTHOR[0],
               "GIT_COMMITTER_EMAIL": AUTHOR[1], "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp,
               "HOME": str(self.path), "PATH": "/usr/bin:/bin:/usr/local/bin", "GIT_CONFIG_NOSYSTEM": "1"}
        done = subprocess.run(["git", "-C", str(self.path), *args], capture_output=True, text=True, env=env)
        if done.returncode:
            raise RuntimeError(f"git {args[0]} in {self.path}: {done.stderr.strip()}")
        return done.stdout

    def commit(self, files: dict[str, str], message: str, author: tuple[str, str] = AUTHOR,
               days: int = 1) -> None:
        for name, content in files.items():
            target = self.path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message, author=author)
        self.when += datetime.timedelta(days=days)


def build_bugfix_repo(path: str | Path, seed: int = 0) -> BugfixRepo:
    """Write the repository at `path` (a new directory) with its whole history."""
    path = Path(path)
    path.mkdir(parents=True)
    rng = random.Random(seed)
    c = _Committer(path)
    c.git("init", "-q", "-b", "main")
    modules = TRAIN_MODULES + TEST_MODULES
    readme = "# tallykit\n\nSmall helpers for numbers, text, lists, dicts, statistics and grids.\n"
    c.commit({"README.md": readme, "pyproject.toml": f'[project]\nname = "{PACKAGE}"\nversion = "0.1.0"\n',
              f"{PACKAGE}/__init__.py": '"""tallykit: small helpers."""\n__version__ = "0.1.0"\n'},
             "Initial project layout")
    for module in modules:
        names = ", ".join(b.function for b in BUGS if b.module == module)
        c.commit({f"{PACKAGE}/{module}.py": module_text(module, set())}, f"Add the {module} module\n\n{names}")
    c.commit({"README.md": readme + "\n" + "".join(f"- `{PACKAGE}.{m}`\n" for m in modules)},
             "Describe the modules in the README")
    c.commit({"requirements-dev.txt": "pytest==8.3.1\n"}, "Bump pytest from 8.2.0 to 8.3.1", author=BOT)
    fixed: set[str] = set()
    order: list[str] = []
    number = 3
    split_date = ""
    for phase, phase_modules in enumerate((TRAIN_MODULES, TEST_MODULES)):
        bugs = [b for b in BUGS if b.module in phase_modules]
        rng.shuffle(bugs)
        if phase:
            c.when += datetime.timedelta(days=30)
            split_date = c.when.date().isoformat()
        for i, bug in enumerate(bugs):
            number += rng.randint(1, 4)
            fixed.add(bug.function)
            order.append(bug.function)
            c.commit({f"{PACKAGE}/{bug.module}.py": module_text(bug.module, fixed)}, issue_text(bug, number, rng))
            if i % 10 == 9:
                version = f"0.{len(order) // 10 + 1}.0"
                c.commit({f"{PACKAGE}/__init__.py": f'"""tallykit: small helpers."""\n__version__ = "{version}"\n'},
                         f"Release {version}")
    return BugfixRepo(path, split_date, order)


def bugfix_instances(prompt_tokens: Callable[[dict[str, Any]], int] | None = None, max_prompt_tokens: int = 0,
                     context_files: int = CONTEXT_FILES, seed: int = 0) -> tuple[list[dict[str, Any]], Any, str]:
    """(instances with a "split" of "train" or "test", the mine report, the split date), mined from a fresh
    build of the repository in a temporary directory."""
    from rljax.data.mine import MineOptions, mine_repository, split_by_date

    with tempfile.TemporaryDirectory() as tmp:
        repo = build_bugfix_repo(Path(tmp) / PACKAGE, seed)
        options = MineOptions(context_files=context_files, max_prompt_tokens=max_prompt_tokens)
        instances, report = mine_repository(repo.path, options, prompt_tokens)
    train, test = split_by_date(instances, repo.split_date)
    return ([dict(i, split="train") for i in train] + [dict(i, split="test") for i in test], report,
            repo.split_date)


def shipped_instances(split: str = "train") -> list[dict[str, Any]]:
    """The shipped instances of one split ("train" or "test")."""
    from rljax.problems import load_jsonl

    if split not in SPLITS:
        raise ValueError(f"SWE-RL practice instances: split {split!r} is not one of {list(SPLITS)}")
    return [row for row in load_jsonl(SHIPPED) if row.get("split") == split]
