"""rljax models: Llama 3/3.1/3.3 and SmolLM2 in Flax NNX, sharding, conversion, tokenizers. No RL here."""
from models.checkpoint import (CheckpointError, convert_checkpoint_to_hf, convert_gguf_to_checkpoint,
                               convert_hf_to_checkpoint, from_hf, load_checkpoint, load_tokenizer)
from models.config import ConfigError, LlamaConfig, RopeScaling
from models.convert import WeightsError, param_count
from models.kv_cache import KVCache
from models.llama import Llama, LlamaValueModel
from models.sharding import make_mesh, shard_model, use_mesh
from models.tokenizer import Tokenizer

__all__ = ["CheckpointError", "ConfigError", "KVCache", "Llama", "LlamaConfig", "LlamaValueModel", "RopeScaling",
           "Tokenizer", "WeightsError", "convert_checkpoint_to_hf", "convert_gguf_to_checkpoint",
           "convert_hf_to_checkpoint", "from_hf", "load_checkpoint", "load_tokenizer", "make_mesh", "param_count",
           "shard_model", "use_mesh"]
