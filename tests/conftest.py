"""Shared fixtures: tiny HF Llama checkpoints written by transformers, and the SmolLM2 GGUF checkpoint."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

# the tests run on the host CPU; with libtpu installed (the tpu-compile extra) jax would first try a TPU backend
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# SmolLM2 is converted from its GGUF once per session, fresh, into a cache that every test and every subprocess
# shares (models.pretrained reads RLJAX_CACHE at import); RLJAX_TEST_CACHE keeps a cache across sessions.
# pytest-xdist's workers share the cache their controller made before starting them (RLJAX_SUITE_CACHE); the
# controller removes it when the session ends.
if os.environ.get("RLJAX_TEST_CACHE"):
    os.environ["RLJAX_SUITE_CACHE"] = os.environ["RLJAX_TEST_CACHE"]
elif not (os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("RLJAX_SUITE_CACHE")):
    os.environ["RLJAX_SUITE_CACHE"] = tempfile.mkdtemp(prefix="rljax-test-cache-")
    atexit.register(shutil.rmtree, os.environ["RLJAX_SUITE_CACHE"], True)
os.environ["RLJAX_CACHE"] = os.environ["RLJAX_SUITE_CACHE"]

# compiled XLA programs are shared through JAX's persistent cache by every test and subprocess of the session
# (a test still compiles each program the first time; toy programs compile in well under JAX's 1 s threshold)
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.environ["RLJAX_CACHE"], "xla"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

# the suite compiles its XLA:CPU programs with LLVM at optimisation level 0: the same XLA programs (HLO passes,
# fusion and thunks are unchanged; only each kernel's machine code is less optimised). Compiling toy programs is
# 42% of the main process's time, and this makes it ~40% faster (a trainer and a parity test: 24 s of compiles
# against 41 s); subprocesses that mostly execute opt out (optimised_env). A flag already in XLA_FLAGS wins.
# Subprocesses inherit it (host_devices_env adds simulated devices to it rather than replacing it).
SUITE_XLA_FLAG = "--xla_backend_optimization_level=0"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SUITE_XLA_FLAG}".strip()

# RLJAX_HOST_MEMORY=retain applies to the test session as to the `rljax` command (rljax.host_memory)
from rljax.host_memory import retain_freed_host_memory  # noqa: E402

retain_freed_host_memory()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "serial: needs the host to itself (a check of every sandbox process on the "
                            "machine; libtpu, one process per host): `make test` runs it after its pytest-xdist "
                            "workers, in one process")


REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def host_devices_env(count: int, **extra: str) -> dict[str, str]:
    """The environment of a subprocess that runs on `count` simulated CPU devices, with the suite's XLA flags."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}".strip()
    return dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu", **extra)


def optimised_env(**extra: str) -> dict[str, str]:
    """The environment of a subprocess whose programs XLA compiles at its default optimisation (without the
    suite's flag): for runs that execute long enough to repay the compiles (the reduced SmolLM2 demo: 120 s
    against 145 s at level 0; the host-memory probe: 19-21 s against 25-26 s)."""
    flags = os.environ.get("XLA_FLAGS", "").replace(SUITE_XLA_FLAG, "").strip()
    return dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu", **extra)


def hf_tiny_llama(tmp_path: Path, seed: int = 0, dtype: str = "float32", **overrides):
    """Save a random transformers LlamaForCausalLM and return (directory, model)."""
    import torch
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM

    kwargs = dict(vocab_size=301, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
                  num_key_value_heads=2, head_dim=8, rope_theta=50000.0, max_position_embeddings=256,
                  tie_word_embeddings=False, rms_norm_eps=1e-5)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(HFLlamaConfig(**kwargs)).eval()
    with torch.no_grad():  # non-trivial norm weights so a mixed-up norm would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model = model.to(getattr(torch, dtype))
    directory = tmp_path / f"hf_{seed}_{dtype}"
    model.save_pretrained(directory)
    return directory, model


@pytest.fixture(scope="session")
def smollm2_ckpt() -> Path:
    from models.pretrained import smollm2_checkpoint

    return smollm2_checkpoint()


@pytest.fixture(scope="session")
def smollm2_hf():
    """transformers' own load of the same GGUF (dequantized fp32): model and tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.pretrained import GGUF_NAME, smollm2_gguf_path

    folder = smollm2_gguf_path().parent
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32).eval()
    return model, tokenizer


def random_ids(seed: int, shape, vocab: int) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, vocab, shape)
