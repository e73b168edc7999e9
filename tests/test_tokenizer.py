"""Tokenizer and chat templates: ids identical to transformers' apply_chat_template; assistant masks."""
import json

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models as tok_models
from tokenizers import pre_tokenizers, trainers

from models.chat import ChatTemplate, ChatTemplateError, template_from_jinja
from models.tokenizer import Tokenizer

DIALOGS = [
    [{"role": "user", "content": "Write a function that adds two numbers."}],
    [{"role": "system", "content": "You solve programming problems."},
     {"role": "user", "content": "Sum a list."},
     {"role": "assistant", "content": "```python\nprint(sum(map(int, input().split())))\n```"},
     {"role": "user", "content": "Your code failed the following tests:\n- input '1 2' failed\nGive it another try."},
     {"role": "assistant", "content": "  Fixed:\n```python\nimport sys\nprint(sum(map(int, sys.stdin.read().split())))\n```  "}],
    [{"role": "user", "content": "ünïcödé ✓ 数字 123456789"}, {"role": "assistant", "content": "ok\n\n"}],
]

# A jinja template equivalent to Meta's Llama 3 Instruct one, written for this test.
LLAMA3_JINJA = ("{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + "
                "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}"
                "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
                "{% endfor %}{% if add_generation_prompt %}"
                "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def _hf_ids(hf_tok, dialog, gen):
    out = hf_tok.apply_chat_template(dialog, add_generation_prompt=gen, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _check_mask(tok, ids, mask, dialog):
    """The masked tokens are each assistant turn's text plus its end-of-turn token, and nothing else but
    template whitespace that BPE merged into the content's first token."""
    runs, current = [], []
    for i, m in zip(ids, mask):
        if m:
            current.append(i)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    template = tok.chat_template
    wanted = [template._content(m["content"]) + template.end_of_turn for m in dialog if m["role"] == "assistant"]
    decoded = [tok.decode(r) for r in runs]
    assert len(decoded) == len(wanted)
    for got, want in zip(decoded, wanted):
        assert got.endswith(want) and not got[:len(got) - len(want)].strip(), (got, want)


@pytest.mark.parametrize("gen", [False, True])
def test_smollm2_chatml_ids_match_transformers(smollm2_ckpt, smollm2_hf, gen):
    from models.checkpoint import load_tokenizer

    tok = load_tokenizer(smollm2_ckpt)
    _, hf_tok = smollm2_hf
    assert tok.chat_template == ChatTemplate(
        "chatml", default_system="You are a helpful AI assistant named SmolLM, trained by Hugging Face")
    for dialog in DIALOGS:
        ids, mask = tok.encode_dialog(dialog, add_generation_prompt=gen)
        assert ids == _hf_ids(hf_tok, dialog, gen)
        _check_mask(tok, ids, mask, dialog)
    assert tok.eos_ids == [2]
    text = "def f(x):\n    return x ** 2  # ünï ✓"
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode(text) == hf_tok.encode(text, add_special_tokens=False)


@pytest.fixture()
def llama3_tokenizer_dir(tmp_path):
    corpus = [m["content"] for d in DIALOGS for m in d] * 20 + ["system user assistant"] * 20
    tok = HFTokenizer(tok_models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    from tokenizers import decoders

    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=LLAMA3_SPECIALS,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": LLAMA3_JINJA}))
    return tmp_path


@pytest.mark.parametrize("gen", [False, True])
def test_llama3_template_ids_match_transformers(llama3_tokenizer_dir, gen):
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_hf_dir(llama3_tokenizer_dir)
    assert tok.chat_template.family == "llama3"
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(llama3_tokenizer_dir / "tokenizer.json"),
                                     bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    hf_tok.chat_template = LLAMA3_JINJA
    for dialog in DIALOGS:
        ids, mask = tok.encode_dialog(dialog, add_generation_prompt=gen)
        assert ids == _hf_ids(hf_tok, dialog, gen)
        _check_mask(tok, ids, mask, dialog)
    assert tok.eos_ids == [tok.token_to_id("<|eot_id|>")]


def test_llama3_1_template_has_date_header():
    text, spans = ChatTemplate("llama3_1").render(DIALOGS[1])
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
                           "December 2023\nToday Date: 26 Jul 2024\n\nYou solve programming problems.<|eot_id|>")
    assert [text[a:b] for a, b in spans] == [DIALOGS[1][2]["content"].strip() + "<|eot_id|>",
                                            DIALOGS[1][4]["content"].strip() + "<|eot_id|>"]


def test_sentencepiece_model_with_special_pieces(tmp_path):
    import sentencepiece as spm

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(m["content"] for d in DIALOGS for m in d) * 30)
    spm.SentencePieceTrainer.Train(input=str(corpus), model_prefix=str(tmp_path / "tokenizer"), vocab_size=80,
                                   user_defined_symbols=["<|im_start|>", "<|im_end|>"], character_coverage=1.0)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "chat_template": "<|im_start|>{{ role }}"}))
    tok = Tokenizer.from_hf_dir(tmp_path)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "tokenizer.model"))
    plain = "Sum a list of numbers"
    assert tok.encode(plain) == sp.EncodeAsIds(plain)
    assert tok.decode(tok.encode(plain)) == plain
    ids, mask = tok.encode_dialog(DIALOGS[1][:3])
    assert ids.count(tok.token_to_id("<|im_start|>")) == 3
    assert tok.decode(np.asarray(ids)[mask]).replace(" ", "") == (DIALOGS[1][2]["content"] + "<|im_end|>").replace(
        " ", "").replace("\n", "")  # sentencepiece normalises whitespace


def test_bad_dialogs_and_templates_raise_clear_errors():
    with pytest.raises(ChatTemplateError, match="dialog is empty"):
        ChatTemplate("chatml").render([])
    with pytest.raises(ChatTemplateError, match="role 'robot'"):
        ChatTemplate("chatml").render([{"role": "robot", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="unrecognised chat template"):
        template_from_jinja("{{ messages }}")


@pytest.mark.parametrize("family", ["chatml", "llama3", "llama3_1"])
def test_next_turn_continues_a_rendered_dialog_exactly(family):
    template = ChatTemplate(family, default_system="You are helpful." if family == "chatml" else None)
    dialog = [{"role": "user", "content": "Solve it."}]
    answer, feedback = "```python\nprint(1)\n```", "It failed.\nGive it another try."
    grown = (template.render(dialog, True)[0] + answer + template.end_of_turn
             + template.next_turn({"role": "user", "content": feedback}))
    full = template.render(dialog + [{"role": "assistant", "content": answer},
                                     {"role": "user", "content": feedback}], True)[0]
    assert grown == full
