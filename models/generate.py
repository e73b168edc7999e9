"""A plain greedy decoding loop over the KV cache: one jitted prefill, one jitted step per token.

Kept for the `rljax generate` command and as a readable reference; batched, sampled generation with the
decode loop inside XLA is models.sampler's job.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from models.llama import KVCache, Llama


@jax.jit
def _forward(graphdef: nnx.GraphDef, state: nnx.State, tokens_bt: jax.Array, positions_bt: jax.Array,
             cache: KVCache) -> tuple[jax.Array, KVCache]:
    model = nnx.merge(graphdef, state)
    logits, cache = model(tokens_bt, positions_bt=positions_bt, cache=cache)
    return logits[:, -1], cache


def greedy_generate(model: Llama, prompt_ids: Sequence[int], max_new_tokens: int,
                    stop_ids: Sequence[int] = ()) -> list[int]:
    """Greedy continuation of one prompt; stops after a token in `stop_ids` (which is returned)."""
    if not prompt_ids:
        raise ValueError("greedy_generate: the prompt is empty")
    if max_new_tokens <= 0:
        raise ValueError(f"greedy_generate: max_new_tokens must be positive, got {max_new_tokens}")
    graphdef, state = nnx.split(model)
    length = len(prompt_ids) + max_new_tokens
    cache = KVCache.init(model.config, 1, length)
    tokens = jnp.asarray([list(prompt_ids)], jnp.int32)
    logits, cache = _forward(graphdef, state, tokens, jnp.arange(tokens.shape[1])[None], cache)
    out: list[int] = []
    for step in range(max_new_tokens):
        token = int(jnp.argmax(logits[0]))
        out.append(token)
        if token in stop_ids or step == max_new_tokens - 1:
            break
        position = jnp.asarray([[len(prompt_ids) + step]], jnp.int32)
        logits, cache = _forward(graphdef, state, jnp.asarray([[token]], jnp.int32), position, cache)
    return out
