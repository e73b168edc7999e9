"""LoRA (Hu et al. 2021) on the decoder's projections: W x becomes W x + (alpha / r) * B (A x).

A target's adapter is a pair of `LoraParam`s stacked on the layer axis like the weight it adapts:
A [L, In..., r] (normal, std 1/sqrt(In)) and B [L, r, Out...] (zeros, so a fresh adapter changes nothing).
Their logical axes are the weight's own plus "lora_rank", which the sharding rules replicate, so an adapter
shards like its weight. `nnx.split(model, LoraParam, ...)` separates the trainable adapters from the frozen
base weights; `rljax.learner` trains only the first and shares the second (the reference policy is the same
model with zero adapters, the PPO value model adapts the same base arrays).

Where the adapters act:
- without a cache (training, scoring): `lora_matmul`, one matmul through the merged weight W + A B (merging
  costs In r Out per layer, not per token) whose backward forms the adapters' gradients from rank-r products
  and no gradient for the frozen weight;
- with a cache (the sampler): `DecoderStack.per_layer` merges W + (alpha / r) A B once per generation call,
  so decoding costs what the base model's does.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# short name -> the stacked layer weight it adapts, and how many leading (input) axes that weight contracts
TARGETS: dict[str, tuple[str, int]] = {
    "q": ("q_dnh", 1), "k": ("k_dkh", 1), "v": ("v_dkh", 1), "o": ("o_nhd", 2),
    "gate": ("gate_df", 1), "up": ("up_df", 1), "down": ("down_fd", 1),
}
RANK_AXIS = "lora_rank"


class LoraParam(nnx.Param):
    """A trainable LoRA adapter weight (the base weights stay plain `nnx.Param`s)."""


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """targets: short names from TARGETS ("all" for every one); rank r > 0; alpha scales the update by alpha / r."""

    targets: tuple[str, ...]
    rank: int = 16
    alpha: float = 32.0

    def __post_init__(self) -> None:
        targets = tuple(TARGETS) if tuple(self.targets) == ("all",) else tuple(self.targets)
        unknown = [t for t in targets if t not in TARGETS]
        if unknown or not targets:
            raise ValueError(f"LoRA targets {list(self.targets)}: expected names from {list(TARGETS)} or 'all'")
        if not isinstance(self.rank, (int, np.integer)) or self.rank <= 0:
            raise ValueError(f"LoRA rank must be a positive integer, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"LoRA alpha must be > 0, got {self.alpha!r}")
        object.__setattr__(self, "targets", targets)

    @classmethod
    def parse(cls, targets: str, rank: int, alpha: float) -> "LoraConfig | None":
        """From a run config's comma list ("" = no LoRA)."""
        names = tuple(t.strip() for t in targets.split(",") if t.strip())
        return cls(names, int(rank), float(alpha)) if names else None

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def as_dict(self) -> dict[str, Any]:
        return {"targets": list(self.targets), "rank": self.rank, "alpha": self.alpha}


class LoraAdapters(nnx.Module):
    """The adapters of one decoder stack: `{target}_a` and `{target}_b` per configured target."""

    def __init__(self, layers: nnx.Module, config: LoraConfig, *, rngs: nnx.Rngs):
        self.config = config
        r = config.rank
        for name in config.targets:
            weight_name, n_in = TARGETS[name]
            weight = getattr(layers, weight_name)
            axes = tuple(weight.get_metadata().get("axes") or (None,) * weight.ndim)
            shape = weight.shape
            in_shape, out_shape = shape[1:1 + n_in], shape[1 + n_in:]
            fan_in = int(np.prod(in_shape))
            a = jax.random.normal(rngs.params(), shape[:1] + in_shape + (r,), jnp.float32) / np.sqrt(fan_in)
            setattr(self, f"{name}_a", LoraParam(a.astype(weight.dtype), axes=axes[:1 + n_in] + (RANK_AXIS,)))
            setattr(self, f"{name}_b", LoraParam(jnp.zeros(shape[:1] + (r,) + out_shape, weight.dtype),
                                                 axes=axes[:1] + (RANK_AXIS,) + axes[1 + n_in:]))

    def stacked(self, scaled: bool = False) -> dict[str, tuple[jax.Array, jax.Array]]:
        """{weight name: (A [L, In..., r], B [L, r, Out...])} for a scan over layers; `scaled`: B * alpha / r."""
        scale = self.config.scale if scaled else 1.0
        return {TARGETS[n][0]: (getattr(self, f"{n}_a")[...], getattr(self, f"{n}_b")[...] * scale)
                for n in self.config.targets}


def add_lora(model: nnx.Module, config: LoraConfig, seed: int = 0) -> nnx.Module:
    """Attach fresh adapters (B = 0: the model's outputs do not change) to a `Llama` in place; returns it."""
    if getattr(model.layers, "lora", None) is not None:
        raise ValueError("add_lora: the model already has LoRA adapters")
    model.layers.lora = LoraAdapters(model.layers, config, rngs=nnx.Rngs(seed))
    return model


def lora_config_of(model: nnx.Module) -> LoraConfig | None:
    adapters = getattr(getattr(model, "layers", None), "lora", None)
    return None if adapters is None else adapters.config


def merged_delta(a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
    """scale * A B: [In..., Out...] for one layer's A [In..., r] and B [r, Out...] (fp32 products)."""
    return (jnp.tensordot(a.astype(jnp.float32), b.astype(jnp.float32), axes=1) * scale).astype(a.dtype)


@jax.custom_vjp
def lora_matmul(x: jax.Array, w: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """x (W + A B): x [T, In], W [In, Out], A [In, r], B [r, Out] (pre-scaled by alpha / r) -> [T, Out], through
    the merged weight in x's dtype, as the sampler computes it. Its VJP, for dy [T, Out]:
    dx = dy (W + A B)^T, dA = x^T (dy B^T), dB = (x A)^T dy, dW = x^T dy (dead code, dropped by XLA, where W is
    frozen). Against x W + (x A) B with autodiff it saves the low-rank output's matmul and sum, and the rank-r
    product and sum of dx."""
    return jnp.dot(x, _merged(w, a, b, x.dtype))


def _merged(w: jax.Array, a: jax.Array, b: jax.Array, dtype: Any) -> jax.Array:
    """W + A B in the weights' dtype, cast to the compute dtype."""
    return (w + merged_delta(a, b, 1.0).astype(w.dtype)).astype(dtype)


def _lora_matmul_fwd(x, w, a, b):
    return lora_matmul(x, w, a, b), (x, w, a, b)


def _lora_matmul_bwd(residuals, dy):
    x, w, a, b = residuals
    dx = jnp.dot(dy, _merged(w, a, b, x.dtype).T)
    dy_b = jnp.dot(dy, b.astype(dy.dtype).T)  # [T, r]
    x_a = jnp.dot(x, a.astype(x.dtype))  # [T, r]
    return (dx, jnp.dot(x.T, dy).astype(w.dtype), jnp.dot(x.T, dy_b).astype(a.dtype),
            jnp.dot(x_a.T, dy).astype(b.dtype))


lora_matmul.defvjp(_lora_matmul_fwd, _lora_matmul_bwd)


def merge_lora(model: nnx.Module) -> nnx.Module:
    """The model with every adapter folded into its weight (W + alpha / r * A B) and the adapters removed, in
    place: a plain Llama for export (`rljax convert --to-hf`) or for serving."""
    adapters = getattr(model.layers, "lora", None)
    if adapters is None:
        return model
    scale = adapters.config.scale
    for weight_name, (a, b) in adapters.stacked().items():
        param = getattr(model.layers, weight_name)
        delta = jax.vmap(lambda a_l, b_l: merged_delta(a_l, b_l, scale))(a, b)
        param[...] = (param[...].astype(jnp.float32) + delta.astype(jnp.float32)).astype(param.dtype)
    del model.layers.lora
    return model
