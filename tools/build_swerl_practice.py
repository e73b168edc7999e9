"""Write rljax/data/bundled/swerl_practice.jsonl: SWE-RL instances mined from the bug-fix repository that
rljax.data.bugfix_repo builds, within a prompt budget measured with SmolLM2's tokenizer and chat template, split
by date into train and test; every instance's oracle change is checked to be expressible as search/replace
edits that score 1.0. Run: python tools/build_swerl_practice.py"""
from __future__ import annotations

import json
import sys

from rljax.data.bugfix_repo import CONTEXT_FILES, PROMPT_BUDGET, SHIPPED, bugfix_instances
from rljax.dialog import ChatCodec
from rljax.envs.swerl import oracle_answer, prompt_token_counter
from rljax.run_config import load_named_tokenizer


def main() -> int:
    count = prompt_token_counter(ChatCodec(load_named_tokenizer("smollm2")))
    rows, report, split_date = bugfix_instances(count, PROMPT_BUDGET, CONTEXT_FILES)
    for row in rows:
        oracle_answer(row)  # raises for an instance no answer can solve
    SHIPPED.write_text("".join(json.dumps(row) + "\n" for row in rows))
    lengths = sorted(count(row) for row in rows)
    train = sum(row["split"] == "train" for row in rows)
    print(f"{report.summary()}\nwrote {SHIPPED}: {train} train and {len(rows) - train} test instances (split "
          f"{split_date}); prompt tokens min {lengths[0]}, median {lengths[len(lengths) // 2]}, max {lengths[-1]} "
          f"(budget {PROMPT_BUDGET}); every oracle answer scores 1.0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
