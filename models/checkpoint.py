"""rljax model checkpoints (orbax) and the conversions HF dir / GGUF file -> checkpoint -> HF dir.

Layout of a checkpoint directory:
  config.json   rljax LlamaConfig
  params/       orbax StandardCheckpointer tree (numpy arrays in the stored dtype)
  tokenizer/    tokenizer.json or tokenizer.model + rljax_tokenizer.json (when known)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding

from models.config import EXECUTION_FIELDS, ConfigError, LlamaConfig
from models.convert import WeightsError, read_hf_params, write_hf
from models.llama import Llama
from models.sharding import DEFAULT_RULES, Rules, state_shardings
from models.tokenizer import Tokenizer

CONFIG_FILE, PARAMS_DIR, TOKENIZER_DIR = "config.json", "params", "tokenizer"


class CheckpointError(ValueError):
    """A checkpoint directory that is missing, empty, incomplete or corrupt."""


def _checkpointer() -> Any:
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer()


def save_params(ckpt_dir: str | Path, cfg: LlamaConfig, params: dict[str, Any],
                tokenizer: Tokenizer | None = None) -> Path:
    """Write config, parameter tree and tokenizer as an rljax checkpoint directory."""
    ckpt = Path(ckpt_dir).absolute()
    if ckpt.exists() and any(ckpt.iterdir()):
        raise CheckpointError(f"{ckpt}: already exists and is not empty; choose a new --out directory")
    ckpt.mkdir(parents=True, exist_ok=True)
    cfg.save(ckpt / CONFIG_FILE)
    checkpointer = _checkpointer()
    checkpointer.save(ckpt / PARAMS_DIR, jax.tree.map(np.asarray, params))
    checkpointer.wait_until_finished()
    if tokenizer is not None:
        tokenizer.save(ckpt / TOKENIZER_DIR)
    return ckpt


def read_config(ckpt_dir: str | Path) -> LlamaConfig:
    ckpt = Path(ckpt_dir)
    if not ckpt.is_dir():
        raise CheckpointError(f"{ckpt}: no such checkpoint directory")
    if not (ckpt / CONFIG_FILE).exists() or not (ckpt / PARAMS_DIR).is_dir():
        raise CheckpointError(f"{ckpt}: not an rljax checkpoint (expected {CONFIG_FILE} and {PARAMS_DIR}/)")
    try:
        return LlamaConfig.load(ckpt / CONFIG_FILE)
    except ConfigError as err:
        raise CheckpointError(f"{ckpt}: bad {CONFIG_FILE}: {err}") from None


def abstract_model(cfg: LlamaConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """Graph and shape-only state of a Llama for `cfg` (no memory allocated)."""
    return nnx.split(nnx.eval_shape(lambda: Llama(cfg, rngs=nnx.Rngs(0))))


def _target_shardings(state: nnx.State, mesh: Mesh | None, rules: Rules) -> Any:
    if mesh is not None:
        return nnx.to_pure_dict(state_shardings(state, mesh, rules))
    device = SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda _: device, nnx.to_pure_dict(state))


def read_params(ckpt_dir: str | Path, mesh: Mesh | None = None, rules: Rules = DEFAULT_RULES
                ) -> tuple[LlamaConfig, dict[str, Any]]:
    """Config and parameter tree restored straight into the target shardings (numpy when mesh is None)."""
    ckpt = Path(ckpt_dir).absolute()
    cfg = read_config(ckpt)
    _, state = abstract_model(cfg)
    shapes = nnx.to_pure_dict(state)
    shardings = _target_shardings(state, mesh, rules)
    target = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)
    try:
        params = _checkpointer().restore(ckpt / PARAMS_DIR, target)
    except Exception as err:  # orbax/tensorstore raise many types for a damaged directory
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{ckpt}: corrupt or incomplete params ({type(err).__name__}: {first[:200]})") from None
    if mesh is None:
        params = jax.tree.map(np.asarray, params)
    return cfg, params


def model_from_params(cfg: LlamaConfig, params: dict[str, Any], mesh: Mesh | None = None,
                      rules: Rules = DEFAULT_RULES) -> Llama:
    """A ready Llama with `params` placed per the sharding rules (or on the default device)."""
    graphdef, state = abstract_model(cfg)
    shardings = _target_shardings(state, mesh, rules)
    dtype = jnp.dtype(cfg.param_dtype)
    placed = jax.tree.map(lambda x, sh: jax.device_put(jnp.asarray(x, dtype), sh), params, shardings)
    nnx.replace_by_pure_dict(state, placed)
    return nnx.merge(graphdef, state)


def load_checkpoint(ckpt_dir: str | Path, mesh: Mesh | None = None, rules: Rules = DEFAULT_RULES,
                    dtype: str | None = None, param_dtype: str | None = None, **execution: Any) -> Llama:
    """Restore an rljax checkpoint as a model (optionally sharded on `mesh`, computing in `dtype` with its
    weights held in `param_dtype`; `dtype` alone sets both; with other execution settings: `remat`,
    `attention_query_blocks`)."""
    cfg, params = read_params(ckpt_dir, mesh, rules)
    cfg = cfg.with_dtypes(dtype, param_dtype)
    execution = {k: v for k, v in execution.items() if v is not None}  # None keeps the checkpoint's own
    unknown = sorted(set(execution) - EXECUTION_FIELDS)
    if unknown:
        raise TypeError(f"load_checkpoint: {unknown} are not execution settings; expected {sorted(EXECUTION_FIELDS)}")
    return model_from_params(cfg.replace(**execution), params, mesh, rules)


def from_hf(hf_dir: str | Path, mesh: Mesh | None = None, rules: Rules = DEFAULT_RULES,
            dtype: str | None = None) -> Llama:
    """A ready model from a Hugging Face Llama directory (config.json + safetensors)."""
    cfg, params = read_hf_params(hf_dir)
    cfg = cfg.with_dtypes(dtype)
    return model_from_params(cfg, params, mesh, rules)


def load_tokenizer(ckpt_dir: str | Path) -> Tokenizer:
    path = Path(ckpt_dir) / TOKENIZER_DIR
    if not path.is_dir():
        raise CheckpointError(f"{ckpt_dir}: checkpoint has no {TOKENIZER_DIR}/ directory")
    return Tokenizer.load(path)


def convert_hf_to_checkpoint(hf_dir: str | Path, out: str | Path) -> Path:
    cfg, params = read_hf_params(hf_dir)
    tokenizer = None
    if (Path(hf_dir) / "tokenizer.json").exists() or (Path(hf_dir) / "tokenizer.model").exists():
        tokenizer = Tokenizer.from_hf_dir(hf_dir)
    return save_params(out, cfg, params, tokenizer)


def convert_gguf_to_checkpoint(gguf_file: str | Path, out: str | Path) -> Path:
    from models.gguf_import import gguf_tokenizer, read_gguf_params

    cfg, params = read_gguf_params(gguf_file)
    ckpt = save_params(out, cfg, params)
    gguf_tokenizer(gguf_file, ckpt / TOKENIZER_DIR)
    return ckpt


def convert_checkpoint_to_hf(ckpt_dir: str | Path, out: str | Path, max_shard_bytes: int = 5 * 2**30) -> list[Path]:
    """Write an rljax checkpoint as a transformers-loadable directory (config, safetensors, tokenizer)."""
    cfg, params = read_params(ckpt_dir)
    written = write_hf(params, cfg, out, max_shard_bytes)
    tok_dir = Path(ckpt_dir) / TOKENIZER_DIR
    for name in ("tokenizer.json", "tokenizer.model"):
        if (tok_dir / name).exists():
            (Path(out) / name).write_bytes((tok_dir / name).read_bytes())
    return written


def export_model(model: Llama, out: str | Path, tokenizer: Tokenizer | None = None, hf: bool = False) -> Path:
    """Write a live model (LoRA adapters merged into the weights, in place) as an rljax checkpoint at `out`, or
    with `hf` as a transformers-loadable directory (through an rljax checkpoint in a temporary directory)."""
    import tempfile

    from models.lora import merge_lora

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise CheckpointError(f"{out}: already exists and is not empty; choose a new --out directory")
    merge_lora(model)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    expected = jax.tree.structure(nnx.to_pure_dict(abstract_model(model.config)[1]))
    if jax.tree.structure(params) != expected:
        raise CheckpointError("export_model: the model's parameters do not form a plain Llama's tree")
    if not hf:
        return save_params(out, model.config, params, tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        convert_checkpoint_to_hf(save_params(Path(tmp) / "ckpt", model.config, params, tokenizer), out)
    return out


__all__ = ["CheckpointError", "WeightsError", "convert_checkpoint_to_hf", "export_model",
           "convert_gguf_to_checkpoint", "convert_hf_to_checkpoint", "from_hf", "load_checkpoint",
           "load_tokenizer", "model_from_params", "read_params", "save_params"]
