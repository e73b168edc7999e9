"""SWE-RL reward: every reference vector (computed by the paper's reference implementation) must match."""
import json
from pathlib import Path

import pytest

from executor.swe_reward import compute_reward

VECTORS = json.loads((Path(__file__).parent / "data" / "swerl_reward_vectors.json").read_text())["cases"]


@pytest.mark.parametrize("case", VECTORS, ids=[c["id"] for c in VECTORS])
def test_reference_vector(case):
    reward, meta = compute_reward(case["code_context"], case["oracle_new_content"], case["output"])
    expected = case.get("reward_sum_in_sorted_path_order", case["reward"])
    assert abs(reward - expected) <= 1e-9
    if "reward_possible_values" in case:
        assert any(abs(reward - v) <= 1e-9 for v in case["reward_possible_values"])
    ref = case["metadata_or_error"]
    if "error_kind" in ref:
        assert reward == -1.0 and meta["error_kind"] == ref["error_kind"]
    else:
        ours = {s["path"]: s for s in meta["similarities"]}
        assert set(ours) == {s["path"] for s in ref["similarities"]}
        for s in ref["similarities"]:
            assert ours[s["path"]]["pred_change"] == s["pred_change"]
            assert ours[s["path"]]["oracle_change"] == s["oracle_change"]
            assert abs(ours[s["path"]]["similarity"] - s["similarity"]) <= 1e-12
        assert meta["thought"] == ref["thought"]


def test_exact_match_variant():
    perfect = next(c for c in VECTORS if c["id"] == "perfect_single")
    partial = next(c for c in VECTORS if c["id"] == "long_file_partial")
    malformed = next(c for c in VECTORS if c["id"] == "missing_think")
    for case, want in ((perfect, 1.0), (partial, 0.0), (malformed, -1.0)):
        reward, _ = compute_reward(case["code_context"], case["oracle_new_content"], case["output"], "exact_match")
        assert reward == want
    with pytest.raises(ValueError, match="variant"):
        compute_reward({}, {}, "", variant="bleu")
