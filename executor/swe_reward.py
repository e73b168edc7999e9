"""The SWE-RL reward (Wei et al. 2025), reproducing the paper's reference implementation exactly.

A response must hold exactly one each of <think>, </think>, <solution>, </solution>, with a non-empty thought
(after str.strip()). The solution's search/replace blocks are applied to the given files; each edited file's
predicted patch is the unified diff (3 lines of context, headers dropped) of its old and new content, split with
str.splitlines(). The reward is the mean over the union of files changed by either patch of
difflib.SequenceMatcher(None, pred, oracle, autojunk=False).ratio(), 0 for a file only one side changes, 1.0
when neither side changes anything; -1 for any malformed response. Per-file scores are summed in sorted path
order so the result is deterministic (the reference sums in set order).
"""
from __future__ import annotations

import difflib
import re
from typing import Any, Callable

TAGS = ("<think>", "</think>", "<solution>", "</solution>")
EDIT_BLOCK = re.compile(r"```.*?\n### (.*)\n<<<<<<< SEARCH\n([\s\S]*?)\n=======\n([\s\S]*?)\n>>>>>>> REPLACE\n```")
VARIANTS = ("similarity", "exact_match")


class FormatError(ValueError):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind  # tag_count | empty_thought | no_edit_blocks | search_equals_replace | search_not_found


def split_thought_solution(output: str) -> tuple[str, str]:
    for tag in TAGS:
        if output.count(tag) != 1:
            raise FormatError("tag_count", f"{tag} appears {output.count(tag)} times, expected once")
    thought = output.split("<think>")[1].split("</think>")[0].strip()
    answer = output.split("<solution>")[1].split("</solution>")[0].strip()
    if not thought:
        raise FormatError("empty_thought", "the <think> section is empty")
    return thought, answer


def parse_edits(answer: str) -> dict[str, list[tuple[str, str]]]:
    """path -> [(search, replace), ...] in the order written."""
    edits: dict[str, list[tuple[str, str]]] = {}
    for path, search, replace in EDIT_BLOCK.findall(answer):
        edits.setdefault(path, []).append((search, replace))
    return edits


def apply_edits(code_context: dict[str, str], edits: dict[str, list[tuple[str, str]]]) -> dict[str, str]:
    """New content of every edited file. Each search text must occur (matched after a newline, so a block
    starts at a line start); every occurrence is replaced; a file not in the context starts empty."""
    new_content: dict[str, str] = {}
    for path, blocks in edits.items():
        content = "\n" + code_context.get(path, "")
        for search, replace in blocks:
            if search == replace:
                raise FormatError("search_equals_replace", f"{path}: a SEARCH block equals its REPLACE block")
            if "\n" + search not in content:
                raise FormatError("search_not_found", f"{path}: SEARCH text not found: {search[:80]!r}")
            content = content.replace("\n" + search, "\n" + replace)
        new_content[path] = content[1:]
    return new_content


def unified_diff(old: str, new: str, context: int = 3) -> str:
    """Unified diff of two file contents without the ---/+++ header lines ('' when equal line by line)."""
    lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), fromfile="old", tofile="new",
                                      lineterm="", n=context))
    return "\n".join(lines[2:]) if len(lines) >= 2 else ""


def file_patches(code_context: dict[str, str], new_content: dict[str, str]) -> dict[str, str]:
    patches = {path: unified_diff(code_context.get(path, ""), new) for path, new in new_content.items()}
    return {path: patch for path, patch in patches.items() if patch}


def _similarity(pred: str, oracle: str) -> float:
    if not pred or not oracle:
        return 0.0
    return difflib.SequenceMatcher(None, pred, oracle, autojunk=False).ratio()


def compute_reward(code_context: dict[str, str], oracle_new_content: dict[str, str], output: str,
                   variant: str = "similarity") -> tuple[float, dict[str, Any]]:
    """(reward, metadata): per-file diffs and similarities, or {'error', 'error_kind'} when malformed.

    variant "similarity" is the paper's reward; "exact_match" is its ablation: 1.0 when the predicted patch
    equals the oracle patch on every file, else 0.0 (-1 when malformed).
    """
    if variant not in VARIANTS:
        raise ValueError(f"SWE-RL reward variant {variant!r}: expected one of {VARIANTS}")
    try:
        thought, answer = split_thought_solution(output)
        edits = parse_edits(answer)
        if not edits:
            raise FormatError("no_edit_blocks", "no search/replace edit blocks found in <solution>")
        pred_patch = file_patches(code_context, apply_edits(code_context, edits))
    except FormatError as err:
        return -1.0, {"error": str(err), "error_kind": err.kind}
    oracle_patch = file_patches(code_context, oracle_new_content)
    score: Callable[[str, str], float] = _similarity if variant == "similarity" else (
        lambda p, o: float(p == o))
    similarities = [{"path": path, "pred_change": pred_patch.get(path, ""),
                     "oracle_change": oracle_patch.get(path, ""),
                     "similarity": score(pred_patch.get(path, ""), oracle_patch.get(path, ""))}
                    for path in sorted(set(pred_patch) | set(oracle_patch))]
    if not similarities:
        reward = 1.0
    elif variant == "exact_match":
        reward = float(all(s["similarity"] == 1.0 for s in similarities))
    else:
        reward = sum(s["similarity"] for s in similarities) / len(similarities)
    return reward, {"similarities": similarities, "thought": thought, "answer": answer}
