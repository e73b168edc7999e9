"""Hugging Face Llama safetensors <-> rljax parameter tree, driven by one declarative, reversible table.

Each `TensorRule` names an HF tensor and an rljax path, whether the weight is transposed, and both shapes;
import is `x.T.reshape(rljax_shape)`, export its exact inverse, so HF -> rljax -> HF is bit-exact.
Tensors are read one at a time from whichever shard holds them and kept in the file's dtype.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from models.config import LlamaConfig
from models.llama import LAYER_PARAMS

Shape = Callable[[LlamaConfig], tuple[int, ...]]
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightsError(ValueError):
    """Weights that do not fit the config: a missing tensor or shard, a wrong shape, an unknown tensor."""


@dataclasses.dataclass(frozen=True)
class TensorRule:
    hf_name: str  # "{i}" stands for the layer index
    path: tuple[str, ...]  # path in the rljax parameter tree (per-layer params are stacked on axis 0)
    hf_shape: Shape
    rljax_shape: Shape  # per layer for per-layer tensors
    transpose: bool = False

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.hf_name

    def to_rljax(self, x: np.ndarray, cfg: LlamaConfig, name: str) -> np.ndarray:
        want = self.hf_shape(cfg)
        if tuple(x.shape) != want:
            raise WeightsError(f"tensor {name}: shape {tuple(x.shape)} does not match the config's {want}")
        return (x.T if self.transpose else x).reshape(self.rljax_shape(cfg))

    def to_hf(self, y: np.ndarray, cfg: LlamaConfig) -> np.ndarray:
        hf = self.hf_shape(cfg)
        return np.ascontiguousarray(y.reshape(hf[::-1]).T) if self.transpose else y.reshape(hf)


def _layer_rule(hf_suffix: str, name: str, hf_shape: Shape, transpose: bool) -> TensorRule:
    return TensorRule(f"model.layers.{{i}}.{hf_suffix}", ("layers", name), hf_shape, LAYER_PARAMS[name][1],
                      transpose)


def tensor_rules(cfg: LlamaConfig) -> list[TensorRule]:
    """The HF <-> rljax table for a config (lm_head only when embeddings are untied)."""
    d, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    rules = [
        TensorRule("model.embed_tokens.weight", ("embed_vd",), lambda c: (v, d), lambda c: (v, d)),
        TensorRule("model.norm.weight", ("final_norm_d",), lambda c: (d,), lambda c: (d,)),
        _layer_rule("input_layernorm.weight", "attn_norm_d", lambda c: (d,), False),
        _layer_rule("self_attn.q_proj.weight", "q_dnh", lambda c: (q, d), True),
        _layer_rule("self_attn.k_proj.weight", "k_dkh", lambda c: (kv, d), True),
        _layer_rule("self_attn.v_proj.weight", "v_dkh", lambda c: (kv, d), True),
        _layer_rule("self_attn.o_proj.weight", "o_nhd", lambda c: (d, q), True),
        _layer_rule("post_attention_layernorm.weight", "mlp_norm_d", lambda c: (d,), False),
        _layer_rule("mlp.gate_proj.weight", "gate_df", lambda c: (f, d), True),
        _layer_rule("mlp.up_proj.weight", "up_df", lambda c: (f, d), True),
        _layer_rule("mlp.down_proj.weight", "down_fd", lambda c: (d, f), True),
    ]
    if not cfg.tie_word_embeddings:
        rules.append(TensorRule("lm_head.weight", ("lm_head_dv",), lambda c: (v, d), lambda c: (d, v), True))
    return rules


def hf_tensors_to_params(get: Callable[[str], np.ndarray], names: set[str], cfg: LlamaConfig
                         ) -> dict[str, Any]:
    """Build the rljax parameter tree from HF tensors, reading each one once via `get(name)`."""
    params: dict[str, Any] = {}
    used: set[str] = set()
    for rule in tensor_rules(cfg):
        hf_names = [rule.hf_name.format(i=i) for i in range(cfg.num_layers)] if rule.per_layer else [rule.hf_name]
        missing = [n for n in hf_names if n not in names]
        if missing:
            raise WeightsError(f"missing tensor {missing[0]} (and {len(missing) - 1} more) for the config")
        if rule.per_layer:
            first = rule.to_rljax(get(hf_names[0]), cfg, hf_names[0])
            value = np.empty((cfg.num_layers,) + first.shape, first.dtype)
            value[0] = first
            for i, name in enumerate(hf_names[1:], start=1):
                value[i] = rule.to_rljax(get(name), cfg, name)
        else:
            value = np.ascontiguousarray(rule.to_rljax(get(hf_names[0]), cfg, hf_names[0]))
        node = params
        for key in rule.path[:-1]:
            node = node.setdefault(key, {})
        node[rule.path[-1]] = value
        used.update(hf_names)
    ignorable = {n for n in names if n.endswith(IGNORED_SUFFIXES)}
    if cfg.tie_word_embeddings:
        ignorable.add("lm_head.weight")  # some tied checkpoints store a copy
    unexpected = sorted(names - used - ignorable)
    if unexpected:
        raise WeightsError(f"unexpected tensors not in a Llama model: {unexpected[:5]}"
                           f"{' ...' if len(unexpected) > 5 else ''} ({len(unexpected)} in all)")
    return params


def params_to_hf_tensors(params: dict[str, Any], cfg: LlamaConfig) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (HF name, tensor) for every rule, in table order, layer by layer."""
    for rule in tensor_rules(cfg):
        value = params
        for key in rule.path:
            value = value[key]
        value = np.asarray(value)
        if rule.per_layer:
            for i in range(cfg.num_layers):
                yield rule.hf_name.format(i=i), rule.to_hf(value[i], cfg)
        else:
            yield rule.hf_name, rule.to_hf(value, cfg)


class SafetensorsShards:
    """Name -> tensor access over one or many safetensors files (with or without an index)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        index = self.directory / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as err:
                raise WeightsError(f"{index}: not a safetensors index ({err})") from None
            for shard in sorted(set(weight_map.values())):
                if not (self.directory / shard).exists():
                    raise WeightsError(f"missing shard {shard} named by {index}")
            self.file_of = {name: self.directory / shard for name, shard in weight_map.items()}
        else:
            files = sorted(self.directory.glob("*.safetensors"))
            if not files:
                raise WeightsError(f"{self.directory}: no *.safetensors files")
            self.file_of = {}
            for path in files:
                with self._open(path) as handle:
                    self.file_of.update({name: path for name in handle.keys()})
        self._handles: dict[Path, Any] = {}

    @staticmethod
    def _open(path: Path) -> Any:
        try:
            return safe_open(str(path), framework="numpy")
        except Exception as err:  # safetensors raises its own error types for corrupt headers
            raise WeightsError(f"{path}: not a readable safetensors file ({err})") from None

    @property
    def names(self) -> set[str]:
        return set(self.file_of)

    def get(self, name: str) -> np.ndarray:
        path = self.file_of[name]
        if path not in self._handles:
            self._handles[path] = self._open(path).__enter__()
        try:
            return self._handles[path].get_tensor(name)
        except Exception as err:
            raise WeightsError(f"{path}: cannot read tensor {name} ({err})") from None

    def dtype(self) -> str:
        """The dtype name of the first tensor (checkpoints are stored in one dtype)."""
        return str(self.get(sorted(self.file_of)[0]).dtype)


def read_hf_config(directory: str | Path) -> LlamaConfig:
    path = Path(directory) / "config.json"
    if not path.exists():
        raise WeightsError(f"{directory}: no config.json (expected a Hugging Face model directory)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise WeightsError(f"{path}: invalid JSON ({err})") from None
    return LlamaConfig.from_hf_dict(raw, source=str(path))


def read_hf_params(directory: str | Path) -> tuple[LlamaConfig, dict[str, Any]]:
    """Config and parameter tree (numpy, in the file's dtype) of an HF Llama directory."""
    cfg = read_hf_config(directory)
    shards = SafetensorsShards(directory)
    dtype = shards.dtype()
    if dtype not in ("float32", "bfloat16", "float16"):
        raise WeightsError(f"{directory}: unsupported weight dtype {dtype}; expected float32, bfloat16 or float16")
    cfg = cfg.replace(param_dtype=dtype, dtype=dtype)
    return cfg, hf_tensors_to_params(shards.get, shards.names, cfg)


def write_hf(params: dict[str, Any], cfg: LlamaConfig, out_dir: str | Path,
             max_shard_bytes: int = 5 * 2**30) -> list[Path]:
    """Write config.json and safetensors (sharded with an index past `max_shard_bytes`) for transformers."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = list(params_to_hf_tensors(params, cfg))
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, tensor in tensors:
        if shards[-1] and size + tensor.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += tensor.nbytes
    config = cfg.to_hf_dict()
    config["torch_dtype"] = str(tensors[0][1].dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    written = []
    if len(shards) == 1:
        written.append(out / "model.safetensors")
        save_file(shards[0], str(written[0]), metadata={"format": "pt"})
        return written
    weight_map = {}
    for k, shard in enumerate(shards, start=1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
        written.append(out / fname)
    total = sum(t.nbytes for _, t in tensors)
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return written


def param_count(cfg: LlamaConfig) -> int:
    """Number of parameters of a config (embedding counted once when tied)."""
    return sum(math.prod(r.hf_shape(cfg)) * (cfg.num_layers if r.per_layer else 1) for r in tensor_rules(cfg))
