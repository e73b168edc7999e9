"""Llama-family architecture config: presets, validation, and HF config.json <-> LlamaConfig."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A model config (preset, config.json, GGUF metadata) that rljax cannot use."""


# LlamaConfig fields that change how the model runs, not its weights (a checkpoint loads under any of them)
EXECUTION_FIELDS = frozenset({"remat", "attention_query_blocks"})


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1 RoPE frequency scaling ("llama3" rope_type)."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Architecture and numerics of a Llama 3 / 3.1 / 3.3 or SmolLM2 model."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 500000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02  # std of the normal init of a fresh model's weights (HF's name and default)
    dtype: str = "float32"  # activations / compute
    param_dtype: str = "float32"
    remat: str = "none"  # none | full | dots_saveable
    # cache-less passes (training, scoring): causal attention in up to this many query blocks (of at least 32
    # positions), each skipping the keys after it
    attention_query_blocks: int = 8

    def __post_init__(self) -> None:
        positive = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                    "head_dim", "attention_query_blocks")
        for name in positive:
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"LlamaConfig.{name} must be a positive integer, got {getattr(self, name)!r}")
        if not self.initializer_range > 0:
            raise ConfigError(f"LlamaConfig.initializer_range must be > 0, got {self.initializer_range!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"LlamaConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                              f"({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"LlamaConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if self.remat not in ("none", "full", "dots_saveable"):
            raise ConfigError(f"LlamaConfig.remat must be none|full|dots_saveable, got {self.remat!r}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16", "float16"):
                raise ConfigError(f"LlamaConfig.{name} must be float32|bfloat16|float16, got {getattr(self, name)!r}")

    def replace(self, **changes: Any) -> "LlamaConfig":
        return dataclasses.replace(self, **changes)

    def with_dtypes(self, dtype: str | None = None, param_dtype: str | None = None) -> "LlamaConfig":
        """Compute in `dtype` and hold the weights in `param_dtype`: `dtype` alone sets both; None keeps each."""
        cfg = self if dtype is None else self.replace(dtype=dtype, param_dtype=dtype)
        return cfg if param_dtype is None else cfg.replace(param_dtype=param_dtype)

    # ---- presets -------------------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "LlamaConfig":
        if name not in PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; expected one of {sorted(PRESETS)}")
        return PRESETS[name].replace(**overrides)

    # ---- serialisation -------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LlamaConfig":
        d = dict(d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown LlamaConfig fields {unknown}")
        if d.get("rope_scaling") is not None:
            d["rope_scaling"] = RopeScaling(**d["rope_scaling"])
        return cls(**d)

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json for transformers' LlamaForCausalLM (classic top-level rope_theta + rope_scaling)."""
        out: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "initializer_range": self.initializer_range,
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": self.param_dtype,
        }
        if self.rope_scaling is not None:
            out["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(self.rope_scaling)}
        return out

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> "LlamaConfig":
        """Read a transformers Llama config (both the classic and the transformers-5 `rope_parameters` layout)."""
        model_type = d.get("model_type")
        if model_type != "llama":
            raise ConfigError(f"{source}: unsupported model_type {model_type!r}; rljax supports 'llama' "
                              "(Llama 3/3.1/3.3, SmolLM2)")
        archs = d.get("architectures") or ["LlamaForCausalLM"]
        if archs != ["LlamaForCausalLM"]:
            raise ConfigError(f"{source}: unsupported architectures {archs}; expected ['LlamaForCausalLM']")
        for flag in ("attention_bias", "mlp_bias"):
            if d.get(flag):
                raise ConfigError(f"{source}: {flag}=true is not supported (Llama 3 has no biases)")
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{source}: hidden_act {d.get('hidden_act')!r} is not supported; expected 'silu'")
        try:
            num_heads = int(d["num_attention_heads"])
            hidden = int(d["hidden_size"])
            rope = dict(d.get("rope_parameters") or {})
            theta = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
            scaling = d.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
            return cls(
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=int(d["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
                head_dim=int(d.get("head_dim") or hidden // num_heads),
                rope_theta=theta,
                rope_scaling=_rope_scaling_from_hf(scaling, source),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(d.get("max_position_embeddings", 8192)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                initializer_range=float(d.get("initializer_range", 0.02)),
            )
        except KeyError as missing:
            raise ConfigError(f"{source}: missing required field {missing}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "LlamaConfig":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError, TypeError) as err:
            raise ConfigError(f"{path}: not a readable rljax model config ({err})") from None


def _rope_scaling_from_hf(scaling: dict[str, Any] | None, source: str) -> RopeScaling | None:
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise ConfigError(f"{source}: unsupported rope scaling type {kind!r}; expected 'llama3' or none")
    return RopeScaling(
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling["low_freq_factor"]),
        high_freq_factor=float(scaling["high_freq_factor"]),
        original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
    )


_LLAMA3_8B = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                         num_kv_heads=8, head_dim=128, rope_theta=500000.0, max_position_embeddings=8192,
                         dtype="bfloat16", param_dtype="bfloat16")
_LLAMA3_1_70B = LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_layers=80,
                            num_heads=64, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
                            rope_scaling=RopeScaling(), max_position_embeddings=131072,
                            dtype="bfloat16", param_dtype="bfloat16")

PRESETS: dict[str, LlamaConfig] = {
    "llama3_8b": _LLAMA3_8B,
    "llama3_1_8b": _LLAMA3_8B.replace(rope_scaling=RopeScaling(), max_position_embeddings=131072),
    "llama3_1_70b": _LLAMA3_1_70B,
    "llama3_3_70b": _LLAMA3_1_70B,
    "smollm2_135m": LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                                num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0,
                                max_position_embeddings=8192, tie_word_embeddings=True),
    "tiny": LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=16, rope_theta=10000.0, max_position_embeddings=2048),
}
