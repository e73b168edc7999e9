"""Problem sources: the bundled demo problems, the practice problems, CodeContests shards, HumanEval, and mined SWE-RL
instances."""
from rljax.data.bundled import BUNDLED_PROBLEMS, bundled_problems
from rljax.data.code_contests import LoadReport, load_code_contests
from rljax.data.humaneval import load_humaneval
from rljax.data.practice import PRACTICE_PROBLEMS, practice_problems

__all__ = ["BUNDLED_PROBLEMS", "PRACTICE_PROBLEMS", "LoadReport", "bundled_problems", "load_code_contests",
           "load_humaneval", "practice_problems"]
