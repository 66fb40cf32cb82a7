"""SWIFTCODE's task suite: sixteen seeded families of small Python function tasks, each with a slow and a fast idiom.

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
| count_distinct | list membership O(n u); list.index O(n^2) | len(set()); seen-set loop | counts values seen once |
| first_repeat | `in` prefix slice O(n^2); list.index O(n^2) | seen-set; seen-dict O(n) | first value with any copy |
| running_max | max of every prefix slice O(n^2) | running variable O(n); accumulate | running max starts at 0 |
| is_sorted | all pairs O(n^2); min of every suffix O(n^2) | adjacent pairs O(n); == sorted() | strict < |
| most_common_char | str.count per char O(n^2) (max key; loop) | Counter; dict counts O(n) | alphabetical tie-break |
| sum_squares | generator sum O(n); for loop O(n) | n(n+1)(2n+1)/6 O(1); via n(n+1)/2 | excludes n |
| mod_pow | b products mod p O(b); full power, then mod | pow(a, b, p); square-and-multiply | starts from a (b = 0) |
| palindrome | strip both ends (slices) O(n^2); prepend O(n^2) | s == s[::-1]; join(reversed) | half split (odd n) |

String building by ``+=`` is not slow in CPython, whose in-place concatenation is amortised linear; prepending,
``out = c + out``, is quadratic, so `reverse_string` and `palindrome` carry the string-building idiom. `sum_squares`
and `mod_pow`, like `fibonacci`, have a constant or logarithmic canonical solution, so the NET of their slow idioms is
in the thousands to tens of thousands (the others: tens to hundreds).
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


def _ref_count_distinct(xs: list[int]) -> int:
    return len(set(xs))


def _ref_first_repeat(xs: list[int]) -> int:
    seen = set()
    for x in xs:
        if x in seen:
            return x
        seen.add(x)
    return -1


def _ref_running_max(xs: list[int]) -> list[int]:
    out, best = [], None
    for x in xs:
        best = x if best is None or x > best else best
        out.append(best)
    return out


def _ref_is_sorted(xs: list[int]) -> bool:
    return all(xs[i] <= xs[i + 1] for i in range(len(xs) - 1))


def _ref_most_common_char(s: str) -> str:
    counts = Counter(s)  # insertion order = order of first occurrence; max keeps the first of equal counts
    return max(counts, key=counts.__getitem__)


def _ref_sum_squares(n: int) -> int:
    return n * (n + 1) * (2 * n + 1) // 6


MOD = 1_000_000_007  # the modulus of the mod_pow family (fixed, stated in its wording)


def _ref_mod_pow(a: int, b: int) -> int:
    return pow(a, b, MOD)


def _ref_palindrome(s: str) -> bool:
    return s == s[::-1]


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


def _small_count_distinct(rng: np.random.Generator) -> list[tuple]:
    return [([1, 2, 2, 3, 1],), ([],), ([5],), ([4, 4, 4],), ([-1, 1, -1, 0],), (_ints(rng, 12, 0, 6),)]


def _small_first_repeat(rng: np.random.Generator) -> list[tuple]:
    # [3, 1, 2, 1, 3]: 1 is the first value seen twice, 3 the first value that has a copy somewhere (the bug)
    return [([2, 1, 3, 1, 2],), ([],), ([1, 2, 3],), ([4, 4],), ([3, 1, 2, 1, 3],), (_ints(rng, 10, 0, 8),)]


def _small_running_max(rng: np.random.Generator) -> list[tuple]:
    return [([1, 3, 2, 5, 4],), ([],), ([-2, -5, -1],), ([7],), (_ints(rng, 10, -6, 6),)]


def _small_is_sorted(rng: np.random.Generator) -> list[tuple]:
    return [([1, 2, 2, 3],), ([],), ([5],), ([3, 1, 2],), ([1, 2, 3, 2],), (sorted(_ints(rng, 10, 0, 5)),),
            (_ints(rng, 8, 0, 5),)]  # fmt: skip


def _small_most_common_char(rng: np.random.Generator) -> list[tuple]:
    # ties: "bbaa" -> "b" and "zyzy" -> "z" (first occurrence), where the alphabetical tie-break gives "a" / "y"
    return [("abracadabra",), ("a",), ("bbaa",), ("zyzy",), ("aabbb",), (_word(rng, 9, "abc"),)]


def _small_sum_squares(rng: np.random.Generator) -> list[tuple]:
    return [(0,), (1,), (2,), (3,), (10,), (int(rng.integers(20, 200)),)]


def _small_mod_pow(rng: np.random.Generator) -> list[tuple]:
    return [(2, 10), (3, 0), (0, 0), (0, 5), (MOD + 1, 2), (7, 13),
            (int(rng.integers(2, 10**6)), int(rng.integers(20, 60)))]  # fmt: skip


def _small_palindrome(rng: np.random.Generator) -> list[tuple]:
    w = _word(rng, 4, "ab")
    return [("racecar",), ("",), ("a",), ("ab",), ("abba",), ("abca",), ("aba",), (w + w[::-1],),
            (_word(rng, 7, "ab"),)]  # fmt: skip


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


def _stress_count_distinct(rng: np.random.Generator, scale: float) -> tuple:
    n = _size(3000, scale)
    return (_ints(rng, n, 0, n),)


def _stress_first_repeat(rng: np.random.Generator, scale: float) -> tuple:
    # distinct values, then one repeat at the very end: every idiom scans the whole list
    n = _size(3000, scale)
    xs = [int(v) for v in rng.permutation(10 * n)[:n]]
    return (xs + [xs[n // 3]],)


def _stress_running_max(rng: np.random.Generator, scale: float) -> tuple:
    return (_ints(rng, _size(2000, scale), -(10**6), 10**6),)


def _stress_is_sorted(rng: np.random.Generator, scale: float) -> tuple:
    # sorted (with repeats): no idiom can stop early
    n = _size(1500, scale)
    return (sorted(_ints(rng, n, 0, n)),)


def _stress_most_common_char(rng: np.random.Generator, scale: float) -> tuple:
    return (_word(rng, _size(4000, scale)),)


def _stress_sum_squares(rng: np.random.Generator, scale: float) -> tuple:
    return (_size(500000, scale) + int(rng.integers(0, 100)),)


def _stress_mod_pow(rng: np.random.Generator, scale: float) -> tuple:
    return (int(rng.integers(2, 1000)), _size(150000, scale) + int(rng.integers(0, 100)))


def _stress_palindrome(rng: np.random.Generator, scale: float) -> tuple:
    w = _word(rng, _size(20000, scale))
    return (w + w[::-1],)


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


_COUNT_DISTINCT = (
    Variant("len_set", "fast", """
def $f($a):
    return len(set($a))
"""),
    Variant("seen_set", "fast", """
def $f($a):
    seen = set()
    count = 0
    for x in $a:
        if x not in seen:
            seen.add(x)
            count += 1
    return count
"""),
    Variant("list_membership", "slow", """
def $f($a):
    seen = []
    for x in $a:
        if x not in seen:
            seen.append(x)
    return len(seen)
"""),
    Variant("index_is_first", "slow", """
def $f($a):
    return sum(1 for i, x in enumerate($a) if $a.index(x) == i)
"""),
    Variant("values_seen_once", "buggy", """
from collections import Counter

def $f($a):
    counts = Counter($a)
    return sum(1 for c in counts.values() if c == 1)
"""),
)  # fmt: skip

_FIRST_REPEAT = (
    Variant("seen_set", "fast", """
def $f($a):
    seen = set()
    for x in $a:
        if x in seen:
            return x
        seen.add(x)
    return -1
"""),
    Variant("seen_dict", "fast", """
def $f($a):
    seen = {}
    for i, x in enumerate($a):
        if x in seen:
            return x
        seen[x] = i
    return -1
"""),
    Variant("prefix_slice", "slow", """
def $f($a):
    for i in range(len($a)):
        if $a[i] in $a[:i]:
            return $a[i]
    return -1
"""),
    Variant("index_lookup", "slow", """
def $f($a):
    for i, x in enumerate($a):
        if $a.index(x) < i:
            return x
    return -1
"""),
    Variant("first_with_copy", "buggy", """
def $f($a):
    for x in $a:
        if $a.count(x) > 1:
            return x
    return -1
"""),
)  # fmt: skip

_RUNNING_MAX = (
    Variant("loop", "fast", """
def $f($a):
    out = []
    best = None
    for x in $a:
        if best is None or x > best:
            best = x
        out.append(best)
    return out
"""),
    Variant("accumulate", "fast", """
from itertools import accumulate

def $f($a):
    return list(accumulate($a, max))
"""),
    Variant("max_of_prefix", "slow", """
def $f($a):
    return [max($a[:i + 1]) for i in range(len($a))]
"""),
    Variant("start_at_zero", "buggy", """
def $f($a):
    out = []
    best = 0
    for x in $a:
        best = max(best, x)
        out.append(best)
    return out
"""),
)  # fmt: skip

_IS_SORTED = (
    Variant("adjacent_pairs", "fast", """
def $f($a):
    return all($a[i] <= $a[i + 1] for i in range(len($a) - 1))
"""),
    Variant("compare_sorted", "fast", """
def $f($a):
    return $a == sorted($a)
"""),
    Variant("all_pairs", "slow", """
def $f($a):
    for i in range(len($a)):
        for j in range(i + 1, len($a)):
            if $a[i] > $a[j]:
                return False
    return True
"""),
    Variant("min_of_suffix", "slow", """
def $f($a):
    return all($a[i] <= min($a[i:]) for i in range(len($a)))
"""),
    Variant("strictly_increasing", "buggy", """
def $f($a):
    return all($a[i] < $a[i + 1] for i in range(len($a) - 1))
"""),
)  # fmt: skip

_MOST_COMMON_CHAR = (
    Variant("counter", "fast", """
from collections import Counter

def $f($a):
    counts = Counter($a)
    return max(counts, key=counts.get)
"""),
    Variant("dict_count", "fast", """
def $f($a):
    counts = {}
    for ch in $a:
        counts[ch] = counts.get(ch, 0) + 1
    best = $a[0]
    for ch in counts:
        if counts[ch] > counts[best]:
            best = ch
    return best
"""),
    Variant("max_by_count", "slow", """
def $f($a):
    return max($a, key=$a.count)
"""),
    Variant("count_each", "slow", """
def $f($a):
    best = $a[0]
    for ch in $a:
        if $a.count(ch) > $a.count(best):
            best = ch
    return best
"""),
    Variant("alphabetical_tie", "buggy", """
from collections import Counter

def $f($a):
    counts = Counter($a)
    return max(sorted(counts), key=counts.get)
"""),
)  # fmt: skip

_SUM_SQUARES = (
    Variant("closed_form", "fast", """
def $f($a):
    return $a * ($a + 1) * (2 * $a + 1) // 6
"""),
    Variant("triangle_form", "fast", """
def $f($a):
    return $a * ($a + 1) // 2 * (2 * $a + 1) // 3
"""),
    Variant("generator_sum", "slow", """
def $f($a):
    return sum(i * i for i in range(1, $a + 1))
"""),
    Variant("loop", "slow", """
def $f($a):
    total = 0
    for i in range(1, $a + 1):
        total += i * i
    return total
"""),
    Variant("excludes_n", "buggy", """
def $f($a):
    return sum(i * i for i in range($a))
"""),
)  # fmt: skip

_MOD_POW = (
    Variant("builtin_pow", "fast", """
def $f($a, $b):
    return pow($a, $b, 1000000007)
"""),
    Variant("square_multiply", "fast", """
def $f($a, $b):
    mod = 1000000007
    result = 1
    power = $a % mod
    e = $b
    while e > 0:
        if e % 2 == 1:
            result = result * power % mod
        power = power * power % mod
        e //= 2
    return result
"""),
    Variant("loop_multiply", "slow", """
def $f($a, $b):
    result = 1
    for _ in range($b):
        result = result * $a % 1000000007
    return result
"""),
    Variant("big_power", "slow", """
def $f($a, $b):
    return $a ** $b % 1000000007
"""),
    Variant("starts_at_base", "buggy", """
def $f($a, $b):
    result = $a
    for _ in range($b - 1):
        result = result * $a % 1000000007
    return result
"""),
)  # fmt: skip

_PALINDROME = (
    Variant("reverse_slice", "fast", """
def $f($a):
    return $a == $a[::-1]
"""),
    Variant("join_reversed", "fast", """
def $f($a):
    return ''.join(reversed($a)) == $a
"""),
    Variant("strip_ends", "slow", """
def $f($a):
    while len($a) > 1:
        if $a[0] != $a[-1]:
            return False
        $a = $a[1:-1]
    return True
"""),
    Variant("prepend_reverse", "slow", """
def $f($a):
    rev = ''
    for ch in $a:
        rev = ch + rev
    return rev == $a
"""),
    Variant("half_split", "buggy", """
def $f($a):
    half = len($a) // 2
    return $a[:half] == $a[half:][::-1]
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
        Family(
            "count_distinct", 1,
            ("count_distinct", "num_distinct", "distinct_count", "n_distinct", "count_different",
             "distinct_values_count", "how_many_distinct", "number_of_distinct"),
            (("nums",), ("xs",), ("values",)),
            ("returns the number of distinct values in the list $a (0 for an empty list)",
             "counts how many different values occur in $a, each value counted once however often it repeats",
             "returns len of the set of values of $a, i.e. how many unique elements it contains"),
            _ref_count_distinct, _small_count_distinct, _stress_count_distinct, _COUNT_DISTINCT,
        ),
        Family(
            "first_repeat", 1,
            ("first_repeat", "first_duplicate", "first_repeated", "earliest_repeat", "first_seen_twice",
             "find_first_duplicate", "first_recurring", "repeat_first"),
            (("nums",), ("items",), ("seq",)),
            ("returns the first value of $a that occurs a second time when reading from left to right, or -1 if "
             "all values are different",
             "scans $a from the left and returns the first element equal to an element before it (-1 when there "
             "is none)",
             "returns $a[j] for the smallest j such that $a[j] == $a[i] for some i < j, or -1 if there is no such j"),
            _ref_first_repeat, _small_first_repeat, _stress_first_repeat, _FIRST_REPEAT,
        ),
        Family(
            "running_max", 1,
            ("running_max", "prefix_max", "cumulative_max", "max_so_far", "running_maximum", "prefix_maxima",
             "rolling_best", "max_prefix_list"),
            (("nums",), ("xs",), ("values",)),
            ("returns a list whose i-th element is the maximum of $a[0], ..., $a[i] (an empty list for an empty $a)",
             "returns the running maximum of $a: for each position, the largest value seen up to and including it",
             "builds the list of prefix maxima of $a, max($a[:i + 1]) for every index i"),
            _ref_running_max, _small_running_max, _stress_running_max, _RUNNING_MAX,
        ),
        Family(
            "is_sorted", 1,
            ("is_sorted", "is_non_decreasing", "sorted_check", "check_sorted", "in_order", "is_ascending",
             "already_sorted", "is_monotonic_up"),
            (("nums",), ("xs",), ("arr",)),
            ("returns True if the list $a is sorted in non-decreasing order (equal neighbours allowed), else False",
             "checks whether every element of $a is <= the next one and returns a bool",
             "returns True when $a[i] <= $a[i + 1] for every valid i (True for empty and one-element lists)"),
            _ref_is_sorted, _small_is_sorted, _stress_is_sorted, _IS_SORTED,
        ),
        Family(
            "most_common_char", 1,
            ("most_common_char", "most_frequent_char", "top_char", "mode_char", "commonest_letter",
             "max_char_count", "dominant_char", "most_repeated_char"),
            (("s",), ("text",), ("word",)),
            ("returns the character that occurs most often in the non-empty string $a; on a tie, the one that "
             "appears first in $a",
             "finds the most frequent character of the non-empty string $a, breaking ties by earliest first "
             "occurrence",
             "returns the character of $a (non-empty) with the highest count; among equally frequent characters, "
             "the one occurring earliest in $a"),
            _ref_most_common_char, _small_most_common_char, _stress_most_common_char, _MOST_COMMON_CHAR,
        ),
        Family(
            "sum_squares", 1,
            ("sum_squares", "sum_of_squares", "square_sum", "squares_total", "sum_sq", "total_of_squares",
             "sum_squares_upto", "squares_up_to"),
            (("n",), ("k",), ("m",)),
            ("returns 1*1 + 2*2 + ... + $a*$a, the sum of the squares of 1 to $a (0 when $a is 0)",
             "computes the sum of i**2 for i from 1 to $a inclusive ($a >= 0)",
             "returns the total of the squares of the integers 1, 2, ..., $a (for $a >= 0)"),
            _ref_sum_squares, _small_sum_squares, _stress_sum_squares, _SUM_SQUARES,
        ),
        Family(
            "mod_pow", 2,
            ("mod_pow", "power_mod", "pow_mod", "modular_power", "mod_exp", "expmod", "power_modulo", "modpow"),
            (("base", "exp"), ("a", "b"), ("x", "n")),
            ("returns ($a ** $b) % 1000000007 for integers $a >= 0 and $b >= 0",
             "computes $a to the power $b modulo 1000000007 (with 0 ** 0 = 1)",
             "returns the remainder of $a raised to the power $b when divided by 10**9 + 7"),
            _ref_mod_pow, _small_mod_pow, _stress_mod_pow, _MOD_POW,
        ),
        Family(
            "palindrome", 1,
            ("is_palindrome", "palindrome", "check_palindrome", "reads_same_backwards", "is_mirror",
             "palindrome_check", "same_both_ways", "is_symmetric_string"),
            (("s",), ("text",), ("word",)),
            ("returns True if the string $a reads the same forwards and backwards (case-sensitive), else False",
             "checks whether $a is a palindrome, comparing characters exactly, and returns a bool",
             "returns True when $a equals its own reverse (True for the empty string)"),
            _ref_palindrome, _small_palindrome, _stress_palindrome, _PALINDROME,
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
