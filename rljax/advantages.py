"""Rewards to advantages on the host (numpy): RLEF's KL-shaped per-turn rewards with GAE over turns, and
SWE-RL's group-normalised advantages. Arrays are [episodes, turns] with a turn mask (valid turns first)."""
from __future__ import annotations

import numpy as np


def kl_shaped_turn_rewards(task_rewards_nt: np.ndarray, kl_nt: np.ndarray, turn_mask_nt: np.ndarray,
                           beta: float) -> np.ndarray:
    """R_t = r_t - beta * KL_t, where KL_t is the sum over the answer's tokens of log(pi / rho)."""
    return (np.asarray(task_rewards_nt, np.float64) - beta * np.asarray(kl_nt, np.float64)) * turn_mask_nt


def gae_over_turns(rewards_nt: np.ndarray, values_nt: np.ndarray, turn_mask_nt: np.ndarray, gamma: float = 1.0,
                   lam: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, returns) by generalised advantage estimation across the turns of each episode.

    values_nt is the critic's estimate at the last prompt token before each answer; the value after the last
    valid turn is 0 (the episode ends). returns = advantages + values, the value model's regression target.
    """
    rewards = np.asarray(rewards_nt, np.float64)
    values = np.asarray(values_nt, np.float64)
    mask = np.asarray(turn_mask_nt, np.float64)
    n, turns = rewards.shape
    advantages = np.zeros((n, turns))
    running = np.zeros(n)
    for t in reversed(range(turns)):
        next_mask = mask[:, t + 1] if t + 1 < turns else np.zeros(n)
        next_value = values[:, t + 1] * next_mask if t + 1 < turns else np.zeros(n)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * next_mask * running
        advantages[:, t] = running * mask[:, t]
        running = running * mask[:, t]
    return advantages, (advantages + values) * mask


BASELINES = ("group_mean", "leave_one_out")


def group_advantages(rewards: np.ndarray, group_size: int, eps: float = 1e-6, scale_by_std: bool = True,
                     baseline: str = "group_mean") -> np.ndarray:
    """Group-relative advantages over consecutive groups of `group_size` responses to one prompt.

    group_mean (GRPO): (r_i - mean_j r_j) / (std_j r_j + eps), population std (ddof 0), so a group of one or a
    group of ties gets 0; scale_by_std False is Dr.GRPO's r_i - mean (Liu et al. 2025).
    leave_one_out (RLOO, Ahmadian et al. 2024): r_i - (1 / (G - 1)) sum_{j != i} r_j = G / (G - 1) (r_i - mean),
    the baseline of each response not using its own reward (G >= 2); divided by the group std when scale_by_std.
    """
    rewards = np.asarray(rewards, np.float64)
    if group_size <= 0 or rewards.size % group_size:
        raise ValueError(f"group_advantages: {rewards.size} rewards do not split into groups of {group_size}")
    if baseline not in BASELINES:
        raise ValueError(f"group baseline {baseline!r}: expected one of {BASELINES}")
    groups = rewards.reshape(-1, group_size)
    if baseline == "leave_one_out":
        if group_size < 2:
            raise ValueError("group baseline leave_one_out needs groups of at least 2 responses")
        centred = groups - (groups.sum(axis=1, keepdims=True) - groups) / (group_size - 1)
    else:
        centred = groups - groups.mean(axis=1, keepdims=True)
    if scale_by_std:
        centred = centred / (groups.std(axis=1, keepdims=True) + eps)
    return centred.reshape(rewards.shape)
