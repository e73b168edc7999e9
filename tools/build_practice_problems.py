"""Write rljax/data/bundled/practice.jsonl: the practice problems (rljax.data.practice), after running every
reference solution on its tests through the sandboxed executor. Run: python tools/build_practice_problems.py"""
from __future__ import annotations

import json
import sys
from collections import Counter

from rljax.data.practice import PRACTICE_PROBLEMS, SEED, generate, verify


def main() -> int:
    rows = generate(SEED)
    failing = verify(rows)
    if failing:
        print(f"reference solutions failing their tests: {failing}", file=sys.stderr)
        return 1
    PRACTICE_PROBLEMS.write_text("".join(json.dumps(row) + "\n" for row in rows))
    splits = Counter(row["split"] for row in rows)
    families = {s: len({r["family"] for r in rows if r["split"] == s}) for s in splits}
    print(f"wrote {PRACTICE_PROBLEMS}: " + ", ".join(f"{splits[s]} {s} problems in {families[s]} families"
                                                    for s in sorted(splits)) + "; every reference solution passes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
