"""Trajectories -> fixed-shape numpy training arrays (right-padded to a length bucket), and the per-token
weights that carry the loss aggregation, so that micro-batch losses add up to the full-batch loss."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from models.sampler import FINISH_LENGTH
from rljax.ppo import AGGREGATIONS
from rljax.rollout import Trajectory


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def build_batch(trajectories: Sequence[Trajectory], max_turns: int, length_bucket: int, pad_id: int
                ) -> dict[str, np.ndarray]:
    """Arrays [B, L] (tokens, valid, positions, sampled, turn_of_token, sampler_logp) and [B, T] per turn
    (value_index, turn_mask, task_reward, truncated), plus group and trainable per dialog."""
    b = len(trajectories)
    if not b:
        raise ValueError("build_batch: no trajectories")
    length = round_up(max(len(t.tokens) for t in trajectories), length_bucket)
    out = {"tokens": np.full((b, length), pad_id, np.int32), "valid": np.zeros((b, length), bool),
           "positions": np.tile(np.arange(length, dtype=np.int32), (b, 1)),
           "sampled": np.zeros((b, length), np.float32), "turn_of_token": np.full((b, length), -1, np.int32),
           "sampler_logp": np.zeros((b, length), np.float32), "value_index": np.zeros((b, max_turns), np.int32),
           "turn_mask": np.zeros((b, max_turns), np.float32), "task_reward": np.zeros((b, max_turns), np.float32),
           "truncated": np.zeros((b, max_turns), bool),  # the answer was cut at the token budget
           "group": np.asarray([t.group for t in trajectories], np.int32),
           "trainable": np.asarray([t.trainable for t in trajectories], np.float32)}
    for row, t in enumerate(trajectories):
        n, turns = len(t.tokens), t.num_turns
        if turns > max_turns or len(t.value_positions) != turns:
            raise ValueError(f"build_batch: dialog {row} ({t.problem}) has {turns} rewards for "
                             f"{len(t.value_positions)} answers (max_turns {max_turns})")
        out["tokens"][row, :n] = t.tokens
        out["valid"][row, :n] = True
        out["sampled"][row, :n] = np.asarray(t.sampled, np.float32) * float(t.trainable)
        out["turn_of_token"][row, :n] = t.turn_of_token
        out["sampler_logp"][row, :n] = t.sampler_logprobs
        out["value_index"][row, :turns] = t.value_positions
        out["turn_mask"][row, :turns] = float(t.trainable)
        out["task_reward"][row, :turns] = t.rewards
        out["truncated"][row, :turns] = [k < len(t.finish_reasons) and t.finish_reasons[k] == FINISH_LENGTH
                                         for k in range(turns)]
    return out


def aggregation_weights(mask_bt: np.ndarray, mode: str, constant_length: int = 0) -> np.ndarray:
    """Per-token weights w with sum(loss_bt * w) = the chosen aggregation of loss_bt over the mask.

    token_mean: 1 / (masked tokens in the batch); sequence_mean: 1 / (tokens of that sequence * sequences
    with at least one masked token); constant_length (Dr.GRPO, Liu et al. 2025): 1 / (constant_length *
    sequences), a normaliser that does not depend on any answer's length (constant_length: the most tokens an
    episode may sample). Computed once over the whole batch, they make the loss of any split into micro-batches
    sum exactly to the loss of the batch.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"loss aggregation {mode!r}: expected one of {AGGREGATIONS}")
    mask = np.asarray(mask_bt, np.float64)
    if mode == "token_mean":
        return (mask / max(mask.sum(), 1.0)).astype(np.float32)
    per_seq = mask.sum(axis=-1, keepdims=True)
    sequences = max(float((per_seq > 0).sum()), 1.0)
    if mode == "constant_length":
        if constant_length <= 0:
            raise ValueError("loss aggregation constant_length needs the episode token budget (> 0)")
        return (mask / float(constant_length) / sequences).astype(np.float32)
    return (mask / np.maximum(per_seq, 1.0) / sequences).astype(np.float32)


def per_turn_sums(values_bt: np.ndarray, turn_of_token_bt: np.ndarray, mask_bt: np.ndarray, max_turns: int
                  ) -> np.ndarray:
    """[B, T]: the sum of values_bt over the masked tokens of each turn (e.g. log(pi/rho) of one answer)."""
    out = np.zeros((values_bt.shape[0], max_turns))
    for t in range(max_turns):
        out[:, t] = np.sum(values_bt * mask_bt * (turn_of_token_bt == t), axis=-1)
    return out


def spread_over_turns(per_turn_bt: np.ndarray, turn_of_token_bt: np.ndarray) -> np.ndarray:
    """[B, L]: each token gets the value of its turn (0 where turn_of_token is -1)."""
    index = np.clip(turn_of_token_bt, 0, None)
    return np.where(turn_of_token_bt >= 0, np.take_along_axis(per_turn_bt, index, axis=1), 0.0).astype(np.float32)


def informative_first(informative_b: np.ndarray, num_micro: int, group_b: np.ndarray | None = None) -> np.ndarray:
    """A row order (indices into the batch) that packs the informative rows into the first micro-batches.

    Micro-batch i holds rows i, i+m, i+2m, ... (`rljax.learner`); row k of the returned order is the batch
    row placed at position k, so informative rows fill micro-batch 0, then 1, ... and the all-zero rows fill
    the rest, each kind in its original order, or sorted by `group_b` (stable) when given, so that a group's
    rows share micro-batches."""
    b = len(informative_b)
    if b % num_micro:
        raise ValueError(f"batch of {b} does not split into {num_micro} micro-batches")
    slots = np.arange(b).reshape(b // num_micro, num_micro).T.reshape(-1)  # positions, micro-batch by micro-batch
    informative_b = np.asarray(informative_b, bool)
    rows = np.lexsort((np.arange(b) if group_b is None else group_b, ~informative_b))
    order = np.empty(b, np.int64)
    order[slots] = rows
    return order


def shared_prefixes(arrays: dict[str, np.ndarray], num_micro: int, prefix_bucket: int, suffix_bucket: int
                    ) -> dict[str, np.ndarray]:
    """The arrays that let the learner compute each distinct prompt of a micro-batch once
    (`Llama.hidden_states_shared_prefix`): row b splits at s_b, the position before its first answer token;
    tokens [0, s_b) are its prefix, shared by the rows of the micro-batch that have the same ones.

    Returns prefix_tokens / prefix_positions / prefix_valid [m * U, P] (micro-batch i's u-th prefix at row
    u * m + i, the layout `rljax.learner._micro` splits; U the most distinct prefixes in a micro-batch, unused
    ones all padding), prefix_row [B] (the row's prefix within its micro-batch) and suffix_columns [B, A]
    (s_b + j: where suffix token j sits in the row; columns past the row are padding), and
    prefix_micro_batches [m] (its length tells the learner which split the layout is for). P is rounded up to
    `prefix_bucket`, A to `suffix_bucket` (a multiple of 64 pads a 161-token suffix to 192, 128 to 256: every
    padded suffix position costs a whole token of compute)."""
    tokens, valid = arrays["tokens"], arrays["valid"]
    b = tokens.shape[0]
    if b % num_micro:
        raise ValueError(f"batch of {b} does not split into {num_micro} micro-batches")
    lengths = valid.sum(axis=1)
    answered = arrays["turn_of_token"] >= 0
    splits = np.where(answered.any(axis=1), answered.argmax(axis=1) - 1, lengths - 1).clip(0)
    keys = [tokens[row, :splits[row]].tobytes() for row in range(b)]
    holders_per_micro: list[list[int]] = []  # per micro-batch: the first row holding each distinct prefix
    prefix_row = np.zeros(b, np.int32)
    for i in range(num_micro):
        index: dict[bytes, int] = {}
        holders: list[int] = []
        for row in range(i, b, num_micro):
            if keys[row] not in index:
                index[keys[row]] = len(holders)
                holders.append(row)
            prefix_row[row] = index[keys[row]]
        holders_per_micro.append(holders)
    u_max = max(len(h) for h in holders_per_micro)
    p_len = round_up(max(int(splits.max()), 1), prefix_bucket)
    a_len = round_up(int((lengths - splits).max()), suffix_bucket)
    out = {"prefix_tokens": np.zeros((num_micro * u_max, p_len), tokens.dtype),
           "prefix_positions": np.tile(np.arange(p_len, dtype=np.int32), (num_micro * u_max, 1)),
           "prefix_valid": np.zeros((num_micro * u_max, p_len), bool), "prefix_row": prefix_row,
           "suffix_columns": (splits[:, None] + np.arange(a_len)[None]).astype(np.int32),
           "prefix_micro_batches": np.zeros(num_micro, np.int32)}  # its length records the layout's split
    for i, holders in enumerate(holders_per_micro):
        for u, row in enumerate(holders):
            n = splits[row]
            out["prefix_tokens"][u * num_micro + i, :n] = tokens[row, :n]
            out["prefix_positions"][u * num_micro + i, :n] = arrays["positions"][row, :n]
            out["prefix_valid"][u * num_micro + i, :n] = True
    return out
