"""Tools a model may call in a text trace: the call syntax, a tool box and a calculator over a safe AST evaluator.

The core knows no task data: tools over lmlab's packaged facts (the country lookup) and the default tool box live
in `lmlab.data.tools`.

Nothing a model writes is ever passed to ``eval`` or ``exec``: the calculator parses the expression with `ast` and
walks a whitelist of nodes (numbers, ``+ - * / // % **``, unary ``+ -``, parentheses); names, calls, attributes,
subscripts, comparisons and everything else are refused. Code that must *run* (a model-written program) belongs in
`lmlab.core.execution.sandbox`, not here.

A tool is a small class with a ``name``, a one-line ``description`` and ``syntax`` (shown to the model), a ``parse``
of the text between the brackets of the model's call syntax ``name[argument]`` and a ``run`` of the parsed value;
calling the tool does both. Bad input raises `ToolError` (a `ValueError`) with a one-line message naming the value
and what was expected; `ToolBox.observe` turns it into an ``"Error: ..."`` observation the model can read.

Usage:
    >>> box = ToolBox([Calculator()])
    >>> box.observe(parse_call("calculator[12*37]"))
    '444'
    >>> box.observe(parse_call("calculator[__import__('os')]"))
    'Error: calculator: a name is not allowed (...)'
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

CALL_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\[(.*)\]\s*$", re.S)


class ToolError(ValueError):
    """A tool's one-line refusal of bad input (names the value and what was expected)."""


def shorten(text: str, limit: int = 60) -> str:
    """`text` on one line, cut to `limit` characters (for error messages that quote model output)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class ToolCall:
    """One call ``name[argument]`` as a model wrote it."""

    name: str
    argument: str = ""

    def __str__(self) -> str:
        return f"{self.name}[{self.argument}]"


def parse_call(text: str) -> ToolCall | None:
    """The `ToolCall` in ``name[argument]`` (whitespace around it allowed), or None when `text` is not a call.

    A bare name (``answer_question``) is a call with an empty argument.
    """
    m = CALL_RE.match(text)
    if m:
        return ToolCall(m.group(1), m.group(2).strip())
    bare = text.strip()
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", bare):
        return ToolCall(bare, "")
    return None


class Tool:
    """Base class: subclasses set `name`, `description`, `syntax` and implement `parse` and `run`."""

    name: str = ""
    description: str = ""
    syntax: str = ""

    def parse(self, argument: str) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def run(self, parsed: Any) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, argument: str) -> str:
        """Parse `argument` (the text between the brackets) and run the tool: the observation text."""
        if not isinstance(argument, str):
            raise ToolError(f"{self.name}: the argument must be a string, got {type(argument).__name__}")
        return self.run(self.parse(argument))

    def call(self, *args: Any) -> ToolCall:
        """The `ToolCall` that asks this tool for ``args`` (what a trace writes)."""
        return ToolCall(self.name, ", ".join(str(a) for a in args))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


# ----------------------------------------------------------------------------------------------------------------
# calculator

# the arithmetic a calculator allows (also the zoo's program-of-thought evaluator): AST operator type -> function
ARITHMETIC_BIN_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
ARITHMETIC_UNARY_OPS: dict[type, Any] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_NODE_NAMES = {ast.Name: "a name", ast.Call: "a call", ast.Attribute: "an attribute", ast.Subscript: "a subscript",
               ast.Compare: "a comparison", ast.BoolOp: "a boolean operator", ast.Lambda: "a lambda",
               ast.IfExp: "a conditional", ast.JoinedStr: "an f-string"}  # fmt: skip


class Calculator(Tool):
    """``calculator[expression]``: evaluates arithmetic on numbers with ``+ - * / // % **`` and parentheses.

    Args:
        max_length (`int`, defaults to 200): longest expression accepted (characters).
        max_exponent (`int`, defaults to 64): largest absolute exponent of ``**``.
        max_digits (`int`, defaults to 100): largest magnitude of any intermediate value, in decimal digits.
    """

    name = "calculator"
    description = "evaluates an arithmetic expression"
    syntax = "calculator[12*37]"

    def __init__(self, max_length: int = 200, max_exponent: int = 64, max_digits: int = 100) -> None:
        for key, v in (("max_length", max_length), ("max_exponent", max_exponent), ("max_digits", max_digits)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{key} must be an int >= 1, got {v!r}")
        self.max_length, self.max_exponent, self.max_digits = max_length, max_exponent, max_digits

    def parse(self, argument: str) -> ast.Expression:
        expr = argument.strip().replace("×", "*").replace("÷", "/").replace("^", "**")
        if not expr:
            raise ToolError("calculator: the expression is empty; expected arithmetic such as 12*37")
        if len(expr) > self.max_length:
            raise ToolError(f"calculator: the expression has {len(expr)} characters, expected <= {self.max_length}")
        try:
            tree = ast.parse(expr, mode="eval")
        except SyntaxError:
            raise ToolError(f"calculator: {shorten(expr)!r} is not an arithmetic expression") from None
        for node in ast.walk(tree):
            self._check_node(node, expr)
        return tree

    def _check_node(self, node: ast.AST, expr: str) -> None:
        if isinstance(node, ast.Expression | ast.operator | ast.unaryop):
            if isinstance(node, ast.operator) and type(node) not in ARITHMETIC_BIN_OPS:
                raise ToolError(f"calculator: the operator {type(node).__name__} is not allowed in {shorten(expr)!r}; "
                                "expected + - * / // % **")  # fmt: skip
            if isinstance(node, ast.unaryop) and type(node) not in ARITHMETIC_UNARY_OPS:
                raise ToolError(f"calculator: the operator {type(node).__name__} is not allowed in {shorten(expr)!r}")
            return
        if isinstance(node, ast.BinOp | ast.UnaryOp):
            return
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ToolError(f"calculator: {v!r} is not a number in {shorten(expr)!r}")
            return
        what = _NODE_NAMES.get(type(node), type(node).__name__)
        raise ToolError(f"calculator: {what} is not allowed ({shorten(expr)!r}); expected numbers and + - * / // % **")

    def _bound(self, v: int | float, expr: str) -> int | float:
        if isinstance(v, float) and not math.isfinite(v):
            raise ToolError(f"calculator: {shorten(expr)!r} overflows (the result is not finite)")
        if abs(v) >= 10**self.max_digits:
            raise ToolError(f"calculator: a value in {shorten(expr)!r} exceeds {self.max_digits} digits")
        return v

    def _eval(self, node: ast.AST, expr: str) -> int | float:
        if isinstance(node, ast.Expression):
            return self._eval(node.body, expr)
        if isinstance(node, ast.Constant):
            return self._bound(node.value, expr)
        if isinstance(node, ast.UnaryOp):
            return ARITHMETIC_UNARY_OPS[type(node.op)](self._eval(node.operand, expr))
        assert isinstance(node, ast.BinOp)
        a, b = self._eval(node.left, expr), self._eval(node.right, expr)
        if isinstance(node.op, ast.Pow):
            if abs(b) > self.max_exponent:
                raise ToolError(f"calculator: the exponent {b!r} in {shorten(expr)!r} exceeds {self.max_exponent}")
            if abs(a) > 1 and b > 0 and b * math.log10(abs(a)) >= self.max_digits:
                raise ToolError(f"calculator: {a!r}**{b!r} exceeds {self.max_digits} digits")
            if a == 0 and b < 0:
                raise ToolError(f"calculator: division by zero in {shorten(expr)!r}")
        if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and b == 0:
            raise ToolError(f"calculator: division by zero in {shorten(expr)!r}")
        try:
            v = ARITHMETIC_BIN_OPS[type(node.op)](a, b)
        except (OverflowError, ValueError, ZeroDivisionError) as e:
            raise ToolError(f"calculator: {shorten(expr)!r} cannot be evaluated ({e})") from None
        if isinstance(v, complex):
            raise ToolError(f"calculator: {shorten(expr)!r} has a complex result")
        return self._bound(v, expr)

    def evaluate(self, argument: str) -> int | float:
        """The numeric value of `argument` (raises `ToolError`)."""
        tree = self.parse(argument)
        return self._eval(tree, argument.strip())

    def run(self, parsed: ast.Expression) -> str:
        return format_number(self._eval(parsed, ast.unparse(parsed)))


def format_number(v: int | float) -> str:
    """An integer-valued result without a decimal point, other floats with up to 10 significant digits."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
        return str(int(v))
    if isinstance(v, float):
        return f"{v:.10g}"
    return str(v)


# ----------------------------------------------------------------------------------------------------------------
# a set of tools


class ToolBox:
    """The tools a trace may call, by name.

    Args:
        tools (`Iterable[Tool]`): distinct names.
    """

    def __init__(self, tools: Iterable[Tool]) -> None:
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if not isinstance(t, Tool) or not t.name:
                raise ValueError(f"tools must be named Tool instances, got {t!r}")
            if t.name in self.tools:
                raise ValueError(f"tool names must be distinct, got {t.name!r} twice")
            self.tools[t.name] = t
        if not self.tools:
            raise ValueError("tools is empty: a ToolBox needs at least one tool")

    def __contains__(self, name: object) -> bool:
        return name in self.tools

    def __getitem__(self, name: str) -> Tool:
        return self.tools[name]

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    def run(self, call: ToolCall) -> str:
        """The tool's output for `call` (raises `ToolError` for an unknown tool or bad input)."""
        tool = self.tools.get(call.name)
        if tool is None:
            raise ToolError(f"unknown tool {call.name!r}; expected one of {', '.join(self.tools)}")
        return tool(call.argument)

    def observe(self, call: ToolCall | None) -> str:
        """What a trace shows after `call`: the output, or ``"Error: <one line>"`` (never raises on model input)."""
        if call is None:
            return "Error: no tool call; expected name[argument]"
        try:
            return self.run(call)
        except ToolError as e:
            return f"Error: {e}"

    def describe(self) -> str:
        """One line per tool: ``syntax: description`` (for a system prompt)."""
        return "\n".join(f"{t.syntax}: {t.description}" for t in self.tools.values())


__all__ = [
    "ARITHMETIC_BIN_OPS",
    "ARITHMETIC_UNARY_OPS",
    "CALL_RE",
    "Calculator",
    "Tool",
    "ToolBox",
    "ToolCall",
    "ToolError",
    "format_number",
    "shorten",
    "parse_call",
]
