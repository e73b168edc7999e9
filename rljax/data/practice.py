"""Practice problems: easy original stdin/stdout tasks in families, for teaching a small model the protocol.

A family is one kind of task (add a constant, count a letter, ...) with varied parameters and wording; each
problem of a family is one draw of those. Training and held-out problems come from disjoint families, so a
held-out gain measures what transfers (reading standard input, printing only the answer), not memorised tasks.

Every problem has a reference solution (trusted Python written here) and the oracle that computes the expected
outputs; `tools/build_practice_problems.py` also runs every reference solution through the sandboxed executor on
its tests before it writes the shipped file, and tests/test_practice.py checks it again.
"""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any, Callable

PRACTICE_PROBLEMS = Path(__file__).with_name("bundled") / "practice.jsonl"
SPLITS = ("train", "heldout")
SEED = 2026
TRAIN_COUNT, HELDOUT_COUNT = 320, 48
PUBLIC_TESTS, PRIVATE_TESTS = 2, 4

WORDS = ("apple", "banana", "cherry", "river", "stone", "python", "garden", "window", "orange", "planet", "silver",
         "rocket", "candle", "forest", "letter", "summer", "winter", "yellow", "bottle", "pencil", "level", "noon",
         "radar", "kayak", "tree", "cat", "dog", "sun", "moon", "code", "data", "queue", "eye", "book", "lamp")
# openings that vary the wording of every family's statements
INTROS = ("", "Here is a small task. ", "Write a program for this. ", "Practice problem. ", "A short exercise. ",
          "Your friend needs a little program. ", "Solve the following. ")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One problem of a family: its statement, reference solution, oracle and test-input generator."""

    description: str
    solution: str
    oracle: Callable[[str], str]
    make_input: Callable[[random.Random], str]


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    split: str
    build: Callable[[random.Random], Variant]


def _ints(rng: random.Random, n: int, lo: int = -50, hi: int = 50) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _word(rng: random.Random) -> str:
    return rng.choice(WORDS)


def _line(values: list[Any]) -> str:
    return " ".join(map(str, values))


def _list_input(rng: random.Random, with_count: bool, lo: int = -50, hi: int = 50) -> str:
    values = _ints(rng, rng.randint(1, 7), lo, hi)
    return (f"{len(values)}\n" if with_count else "") + _line(values) + "\n"


def _list_of(text: str) -> list[int]:
    """The integers of a list input: the last non-empty line (after an optional count line)."""
    return [int(x) for x in text.strip().splitlines()[-1].split()]


LIST_FORMATS = {
    True: ("The first line has an integer n. The second line has n integers separated by spaces.",
           "input()\nxs = list(map(int, input().split()))\n"),
    False: ("The input is one line of integers separated by spaces.", "xs = list(map(int, input().split()))\n"),
}

# ---------------------------------------------------------------- training families


def _add_const(rng: random.Random) -> Variant:
    k = rng.randint(1, 99)
    words = rng.choice(["Read an integer n. Print n + {k}.", "Read an integer from standard input and print it "
                        "increased by {k}.", "You are given an integer x. Output x plus {k}."])
    return Variant(words.format(k=k), f"print(int(input()) + {k})\n", lambda s: f"{int(s) + k}\n",
                   lambda r: f"{r.randint(-1000, 1000)}\n")


def _mul_const(rng: random.Random) -> Variant:
    k = rng.randint(2, 12)
    words = rng.choice(["Read an integer n. Print n multiplied by {k}.", "You are given an integer x. Output "
                        "{k} times x.", "Read one integer and print the product of that integer and {k}."])
    return Variant(words.format(k=k), f"print(int(input()) * {k})\n", lambda s: f"{int(s) * k}\n",
                   lambda r: f"{r.randint(-500, 500)}\n")


BINARY_OPS = {"sum": ("their sum", "a + b", lambda a, b: a + b),
              "difference": ("a minus b", "a - b", lambda a, b: a - b),
              "product": ("their product", "a * b", lambda a, b: a * b),
              "maximum": ("the larger of the two", "max(a, b)", max),
              "minimum": ("the smaller of the two", "min(a, b)", min)}


def _two_ints(same_line: bool) -> Callable[[random.Random], Variant]:
    def build(rng: random.Random) -> Variant:
        what, expr, fn = BINARY_OPS[rng.choice(sorted(BINARY_OPS))]
        if same_line:
            desc = rng.choice(["Read two integers a and b on one line, separated by a space. Print {w}.",
                               "The input is one line with two integers a and b. Output {w}."]).format(w=what)
            read, split = "a, b = map(int, input().split())\n", lambda s: s.split()
            gen = lambda r: f"{r.randint(-100, 100)} {r.randint(-100, 100)}\n"
        else:
            desc = rng.choice(["Read an integer a on the first line and an integer b on the second line. Print "
                               "{w}.", "The input has two lines: an integer a, then an integer b. Output {w}."]
                              ).format(w=what)
            read, split = "a = int(input())\nb = int(input())\n", lambda s: s.split("\n")[:2]
            gen = lambda r: f"{r.randint(-100, 100)}\n{r.randint(-100, 100)}\n"
        return Variant(desc, f"{read}print({expr})\n", lambda s: f"{fn(*map(int, split(s)))}\n", gen)
    return build


LIST_AGGREGATES = {"sum": ("their sum", "sum(xs)", sum), "largest": ("the largest of them", "max(xs)", max),
                   "smallest": ("the smallest of them", "min(xs)", min),
                   "first": ("the first of them", "xs[0]", lambda xs: xs[0]),
                   "last": ("the last of them", "xs[-1]", lambda xs: xs[-1])}


def _list_aggregate(rng: random.Random) -> Variant:
    what, expr, fn = LIST_AGGREGATES[rng.choice(sorted(LIST_AGGREGATES))]
    with_count = rng.random() < 0.5
    fmt, read = LIST_FORMATS[with_count]
    return Variant(f"{fmt} Print {what}.", f"{read}print({expr})\n", lambda s: f"{fn(_list_of(s))}\n",
                   lambda r: _list_input(r, with_count))


def _list_mean_floor(rng: random.Random) -> Variant:
    with_count = rng.random() < 0.5
    fmt, read = LIST_FORMATS[with_count]
    return Variant(f"{fmt} Print their average rounded down to an integer (floor division of the sum by the "
                   "count).", f"{read}print(sum(xs) // len(xs))\n",
                   lambda s: f"{sum(_list_of(s)) // len(_list_of(s))}\n", lambda r: _list_input(r, with_count, 0, 99))


def _count_letter(rng: random.Random) -> Variant:
    c = rng.choice("aeinorst")
    return Variant(rng.choice([f"Read a lowercase word. Print how many times the letter '{c}' appears in it.",
                               f"Count the occurrences of the character {c} in a line of lowercase text read from "
                               "standard input, and print the count."]),
                   f"print(input().count('{c}'))\n", lambda s: f"{s.rstrip(chr(10)).count(c)}\n",
                   lambda r: " ".join(_word(r) for _ in range(r.randint(1, 3))) + "\n")


STRING_MAPS = {"uppercase": ("in uppercase", ".upper()", str.upper),
               "lowercase": ("in lowercase", ".lower()", str.lower),
               "reversed": ("reversed", "[::-1]", lambda s: s[::-1]),
               "swapped case": ("with the case of every letter swapped", ".swapcase()", str.swapcase)}


def _string_map(rng: random.Random) -> Variant:
    what, suffix, fn = STRING_MAPS[rng.choice(sorted(STRING_MAPS))]
    return Variant(rng.choice([f"Read a line of text. Print it {what}.", f"Read one line from standard input and "
                               f"output the same line {what}."]),
                   f"print(input(){suffix})\n", lambda s: fn(s.rstrip("\n")) + "\n",
                   lambda r: " ".join(r.choice([_word(r), _word(r).upper(), _word(r).title()])
                                      for _ in range(r.randint(1, 3))) + "\n")


def _parity(rng: random.Random) -> Variant:
    even, odd = rng.choice([("EVEN", "ODD"), ("even", "odd"), ("YES", "NO"), ("Even", "Odd")])
    return Variant(f"Read an integer n. Print {even} if n is even, otherwise print {odd}.",
                   f"print('{even}' if int(input()) % 2 == 0 else '{odd}')\n",
                   lambda s: (even if int(s) % 2 == 0 else odd) + "\n", lambda r: f"{r.randint(-99, 99)}\n")


def _sign(rng: random.Random) -> Variant:
    pos, neg, zero = rng.choice([("positive", "negative", "zero"), ("POSITIVE", "NEGATIVE", "ZERO"),
                                 ("+", "-", "0")])
    return Variant(f"Read an integer n. Print {pos} if n > 0, {neg} if n < 0, and {zero} if n is 0.",
                   f"n = int(input())\nprint('{pos}' if n > 0 else '{neg}' if n < 0 else '{zero}')\n",
                   lambda s: (pos if int(s) > 0 else neg if int(s) < 0 else zero) + "\n",
                   lambda r: f"{r.choice([0, r.randint(-50, 50)])}\n")


def _repeat_word(rng: random.Random) -> Variant:
    k = rng.randint(2, 5)
    sep, sep_words = rng.choice([(" ", "separated by single spaces"), ("-", "joined by dashes (-)"),
                                 ("", "with nothing between the copies")])
    return Variant(f"Read a word. Print it {k} times on one line, {sep_words}.",
                   f"print({sep!r}.join([input()] * {k}))\n", lambda s: sep.join([s.strip()] * k) + "\n",
                   lambda r: f"{_word(r)}\n")


def _range_sum(rng: random.Random) -> Variant:
    power = rng.choice([1, 2])
    what = "1 + 2 + ... + n" if power == 1 else "1*1 + 2*2 + ... + n*n"
    term = "i" if power == 1 else "i * i"
    return Variant(f"Read a positive integer n. Print the sum {what}.",
                   f"n = int(input())\nprint(sum({term} for i in range(1, n + 1)))\n",
                   lambda s: f"{sum(i ** power for i in range(1, int(s) + 1))}\n", lambda r: f"{r.randint(1, 60)}\n")


def _multiples(rng: random.Random) -> Variant:
    k = rng.randint(2, 9)
    return Variant(f"Read a positive integer n. Print the first n multiples of {k} ({k}, {2 * k}, ...) on one "
                   "line, separated by spaces.",
                   f"n = int(input())\nprint(' '.join(str({k} * i) for i in range(1, n + 1)))\n",
                   lambda s: _line([k * i for i in range(1, int(s) + 1)]) + "\n", lambda r: f"{r.randint(1, 10)}\n")


def _divisible(rng: random.Random) -> Variant:
    k = rng.randint(2, 9)
    yes, no = rng.choice([("YES", "NO"), ("yes", "no"), ("True", "False")])
    return Variant(f"Read an integer n. Print {yes} if n is divisible by {k}, otherwise print {no}.",
                   f"print('{yes}' if int(input()) % {k} == 0 else '{no}')\n",
                   lambda s: (yes if int(s) % k == 0 else no) + "\n",
                   lambda r: f"{r.choice([k * r.randint(-9, 9), r.randint(-99, 99)])}\n")


def _length(rng: random.Random) -> Variant:
    return Variant(rng.choice(["Read a line of text. Print the number of characters in it.",
                               "Read a word from standard input and print its length."]),
                   "print(len(input()))\n", lambda s: f"{len(s.rstrip(chr(10)))}\n",
                   lambda r: " ".join(_word(r) for _ in range(r.randint(1, 2))) + "\n")


def _count_vowels(rng: random.Random) -> Variant:
    vowels = rng.random() < 0.5
    what, test = ("vowels (a, e, i, o, u)", "in") if vowels else ("consonants (letters that are not a, e, i, o, u)",
                                                                  "not in")
    return Variant(f"Read a lowercase word. Print how many of its letters are {what}.",
                   f"print(sum(c {test} 'aeiou' for c in input().strip()))\n",
                   lambda s: f"{sum((c in 'aeiou') == vowels for c in s.strip())}\n", lambda r: f"{_word(r)}\n")


def _ends(rng: random.Random) -> Variant:
    what, expr, fn = rng.choice([("its first letter", "s[0]", lambda s: s[0]), ("its last letter", "s[-1]",
                                 lambda s: s[-1]), ("its first and last letters, with no space between them",
                                                    "s[0] + s[-1]", lambda s: s[0] + s[-1])])
    return Variant(f"Read a word. Print {what}.", f"s = input().strip()\nprint({expr})\n",
                   lambda s: fn(s.strip()) + "\n", lambda r: f"{_word(r)}\n")


def _count_words(rng: random.Random) -> Variant:
    return Variant(rng.choice(["Read a line of words separated by single spaces. Print how many words it has.",
                               "Count the words in one line of input (words are separated by spaces) and print "
                               "the count."]),
                   "print(len(input().split()))\n", lambda s: f"{len(s.split())}\n",
                   lambda r: " ".join(_word(r) for _ in range(r.randint(1, 6))) + "\n")


def _count_to(rng: random.Random) -> Variant:
    up = rng.random() < 0.5
    what, rng_expr = ("from 1 up to n", "range(1, n + 1)") if up else ("from n down to 1", "range(n, 0, -1)")
    return Variant(f"Read a positive integer n. Print the numbers {what}, each on its own line.",
                   f"n = int(input())\nfor i in {rng_expr}:\n    print(i)\n",
                   lambda s: "".join(f"{i}\n" for i in (range(1, int(s) + 1) if up else range(int(s), 0, -1))),
                   lambda r: f"{r.randint(1, 8)}\n")


def _linear(rng: random.Random) -> Variant:
    a, b = rng.randint(2, 9), rng.randint(-20, 20)
    return Variant(f"Read an integer x. Print the value of {a} * x + ({b}).", f"x = int(input())\nprint({a} * x + "
                   f"({b}))\n", lambda s: f"{a * int(s) + b}\n", lambda r: f"{r.randint(-100, 100)}\n")


def _digits(rng: random.Random) -> Variant:
    what, expr, fn = rng.choice([("the sum of its digits", "sum(int(c) for c in s)",
                                  lambda s: sum(int(c) for c in s)), ("how many digits it has", "len(s)", len)])
    return Variant(f"Read a non-negative integer n. Print {what}.", f"s = input().strip()\nprint({expr})\n",
                   lambda s: f"{fn(s.strip())}\n", lambda r: f"{r.randint(0, 10 ** r.randint(1, 9))}\n")


def _palindrome(rng: random.Random) -> Variant:
    yes, no = rng.choice([("YES", "NO"), ("yes", "no"), ("True", "False")])
    return Variant(f"Read a lowercase word. Print {yes} if it reads the same forwards and backwards, otherwise "
                   f"print {no}.", f"s = input().strip()\nprint('{yes}' if s == s[::-1] else '{no}')\n",
                   lambda s: (yes if s.strip() == s.strip()[::-1] else no) + "\n", lambda r: f"{_word(r)}\n")


def _power(rng: random.Random) -> Variant:
    k = rng.randint(2, 4)
    name = {2: "squared", 3: "cubed", 4: "to the fourth power"}[k]
    return Variant(f"Read an integer n. Print n {name}.", f"print(int(input()) ** {k})\n",
                   lambda s: f"{int(s) ** k}\n", lambda r: f"{r.randint(-30, 30)}\n")


def _join_lines(rng: random.Random) -> Variant:
    sep, words = rng.choice([(" ", "a single space"), (", ", "a comma and a space"), ("", "nothing")])
    return Variant(f"Read two lines, each with one word. Print the two words on one line with {words} between "
                   "them.", f"a = input()\nb = input()\nprint(a + {sep!r} + b)\n",
                   lambda s: sep.join(s.split("\n")[:2]) + "\n", lambda r: f"{_word(r)}\n{_word(r)}\n")


# ---------------------------------------------------------------- held-out families
# Statements come in several wordings and, where the task allows, parameters, so each family gives several
# distinct problems.


def _count_greater(rng: random.Random) -> Variant:
    k = rng.randint(-5, 20)
    return Variant(rng.choice(["The input is one line of integers separated by spaces. Print how many of them are "
                               "greater than {k}.", "Read a line of integers and output the number of values "
                               "that are strictly bigger than {k}."]).format(k=k),
                   f"print(sum(x > {k} for x in map(int, input().split())))\n",
                   lambda s: f"{sum(x > k for x in _list_of(s))}\n", lambda r: _list_input(r, False, -20, 40))


def _swap_words(rng: random.Random) -> Variant:
    sep, sep_words = rng.choice([(" ", "separated by a space"), (",", "separated by a comma"),
                                 ("\n", "each on its own line")])
    return Variant(rng.choice(["Read a line with two words separated by a space. Print the two words in the "
                               "opposite order, {w}.", "The input is two words on one line. Output the second "
                               "word and then the first, {w}."]).format(w=sep_words),
                   f"a, b = input().split()\nprint(b + {sep!r} + a)\n",
                   lambda s: sep.join(s.split()[::-1]) + "\n", lambda r: f"{_word(r)} {_word(r)}\n")


def _distinct(rng: random.Random) -> Variant:
    with_count = rng.random() < 0.5
    fmt, read = LIST_FORMATS[with_count]
    return Variant(rng.choice([f"{fmt} Print how many different values there are among them.",
                               f"{fmt} Output the number of distinct integers."]),
                   f"{read}print(len(set(xs)))\n", lambda s: f"{len(set(_list_of(s)))}\n",
                   lambda r: _list_input(r, with_count, 0, 5))


def _double_letters(rng: random.Random) -> Variant:
    k = rng.choice([2, 3])
    times, example = {2: ("twice", "ccaatt"), 3: ("three times", "cccaaattt")}[k]
    return Variant(rng.choice([f"Read a word. Print it with every letter written {times} (for example, cat "
                               f"becomes {example}).", f"Read a word and output it with each character repeated "
                               f"{times} in place (cat gives {example})."]),
                   f"print(''.join(c * {k} for c in input().strip()))\n",
                   lambda s: "".join(c * k for c in s.strip()) + "\n", lambda r: f"{_word(r)}\n")


def _sum_parity(rng: random.Random) -> Variant:
    even = rng.random() < 0.5
    which, test = ("even", "== 0") if even else ("odd", "!= 0")
    return Variant(rng.choice([f"The input is one line of integers separated by spaces. Print the sum of the "
                               f"{which} ones (0 if there are none).", f"Read a line of integers and output the "
                               f"sum of those that are {which} (print 0 when none are)."]),
                   f"print(sum(x for x in map(int, input().split()) if x % 2 {test}))\n",
                   lambda s: f"{sum(x for x in _list_of(s) if (x % 2 == 0) == even)}\n",
                   lambda r: _list_input(r, False))


def _spread(rng: random.Random) -> Variant:
    with_count = rng.random() < 0.5
    fmt, read = LIST_FORMATS[with_count]
    return Variant(rng.choice([f"{fmt} Print the largest minus the smallest.",
                               f"{fmt} Output the difference between the maximum and the minimum."]),
                   f"{read}print(max(xs) - min(xs))\n", lambda s: f"{max(_list_of(s)) - min(_list_of(s))}\n",
                   lambda r: _list_input(r, with_count))


def _capitalize(rng: random.Random) -> Variant:
    first = rng.random() < 0.5
    what, expr = (("the first letter of every word in uppercase", "w.capitalize()") if first else
                  ("the last letter of every word in uppercase", "w[:-1] + w[-1].upper()"))
    return Variant(rng.choice([f"Read a line of lowercase words separated by single spaces. Print it with {what}.",
                               f"Read one line of lowercase words (single spaces between them) and output it with "
                               f"{what}."]),
                   f"print(' '.join({expr} for w in input().split()))\n",
                   lambda s: " ".join(w.capitalize() if first else w[:-1] + w[-1].upper() for w in s.split()) + "\n",
                   lambda r: " ".join(_word(r) for _ in range(r.randint(1, 4))) + "\n")


def _remove_letters(rng: random.Random) -> Variant:
    vowels = rng.random() < 0.5
    what, test = ("every vowel (a, e, i, o, u)", "not in") if vowels else ("every consonant (keep only a, e, i, "
                                                                            "o, u)", "in")
    return Variant(f"Read a lowercase word. Print it with {what} removed.",
                   f"print(''.join(c for c in input().strip() if c {test} 'aeiou'))\n",
                   lambda s: "".join(c for c in s.strip() if (c in "aeiou") != vowels) + "\n",
                   lambda r: f"{_word(r)}\n")


def _subtract_const(rng: random.Random) -> Variant:
    k = rng.randint(1, 99)
    return Variant(rng.choice(["Read an integer n. Print n - {k}.", "You are given an integer x. Output x minus {k}.",
                               "Read one integer and print what remains after subtracting {k} from it."]).format(k=k),
                   f"print(int(input()) - {k})\n", lambda s: f"{int(s) - k}\n", lambda r: f"{r.randint(-1000, 1000)}\n")


def _divide(rng: random.Random) -> Variant:
    k = rng.randint(2, 9)
    what, expr, fn = rng.choice([("the quotient n // {k} (integer division, rounded down)", "n // {k}",
                                  lambda n: n // k),
                                 ("the remainder of n divided by {k}", "n % {k}", lambda n: n % k)])
    return Variant(rng.choice(["Read a non-negative integer n. Print {w}.", "You are given a non-negative integer n. "
                               "Output {w}."]).format(w=what.format(k=k)),
                   f"n = int(input())\nprint({expr.format(k=k)})\n", lambda s: f"{fn(int(s))}\n",
                   lambda r: f"{r.randint(0, 500)}\n")


def _absolute(rng: random.Random) -> Variant:
    return Variant(rng.choice(["Read an integer n. Print its absolute value.", "You are given an integer x. Output "
                               "x without its sign (the absolute value).", "Read one integer and print how far it "
                               "is from zero."]),
                   "print(abs(int(input())))\n", lambda s: f"{abs(int(s))}\n", lambda r: f"{r.randint(-500, 500)}\n")


def _pick_word(rng: random.Random) -> Variant:
    what, expr, fn = rng.choice([("first", "[0]", lambda ws: ws[0]), ("last", "[-1]", lambda ws: ws[-1]),
                                 ("longest (the first one if several are equally long)", "",
                                  lambda ws: max(ws, key=len))])
    code = (f"print(input().split(){expr})\n" if expr else "print(max(input().split(), key=len))\n")
    return Variant(rng.choice([f"Read a line of words separated by spaces. Print the {what} word.",
                               f"One line of input holds several words separated by spaces. Output the {what} one."]),
                   code, lambda s: fn(s.split()) + "\n",
                   lambda r: " ".join(_word(r) for _ in range(r.randint(1, 5))) + "\n")


FAMILIES = (
    Family("add_const", "train", _add_const), Family("mul_const", "train", _mul_const),
    Family("two_ints_one_line", "train", _two_ints(True)), Family("two_ints_two_lines", "train", _two_ints(False)),
    Family("list_aggregate", "train", _list_aggregate), Family("list_mean_floor", "train", _list_mean_floor),
    Family("count_letter", "train", _count_letter), Family("string_map", "train", _string_map),
    Family("parity", "train", _parity), Family("sign", "train", _sign), Family("repeat_word", "train", _repeat_word),
    Family("range_sum", "train", _range_sum), Family("multiples", "train", _multiples),
    Family("divisible", "train", _divisible), Family("length", "train", _length),
    Family("count_vowels", "train", _count_vowels), Family("word_ends", "train", _ends),
    Family("count_words", "train", _count_words), Family("count_to", "train", _count_to),
    Family("linear", "train", _linear), Family("digits", "train", _digits), Family("palindrome", "train", _palindrome),
    Family("power", "train", _power), Family("join_lines", "train", _join_lines),
    Family("subtract_const", "heldout", _subtract_const), Family("count_greater", "heldout", _count_greater),
    Family("swap_words", "heldout", _swap_words), Family("distinct", "heldout", _distinct),
    Family("divide", "heldout", _divide), Family("double_letters", "heldout", _double_letters),
    Family("sum_parity", "heldout", _sum_parity), Family("spread", "heldout", _spread),
    Family("capitalize", "heldout", _capitalize), Family("absolute", "heldout", _absolute),
    Family("remove_letters", "heldout", _remove_letters), Family("pick_word", "heldout", _pick_word),
)


def _tests(variant: Variant, rng: random.Random, count: int, seen: set[str]) -> dict[str, list[str]]:
    """`count` distinct inputs (as far as 50 draws find them) and their expected outputs."""
    inputs: list[str] = []
    for _ in range(50):
        if len(inputs) == count:
            break
        text = variant.make_input(rng)
        if text not in seen:
            seen.add(text)
            inputs.append(text)
    return {"input": inputs, "output": [variant.oracle(x) for x in inputs]}


def generate(seed: int = SEED, train_count: int = TRAIN_COUNT, heldout_count: int = HELDOUT_COUNT
             ) -> list[dict[str, Any]]:
    """CodeContests-schema rows: `train_count` training problems, then `heldout_count` held-out ones.

    The families of a split take turns; each turn draws (an opening from INTROS and a family variant) until a
    statement new to the split comes (a family that finds none in 30 draws leaves the rotation), so no two
    problems share a statement. Deterministic in `seed`."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for split, count in (("train", train_count), ("heldout", heldout_count)):
        families = [f for f in FAMILIES if f.split == split]
        statements: set[str] = set()
        turn = 0
        while len(statements) < count:
            if not families:
                raise ValueError(f"practice problems: the {split} families have only {len(statements)} distinct "
                                 f"statements, {count} were asked for")
            family = families[turn % len(families)]
            drawn = ((rng.choice(INTROS) + v.description, v) for v in (family.build(rng) for _ in range(30)))
            description, variant = next(((d, v) for d, v in drawn if d not in statements), ("", None))
            if variant is None:
                families.remove(family)
                continue
            turn += 1
            statements.add(description)
            seen: set[str] = set()
            public, private = _tests(variant, rng, PUBLIC_TESTS, seen), _tests(variant, rng, PRIVATE_TESTS, seen)
            rows.append({
                "name": f"{split}_{len(statements):03d}_{family.name}", "family": family.name, "split": split,
                "description": description, "source": "rljax-practice", "difficulty": 1,
                "public_tests": public, "private_tests": private,
                "time_limit": {"seconds": 2, "nanos": 0}, "memory_limit_bytes": 256 * 2**20,
                "solutions": {"language": [3], "solution": [variant.solution]}})
    return rows


def practice_problems(split: str = "train") -> list[dict[str, Any]]:
    """The shipped practice problems of one split ("train" or "heldout")."""
    from rljax.problems import load_jsonl

    if split not in SPLITS:
        raise ValueError(f"practice problems: split {split!r} is not one of {list(SPLITS)}")
    return [row for row in load_jsonl(PRACTICE_PROBLEMS) if row.get("split") == split]


def verify(rows: list[dict[str, Any]]) -> list[str]:
    """Run every row's reference solution on all its tests through the sandboxed executor (a pool over the
    cores); returns the names of the rows whose solution fails any test (empty when all pass)."""
    from executor.pool import ExecutorPool
    from executor.testing import Test, limits_for_problem, run_tests

    def failed(row: dict[str, Any]) -> bool:
        tests = [Test(i, o) for part in ("public_tests", "private_tests")
                 for i, o in zip(row[part]["input"], row[part]["output"])]
        return not all(r.passed for r in run_tests(row["solutions"]["solution"][0], tests, limits_for_problem(row)))

    with ExecutorPool() as pool:
        outcomes = pool.run_many(failed, rows)
    return [row["name"] for row, outcome in zip(rows, outcomes) if not outcome.ok or outcome.value]
