"""Write rljax/data/bundled/problems.jsonl: the demo's small original stdin/stdout problems.

Each problem is a description, a reference solution and test inputs; the expected outputs come from running the
reference solution here (trusted code, written for this file). Rows are in the CodeContests schema, the reference
solution in `solutions` (language 3 = Python 3). Run: python tools/build_bundled_problems.py
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "rljax" / "data" / "bundled" / "problems.jsonl"

# (name, description, solution, public inputs, private inputs)
PROBLEMS = [
    ("sum_two", "Read two integers a and b on one line, separated by a space. Print their sum.",
     "a, b = map(int, input().split())\nprint(a + b)\n", ["1 2\n"], ["10 -3\n", "0 0\n", "123456 654321\n"]),
    ("product_two", "Read two integers a and b on one line. Print their product.",
     "a, b = map(int, input().split())\nprint(a * b)\n", ["3 4\n"], ["-2 5\n", "0 99\n", "1000 1000\n"]),
    ("difference", "Read two integers a and b on one line. Print a minus b.",
     "a, b = map(int, input().split())\nprint(a - b)\n", ["7 2\n"], ["2 7\n", "-5 -5\n", "100 1\n"]),
    ("absolute_difference", "Read two integers a and b on one line. Print the absolute value of a - b.",
     "a, b = map(int, input().split())\nprint(abs(a - b))\n", ["3 8\n"], ["8 3\n", "-4 4\n", "5 5\n"]),
    ("square", "Read an integer n. Print n squared.",
     "n = int(input())\nprint(n * n)\n", ["5\n"], ["0\n", "-7\n", "1000\n"]),
    ("reverse_string", "Read a string on one line. Print it reversed.",
     "print(input()[::-1])\n", ["hello\n"], ["a\n", "racecar\n", "abc123\n"]),
    ("uppercase", "Read a line of lowercase words. Print it in uppercase.",
     "print(input().upper())\n", ["hello world\n"], ["abc\n", "python is fun\n", "x\n"]),
    ("string_length", "Read a string on one line. Print its length.",
     "print(len(input()))\n", ["hello\n"], ["a\n", "abcdefghij\n", "two words\n"]),
    ("count_vowels", "Read a lowercase word. Print how many of its letters are vowels (a, e, i, o, u).",
     "print(sum(c in 'aeiou' for c in input().strip()))\n", ["banana\n"], ["rhythm\n", "aeiou\n", "programming\n"]),
    ("max_of_list", "The first line has an integer n. The second line has n integers. Print the largest.",
     "input()\nprint(max(map(int, input().split())))\n", ["3\n1 5 2\n"], ["1\n-4\n", "5\n-1 -2 -3 -4 -5\n",
                                                                          "4\n7 7 3 9\n"]),
    ("min_of_list", "The first line has an integer n. The second line has n integers. Print the smallest.",
     "input()\nprint(min(map(int, input().split())))\n", ["3\n4 1 9\n"], ["1\n8\n", "4\n-3 0 -7 2\n",
                                                                          "3\n5 5 5\n"]),
    ("sum_of_list", "The first line has an integer n. The second line has n integers. Print their sum.",
     "input()\nprint(sum(map(int, input().split())))\n", ["3\n1 2 3\n"], ["1\n-5\n", "5\n10 20 30 40 50\n",
                                                                         "4\n1 -1 2 -2\n"]),
    ("sum_to_n", "Read a positive integer n. Print the sum 1 + 2 + ... + n.",
     "n = int(input())\nprint(n * (n + 1) // 2)\n", ["4\n"], ["1\n", "100\n", "12345\n"]),
    ("factorial", "Read an integer n (0 <= n <= 20). Print n factorial.",
     "import math\nprint(math.factorial(int(input())))\n", ["5\n"], ["0\n", "1\n", "20\n"]),
    ("even_or_odd", "Read an integer n. Print EVEN if it is even, otherwise print ODD.",
     "print('EVEN' if int(input()) % 2 == 0 else 'ODD')\n", ["4\n"], ["7\n", "0\n", "-3\n"]),
    ("digit_sum", "Read a non-negative integer n. Print the sum of its decimal digits.",
     "print(sum(int(c) for c in input().strip()))\n", ["123\n"], ["0\n", "9999\n", "1000001\n"]),
    ("palindrome", "Read a lowercase word. Print YES if it reads the same backwards, otherwise NO.",
     "s = input().strip()\nprint('YES' if s == s[::-1] else 'NO')\n", ["level\n"], ["abc\n", "a\n", "abba\n"]),
    ("max_of_three", "Read three integers on one line. Print the largest of them.",
     "print(max(map(int, input().split())))\n", ["1 9 4\n"], ["-1 -2 -3\n", "5 5 2\n", "0 10 10\n"]),
    ("count_words", "Read a line of words separated by single spaces. Print how many words it has.",
     "print(len(input().split()))\n", ["the quick brown fox\n"], ["one\n", "a b c d e f\n", "hello world\n"]),
    ("repeat_hello", "Read an integer n. Print the word Hello n times, each on its own line.",
     "for _ in range(int(input())):\n    print('Hello')\n", ["2\n"], ["1\n", "5\n", "3\n"]),
    ("count_char", "The first line is a word, the second line a single letter. Print how many times the letter "
     "occurs in the word.", "w = input().strip()\nc = input().strip()\nprint(w.count(c))\n", ["banana\na\n"],
     ["banana\nz\n", "mississippi\ns\n", "aaaa\na\n"]),
    ("sort_numbers", "The first line has an integer n, the second n integers. Print them sorted in increasing "
     "order, separated by spaces.", "input()\nprint(*sorted(map(int, input().split())))\n", ["3\n3 1 2\n"],
     ["1\n5\n", "5\n5 -1 3 3 0\n", "4\n10 9 8 7\n"]),
    ("gcd", "Read two positive integers a and b. Print their greatest common divisor.",
     "import math\na, b = map(int, input().split())\nprint(math.gcd(a, b))\n", ["12 18\n"],
     ["7 13\n", "100 75\n", "5 5\n"]),
    ("leap_year", "Read a year. Print YES if it is a leap year in the Gregorian calendar, otherwise NO.",
     "y = int(input())\nprint('YES' if y % 4 == 0 and (y % 100 != 0 or y % 400 == 0) else 'NO')\n", ["2024\n"],
     ["1900\n", "2000\n", "2023\n"]),
    ("count_positive", "The first line has an integer n, the second n integers. Print how many are greater than "
     "zero.", "input()\nprint(sum(int(x) > 0 for x in input().split()))\n", ["4\n1 -2 3 0\n"],
     ["1\n-1\n", "5\n1 2 3 4 5\n", "3\n0 0 0\n"]),
    ("average", "The first line has an integer n, the second n integers. Print their average with exactly two "
     "digits after the decimal point.", "n = int(input())\nprint(f'{sum(map(int, input().split())) / n:.2f}')\n",
     ["2\n1 2\n"], ["1\n5\n", "3\n1 1 2\n", "4\n-1 -2 -3 -4\n"]),
    ("fizzbuzz_one", "Read an integer n. Print Fizz if it is divisible by 3, Buzz if divisible by 5, FizzBuzz if "
     "divisible by both, otherwise the number itself.",
     "n = int(input())\nprint('FizzBuzz' if n % 15 == 0 else 'Fizz' if n % 3 == 0 else 'Buzz' if n % 5 == 0 "
     "else n)\n", ["9\n"], ["10\n", "30\n", "7\n"]),
    ("multiples", "Read two integers n and k. Print the first k multiples of n (n, 2n, ..., kn) separated by "
     "spaces.", "n, k = map(int, input().split())\nprint(*(n * i for i in range(1, k + 1)))\n", ["3 4\n"],
     ["1 1\n", "5 3\n", "-2 3\n"]),
    ("remove_spaces", "Read a line of text. Print it with every space removed.",
     "print(input().replace(' ', ''))\n", ["a b c\n"], ["hello world\n", "nospace\n", "x  y\n"]),
    ("first_last", "Read a word. Print its first and its last letter, separated by a space.",
     "s = input().strip()\nprint(s[0], s[-1])\n", ["python\n"], ["a\n", "hello\n", "xy\n"]),
    ("celsius", "Read a temperature in degrees Celsius (an integer). Print it in degrees Fahrenheit "
     "(C * 9 / 5 + 32) with one digit after the decimal point.", "c = int(input())\nprint(f'{c * 9 / 5 + 32:.1f}')\n",
     ["100\n"], ["0\n", "-40\n", "37\n"]),
    ("second_largest", "The first line has an integer n (n >= 2), the second n distinct integers. Print the "
     "second largest.", "input()\nprint(sorted(map(int, input().split()))[-2])\n", ["3\n1 3 2\n"],
     ["2\n5 9\n", "5\n10 -1 7 3 8\n", "4\n-5 -6 -7 -8\n"]),
]


def run(solution: str, stdin: str) -> str:
    return subprocess.run([sys.executable, "-c", solution], input=stdin, capture_output=True, text=True,
                          check=True, timeout=10).stdout


def build_rows() -> list[dict]:
    rows = []
    for name, description, solution, public, private in PROBLEMS:
        rows.append({
            "name": name, "description": description, "source": "rljax-bundled", "difficulty": 1,
            "public_tests": {"input": public, "output": [run(solution, x) for x in public]},
            "private_tests": {"input": private, "output": [run(solution, x) for x in private]},
            "time_limit": {"seconds": 2, "nanos": 0}, "memory_limit_bytes": 256 * 2**20,
            "solutions": {"language": [3], "solution": [solution]}})
    return rows


if __name__ == "__main__":
    rows = build_rows()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} problems to {OUT}")
