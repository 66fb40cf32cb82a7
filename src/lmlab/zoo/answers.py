"""Answer keys (self-consistency votes) and the safe evaluator (program of thought) of the zoo's variants.

`answer_key` is the answer an output commits to, without the gold (the suite's own extraction); ``smol-sc5``
votes over it. ``smol-pot`` asks for an arithmetic expression (`POT_INSTRUCTION`), `extract_expression` finds it in
the output and `safe_eval` (a whitelisted AST walk, never ``eval``) computes it.
"""

from __future__ import annotations

import ast
import math
import re

from lmlab.core.execution.tools import ARITHMETIC_BIN_OPS, ARITHMETIC_UNARY_OPS
from lmlab.data.respsuite import Query


def answer_key(q: Query, text: str) -> str | None:
    """The answer an output commits to, as a voting key (no gold used): the suite's own extraction where it has one
    (last number, last word, last bracketed list), the last normalised word for the country facts."""
    from lmlab.data.normalize import last_number, normalize

    if q.suite == "arithmetic":
        v = last_number(text)
        return None if v is None else str(v)
    if q.suite == "strings":
        from lmlab.data.strings import extract_answer

        task = q.example.meta["task"]
        a = extract_answer(task, text)
        if a is None:
            return None
        return a if task == "uppercase" else a.casefold()  # uppercase is graded case-sensitively: case is the answer
    if q.suite == "permutations":
        from lmlab.data.permutations import parse_answer

        p = parse_answer(text)
        return None if p is None else " ".join(map(str, p))
    words = normalize(text).split()
    return words[-1] if words else None


def safe_eval(expr: str, *, max_abs: float = 1e12, max_len: int = 200) -> float:
    """The value of an arithmetic expression (numbers, + - * / // % **, unary +/-, parentheses), by walking its AST.

    Never calls `eval`: names, calls, attributes, subscripts and every other node raise `ValueError`, as do
    exponents above 12, magnitudes above `max_abs`, division by zero and inputs longer than `max_len` characters.
    """
    if len(expr) > max_len:
        raise ValueError(f"expression is {len(expr)} characters long, expected at most {max_len}")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expr!r}") from None

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in ARITHMETIC_UNARY_OPS:
            return ARITHMETIC_UNARY_OPS[type(node.op)](walk(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC_BIN_OPS:
            a, b = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and (abs(b) > 12 or abs(a) > 1e6):
                raise ValueError(f"exponent too large in {expr!r}")
            if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and b == 0:
                raise ValueError(f"division by zero in {expr!r}")
            v = ARITHMETIC_BIN_OPS[type(node.op)](a, b)
            if isinstance(v, complex) or not math.isfinite(v) or abs(v) > max_abs:
                raise ValueError(f"value out of range in {expr!r}")
            return v
        raise ValueError(f"{type(node).__name__} is not allowed in an arithmetic expression: {expr!r}")

    return walk(tree)


_EXPR_RUN = re.compile(r"[0-9][0-9\s+\-*/().%]*|\([0-9\s+\-*/().%]*")


def extract_expression(text: str) -> str | None:
    """The longest run of arithmetic characters (digits, operators, parentheses) that `safe_eval` accepts."""
    text = text.replace("\u00d7", "*").replace("\u2212", "-").replace("`", " ")
    text = re.sub(r"(?<=[0-9)])\s*[xX]\s*(?=[0-9(])", " * ", text)
    text = text.split("=")[0] if "=" in text and not text.strip().startswith("=") else text
    runs = sorted((m.group(0).strip() for m in _EXPR_RUN.finditer(text)), key=len, reverse=True)
    for r in runs:
        r = r.rstrip("+-*/%(. \n").strip()
        if not r or not any(ch.isdigit() for ch in r):
            continue
        try:
            safe_eval(r)
        except ValueError:
            continue
        return r
    return None


def _format_value(v: float) -> str:
    if isinstance(v, int) or float(v).is_integer():
        return str(int(v))
    return f"{v:.6g}"


POT_INSTRUCTION = (
    "Translate the question into one arithmetic expression that computes the answer, using only numbers, "
    "+, -, * and /. Do not compute it. Answer with the expression only.\n"
    "Example: 'Ana has 3 apples. She gets 4 more apples. How many apples does Ana have now?' -> 3 + 4\n"
    "Question: {q}"
)


__all__ = ["answer_key", "extract_expression", "safe_eval"]
