"""Reward and loss-mask shaping for answers that reach the token budget (DAPO, Yu et al. 2025), on the host.

Soft overlong punishment: an answer of L tokens under a budget L_max with a buffer B is penalised
    0                                  if L <= L_max - B
    -penalty * (L - (L_max - B)) / B   if L_max - B < L <= L_max
so the penalty grows linearly from 0 to -penalty over the last B tokens of the budget. Overlong filtering: an
answer cut at the budget gets no loss weight (its reward says nothing about the answer it would have finished).
"""
from __future__ import annotations

import numpy as np


def overlong_penalty(lengths: np.ndarray, max_new_tokens: int, buffer: int, penalty: float = 1.0) -> np.ndarray:
    """The soft overlong punishment (<= 0) of answers of `lengths` tokens; buffer 0 switches it off."""
    lengths = np.asarray(lengths, np.float64)
    if buffer <= 0:
        return np.zeros_like(lengths)
    start = max_new_tokens - buffer
    return -penalty * np.clip(lengths - start, 0.0, buffer) / buffer


def mask_turns(sampled_bl: np.ndarray, turn_of_token_bl: np.ndarray, drop_bt: np.ndarray) -> np.ndarray:
    """The sampled-token mask with the tokens of every turn where `drop_bt` [B, T] is true set to 0."""
    turns = drop_bt.shape[1]
    index = np.clip(turn_of_token_bl, 0, turns - 1)
    dropped = (turn_of_token_bl >= 0) & np.take_along_axis(np.asarray(drop_bt, bool), index, axis=1)
    return np.where(dropped, 0.0, sampled_bl).astype(sampled_bl.dtype)
