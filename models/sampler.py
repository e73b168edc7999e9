"""Batched generation under `jax.jit`: prefill of left-padded prompts, then a decode loop inside XLA.

One jitted prefill and one jitted `lax.while_loop` decode serve every call of the same shape
(batch, prompt-length bucket, max_new_tokens, cache capacity); weights, temperature and top-p are traced,
so a new policy or new sampling values do not recompile.

Cache discipline (what makes multi-turn continuation exact): every token a sequence has *consumed* is in
the KV cache at its own position; the last sampled token of each sequence is not yet consumed (it is
`SamplerState.last_b`). `Sampler.extend` feeds that token followed by the new prompt tokens (feedback
turn), so a dialog continued from its cache sees exactly the tokens a fresh prefill of the whole dialog
would. Padding and the slots of sequences that stopped early are marked invalid and never attended to.

Attended window (what decode costs): a pass works on cache slots [0, W) only, W the next power of two
(from 128) above the slots filled by the end of the pass, capped at the capacity (`attention_window`): the
jitted prefill/decode copy those slots out once, run on them, and write them back once; the host loop re-enters
decode with the next W when the cache index reaches it. So a dialog that reserves
4096 slots for later turns reads ~256 of them while its first answer is short, and the compiled variants stay
few (one per power of two). Decode runs over per-layer weights sliced once per call and per-layer cache
buffers updated in place (no stacked-weight or whole-cache copy per step; tests/test_sampler.py counts them in
the HLO). Batch stays on the data/fsdp mesh axes and KV heads on tensor, so the same code shards on a pod. On
TPU the pod-scale form of this is a ragged paged-attention kernel (Pallas: per-sequence page tables, each
sequence reads only its own filled pages, e.g. `jax.experimental.pallas.ops.tpu.paged_attention`): it would
replace the window copy and `models.llama._cached_attention`'s einsums, and the per-batch W by per-sequence
lengths.

First turn (`generate`): the cache is empty, so the prompts attend only to each other (blocked causal
attention, no scores against empty slots), and identical prompts (GRPO's G answers to one problem) are
computed once, their K/V copied into each row that shares them: a SWE-RL group of 8 answers to a 730-token
prompt prefills in 1.7 s instead of 16 s on 2 CPU cores. Sampling still draws over the whole batch, so the
tokens are those of the unshared pass for the same key.

Log-probabilities: for each sampled token, log_softmax(logits / temperature) over the full vocabulary,
in fp32, before top-k/top-p truncation (temperature 1 for greedy). This is the quantity a training pass
recomputes for PPO's importance ratio with the same temperature.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from models.kv_cache import VALID_AXES, VALUE_AXES, KVCache, key_axes, slice_keys
from models.llama import Llama
from models.sharding import (DEFAULT_RULES, Rules, batch_sharding, constrain, host_array, logical_to_spec, use_mesh,
                             without_batch_axes)
from models.token_draw import DrawStatic, append_tokens, pick

FINISH_EOS, FINISH_STOP, FINISH_LENGTH = "eos", "stop", "length"


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. temperature 0 means greedy; top_k 0 and top_p 1 switch those filters off.

    stop_ids end a sequence on that token (EOS, end-of-turn); stop_strings end it on the first token
    whose decoded text completes the string (checked on the host every `stop_check_every` tokens).
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    stop_check_every: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, (int, np.integer)) or self.max_new_tokens <= 0:
            raise ValueError(f"SamplingParams.max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        if not self.temperature >= 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, (int, np.integer)) or self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if any(not s for s in self.stop_strings):
            raise ValueError("SamplingParams.stop_strings must not contain an empty string")
        if self.stop_check_every <= 0:
            raise ValueError(f"SamplingParams.stop_check_every must be positive, got {self.stop_check_every}")
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclasses.dataclass
class Completion:
    """One sequence's new tokens, their log-probabilities (see module doc), the decoded text and why it ended."""

    token_ids: list[int]
    logprobs: np.ndarray
    text: str | None
    finish_reason: str
    entropies: np.ndarray | None = None  # entropy of softmax(logits / T) at each new token (the policy's spread)


@flax.struct.dataclass
class SamplerState:
    """Device-side state of a batch of dialogs; pass it to `Sampler.extend` to continue them."""

    cache: KVCache
    last_b: jax.Array  # int32: the last sampled token, not yet in the cache
    position_b: jax.Array  # int32: the position `last_b` takes when it is fed
    done_b: jax.Array  # bool
    count_b: jax.Array  # int32: tokens generated in the current call
    tokens_bn: jax.Array  # int32 [B, max_new]
    logprobs_bn: jax.Array  # float32 [B, max_new]
    entropy_bn: jax.Array  # float32 [B, max_new]: entropy of the distribution each token was drawn from
    step: jax.Array  # int32 scalar: decode iterations run in the current call (one cache slot each)

    @property
    def batch_size(self) -> int:
        return self.last_b.shape[0]


def _record(state: SamplerState, token_b: jax.Array, logprob_b: jax.Array, entropy_b: jax.Array,
            static: DrawStatic) -> SamplerState:
    """Append each live sequence's new token; finish it on a stop id or at max_new tokens."""
    live = ~state.done_b
    fields, ends = append_tokens(state, live, token_b, logprob_b, entropy_b, static)
    return state.replace(**fields, done_b=state.done_b | (live & ends))


Layers = tuple[dict[str, jax.Array], ...]  # per-layer weights, `DecoderStack.per_layer`
_Weights = tuple[nnx.GraphDef, nnx.State, Layers]


@functools.partial(jax.jit, static_argnames=("graphdef",))
def per_layer_weights(graphdef: nnx.GraphDef, params: nnx.State) -> Layers:
    return nnx.merge(graphdef, params).layers.per_layer()


def _outside_layers(path: tuple[Any, ...]) -> bool:
    return not (path and getattr(path[0], "key", None) == "layers")


@functools.partial(jax.jit, static_argnames=("dtype",))
def _outside_in(params: nnx.State, dtype: str) -> nnx.State:
    return jax.tree_util.tree_map_with_path(
        lambda path, x: x.astype(dtype) if _outside_layers(path) and jnp.issubdtype(x.dtype, jnp.floating) else x,
        params)


def head_in_compute_dtype(params: nnx.State, config: Any) -> nnx.State:
    """`params` with the embedding, final norm and head in the compute dtype `config.dtype` where the weights are
    held in another (every use casts them to it anyway, so the tokens are the same): a decode step then reads
    bfloat16 heads, not float32 master weights. The layer stacks pass through (the cached passes read the
    per-layer copies)."""
    if jnp.dtype(config.dtype) == jnp.dtype(config.param_dtype):
        return params
    return _outside_in(params, config.dtype)


def sampling_shardings(params: Any, layers: Any, rules: Rules) -> tuple[Any, Any]:
    """The shardings a sampler reads its weights with when they are replicated over the batch axes: the
    per-layer copies and the parameters outside the layer stacks (embedding, final norm, head) without their
    data/fsdp split (`without_batch_axes`); the layer stacks as they are (the cached passes read the copies)."""
    params_out = jax.tree_util.tree_map_with_path(
        lambda path, x: without_batch_axes(x.sharding, rules) if _outside_layers(path) else x.sharding, params)
    return params_out, jax.tree.map(lambda x: without_batch_axes(x.sharding, rules), layers)


@functools.partial(jax.jit, static_argnames=("graphdef", "static", "mesh_rules", "window", "fresh"),
                   donate_argnames=("cache",))
def _prefill(graphdef: nnx.GraphDef, params: nnx.State, layers: Layers, cache: KVCache, tokens_ut: jax.Array,
             mask_ut: jax.Array, start_position_b: jax.Array, active_b: jax.Array, last_b: jax.Array, key: jax.Array,
             temperature: jax.Array, top_p: jax.Array, static: DrawStatic, mesh_rules: Any, window: int,
             fresh: bool = False, rows_b: jax.Array | None = None) -> SamplerState:
    """Write the (left-padded) new tokens into the cache and sample the first new token of each active
    sequence; inactive ones keep their pending token and position. The pass works on cache slots [0, window).

    fresh: the cache is empty (a first turn); then `rows_b` may give each sequence b its input row rows_b[b]
    (U <= B distinct prompts, each computed once; its K/V are copied into every row that shares it)."""
    with maybe_mesh(mesh_rules):
        model = nnx.merge(graphdef, params)
        positions_ut = jnp.maximum(jnp.cumsum(mask_ut, axis=-1) - 1, 0)  # after each row's start position
        if rows_b is None:
            positions_ut = positions_ut + start_position_b[:, None]
        full = cache
        h_utd, cache = model.hidden_states(tokens_ut, positions_ut, mask_ut, window_of(cache, window), layers,
                                           fresh=fresh, rows_b=rows_b)
        cache = constrain_cache(put_window(full, cache))
        logits = model.logits(h_utd[:, -1:])[:, 0]
        last_position_b = positions_ut[:, -1]
        if rows_b is not None:
            logits = jnp.take(logits, rows_b, axis=0)
            last_position_b = jnp.take(last_position_b, rows_b) + start_position_b
        batch = start_position_b.shape[0]
        state = SamplerState(
            cache=cache, last_b=last_b, position_b=jnp.where(active_b, last_position_b + 1, start_position_b),
            done_b=~active_b, count_b=jnp.zeros((batch,), jnp.int32),
            tokens_bn=jnp.zeros((batch, static.max_new), jnp.int32),
            logprobs_bn=jnp.zeros((batch, static.max_new), jnp.float32),
            entropy_bn=jnp.zeros((batch, static.max_new), jnp.float32), step=jnp.zeros((), jnp.int32))
        token, logprob, entropy = pick(logits, jax.random.fold_in(key, 0), temperature, top_p, static)
        return _record(state, token, logprob, entropy, static)


@functools.partial(jax.jit, static_argnames=("graphdef", "static", "mesh_rules", "window"),
                   donate_argnames=("state",))
def _decode(graphdef: nnx.GraphDef, params: nnx.State, layers: Layers, state: SamplerState, step_limit: jax.Array,
            key: jax.Array, temperature: jax.Array, top_p: jax.Array, static: DrawStatic, mesh_rules: Any, window: int
            ) -> SamplerState:
    """Feed each live sequence's last token and sample the next, until all are done or `step_limit` steps.
    The loop runs on the cache's first `window` slots, copied out once before it and back once after it (the
    caller keeps the cache index below `window`): a slice of the full buffers inside the loop would make XLA
    copy every layer's whole buffer on every step."""
    with maybe_mesh(mesh_rules):
        model = nnx.merge(graphdef, params)

        def cond(s: SamplerState) -> jax.Array:
            return (s.step < step_limit) & ~jnp.all(s.done_b)

        def body(s: SamplerState) -> SamplerState:
            live = ~s.done_b
            logits, cache = model(s.last_b[:, None], s.position_b[:, None], live[:, None], s.cache, layers)
            token, logprob, entropy = pick(logits[:, 0], jax.random.fold_in(key, s.step + 1), temperature, top_p,
                                           static)
            s = s.replace(cache=constrain_cache(cache), position_b=s.position_b + live, step=s.step + 1)
            return _record(s, token, logprob, entropy, static)

        full = state.cache
        state = jax.lax.while_loop(cond, body, state.replace(cache=window_of(full, window)))
        return state.replace(cache=constrain_cache(put_window(full, state.cache)))


@functools.partial(jax.jit, donate_argnames=("state",))
def _truncate(state: SamplerState, cut_b: jax.Array) -> SamplerState:
    """End sequence b after its generated token cut_b[b] (-1: leave it), forgetting what followed it."""
    hit = cut_b >= 0
    rows = jnp.arange(cut_b.shape[0])
    new_count = jnp.where(hit, cut_b + 1, state.count_b)
    # each decode step consumed one token into one slot, so generated token i of this call sits in slot
    # index - step + i; token cut_b becomes the pending one
    base_slot = state.cache.index - state.step
    slot = jnp.arange(state.cache.length)[None, :]
    forget = hit[:, None] & (slot >= base_slot + cut_b[:, None]) & (slot < state.cache.index)
    cache = state.cache.replace(valid_bs=state.cache.valid_bs & ~forget)
    last = jnp.where(hit, state.tokens_bn[rows, jnp.maximum(cut_b, 0)], state.last_b)
    position = state.position_b - (state.count_b - new_count) * hit
    return state.replace(cache=cache, last_b=last, position_b=position, count_b=new_count,
                         done_b=state.done_b | hit)


def window_of(cache: KVCache, window: int) -> KVCache:
    """The first `window` slots of every buffer: the cache a pass works on (one copy of the window per call)."""
    if window >= cache.length:
        return cache
    return KVCache(tuple(slice_keys(k, window) for k in cache.k_bkchw), tuple(v[:, :, :window] for v in cache.v_bksh),
                   cache.valid_bs[:, :window], cache.index)


def put_window(full: KVCache, window: KVCache) -> KVCache:
    """`window` written back over the first slots of `full` (in place: the state is donated)."""
    if window.length == full.length:
        return window
    put = jax.lax.dynamic_update_slice
    return KVCache(tuple(put(f, w, (0,) * 5) for f, w in zip(full.k_bkchw, window.k_bkchw)),
                   tuple(put(f, w, (0, 0, 0, 0)) for f, w in zip(full.v_bksh, window.v_bksh)),
                   put(full.valid_bs, window.valid_bs, (0, 0)), window.index)


def constrain_cache(cache: KVCache) -> KVCache:
    return cache.replace(k_bkchw=tuple(constrain(k, key_axes(k)) for k in cache.k_bkchw),
                         v_bksh=tuple(constrain(v, VALUE_AXES) for v in cache.v_bksh),
                         valid_bs=constrain(cache.valid_bs, VALID_AXES))


def cache_shardings(cache: KVCache, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> KVCache:
    """NamedShardings (in a KVCache) for `cache` (arrays or ShapeDtypeStructs) by the logical axes its programs
    constrain it to: rows over data/fsdp, kv heads over tensor; the index replicated."""
    def spec(x: Any, axes: tuple[str, ...]) -> NamedSharding:
        return NamedSharding(mesh, logical_to_spec(axes, x.shape, mesh, rules))

    return KVCache(tuple(spec(k, key_axes(k)) for k in cache.k_bkchw), tuple(spec(v, VALUE_AXES) for v in cache.v_bksh),
                   spec(cache.valid_bs, VALID_AXES), NamedSharding(mesh, PartitionSpec()))


def maybe_mesh(mesh_rules: tuple[Mesh, Rules] | None) -> Any:
    """The (mesh, rules) context for activation constraints; `mesh_rules` is a static (hashable) jit argument."""
    return use_mesh(*mesh_rules) if mesh_rules is not None else contextlib.nullcontext()


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


MIN_WINDOW = 128


def attention_window(filled: int, capacity: int) -> int:
    """Cache slots a pass attends to when `filled` slots must be visible: the next power of two from
    MIN_WINDOW, capped at the capacity. Powers of two bound the compiled variants to log2(capacity / 128) + 1
    and the slots read to under 2x the filled ones."""
    return min(capacity, max(MIN_WINDOW, 1 << max(filled - 1, 0).bit_length()))


class Sampler:
    """Generates from a `Llama` for a batch of token-id prompts; continues the same batch from its cache.

    The model is read at each call (so a policy updated in place by the trainer is used as is). With a
    mesh, the batch is sharded over the data/fsdp axes and the cache like the activations; the model's
    parameters should already be placed with `shard_model`.

    replicate_weights (with a mesh): each call first copies the decoder weights and the head whole onto every
    data/fsdp shard (split over tensor only). A decode step of a few rows per chip then reads its local copy;
    with the training layout (the embed axis split over fsdp) XLA gathers every weight over the mesh on every
    step (measured with the TPU compiler: an all-gather per weight per step). It costs one full copy of the
    weights per tensor shard during the rollout (`rljax plan` counts it); False keeps the training layout.
    """

    def __init__(self, model: Llama, tokenizer: Any = None, *, mesh: Mesh | None = None,
                 rules: Rules = DEFAULT_RULES, cache_dtype: Any = None, length_bucket: int = 64,
                 pad_id: int = 0, replicate_weights: bool = True):
        self.model = model
        self.replicate_weights = replicate_weights
        self.tokenizer = tokenizer
        self.cache_dtype = cache_dtype or model.config.dtype
        self.length_bucket = length_bucket
        self.pad_id = pad_id
        self._mesh_rules = (mesh, rules) if mesh is not None else None

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, key: jax.Array,
                 cache_capacity: int | None = None) -> tuple[list[Completion], SamplerState]:
        """Complete each prompt. `cache_capacity` reserves cache slots for later `extend` turns
        (default: just this call, bucketed prompt length + max_new_tokens)."""
        prompts = [list(p) for p in prompts]
        if not prompts:
            raise ValueError("Sampler.generate: no prompts given")
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"Sampler.generate: prompt {i} is empty; every prompt needs at least one token")
        longest = max(len(p) for p in prompts)
        width = _round_up(longest, self.length_bucket)
        needed = longest + sampling.max_new_tokens
        capacity = cache_capacity if cache_capacity is not None else width + sampling.max_new_tokens
        if needed > capacity:
            raise ValueError(f"Sampler.generate: the longest prompt ({longest} tokens) plus max_new_tokens "
                             f"({sampling.max_new_tokens}) needs {needed} cache slots, but the cache holds {capacity}")
        width = min(width, capacity - sampling.max_new_tokens)
        max_pos = self.model.config.max_position_embeddings
        if needed > max_pos:
            raise ValueError(f"Sampler.generate: {needed} positions exceed the model's "
                             f"max_position_embeddings ({max_pos})")
        cache = self.place_cache(KVCache.init(self.model.config, len(prompts), capacity, self.cache_dtype))
        start = np.zeros(len(prompts), np.int32)
        weights = self.weights()
        state = self._prefill(weights, cache, prompts, width, start, [True] * len(prompts),
                              np.zeros(len(prompts), np.int32), sampling, key, fresh=True)
        return self._run(weights, state, sampling, key)

    def extend(self, state: SamplerState, new_tokens: Sequence[Sequence[int] | None], sampling: SamplingParams,
               key: jax.Array) -> tuple[list[Completion | None], SamplerState]:
        """Continue each dialog: append `new_tokens[b]` (e.g. a feedback turn and the next assistant header)
        after its last completion and generate. `None` leaves that dialog out of this turn (its result is None).
        """
        if len(new_tokens) != state.batch_size:
            raise ValueError(f"Sampler.extend: got {len(new_tokens)} continuations for a batch of {state.batch_size}")
        active = [t is not None for t in new_tokens]
        if not any(active):
            raise ValueError("Sampler.extend: every dialog is None; nothing to continue")
        last = host_array(state.last_b)
        segments = [[int(last[b])] + list(t) if t is not None else [self.pad_id] for b, t in enumerate(new_tokens)]
        longest = max(len(s) for s in segments)
        used = int(state.cache.index)
        capacity = state.cache.length
        needed = used + longest + sampling.max_new_tokens
        if needed > capacity:
            raise ValueError(f"Sampler.extend: the dialog needs {needed} cache slots ({used} used, {longest} new, "
                             f"{sampling.max_new_tokens} to generate) but the cache holds {capacity}; "
                             f"pass a larger cache_capacity to generate()")
        width = min(_round_up(longest, self.length_bucket), capacity - used - sampling.max_new_tokens)
        positions = host_array(state.position_b)
        if int(positions.max()) + longest + sampling.max_new_tokens > self.model.config.max_position_embeddings:
            raise ValueError("Sampler.extend: the dialog would exceed the model's max_position_embeddings "
                             f"({self.model.config.max_position_embeddings})")
        weights = self.weights()
        new_state = self._prefill(weights, state.cache, segments, width, positions, active, last, sampling, key)
        completions, new_state = self._run(weights, new_state, sampling, key)
        return [c if a else None for c, a in zip(completions, active)], new_state

    def _place(self, tree: Any) -> Any:
        if self._mesh_rules is None:
            return tree
        mesh, rules = self._mesh_rules
        return jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, x.ndim, rules, x.shape[0]))
                            if x.ndim else x, tree)

    def place_cache(self, cache: KVCache) -> KVCache:
        """`cache` on the mesh as its programs read it (`cache_shardings`: rows over data/fsdp, kv heads over
        tensor), so a program that takes it donated can write its output over it; the index stays as it is."""
        if self._mesh_rules is None:
            return cache
        shardings = cache_shardings(cache, *self._mesh_rules)
        placed = jax.device_put(cache.replace(index=None), shardings.replace(index=None))
        return placed.replace(index=cache.index)

    def draw_static(self, sampling: SamplingParams) -> DrawStatic:
        return DrawStatic(greedy=sampling.greedy, top_k=0 if sampling.greedy else sampling.top_k,
                          use_top_p=not sampling.greedy and sampling.top_p < 1.0, stop_ids=sampling.stop_ids,
                          max_new=sampling.max_new_tokens)

    def check_token_ids(self, tokens: np.ndarray, owner: str) -> None:
        """One line naming `owner` when an id of `tokens` is outside the model's vocabulary [0, V)."""
        vocab = self.model.config.vocab_size
        if tokens.min() < 0 or tokens.max() >= vocab:
            raise ValueError(f"{owner}: token ids must be in [0, {vocab}), got range [{tokens.min()}, {tokens.max()}]")

    def scalars(self, sampling: SamplingParams) -> tuple[jax.Array, jax.Array]:
        return jnp.float32(sampling.temperature or 1.0), jnp.float32(sampling.top_p)

    def weights(self) -> _Weights:
        """The model read now: graph, parameters and the per-layer weight copies the cached passes read (made
        once per generate/extend call, so the decode loop slices nothing)."""
        graphdef, params = nnx.split(self.model)
        layers = per_layer_weights(graphdef, params)
        params = head_in_compute_dtype(params, self.model.config)
        if self._mesh_rules is not None and self.replicate_weights:
            params, layers = jax.device_put((params, layers), sampling_shardings(params, layers, self._mesh_rules[1]))
        return graphdef, params, layers

    def _prefill(self, weights: _Weights, cache: KVCache, segments: list[list[int]], width: int,
                 start_positions: np.ndarray, active: list[bool], last: np.ndarray, sampling: SamplingParams,
                 key: jax.Array, fresh: bool = False) -> SamplerState:
        """One prefill pass. `fresh` (an empty cache, every row active): identical prompts (GRPO's group) are
        computed once and their K/V copied into each of their rows."""
        rows_b = None
        if fresh:
            first_row: dict[tuple[int, ...], int] = {}
            shared = [first_row.setdefault(tuple(seg), len(first_row)) for seg in segments]
            if len(first_row) < len(segments):
                segments, rows_b = [list(seg) for seg in first_row], np.asarray(shared, np.int32)
                active = [True] * len(segments)
        tokens = np.full((len(segments), width), self.pad_id, np.int32)
        mask = np.zeros((len(segments), width), bool)
        for b, seg in enumerate(segments):
            tokens[b, width - len(seg):] = seg
            mask[b, width - len(seg):] = active[b]
        self.check_token_ids(tokens, "Sampler")
        graphdef, params, layers = weights
        temperature, top_p = self.scalars(sampling)
        batch = len(start_positions)
        inputs = self._place((tokens, mask, np.asarray(start_positions, np.int32), np.ones(batch, bool)
                              if rows_b is not None else np.asarray(active, bool), np.asarray(last, np.int32)))
        window = attention_window(int(cache.index) + width, cache.length)
        return _prefill(graphdef, params, layers, cache, *inputs, key, temperature, top_p,
                        static=self.draw_static(sampling), mesh_rules=self._mesh_rules, window=window, fresh=fresh,
                        rows_b=None if rows_b is None else self._place(rows_b))

    def _run(self, weights: _Weights, state: SamplerState, sampling: SamplingParams, key: jax.Array
             ) -> tuple[list[Completion], SamplerState]:
        graphdef, params, layers = weights
        temperature, top_p = self.scalars(sampling)
        static = self.draw_static(sampling)
        if sampling.stop_strings and self.tokenizer is None:
            raise ValueError("Sampler: stop_strings need a tokenizer")
        chunk = sampling.stop_check_every if sampling.stop_strings else sampling.max_new_tokens
        checked = np.zeros(state.batch_size, bool)  # rows whose final text was already searched
        stopped = np.zeros(state.batch_size, bool)  # rows ended by a stop string
        # decode step s (from 0) writes slot base + s; each _decode call runs while that stays in its window
        base, capacity = int(state.cache.index), state.cache.length
        limit = 0
        while True:
            if sampling.stop_strings:
                state = self._apply_stop_strings(state, sampling.stop_strings, checked, stopped)
            if bool(jnp.all(state.done_b)) or limit >= sampling.max_new_tokens:
                break
            target = min(limit + chunk, sampling.max_new_tokens)
            while limit < target:
                window = attention_window(base + limit + 1, capacity)
                limit = min(target, window - base)
                state = _decode(graphdef, params, layers, state, jnp.int32(limit), key, temperature, top_p,
                                static=static, mesh_rules=self._mesh_rules, window=window)
                if limit < target and bool(jnp.all(state.done_b)):
                    break
        return self._completions(state, sampling, stopped), state

    def _apply_stop_strings(self, state: SamplerState, stop_strings: tuple[str, ...], checked: np.ndarray,
                            stopped: np.ndarray) -> SamplerState:
        """Search the new text of each row not yet searched in its final form; cut rows that hit a stop string."""
        tokens, counts, done = (host_array(x) for x in (state.tokens_bn, state.count_b, state.done_b))
        cut = np.full(len(counts), -1, np.int32)
        for b in np.flatnonzero(~checked & (counts > 0)):
            cut[b] = self._stop_cut(tokens[b, :counts[b]].tolist(), stop_strings)
        checked |= done | (cut >= 0)
        stopped |= cut >= 0
        return _truncate(state, jnp.asarray(cut)) if (cut >= 0).any() else state

    def _stop_cut(self, ids: list[int], stop_strings: tuple[str, ...]) -> int:
        """Index of the first token whose decoded prefix contains a stop string, or -1."""
        text = self.tokenizer.decode(ids)
        ends = [text.find(s) + len(s) for s in stop_strings if s in text]
        if not ends:
            return -1
        target = min(ends)
        lo, hi = 0, len(ids) - 1
        while lo < hi:  # smallest j with len(decode(ids[:j+1])) >= target
            mid = (lo + hi) // 2
            if len(self.tokenizer.decode(ids[:mid + 1])) >= target:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _completions(self, state: SamplerState, sampling: SamplingParams, stopped: np.ndarray) -> list[Completion]:
        tokens, logprobs, entropies, counts = (host_array(x) for x in (state.tokens_bn, state.logprobs_bn,
                                                                        state.entropy_bn, state.count_b))
        stop_ids = set(sampling.stop_ids)
        out = []
        for b in range(len(counts)):
            ids = tokens[b, :counts[b]].tolist()
            text = self.tokenizer.decode(ids, skip_special=True) if self.tokenizer is not None else None
            if stopped[b]:
                reason = FINISH_STOP
            elif ids and ids[-1] in stop_ids:
                reason = FINISH_EOS
            else:
                reason = FINISH_LENGTH
            out.append(Completion(ids, logprobs[b, :counts[b]].copy(), text, reason, entropies[b, :counts[b]].copy()))
        return out
