"""The jitted device side of training: scoring passes (old/reference logprobs, values) and one optimizer
update each for the policy and the value model, with micro-batch gradient accumulation in `lax.scan`.

Models are split once into (graphdef, params); params and optimizer state live in a `TrainState` pytree
that the update donates. Batches are dicts of [B, ...] arrays placed with the batch sharding; micro-batch i
takes rows i, i+m, i+2m, ... so that every device keeps an equal share of each micro-batch.

Two exact savings for sparse, on-policy signal (a weak model that solves few problems):
- a policy batch without `old_logp` is scored on-policy: old_logp = stop_gradient(logp), so the ratio is 1
  and no separate scoring pass is needed (one update per rollout, no reference policy);
- when the loss has no term besides the advantage-weighted ratio (no entropy bonus, no KL in the loss), a
  micro-batch whose advantages are all 0 has loss and gradient exactly 0: `lax.cond` skips its forward and
  backward (`rljax.batching.informative_first` packs the informative rows into the first micro-batches).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from models.llama import Llama, LlamaValueModel
from models.lora import LoraParam
from models.sharding import constrain
from rljax.grpo import KL_ESTIMATORS, grpo_loss
from rljax.ppo import RATIO_LEVELS, clipped_policy_loss, clipped_value_loss

ALGORITHMS = ("ppo", "grpo")
OPTIMIZERS = ("adamw", "sgd")


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    learning_rate: float = 2e-7  # RLEF's
    warmup_steps: int = 50
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    optimizer: str = "adamw"  # adamw | sgd (plain gradient steps: updates proportional to the gradient)

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer {self.optimizer!r}: expected one of {OPTIMIZERS}")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    algorithm: str = "ppo"
    temperature: float = 1.0  # logprobs are log_softmax(logits / T), as the sampler's
    clip_eps: float = 0.2  # the lower side (1 - eps) and, unless clip_eps_high is set, the upper one
    clip_eps_high: float | None = None  # DAPO's clip-higher: the ratio may rise to 1 + clip_eps_high
    dual_clip: float = 0.0  # > 1: cap the loss of a negative-advantage token at -dual_clip * A (0 = off)
    ratio_level: str = "token"  # token | sequence (GSPO's length-normalised sequence ratio)
    tis_cap: float = 0.0  # > 0: truncated importance sampling, tokens weighted min(pi_old / pi_sampler, cap)
    value_clip: float = 0.2
    entropy_coef: float = 0.0
    kl_coef: float = 0.0  # GRPO with KL in the loss
    kl_estimator: str = "k3"
    kl_in_loss: bool = False
    vocab_chunk: int = 32  # sequence positions per chunk of the vocabulary log-softmax (memory vs. speed)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm {self.algorithm!r}: expected one of {ALGORITHMS}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator {self.kl_estimator!r}: expected one of {KL_ESTIMATORS}")
        if not (isinstance(self.vocab_chunk, int) and self.vocab_chunk > 0):
            raise ValueError(f"vocab_chunk: expected a positive integer, got {self.vocab_chunk!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 for training logprobs, got {self.temperature}")
        if self.ratio_level not in RATIO_LEVELS:
            raise ValueError(f"ratio_level {self.ratio_level!r}: expected one of {RATIO_LEVELS}")
        if self.dual_clip and not self.dual_clip > 1:
            raise ValueError(f"dual_clip must be 0 (off) or > 1, got {self.dual_clip}")
        if self.tis_cap < 0 or (self.clip_eps_high is not None and self.clip_eps_high < 0):
            raise ValueError("tis_cap and clip_eps_high must be >= 0")


def learning_rate_schedule(cfg: OptimConfig) -> optax.Schedule:
    """lr * min(step, warmup) / warmup for update `step` = 0, 1, ... (linear warm-up from 0, as HF and optax
    schedules do); warmup 0 is a constant rate from the first update on."""
    if cfg.warmup_steps <= 0:
        return optax.constant_schedule(cfg.learning_rate)
    return optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW with linear warm-up to a constant rate and no decay on norms and biases
    (or plain SGD on the same schedule)."""
    schedule = learning_rate_schedule(cfg)
    if cfg.optimizer == "sgd":
        return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.sgd(schedule))
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm),
                       optax.adamw(schedule, cfg.b1, cfg.b2, cfg.eps, weight_decay=cfg.weight_decay, mask=decay_mask))


def _micro(batch: dict[str, jax.Array], num_micro: int) -> dict[str, jax.Array]:
    """[B, ...] -> [m, B/m, ...] with micro-batch i = rows i, i+m, ... (keeps each device's share equal).
    Shared-prompt arrays laid out for another split are refused (their prefix rows would be wrong)."""
    if "prefix_tokens" in batch and batch["prefix_micro_batches"].shape[0] != num_micro:
        raise ValueError(f"the batch's shared prompts are laid out for {batch['prefix_micro_batches'].shape[0]} "
                         f"micro-batches; this update splits it into {num_micro}")
    def split(x: jax.Array) -> jax.Array:
        b = x.shape[0]
        if b % num_micro:
            raise ValueError(f"batch of {b} does not split into {num_micro} micro-batches")
        y = x.reshape((b // num_micro, num_micro) + x.shape[1:]).swapaxes(0, 1)
        return constrain(y, (None, "batch") + (None,) * (x.ndim - 1))
    return {k: split(v) for k, v in batch.items()}


SHARED_PREFIX_KEYS = ("prefix_tokens", "prefix_positions", "prefix_valid", "prefix_row", "suffix_columns",
                      "prefix_micro_batches")


def token_logprobs(model: Llama, batch: dict[str, jax.Array], temperature: float,
                   vocab_chunk: int = LossConfig.vocab_chunk) -> tuple[jax.Array, jax.Array]:
    """[B, L] log p(token_t | tokens_<t) under log_softmax(logits / T) (0 at t = 0) and the entropy there,
    computed `vocab_chunk` positions at a time (no [B, L, V] logits; see models/logprobs.py). With the
    `rljax.batching.shared_prefixes` arrays in the batch, each distinct prompt is computed once and the
    positions before a row's split are 0."""
    if "prefix_tokens" in batch:
        return _shared_prefix_token_logprobs(model, batch, temperature, vocab_chunk)
    h_btd, _ = model.hidden_states(batch["tokens"], batch["positions"], batch["valid"])
    logp, entropy = model.token_logprobs(h_btd[:, :-1], batch["tokens"][:, 1:], temperature, vocab_chunk)
    pad = jnp.zeros_like(logp[:, :1])
    return jnp.concatenate([pad, logp], axis=1), jnp.concatenate([pad, entropy], axis=1)


def _shared_prefix_token_logprobs(model: Llama, batch: dict[str, jax.Array], temperature: float,
                                  vocab_chunk: int) -> tuple[jax.Array, jax.Array]:
    """`token_logprobs` over each row's suffix (columns `suffix_columns` [B, A], after its shared prefix),
    scattered back to the row's [B, L] layout."""
    tokens = batch["tokens"]
    columns = batch["suffix_columns"]
    inside = columns < tokens.shape[1]
    gather = lambda x: jnp.take_along_axis(x, jnp.minimum(columns, tokens.shape[1] - 1), axis=1)  # noqa: E731
    suffix = gather(tokens)
    h_btd = model.hidden_states_shared_prefix(batch["prefix_tokens"], batch["prefix_positions"],
                                              batch["prefix_valid"], suffix, gather(batch["positions"]),
                                              gather(batch["valid"]) & inside, batch["prefix_row"])
    logp, entropy = model.token_logprobs(h_btd[:, :-1], suffix[:, 1:], temperature, vocab_chunk)
    rows = jnp.arange(tokens.shape[0])[:, None]
    scatter = lambda x: jnp.zeros(tokens.shape, x.dtype).at[rows, columns[:, 1:]].set(x, mode="drop")  # noqa: E731
    return scatter(logp), scatter(entropy)


def turn_values(value_model: LlamaValueModel, batch: dict[str, jax.Array]) -> jax.Array:
    """[B, T] the value model's estimate at each turn's value index."""
    values_bl = value_model(batch["tokens"], batch["positions"], batch["valid"])
    return jnp.take_along_axis(values_bl, batch["value_index"], axis=1)


def init_state(params: Any, tx: optax.GradientTransformation) -> TrainState:
    """A fresh TrainState whose leaves all live on the params' mesh: the step and optimizer counters are
    replicated there (not left on one device), so a restored checkpoint has the same placement as a new run.
    Without a mesh every leaf is committed to the params' device: the update's outputs are, and a jitted
    update whose first call got uncommitted leaves (`jnp.zeros`, optax's init) compiles a second time on its
    second call (SmolLM2 GRPO update: 8 s of compile and a 28.6 s second step on 2 CPU cores)."""
    if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params)):  # an abstract model
        return jax.eval_shape(lambda p: TrainState(jnp.zeros((), jnp.int32), p, tx.init(p)), params)
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    shardings = [leaf.sharding for leaf in jax.tree.leaves(params)]
    mesh = next((s.mesh for s in shardings if isinstance(s, NamedSharding)), None)
    if mesh is None:
        return jax.device_put(state, shardings[0]) if len(set(shardings)) == 1 else state
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda x: x if isinstance(x.sharding, NamedSharding) else jax.device_put(x, replicated),
                        state)


@functools.partial(jax.jit, static_argnames=("dtype",))
def in_compute_dtype(params: Any, dtype: str) -> Any:
    """A copy of `params` (new buffers, never the inputs forwarded: the policy's are donated to its update) with
    its floating leaves in `dtype`, each leaf on its own sharding."""
    return jax.tree.map(lambda x: jnp.copy(x).astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
                        else jnp.copy(x), params)


def split_trainable(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """(graphdef, frozen, trainable): without LoRA everything trains (frozen is empty); with LoRA adapters
    (models/lora.py) the base weights are frozen and the adapters, plus a value model's head, train."""
    if not jax.tree.leaves(nnx.state(model, LoraParam)):
        return nnx.split(model, nnx.Nothing, ...)
    base = nnx.All(nnx.Not(LoraParam), nnx.PathContains("backbone")) if isinstance(model, LlamaValueModel) \
        else nnx.Not(LoraParam)
    return nnx.split(model, base, ...)


class Learner:
    """Jitted scoring and updates for one policy (and, for PPO, one value model). Only the trainable part of each
    model (`split_trainable`) has optimizer state and is donated; the frozen part is an argument of every call,
    shared, never copied."""

    def __init__(self, policy: Llama, loss: LossConfig, optim: OptimConfig, num_micro: int = 1,
                 value_model: LlamaValueModel | None = None, value_optim: OptimConfig | None = None):
        self.loss = loss
        self.num_micro = num_micro
        self.policy_graphdef, self.policy_frozen, params = split_trainable(policy)
        self.compute_dtype = jnp.dtype(policy.config.dtype)
        self.policy_tx = make_optimizer(optim)
        self.policy_state = init_state(params, self.policy_tx)
        self.value_graphdef = None
        self.value_frozen = None
        self.value_state = None
        if loss.algorithm == "ppo":
            if value_model is None:
                raise ValueError("Learner: PPO needs a value model")
            self.value_graphdef, self.value_frozen, vparams = split_trainable(value_model)
            self.value_tx = make_optimizer(value_optim or optim)
            self.value_state = init_state(vparams, self.value_tx)
        self._score = jax.jit(self._score_impl)
        self._values = jax.jit(self._values_impl)
        self._update_policy = jax.jit(self._update_policy_impl, donate_argnums=0)
        self._update_value = jax.jit(self._update_value_impl, donate_argnums=0)

    # ---- public ------------------------------------------------------------------------------------------------
    def policy_model(self) -> Llama:
        return nnx.merge(self.policy_graphdef, self.policy_frozen, self.policy_state.params)

    def reference_params(self, keep_adapters: bool = False) -> Any:
        """Trainable params of the reference policy for KL, at the current weights: a copy of the weights held in
        the compute dtype (`config.dtype`; every use casts a weight to it, so the reference scores exactly what
        the float32 master weights would, in half their bytes under bfloat16 compute), or with LoRA zero adapters
        (the base model exactly, no copy of the base; `keep_adapters`: a copy of the current adapters, e.g. the
        warmed-up policy)."""
        if jax.tree.leaves(self.policy_frozen):
            copy = jnp.copy if keep_adapters else jnp.zeros_like
            return jax.tree.map(copy, self.policy_state.params)
        return in_compute_dtype(self.policy_state.params, self.compute_dtype.name)

    def score(self, params: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """(logprobs, entropy) [B, L] of the batch's tokens under `params` (the policy's or the reference's)."""
        return self._score(params, self.policy_frozen, batch)

    def values(self, batch: dict[str, jax.Array]) -> jax.Array:
        return self._values(self.value_state.params, self.value_frozen, batch)

    def update_policy(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        self.policy_state, metrics = self._update_policy(self.policy_state, self.policy_frozen, batch)
        return metrics

    def compiled_update(self, batch: dict[str, Any]) -> Any:
        """The policy update compiled for `batch`'s shapes (arrays or ShapeDtypeStructs), e.g. for its
        memory analysis; works on a Learner built over an abstract (`nnx.eval_shape`) model."""
        return self._update_policy.lower(self.policy_state, self.policy_frozen, batch).compile()

    def update_value(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        self.value_state, metrics = self._update_value(self.value_state, self.value_frozen, batch)
        return metrics

    # ---- jitted bodies -----------------------------------------------------------------------------------------
    def _score_impl(self, params: Any, frozen: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        model = nnx.merge(self.policy_graphdef, frozen, params)
        keys = ("tokens", "positions", "valid") + tuple(k for k in SHARED_PREFIX_KEYS if k in batch)
        micro = _micro({k: batch[k] for k in keys}, self.num_micro)
        logp, entropy = jax.lax.map(lambda mb: token_logprobs(model, mb, self.loss.temperature,
                                                                 self.loss.vocab_chunk), micro)
        return _unmicro(logp), _unmicro(entropy)

    def _values_impl(self, params: Any, frozen: Any, batch: dict[str, jax.Array]) -> jax.Array:
        model = nnx.merge(self.value_graphdef, frozen, params)
        micro = _micro({k: batch[k] for k in ("tokens", "positions", "valid", "value_index")}, self.num_micro)
        return _unmicro(jax.lax.map(lambda mb: turn_values(model, mb), micro))

    def _policy_loss(self, params: Any, frozen: Any, mb: dict[str, jax.Array]
                     ) -> tuple[jax.Array, dict[str, jax.Array]]:
        cfg = self.loss
        model = nnx.merge(self.policy_graphdef, frozen, params)
        logp, entropy = token_logprobs(model, mb, cfg.temperature, cfg.vocab_chunk)
        if not cfg.entropy_coef:  # a diagnostic only: no gradient through it
            entropy = jax.lax.stop_gradient(entropy)
        old_logp = mb["old_logp"] if "old_logp" in mb else jax.lax.stop_gradient(logp)  # on-policy: ratio 1
        sampled = mb["sampled"]
        extra = {}
        is_weights = None
        if cfg.tis_cap:  # min(pi_old / pi_sampler, cap): corrects for the sampler's numerics or stale weights
            is_weights = jnp.minimum(jnp.exp(old_logp - mb["sampler_logp"]), cfg.tis_cap) * sampled
            extra["tis_weight_mean"] = jnp.sum(is_weights) / jnp.maximum(jnp.sum(sampled), 1.0)
            extra["max_tis_weight"] = jnp.max(is_weights)
        variant = dict(clip_eps_high=cfg.clip_eps_high, dual_clip=cfg.dual_clip, ratio_level=cfg.ratio_level,
                       is_weights_bt=is_weights)
        if cfg.algorithm == "ppo":
            loss, diag = clipped_policy_loss(logp, old_logp, mb["advantages"], sampled, cfg.clip_eps,
                                             weights_bt=mb["weights"], **variant)
        else:
            loss, diag = grpo_loss(logp, old_logp, mb.get("ref_logp", old_logp), mb["advantages"], sampled,
                                   cfg.clip_eps, cfg.kl_coef, cfg.kl_estimator, cfg.kl_in_loss,
                                   weights_bt=mb["weights"], **variant)
        entropy_term = jnp.sum(entropy * mb["weights"])
        total = loss - cfg.entropy_coef * entropy_term
        if "sampler_logp" in mb:  # how far the sampler's logprobs are from the trainer's (numerics, stale weights)
            extra["max_sampler_logprob_diff"] = jnp.max(jnp.abs(jax.lax.stop_gradient(logp) - mb["sampler_logp"])
                                                        * sampled)
        return total, {"policy_loss": loss, "entropy": entropy_term, **diag, **extra}

    @property
    def skips_zero_advantage(self) -> bool:
        """Whether a micro-batch with all-zero advantages has exactly zero loss (and is skipped)."""
        return not self.loss.entropy_coef and not (self.loss.kl_in_loss and self.loss.kl_coef)

    def _value_loss(self, params: Any, frozen: Any, mb: dict[str, jax.Array]
                    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        values = turn_values(nnx.merge(self.value_graphdef, frozen, params), mb)
        loss = clipped_value_loss(values, mb["old_values"], mb["returns"], mb["turn_mask"], self.loss.value_clip,
                                  weights=mb["turn_weights"])
        return loss, {"value_loss": loss}

    def _update_policy_impl(self, state: TrainState, frozen: Any, batch: dict[str, jax.Array]):
        skip_key = "advantages" if self.skips_zero_advantage else None
        return accumulate_and_apply(functools.partial(self._policy_loss, frozen=frozen), self.policy_tx, state,
                                    batch, self.num_micro, skip_key)

    def _update_value_impl(self, state: TrainState, frozen: Any, batch: dict[str, jax.Array]):
        return accumulate_and_apply(functools.partial(self._value_loss, frozen=frozen), self.value_tx, state,
                                    batch, self.num_micro)


def _unmicro(x: jax.Array) -> jax.Array:
    """Inverse of `_micro` for one array: [m, B/m, ...] -> [B, ...]."""
    return x.swapaxes(0, 1).reshape((-1,) + x.shape[2:])


def accumulate_and_apply(loss_fn: Callable, tx: optax.GradientTransformation, state: TrainState,
                         batch: dict[str, jax.Array], num_micro: int, skip_if_zero: str | None = None
                         ) -> tuple[TrainState, dict[str, jax.Array]]:
    """Sum the loss and gradients over micro-batches (the loss weights are global, so the sums are the full
    batch's), then one optimizer step. With `skip_if_zero`, a micro-batch whose `batch[skip_if_zero]` is all
    zero is not computed (the caller guarantees its loss is exactly 0 then). Per-micro-batch means among the
    diagnostics are averaged over the micro-batches computed; `max_*` diagnostics take the maximum."""
    grad_fn = jax.value_and_grad(lambda params, mb: loss_fn(params, mb=mb), has_aux=True)
    micro = _micro(batch, num_micro)
    first = jax.tree.map(lambda x: x[0], micro)
    aux_shape = jax.eval_shape(lambda: grad_fn(state.params, first)[0][1])
    nothing = (jnp.zeros(()), jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), aux_shape),
               jax.tree.map(jnp.zeros_like, state.params))

    def one(mb):
        def compute(mb):
            (loss, aux), grads = grad_fn(state.params, mb)
            return loss, aux, grads
        if skip_if_zero is None:
            return compute(mb), jnp.ones(())
        run = jnp.any(mb[skip_if_zero] != 0)
        return jax.lax.cond(run, compute, lambda _: nothing, mb), run.astype(jnp.float32)

    if num_micro == 1:  # no accumulation buffers: they would cost two extra passes over every parameter
        (loss, aux, grads), computed = one(first)
    else:
        def body(carry, mb):
            (loss, aux, grads), ran = one(mb)
            acc_loss, acc_aux, acc_grads, acc_ran = carry
            acc_aux = {k: jnp.maximum(acc_aux[k], v) if k.startswith("max_") else acc_aux[k] + v
                       for k, v in aux.items()}
            return (acc_loss + loss, acc_aux, jax.tree.map(jnp.add, acc_grads, grads), acc_ran + ran), None

        (loss, aux, grads, computed), _ = jax.lax.scan(body, nothing + (jnp.zeros(()),), micro)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    summed = ("policy_loss", "value_loss", "entropy")  # weighted sums add up over micro-batches
    metrics = {k: v if k in summed or k.startswith("max_") else v / jnp.maximum(computed, 1.0)
               for k, v in aux.items()}
    metrics.update(loss=loss, grad_norm=optax.tree.norm(grads), micro_batches_computed=computed)
    return TrainState(state.step + 1, params, opt_state), metrics
