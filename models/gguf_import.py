"""Import a llama.cpp GGUF file (Llama architecture): dequantized weights in HF naming, config, tokenizer.

llama.cpp stores the q/k projections permuted for its interleaved RoPE; `unpermute_qk` undoes that so the
weights match HF's rotate-half layout. Dequantization is the `gguf` package's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from models.chat import template_from_jinja
from models.config import ConfigError, LlamaConfig
from models.convert import WeightsError, hf_tensors_to_params
from models.tokenizer import Tokenizer, _HFBackend

GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
GGUF_LAYER_TO_HF = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
# Pre-tokenizer split of Llama 3 style vocabularies (GGUF `tokenizer.ggml.pre` llama-bpe and friends).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PRE = {"llama3", "llama-v3", "llama-bpe", "smaug-bpe"}


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k row permutation (interleaved pairs -> rotate-half halves), per head."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _reader(path: str | Path) -> Any:
    import gguf

    if not Path(path).is_file():
        raise WeightsError(f"{path}: no such GGUF file")
    try:
        return gguf.GGUFReader(str(path))
    except Exception as err:
        raise WeightsError(f"{path}: not a readable GGUF file ({err})") from None


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _f32_decimal(value: float) -> float:
    """GGUF stores floats as float32: recover the shortest decimal (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def gguf_config(reader: Any, path: str | Path) -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ConfigError(f"{path}: unsupported GGUF architecture {arch!r}; expected 'llama'")
    p = "llama."
    heads = int(_field(reader, p + "attention.head_count"))
    hidden = int(_field(reader, p + "embedding_length"))
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    vocab = _field(reader, p + "vocab_size") or len(_field(reader, "tokenizer.ggml.tokens"))
    return LlamaConfig(
        vocab_size=int(vocab), hidden_size=hidden, intermediate_size=int(_field(reader, p + "feed_forward_length")),
        num_layers=int(_field(reader, p + "block_count")), num_heads=heads,
        num_kv_heads=int(_field(reader, p + "attention.head_count_kv", heads)),
        head_dim=int(_field(reader, p + "rope.dimension_count", hidden // heads)),
        rope_theta=_f32_decimal(_field(reader, p + "rope.freq_base", 10000.0)),
        rms_norm_eps=_f32_decimal(_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-5)),
        max_position_embeddings=int(_field(reader, p + "context_length", 8192)),
        tie_word_embeddings=tied,
    )


def read_gguf_params(path: str | Path) -> tuple[LlamaConfig, dict[str, Any]]:
    """Config and float32 parameter tree of a GGUF Llama model."""
    import gguf

    reader = _reader(path)
    cfg = gguf_config(reader, path)
    tensors = {t.name: t for t in reader.tensors}
    hf_names: dict[str, str] = {}
    for name in tensors:
        if name in GGUF_TO_HF:
            hf_names[GGUF_TO_HF[name]] = name
        elif name.startswith("blk."):
            _, layer, kind, suffix = name.split(".", 3)
            if kind not in GGUF_LAYER_TO_HF:
                raise WeightsError(f"{path}: unexpected GGUF tensor {name}")
            hf_names[f"model.layers.{layer}.{GGUF_LAYER_TO_HF[kind]}.{suffix}"] = name
        else:
            raise WeightsError(f"{path}: unexpected GGUF tensor {name}")

    def get(hf_name: str) -> np.ndarray:
        tensor = tensors[hf_names[hf_name]]
        value = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        value = value.reshape(tuple(int(n) for n in reversed(tensor.shape)))
        if hf_name.endswith("q_proj.weight"):
            value = unpermute_qk(value, cfg.num_heads)
        elif hf_name.endswith("k_proj.weight"):
            value = unpermute_qk(value, cfg.num_kv_heads)
        return value

    return cfg, hf_tensors_to_params(get, set(hf_names), cfg)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def gguf_tokenizer(path: str | Path, out_dir: str | Path) -> Tokenizer:
    """Build tokenizer.json (byte-level BPE) from GGUF metadata, save it to `out_dir`, and load it."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    reader = _reader(path)
    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ConfigError(f"{path}: GGUF tokenizer model {kind!r} is not supported; expected 'gpt2' (byte-level BPE)")
    tokens: list[str] = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ")) for m in _field(reader, "tokenizer.ggml.merges", [])]
    alphabet = _bytes_to_unicode()
    spelled = set(alphabet.values())
    vocab = {(t if set(t) <= spelled else "".join(alphabet[b] for b in t.encode("utf-8"))): i
             for i, t in enumerate(tokens)}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    if _field(reader, "tokenizer.ggml.pre") in LLAMA3_PRE:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                              use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    control = [t for t, kind_ in zip(tokens, types) if kind_ == 3 and set(t) <= spelled]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))

    def token(key: str) -> str | None:
        i = _field(reader, f"tokenizer.ggml.{key}")
        return tokens[int(i)] if i is not None else None

    template = template_from_jinja(_field(reader, "tokenizer.chat_template"))
    eos = [t for t in dict.fromkeys([token("eos_token_id"), template.end_of_turn]) if t in vocab]
    result = Tokenizer(_HFBackend(out_dir / "tokenizer.json"), template, eos, token("bos_token_id"),
                       token("padding_token_id"))
    result.save(out_dir)
    return result
