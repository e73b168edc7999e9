"""One Tokenizer over HF `tokenizer.json` (the `tokenizers` library) and sentencepiece `.model` files.

Chat rendering lives in models.chat; `encode_dialog` tokenizes a rendered dialog once and derives the
assistant mask from token offsets, so the ids equal tokenizing the whole text (as transformers does).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from models.chat import ChatTemplate, Message, template_from_jinja

META_FILE = "rljax_tokenizer.json"


class TokenizerError(ValueError):
    """A tokenizer directory or file that cannot be used."""


class _HFBackend:
    def __init__(self, path: Path):
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self.tok = HFTokenizer.from_file(str(path))
        except Exception as err:
            raise TokenizerError(f"{path}: not a readable tokenizer.json ({err})") from None
        self.path = path

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        enc = self.tok.encode(text, add_special_tokens=False)
        return list(enc.ids), list(enc.offsets)

    def decode(self, ids: Sequence[int], skip_special: bool) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)

    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)


class _SentencePieceBackend:
    """sentencepiece model; control pieces (<s>, </s>, ...) written in the text are split out and mapped to their
    ids (sentencepiece itself already keeps user-defined symbols whole)."""

    def __init__(self, path: Path):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.Load(str(path))
        except Exception as err:
            raise TokenizerError(f"{path}: not a readable sentencepiece model ({err})") from None
        self.path = path
        specials = [self.sp.IdToPiece(i) for i in range(self.sp.GetPieceSize()) if self.sp.IsControl(i)]
        specials = sorted((s for s in specials if s), key=len, reverse=True)
        self.special_re = re.compile("|".join(map(re.escape, specials))) if specials else None

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        pos = 0
        pieces = list(self.special_re.finditer(text)) if self.special_re else []
        for match in pieces + [None]:
            end = match.start() if match else len(text)
            if end > pos:
                proto = self.sp.Encode(text[pos:end], return_type="proto")
                for piece in proto.pieces:
                    ids.append(piece.id)
                    offsets.append((pos + piece.begin, pos + piece.end))
            if match:
                ids.append(self.sp.PieceToId(match.group()))
                offsets.append((match.start(), match.end()))
                pos = match.end()
        return ids, offsets

    def decode(self, ids: Sequence[int], skip_special: bool) -> str:
        if skip_special:
            ids = [i for i in ids if not self.sp.IsControl(i)]
        return self.sp.DecodeIds(list(ids))

    def token_to_id(self, token: str) -> int | None:
        i = self.sp.PieceToId(token)
        return None if i == self.sp.unk_id() and token != self.sp.IdToPiece(i) else i

    def vocab_size(self) -> int:
        return self.sp.GetPieceSize()


class Tokenizer:
    """Text <-> ids, chat rendering with assistant masks, and the ids that end a turn."""

    def __init__(self, backend: Any, chat_template: ChatTemplate | None, eos_tokens: Sequence[str],
                 bos_token: str | None = None, pad_token: str | None = None):
        self.backend = backend
        self.chat_template = chat_template
        self.eos_tokens = list(eos_tokens)
        self.bos_token = bos_token
        self.pad_token = pad_token
        for token in self.eos_tokens:
            if backend.token_to_id(token) is None:
                raise TokenizerError(f"end token {token!r} is not in the vocabulary of {backend.path}")

    # ---- construction ---------------------------------------------------------------------------------------
    @classmethod
    def load(cls, directory: str | Path) -> "Tokenizer":
        """Load a tokenizer directory written by `save` (tokenizer.json or tokenizer.model + rljax meta)."""
        directory = Path(directory)
        meta_path = directory / META_FILE
        if not meta_path.exists():
            return cls.from_hf_dir(directory)
        meta = json.loads(meta_path.read_text())
        template = ChatTemplate(**meta["chat_template"]) if meta.get("chat_template") else None
        return cls(_backend_in(directory), template, meta["eos_tokens"], meta.get("bos_token"), meta.get("pad_token"))

    @classmethod
    def from_hf_dir(cls, directory: str | Path) -> "Tokenizer":
        """A Hugging Face tokenizer directory: tokenizer.json or tokenizer.model + tokenizer_config.json."""
        directory = Path(directory)
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        jinja = config.get("chat_template")
        template = template_from_jinja(jinja) if jinja else None
        eos = _token_text(config.get("eos_token"))
        eos_tokens = [t for t in dict.fromkeys([eos, template.end_of_turn if template else None]) if t]
        backend = _backend_in(directory)
        eos_tokens = [t for t in eos_tokens if backend.token_to_id(t) is not None]
        return cls(backend, template, eos_tokens, _token_text(config.get("bos_token")),
                   _token_text(config.get("pad_token")))

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / self.backend.path.name
        if self.backend.path.resolve() != target.resolve():
            shutil.copyfile(self.backend.path, target)
        meta = {"chat_template": self.chat_template.to_dict() if self.chat_template else None,
                "eos_tokens": self.eos_tokens, "bos_token": self.bos_token, "pad_token": self.pad_token}
        (directory / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    # ---- text <-> ids ------------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Ids of `text`; special-token strings in it become their ids; nothing is added."""
        return self.backend.encode(text)[0]

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special)

    def token_to_id(self, token: str) -> int:
        i = self.backend.token_to_id(token)
        if i is None:
            raise TokenizerError(f"token {token!r} is not in the vocabulary")
        return i

    @property
    def vocab_size(self) -> int:
        return self.backend.vocab_size()

    @property
    def eos_ids(self) -> list[int]:
        return [self.token_to_id(t) for t in self.eos_tokens]

    @property
    def pad_id(self) -> int:
        return self.token_to_id(self.pad_token or self.eos_tokens[0])

    # ---- chat ----------------------------------------------------------------------------------------------------
    def _template(self) -> ChatTemplate:
        if self.chat_template is None:
            raise TokenizerError("this tokenizer has no chat template")
        return self.chat_template

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
        return self._template().render(messages, add_generation_prompt)[0]

    def encode_dialog(self, messages: Sequence[Message], add_generation_prompt: bool = False
                      ) -> tuple[list[int], np.ndarray]:
        """Token ids of the rendered dialog and a bool mask of the tokens the assistant wrote.

        A token is the assistant's when it holds any character the assistant wrote (a BPE token can join the
        template's newline to leading spaces of the content: the model has to produce it, so it is trained).
        """
        text, spans = self._template().render(messages, add_generation_prompt)
        ids, offsets = self.backend.encode(text)
        starts = np.asarray([s for s, _ in offsets], dtype=np.int64)
        ends = np.asarray([e for _, e in offsets], dtype=np.int64)
        mask = np.zeros(len(ids), dtype=bool)
        for begin, end in spans:
            mask |= (starts < end) & (ends > begin) & (ends > starts)
        return ids, mask


def _backend_in(directory: Path) -> Any:
    if (directory / "tokenizer.json").exists():
        return _HFBackend(directory / "tokenizer.json")
    if (directory / "tokenizer.model").exists():
        return _SentencePieceBackend(directory / "tokenizer.model")
    raise TokenizerError(f"{directory}: no tokenizer.json or tokenizer.model")


def _token_text(token: Any) -> str | None:
    if isinstance(token, dict):  # {"content": "<|eot_id|>", ...}
        return token.get("content")
    return token
