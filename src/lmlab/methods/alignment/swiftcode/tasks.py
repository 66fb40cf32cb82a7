"""SWIFTCODE's task suite: eight seeded families of small Python function tasks, each with a slow and a fast idiom.

Every family has surface variation (function names, argument names, wording of the statement), small correctness
tests (edge cases included: duplicates, negatives, empty inputs, so that fast-but-wrong idioms fail), a stress-input
generator sized so that the slow idiom takes tens of milliseconds in CPython, a canonical efficient solution (the
denominator of NET) and a bank of program variants, correct and buggy, written as `string.Template` sources with
``$f`` (function name) and ``$a``, ``$b`` (argument names).

The variant bank is the *programmatic candidate generator* of the reproduction (source C of the spec): it stands in
for stronger code LLMs, which a 135M / 270M model is not, and every report labels it as such.

Nothing here executes a candidate: expected outputs come from each family's `reference` (lmlab's own trusted Python,
called directly), and every variant source only ever runs inside `lmlab.core.execution.sandbox` (see
`method.measure_many`).

| family | slow idiom | fast idiom (canonical first) | buggy idioms |
|---|---|---|---|
| pair_sum | double loop O(n^2) | one-pass dict O(n); Counter | set instead of counts (misses duplicates) |
| fibonacci | naive recursion O(phi^n) | iteration O(n); memo dict | off by one |
| count_primes | trial division to sqrt | sieve of Eratosthenes (bytearray; list) | counts 1 as prime / stops below n |
| dedupe | list membership O(n u) | seen-set O(n); dict.fromkeys | sorted(set()) (order lost) |
| count_members | list membership O(n m) | set membership O(n + m) | unique queries only |
| reverse_string | prepend concatenation O(n^2) | slicing; join(reversed) | reverses words, not characters |
| max_subarray | all subarrays O(n^2) | Kadane O(n); prefix minimum | Kadane from 0 (fails all-negative) |
| anagram | str.count per char O(n^2); list.remove O(n^2) | Counter; sorted | set equality (ignores multiplicity) |

(String building by ``+=`` is not slow in CPython, whose in-place concatenation is amortised linear; prepending,
``out = c + out``, is quadratic, so `reverse_string` carries the string-building idiom.)
"""

from __future__ import annotations

import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

KINDS = ("fast", "slow", "buggy")
HELD_OUT_NAMES = 2  # the last two function names of each family appear only in held-out tasks


@dataclass(frozen=True)
class Variant:
    """One program of a family: `template` is a `string.Template` with ``$f``, ``$a``, ``$b``."""

    name: str
    kind: str
    template: str

    def render(self, func: str, args: Sequence[str]) -> str:
        names = {"f": func, **{k: v for k, v in zip("ab", args)}}
        return string.Template(self.template).substitute(names).strip() + "\n"


@dataclass(frozen=True)
class Family:
    """A task family: statement, tests, stress input, reference and variant bank.

    Attributes:
        name (`str`); arity (`int`): number of arguments.
        func_names (`tuple[str]`): surface names; the last `HELD_OUT_NAMES` are reserved for held-out tasks.
        arg_names (`tuple[tuple[str]]`): argument-name sets.
        wordings (`tuple[str]`): statements, a `string.Template` over ``$a``, ``$b``.
        reference (`Callable`): trusted Python computing the expected output.
        small_inputs (`Callable[[np.random.Generator], list[tuple]]`): the correctness tests' inputs.
        stress_input (`Callable[[np.random.Generator, float], tuple]`): one stress input at a size scale (1.0 sizes
            the slow idiom to tens of ms).
        variants (`tuple[Variant]`): the bank; the first ``fast`` one is the canonical solution.
    """

    name: str
    arity: int
    func_names: tuple[str, ...]
    arg_names: tuple[tuple[str, ...], ...]
    wordings: tuple[str, ...]
    reference: Callable[..., Any]
    small_inputs: Callable[[np.random.Generator], list[tuple]]
    stress_input: Callable[[np.random.Generator, float], tuple]
    variants: tuple[Variant, ...]

    @property
    def canonical(self) -> Variant:
        return next(v for v in self.variants if v.kind == "fast")

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"family {self.name!r} has no variant {name!r}; it has {[v.name for v in self.variants]}")


@dataclass(frozen=True)
class CodeTask:
    """One task instance: what the model sees (`prompt`) and what grades it (tests, stress input, expected values).

    Attributes:
        id (`str`): ``"<family>/<split>/<i>"``.
        family (`str`); entry_point (`str`): the function to write; arg_names (`tuple[str]`).
        prompt (`str`): the task statement.
        tests (`tuple[tuple[tuple, Any], ...]`): (args, expected) of the small correctness tests.
        stress_args (`tuple`): the stress input (JSON-serialisable); stress_expected: its reference output.
        canonical (`str`): the canonical efficient solution, renamed to this task's surface.
    """

    id: str
    family: str
    entry_point: str
    arg_names: tuple[str, ...]
    prompt: str
    tests: tuple[tuple[tuple, Any], ...]
    stress_args: tuple
    stress_expected: Any
    canonical: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def test_code(self) -> str:
        """Assertions of the small tests, run in the candidate's namespace inside the sandbox."""
        lines = [
            f"assert {self.entry_point}(*{list(args)!r}) == {expected!r}, 'small test {i}'"
            for i, (args, expected) in enumerate(self.tests)
        ]
        return "\n".join(lines) + "\n"

    def render(self, variant: Variant) -> str:
        """A variant of this task's family under this task's names."""
        return variant.render(self.entry_point, self.arg_names)


# ---------------------------------------------------------------------------------------------------------------
# references (trusted, parent-side) and inputs


def _ref_pair_sum(nums: list[int], k: int) -> int:
    seen: Counter = Counter()
    total = 0
    for x in nums:
        total += seen[k - x]
        seen[x] += 1
    return total


def _ref_fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _ref_count_primes(n: int) -> int:
    if n < 2:
        return 0
    sieve = bytearray([1]) * (n + 1)
    sieve[0] = sieve[1] = 0
    for i in range(2, int(n**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, n + 1, i)))
    return sum(sieve)


def _ref_dedupe(xs: list[int]) -> list[int]:
    return list(dict.fromkeys(xs))


def _ref_count_members(items: list[int], queries: list[int]) -> int:
    s = set(items)
    return sum(1 for q in queries if q in s)


def _ref_reverse(s: str) -> str:
    return s[::-1]


def _ref_max_subarray(xs: list[int]) -> int:
    best = cur = xs[0]
    for x in xs[1:]:
        cur = max(x, cur + x)
        best = max(best, cur)
    return best


def _ref_anagram(a: str, b: str) -> bool:
    return Counter(a) == Counter(b)


def _ints(rng: np.random.Generator, n: int, lo: int, hi: int) -> list[int]:
    return [int(v) for v in rng.integers(lo, hi, size=n)]


def _word(rng: np.random.Generator, n: int, alphabet: str = "abcdefghijklmnopqrstuvwxyz") -> str:
    return "".join(alphabet[int(i)] for i in rng.integers(0, len(alphabet), size=n))


def _size(base: int, scale: float, lo: int = 4) -> int:
    return max(lo, int(round(base * scale)))


def _small_pair_sum(rng: np.random.Generator) -> list[tuple]:
    return [([1, 2, 3, 2], 4), ([], 3), ([5, 5, 5], 10), ([1, -1, 0, 2, -2], 0), ([3, 1, 4, 1, 5, 9, 2, 6], 7),
            (_ints(rng, 12, -3, 6), 3)]  # fmt: skip


def _small_fib(rng: np.random.Generator) -> list[tuple]:
    return [(0,), (1,), (2,), (7,), (int(rng.integers(10, 16)),)]


def _small_primes(rng: np.random.Generator) -> list[tuple]:
    return [(0,), (1,), (2,), (10,), (13,), (int(rng.integers(40, 120)),)]


def _small_dedupe(rng: np.random.Generator) -> list[tuple]:
    return [([3, 1, 3, 2, 1],), ([],), ([7],), ([5, 4, 5, 4, 3],), (_ints(rng, 12, 0, 6),)]


def _small_members(rng: np.random.Generator) -> list[tuple]:
    return [([1, 2, 3], [2, 2, 5]), ([], [1]), ([4, 4], []), ([9, 8, 7], [7, 8, 9, 10, 7]),
            (_ints(rng, 8, 0, 10), _ints(rng, 8, 0, 10))]  # fmt: skip


def _small_reverse(rng: np.random.Generator) -> list[tuple]:
    return [("abc",), ("",), ("a",), ("hello world",), (_word(rng, 9),)]


def _small_max_subarray(rng: np.random.Generator) -> list[tuple]:
    return [([1, -2, 3, 4, -1],), ([-3, -1, -2],), ([5],), ([2, -1, 2, -1, 2],), (_ints(rng, 10, -6, 6),)]


def _small_anagram(rng: np.random.Generator) -> list[tuple]:
    w = _word(rng, 7, "abcd")
    return [("listen", "silent"), ("aab", "abb"), ("", ""), ("ab", "abc"), (w, "".join(sorted(w))), ("abc", "abd")]


def _stress_pair_sum(rng: np.random.Generator, scale: float) -> tuple:
    return (_ints(rng, _size(1500, scale), 0, 1000), 1000)


def _stress_fib(rng: np.random.Generator, scale: float) -> tuple:
    # naive recursion costs ~phi^n calls: scale moves n by log_phi(scale) so the cost scales like the others
    return (max(5, 26 + int(round(np.log(max(scale, 1e-6)) / np.log(1.618)))),)


def _stress_primes(rng: np.random.Generator, scale: float) -> tuple:
    return (_size(30000, scale, 10) + int(rng.integers(0, 100)),)


def _stress_dedupe(rng: np.random.Generator, scale: float) -> tuple:
    n = _size(3000, scale)
    return (_ints(rng, n, 0, max(2, n // 2)),)


def _stress_members(rng: np.random.Generator, scale: float) -> tuple:
    n = _size(3000, scale)
    return (_ints(rng, n, 0, 2 * n), _ints(rng, n, 0, 2 * n))


def _stress_reverse(rng: np.random.Generator, scale: float) -> tuple:
    return (_word(rng, _size(30000, scale)),)


def _stress_max_subarray(rng: np.random.Generator, scale: float) -> tuple:
    return (_ints(rng, _size(1200, scale), -50, 51),)


def _stress_anagram(rng: np.random.Generator, scale: float) -> tuple:
    a = _word(rng, _size(5000, scale))
    b = "".join(a[int(i)] for i in rng.permutation(len(a)))
    return (a, b)


# ---------------------------------------------------------------------------------------------------------------
# the variant banks (fast first: the first fast variant is the canonical solution)

_PAIR_SUM = (
    Variant("dict_one_pass", "fast", """
def $f($a, $b):
    seen = {}
    count = 0
    for x in $a:
        count += seen.get($b - x, 0)
        seen[x] = seen.get(x, 0) + 1
    return count
"""),
    Variant("counter", "fast", """
from collections import Counter

def $f($a, $b):
    c = Counter($a)
    count = 0
    for x in c:
        y = $b - x
        if x < y:
            count += c[x] * c[y]
        elif x == y:
            count += c[x] * (c[x] - 1) // 2
    return count
"""),
    Variant("double_loop", "slow", """
def $f($a, $b):
    count = 0
    n = len($a)
    for i in range(n):
        for j in range(i + 1, n):
            if $a[i] + $a[j] == $b:
                count += 1
    return count
"""),
    Variant("set_no_counts", "buggy", """
def $f($a, $b):
    seen = set()
    count = 0
    for x in $a:
        if $b - x in seen:
            count += 1
        seen.add(x)
    return count
"""),
)  # fmt: skip

_FIB = (
    Variant("iterative", "fast", """
def $f($a):
    x, y = 0, 1
    for _ in range($a):
        x, y = y, x + y
    return x
"""),
    Variant("memo", "fast", """
def $f($a, memo=None):
    if memo is None:
        memo = {0: 0, 1: 1}
    if $a not in memo:
        memo[$a] = $f($a - 1, memo) + $f($a - 2, memo)
    return memo[$a]
"""),
    Variant("naive_recursion", "slow", """
def $f($a):
    if $a < 2:
        return $a
    return $f($a - 1) + $f($a - 2)
"""),
    Variant("off_by_one", "buggy", """
def $f($a):
    x, y = 1, 1
    for _ in range($a):
        x, y = y, x + y
    return x
"""),
)  # fmt: skip

_PRIMES = (
    Variant("sieve_bytearray", "fast", """
def $f($a):
    if $a < 2:
        return 0
    sieve = bytearray([1]) * ($a + 1)
    sieve[0] = sieve[1] = 0
    for i in range(2, int($a ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = bytearray(len(range(i * i, $a + 1, i)))
    return sum(sieve)
"""),
    Variant("sieve_list", "fast", """
def $f($a):
    if $a < 2:
        return 0
    is_prime = [True] * ($a + 1)
    is_prime[0] = is_prime[1] = False
    i = 2
    while i * i <= $a:
        if is_prime[i]:
            for j in range(i * i, $a + 1, i):
                is_prime[j] = False
        i += 1
    return sum(is_prime)
"""),
    Variant("trial_division", "slow", """
def $f($a):
    count = 0
    for x in range(2, $a + 1):
        d = 2
        while d * d <= x:
            if x % d == 0:
                break
            d += 1
        else:
            count += 1
    return count
"""),
    Variant("below_n", "buggy", """
def $f($a):
    if $a < 2:
        return 0
    sieve = [True] * $a
    sieve[0] = sieve[1] = False
    for i in range(2, int($a ** 0.5) + 1):
        if sieve[i]:
            for j in range(i * i, $a, i):
                sieve[j] = False
    return sum(sieve)
"""),
)  # fmt: skip

_DEDUPE = (
    Variant("seen_set", "fast", """
def $f($a):
    seen = set()
    out = []
    for x in $a:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out
"""),
    Variant("dict_fromkeys", "fast", """
def $f($a):
    return list(dict.fromkeys($a))
"""),
    Variant("list_membership", "slow", """
def $f($a):
    out = []
    for x in $a:
        if x not in out:
            out.append(x)
    return out
"""),
    Variant("sorted_set", "buggy", """
def $f($a):
    return sorted(set($a))
"""),
)  # fmt: skip

_MEMBERS = (
    Variant("set_lookup", "fast", """
def $f($a, $b):
    lookup = set($a)
    return sum(1 for q in $b if q in lookup)
"""),
    Variant("set_loop", "fast", """
def $f($a, $b):
    lookup = set($a)
    count = 0
    for q in $b:
        if q in lookup:
            count += 1
    return count
"""),
    Variant("list_lookup", "slow", """
def $f($a, $b):
    count = 0
    for q in $b:
        if q in $a:
            count += 1
    return count
"""),
    Variant("unique_queries", "buggy", """
def $f($a, $b):
    return len(set($a) & set($b))
"""),
)  # fmt: skip

_REVERSE = (
    Variant("slice", "fast", """
def $f($a):
    return $a[::-1]
"""),
    Variant("join_reversed", "fast", """
def $f($a):
    return ''.join(reversed($a))
"""),
    Variant("prepend", "slow", """
def $f($a):
    out = ''
    for ch in $a:
        out = ch + out
    return out
"""),
    Variant("reverse_words", "buggy", """
def $f($a):
    return ' '.join($a.split(' ')[::-1])
"""),
)  # fmt: skip

_MAX_SUBARRAY = (
    Variant("kadane", "fast", """
def $f($a):
    best = cur = $a[0]
    for x in $a[1:]:
        cur = max(x, cur + x)
        best = max(best, cur)
    return best
"""),
    Variant("prefix_min", "fast", """
def $f($a):
    best = $a[0]
    prefix = 0
    low = 0
    for x in $a:
        prefix += x
        best = max(best, prefix - low)
        low = min(low, prefix)
    return best
"""),
    Variant("all_subarrays", "slow", """
def $f($a):
    best = $a[0]
    for i in range(len($a)):
        total = 0
        for j in range(i, len($a)):
            total += $a[j]
            if total > best:
                best = total
    return best
"""),
    Variant("kadane_from_zero", "buggy", """
def $f($a):
    best = cur = 0
    for x in $a:
        cur = max(0, cur + x)
        best = max(best, cur)
    return best
"""),
)  # fmt: skip

_ANAGRAM = (
    Variant("counter", "fast", """
from collections import Counter

def $f($a, $b):
    return Counter($a) == Counter($b)
"""),
    Variant("sorted", "fast", """
def $f($a, $b):
    return sorted($a) == sorted($b)
"""),
    Variant("count_each", "slow", """
def $f($a, $b):
    if len($a) != len($b):
        return False
    for ch in $a:
        if $a.count(ch) != $b.count(ch):
            return False
    return True
"""),
    Variant("list_remove", "slow", """
def $f($a, $b):
    rest = list($b)
    for ch in $a:
        if ch in rest:
            rest.remove(ch)
        else:
            return False
    return not rest
"""),
    Variant("set_equal", "buggy", """
def $f($a, $b):
    return set($a) == set($b)
"""),
)  # fmt: skip


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "pair_sum", 2,
            ("count_pairs", "pair_count", "count_sum_pairs", "num_pairs_with_sum", "pairs_summing_to",
             "count_target_pairs", "count_two_sum", "how_many_pairs"),
            (("nums", "k"), ("values", "target"), ("arr", "total")),
            ("returns the number of index pairs i < j with $a[i] + $a[j] == $b",
             "counts how many pairs of positions i < j in the list $a have values adding up to $b",
             "takes a list of integers $a and an integer $b and returns how many pairs (i, j), i < j, sum to $b"),
            _ref_pair_sum, _small_pair_sum, _stress_pair_sum, _PAIR_SUM,
        ),
        Family(
            "fibonacci", 1,
            ("fib", "fibonacci", "nth_fibonacci", "fib_number", "fibo", "get_fibonacci", "fibonacci_at",
             "fib_value"),
            (("n",), ("k",), ("index",)),
            ("returns the $a-th Fibonacci number, with F(0) = 0 and F(1) = 1",
             "computes Fibonacci number $a (F(0) = 0, F(1) = 1, F(m) = F(m-1) + F(m-2))",
             "returns F($a) for the Fibonacci sequence 0, 1, 1, 2, 3, 5, ..."),
            _ref_fib, _small_fib, _stress_fib, _FIB,
        ),
        Family(
            "count_primes", 1,
            ("count_primes", "prime_count", "num_primes", "primes_up_to", "count_primes_upto", "prime_pi",
             "how_many_primes", "count_prime_numbers"),
            (("n",), ("limit",), ("m",)),
            ("returns how many prime numbers are less than or equal to $a",
             "counts the primes p with 2 <= p <= $a",
             "returns the number of primes not greater than $a (0 when $a < 2)"),
            _ref_count_primes, _small_primes, _stress_primes, _PRIMES,
        ),
        Family(
            "dedupe", 1,
            ("dedupe", "remove_duplicates", "unique_in_order", "drop_duplicates", "distinct", "dedup_list",
             "first_occurrences", "uniq"),
            (("items",), ("xs",), ("values",)),
            ("returns the list $a without duplicates, keeping the first occurrence of each value in order",
             "removes repeated values from $a and returns the remaining values in their original order",
             "returns a new list with each value of $a once, in the order of first appearance"),
            _ref_dedupe, _small_dedupe, _stress_dedupe, _DEDUPE,
        ),
        Family(
            "count_members", 2,
            ("count_hits", "count_members", "count_present", "num_found", "count_in", "hits",
             "count_matches", "found_count"),
            (("items", "queries"), ("pool", "probes"), ("data", "keys")),
            ("returns how many elements of $b (counting repeats) occur in the list $a",
             "counts the queries in $b that are present in $a; a repeated query counts each time",
             "returns the number of positions i with $b[i] in $a"),
            _ref_count_members, _small_members, _stress_members, _MEMBERS,
        ),
        Family(
            "reverse_string", 1,
            ("reverse", "reverse_string", "reversed_text", "flip", "backwards", "rev", "mirror_string",
             "reverse_chars"),
            (("s",), ("text",), ("word",)),
            ("returns the string $a with its characters in reverse order",
             "builds and returns $a reversed, character by character",
             "returns a string holding the characters of $a from last to first"),
            _ref_reverse, _small_reverse, _stress_reverse, _REVERSE,
        ),
        Family(
            "max_subarray", 1,
            ("max_subarray", "max_subarray_sum", "best_segment", "largest_sum", "max_contiguous_sum",
             "max_run_sum", "best_subarray", "max_slice_sum"),
            (("nums",), ("xs",), ("arr",)),
            ("returns the largest sum of a non-empty contiguous sublist of $a",
             "finds the maximum total of any non-empty run of consecutive elements of $a",
             "returns max(sum($a[i:j])) over 0 <= i < j <= len($a)"),
            _ref_max_subarray, _small_max_subarray, _stress_max_subarray, _MAX_SUBARRAY,
        ),
        Family(
            "anagram", 2,
            ("is_anagram", "anagrams", "are_anagrams", "same_letters", "check_anagram", "is_permutation",
             "anagram_check", "letters_match"),
            (("a", "b"), ("s", "t"), ("first", "second")),
            ("returns True if the strings $a and $b are anagrams (the same characters with the same counts)",
             "checks whether $b is a rearrangement of the characters of $a and returns a bool",
             "returns True when $a and $b contain exactly the same multiset of characters, else False"),
            _ref_anagram, _small_anagram, _stress_anagram, _ANAGRAM,
        ),
    )
}  # fmt: skip


def _statement(fam: Family, func: str, args: Sequence[str], wording: str) -> str:
    what = string.Template(wording).substitute({k: v for k, v in zip("ab", args)})
    return f"Write a Python function `{func}({', '.join(args)})` that {what}."


def make_task(fam: Family, func: str, args: Sequence[str], wording: str, *, task_id: str, seed: int,
              stress_scale: float = 1.0) -> CodeTask:  # fmt: skip
    """A task of `fam` under the given surface, with tests and a stress input drawn from `seed`."""
    rng = np.random.default_rng(seed)
    tests = tuple((tuple(args_), fam.reference(*args_)) for args_ in fam.small_inputs(rng))
    stress = tuple(fam.stress_input(rng, stress_scale))
    return CodeTask(
        id=task_id,
        family=fam.name,
        entry_point=func,
        arg_names=tuple(args),
        prompt=_statement(fam, func, args, wording),
        tests=tests,
        stress_args=stress,
        stress_expected=fam.reference(*stress),
        canonical=fam.canonical.render(func, args),
        meta={"wording": fam.wordings.index(wording)},
    )


def build_tasks(
    families: Sequence[str], n_train: int, n_eval: int, *, seed: int = 0, stress_scale: float = 1.0
) -> tuple[list[CodeTask], list[CodeTask]]:
    """Train and held-out tasks, spread evenly over `families` (round robin).

    Held-out tasks use only the `HELD_OUT_NAMES` reserved function names of their family, training tasks only the
    others, so no held-out surface form (function name, with its arguments and wording) occurs in training: the
    held-out set tests the idiom under new names, not recall of a seen prompt. Surfaces are drawn without
    replacement (seeded) while they last.

    Raises:
        `ValueError`: for an unknown family, an empty family list or negative counts.
    """
    if not families:
        raise ValueError("families must name at least one family, got an empty list")
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown task families {unknown}; expected among {sorted(FAMILIES)}")
    if n_train < 0 or n_eval < 0:
        raise ValueError(f"n_train and n_eval must be >= 0, got {n_train} and {n_eval}")
    rng = np.random.default_rng(seed)
    out: dict[str, list[CodeTask]] = {"train": [], "test": []}
    for split, n in (("train", n_train), ("test", n_eval)):
        surfaces: dict[str, list[tuple[str, tuple[str, ...], str]]] = {}
        for name in families:
            fam = FAMILIES[name]
            names = fam.func_names[-HELD_OUT_NAMES:] if split == "test" else fam.func_names[:-HELD_OUT_NAMES]
            combos = [(f, a, w) for f in names for a in fam.arg_names for w in fam.wordings]
            surfaces[name] = [combos[i] for i in rng.permutation(len(combos))]
        for i in range(n):
            fam = FAMILIES[families[i % len(families)]]
            pool = surfaces[fam.name]
            j = i // len(families)
            func, args, wording = pool[j % len(pool)]
            task_seed = int(rng.integers(0, 2**31 - 1))
            out[split].append(make_task(fam, func, args, wording, task_id=f"{fam.name}/{split}/{i}",
                                        seed=task_seed, stress_scale=stress_scale))  # fmt: skip
    return out["train"], out["test"]
