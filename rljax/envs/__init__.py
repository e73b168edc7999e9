"""Environments: RLEF's multi-turn code dialog and SWE-RL's single-turn patch task."""
from rljax.envs.base import Env, Episode, ProblemError, StepResult
from rljax.envs.rlef import CodeProblem, RLEFEnv, RLEFRewards, parse_problem
from rljax.envs.swerl import SWERLEnv

__all__ = ["CodeProblem", "Env", "Episode", "ProblemError", "RLEFEnv", "RLEFRewards", "SWERLEnv", "StepResult",
           "parse_problem"]
