"""The functions of the `tallykit` fixture library (original code written for rljax) and one bug in each.

Every `Bug` holds a function's correct source, the line fragment a bug replaces and what replaces it, and a call
that shows the difference. `rljax.data.bugfix_repo` writes the library with the bugs in, then fixes them one
commit at a time; each fix becomes a SWE-RL instance.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Bug:
    module: str
    source: str  # the function's correct source
    correct: str  # the fragment of `source` the bug replaces (occurs exactly once)
    buggy: str  # what replaces it
    example: str  # a call whose result differs between the two

    @property
    def function(self) -> str:
        return self.source.split("def ", 1)[1].split("(", 1)[0]

    @property
    def buggy_source(self) -> str:
        return self.source.replace(self.correct, self.buggy)

    @property
    def doc(self) -> str:
        return self.source.split('"""')[1]


PACKAGE = "tallykit"
MODULE_DOCS = {
    "arith": '"""Small arithmetic helpers."""\n',
    "text": '"""String helpers."""\n',
    "seqs": '"""Helpers for lists and other sequences."""\n',
    "maps": '"""Helpers for dictionaries."""\n',
    "stats": '"""Descriptive statistics over lists of numbers."""\nfrom tallykit.arith import mean\n',
    "grid": '"""Two-dimensional grids stored as lists of rows."""\nfrom tallykit.seqs import flatten\n',
}


def _b(module: str, source: str, correct: str, buggy: str, example: str) -> Bug:
    return Bug(module, source.strip("\n") + "\n", correct, buggy, example)


BUGS: tuple[Bug, ...] = (
    # ---- arith -------------------------------------------------------------------------------------------------
    _b("arith", '''
def clamp(value, low, high):
    """value limited to the range [low, high]."""
    if value < low:
        return low
    if value > high:
        return high
    return value
''', "        return high\n", "        return value\n", "clamp(15, 0, 10)"),
    _b("arith", '''
def mean(values):
    """The arithmetic mean of a non-empty list."""
    return sum(values) / len(values)
''', "sum(values) / len(values)", "sum(values) // len(values)", "mean([1, 2])"),
    _b("arith", '''
def factorial(n):
    """n! for n >= 0."""
    result = 1
    for k in range(2, n + 1):
        result *= k
    return result
''', "range(2, n + 1)", "range(2, n)", "factorial(5)"),
    _b("arith", '''
def digit_sum(n):
    """The sum of the decimal digits of n (the sign is ignored)."""
    n = abs(n)
    total = 0
    while n > 0:
        total += n % 10
        n //= 10
    return total
''', "n //= 10", "n //= 100", "digit_sum(123)"),
    _b("arith", '''
def is_prime(n):
    """True when n is a prime number."""
    if n < 2:
        return False
    k = 2
    while k * k <= n:
        if n % k == 0:
            return False
        k += 1
    return True
''', "k * k <= n", "k * k < n", "is_prime(9)"),
    _b("arith", '''
def round_to(value, step):
    """value rounded to the nearest multiple of step."""
    return step * round(value / step)
''', "round(value / step)", "int(value / step)", "round_to(19, 5)"),
    _b("arith", '''
def percent(part, whole):
    """part as a percentage of whole."""
    return 100 * part / whole
''', "100 * part / whole", "part / whole", "percent(1, 4)"),
    _b("arith", '''
def sign(x):
    """1 for positive x, -1 for negative x, 0 for zero."""
    if x > 0:
        return 1
    if x < 0:
        return -1
    return 0
''', "if x < 0:", "if x <= 0:", "sign(0)"),
    # ---- text --------------------------------------------------------------------------------------------------
    _b("text", '''
def capitalize_words(s):
    """s with the first letter of every space-separated word in upper case."""
    return " ".join(w[:1].upper() + w[1:] for w in s.split(" "))
''', "w[1:]", "w[2:]", 'capitalize_words("hello world")'),
    _b("text", '''
def count_vowels(s):
    """The number of vowels (a, e, i, o, u) in s, in either case."""
    return sum(1 for ch in s.lower() if ch in "aeiou")
''', "s.lower()", "s", 'count_vowels("AbE")'),
    _b("text", '''
def reverse_words(s):
    """The words of s in reverse order, separated by single spaces."""
    return " ".join(reversed(s.split()))
''', "reversed(s.split())", "sorted(s.split())", 'reverse_words("one two three")'),
    _b("text", '''
def is_palindrome(s):
    """True when s reads the same backwards, ignoring case and spaces."""
    cleaned = s.replace(" ", "").lower()
    return cleaned == cleaned[::-1]
''', '.replace(" ", "").lower()', '.replace(" ", "")', 'is_palindrome("Never odd or even")'),
    _b("text", '''
def truncate(s, width):
    """s cut to at most width characters, ending in '...' when it was cut."""
    if len(s) <= width:
        return s
    return s[:width - 3] + "..."
''', "s[:width - 3]", "s[:width]", 'truncate("abcdefghij", 6)'),
    _b("text", '''
def initials(name):
    """The upper-case first letters of the words of name."""
    return "".join(part[0].upper() for part in name.split())
''', "part[0].upper()", "part[0]", 'initials("ada lovelace")'),
    _b("text", '''
def count_words(s):
    """The number of whitespace-separated words in s."""
    return len(s.split())
''', "s.split()", 's.split(" ")', 'count_words("a  b")'),
    _b("text", '''
def pad_left(s, width, fill=" "):
    """s right-aligned in width characters, padded on the left with fill."""
    missing = width - len(s)
    return fill * max(missing, 0) + s
''', "fill * max(missing, 0) + s", "s + fill * max(missing, 0)", 'pad_left("7", 3, "0")'),
    # ---- seqs --------------------------------------------------------------------------------------------------
    _b("seqs", '''
def chunks(items, size):
    """items cut into consecutive lists of size items (the last may be shorter)."""
    return [items[i:i + size] for i in range(0, len(items), size)]
''', "range(0, len(items), size)", "range(0, len(items) - 1, size)", "chunks([1, 2, 3], 1)"),
    _b("seqs", '''
def flatten(nested):
    """One list of the items of a list of lists, in order."""
    out = []
    for inner in nested:
        out.extend(inner)
    return out
''', "out.extend(inner)", "out.append(inner)", "flatten([[1, 2], [3]])"),
    _b("seqs", '''
def dedupe(items):
    """items without repeats, keeping the first occurrence of each."""
    seen = set()
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out
''', "            seen.add(item)\n", "", "dedupe([1, 1, 2])"),
    _b("seqs", '''
def rotate(items, k):
    """items rotated left by k places."""
    if not items:
        return []
    k %= len(items)
    return items[k:] + items[:k]
''', "items[k:] + items[:k]", "items[:k] + items[k:]", "rotate([1, 2, 3, 4], 1)"),
    _b("seqs", '''
def running_total(values):
    """The cumulative sums of values."""
    out, total = [], 0
    for v in values:
        total += v
        out.append(total)
    return out
''', "total += v", "total = v", "running_total([1, 2, 3])"),
    _b("seqs", '''
def max_index(values):
    """The index of the largest value (the first one on ties)."""
    best = 0
    for i in range(1, len(values)):
        if values[i] > values[best]:
            best = i
    return best
''', "values[i] > values[best]", "values[i] >= values[best]", "max_index([3, 1, 3])"),
    _b("seqs", '''
def pairwise_diff(values):
    """The differences between consecutive values: values[i + 1] - values[i]."""
    return [b - a for a, b in zip(values, values[1:])]
''', "[b - a for", "[a - b for", "pairwise_diff([1, 4, 9])"),
    _b("seqs", '''
def last_n(items, n):
    """The last n items (an empty list for n <= 0)."""
    return items[-n:] if n > 0 else []
''', "items[-n:]", "items[n:]", "last_n([1, 2, 3, 4, 5], 2)"),
    # ---- maps --------------------------------------------------------------------------------------------------
    _b("maps", '''
def invert(mapping):
    """A dict from each value of mapping to its key."""
    return {v: k for k, v in mapping.items()}
''', "{v: k for", "{k: v for", 'invert({"a": 1})'),
    _b("maps", '''
def merge(a, b):
    """The keys of a and b; where both have a key, b's value wins."""
    out = dict(a)
    out.update(b)
    return out
''', "out.update(b)", "out.update({k: v for k, v in b.items() if k not in out})", 'merge({"x": 1}, {"x": 2})'),
    _b("maps", '''
def count_by(items, key):
    """How many items share each value of key(item)."""
    counts = {}
    for item in items:
        k = key(item)
        counts[k] = counts.get(k, 0) + 1
    return counts
''', "counts.get(k, 0) + 1", "counts.get(k, 1) + 1", 'count_by(["a", "bb", "c"], len)'),
    _b("maps", '''
def get_path(mapping, path, default=None):
    """The value at a dotted path ("a.b.c") in nested dicts, or default when it is missing."""
    current = mapping
    for part in path.split("."):
        if not isinstance(current, dict) or part not in current:
            return default
        current = current[part]
    return current
''', "            return default\n", "            return None\n", 'get_path({"a": {}}, "a.b", 0)'),
    _b("maps", '''
def filter_keys(mapping, keys):
    """The entries of mapping whose key is in keys."""
    return {k: v for k, v in mapping.items() if k in keys}
''', "if k in keys", "if k not in keys", 'filter_keys({"a": 1, "b": 2}, ["a"])'),
    _b("maps", '''
def group_by(items, key):
    """A dict from each value of key(item) to the list of items that have it, in order."""
    groups = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return groups
''', "groups.setdefault(key(item), []).append(item)", "groups[key(item)] = [item]",
       "group_by([1, 2, 3], lambda n: n % 2)"),
    _b("maps", '''
def sort_by_value(mapping):
    """The keys of mapping, largest value first."""
    return sorted(mapping, key=mapping.get, reverse=True)
''', "reverse=True", "reverse=False", 'sort_by_value({"a": 1, "b": 3})'),
    _b("maps", '''
def with_defaults(mapping, fallback):
    """mapping completed with the entries of fallback it lacks."""
    out = dict(fallback)
    out.update(mapping)
    return out
''', "out = dict(fallback)", "out = dict()", 'with_defaults({"a": 1}, {"b": 2})'),
    # ---- stats -------------------------------------------------------------------------------------------------
    _b("stats", '''
def variance(values):
    """The population variance of values."""
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)
''', "(v - m) ** 2", "(v - m) * 2", "variance([1, 2, 3, 4])"),
    _b("stats", '''
def median(values):
    """The middle value of values (the mean of the two middle ones for an even count)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2
''', "ordered = sorted(values)", "ordered = list(values)", "median([3, 1, 2])"),
    _b("stats", '''
def mode(values):
    """The most common value (the smallest one on ties)."""
    counts = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return min(counts, key=lambda v: (-counts[v], v))
''', "(-counts[v], v)", "(counts[v], v)", "mode([1, 2, 2])"),
    _b("stats", '''
def value_range(values):
    """The largest value minus the smallest."""
    return max(values) - min(values)
''', "max(values) - min(values)", "max(values) - values[0]", "value_range([5, 1, 9])"),
    _b("stats", '''
def normalize(values):
    """values scaled so that they sum to 1."""
    total = sum(values)
    return [v / total for v in values]
''', "total = sum(values)", "total = max(values)", "normalize([1, 3])"),
    _b("stats", '''
def moving_average(values, window):
    """The means of every run of window consecutive values."""
    return [mean(values[i:i + window]) for i in range(len(values) - window + 1)]
''', "range(len(values) - window + 1)", "range(len(values) - window)", "moving_average([1, 2, 3], 2)"),
    _b("stats", '''
def count_above(values, threshold):
    """How many values are strictly greater than threshold."""
    return sum(1 for v in values if v > threshold)
''', "if v > threshold", "if v >= threshold", "count_above([1, 2, 3], 2)"),
    _b("stats", '''
def percentile_rank(values, x):
    """The share of values strictly below x."""
    return sum(1 for v in values if v < x) / len(values)
''', "/ len(values)", "/ (len(values) + 1)", "percentile_rank([1, 2, 3, 4], 3)"),
    # ---- grid --------------------------------------------------------------------------------------------------
    _b("grid", '''
def make_grid(rows, cols, fill=0):
    """A grid of rows x cols cells, each set to fill."""
    return [[fill] * cols for _ in range(rows)]
''', "[[fill] * cols for _ in range(rows)]", "[[fill] * rows for _ in range(cols)]", "make_grid(2, 3)"),
    _b("grid", '''
def transpose(grid):
    """The grid with rows and columns swapped."""
    return [list(row) for row in zip(*grid)]
''', "zip(*grid)", "grid", "transpose([[1, 2], [3, 4]])"),
    _b("grid", '''
def neighbors(grid, r, c):
    """The in-bounds orthogonal neighbours of cell (r, c) as (row, col) pairs."""
    out = []
    for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        nr, nc = r + dr, c + dc
        if 0 <= nr < len(grid) and 0 <= nc < len(grid[0]):
            out.append((nr, nc))
    return out
''', "0 <= nr < len(grid)", "0 <= nr <= len(grid)", "neighbors([[0, 0], [0, 0]], 1, 1)"),
    _b("grid", '''
def row_sums(grid):
    """The sum of each row."""
    return [sum(row) for row in grid]
''', "sum(row) for", "sum(row[1:]) for", "row_sums([[1, 2], [3, 4]])"),
    _b("grid", '''
def col_sums(grid):
    """The sum of each column."""
    return [sum(row[c] for row in grid) for c in range(len(grid[0]))]
''', "range(len(grid[0]))", "range(len(grid))", "col_sums([[1, 2, 3], [4, 5, 6]])"),
    _b("grid", '''
def diagonal(grid):
    """The cells grid[i][i] of the main diagonal."""
    return [grid[i][i] for i in range(min(len(grid), len(grid[0])))]
''', "[grid[i][i] for", "[grid[i][-i] for", "diagonal([[1, 2, 3], [4, 5, 6], [7, 8, 9]])"),
    _b("grid", '''
def count_value(grid, value):
    """How many cells of the grid equal value."""
    return sum(row.count(value) for row in flatten([grid]))
''', "sum(row.count(value) for row in flatten([grid]))", "sum(1 for row in flatten([grid]) if value in row)",
       "count_value([[1, 1], [1, 0]], 1)"),
    _b("grid", '''
def render(grid):
    """The grid as text: one line per row, cells separated by single spaces."""
    return "\\n".join(" ".join(str(x) for x in row) for row in grid)
''', '" ".join(str(x)', '"".join(str(x)', "render([[1, 2], [3, 4]])"),
)

TRAIN_MODULES = ("arith", "text", "seqs", "maps")  # fixed before the split date
TEST_MODULES = ("stats", "grid")  # fixed after it: the held-out issues
