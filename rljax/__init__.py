"""rljax: reinforcement learning for code models (RLEF, SWE-RL) in JAX/Flax."""
__version__ = "0.1.0"
