"""Programs and logic units: the normalised `Program`, the `LogicUnit` and `Fragment` types, and unit-string reading.

RaLU (Li et al., ICML 2025, https://arxiv.org/abs/2502.07803) splits a program into *logic units* by static analysis
(`lmlab.methods.decoding.ralu.cfg` builds the official CFG units, `lmlab.methods.decoding.ralu.units` the other unit
modes). This module holds what every unit mode shares:

- the renderer: lmlab works on the standard library (`ast.unparse` instead of astor, an AST pass instead of the
  tokenizer-based docstring stripper and autopep8), with an `ast.unparse` variant that spells code as astor does,
  because the official unit strings use astor;
- `Program`: a program cleaned of docstrings and comments and normalised, with its AST;
- `LogicUnit`: a unit string (what a judge sees) and its *fragments* (`Fragment`: the code snippets inside back-ticks
  or ``RUN [...]`` lines) with a pointer to the AST node each came from, so a corrected unit can be written back
  into the program (`lmlab.methods.decoding.ralu.units.apply_fix`);
- `text_fragments`: the code snippets read back out of a (corrected) unit string.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Fragment",
    "LogicUnit",
    "Program",
    "text_fragments",
]


# astor writes an operator expression inside parentheses; the official true/false test relies on that
_PAREN_EXPR = (ast.BoolOp, ast.BinOp, ast.Compare, ast.UnaryOp, ast.IfExp, ast.Lambda, ast.NamedExpr)


def _make_renderer() -> Callable[[ast.AST], str]:
    """`ast.unparse` with astor's spelling where they differ on common code (the official unit strings use astor):
    ``return a, b`` and ``x = a, b`` without parentheses, ``sum(x for x in y)`` without doubled parentheses, and
    ``a and b and c`` without the extra parentheses CPython 3.11 adds from the third operand on. Falls back to plain
    `ast.unparse` when the private `ast._Unparser` is not available."""
    base = getattr(ast, "_Unparser", None)
    prec = getattr(ast, "_Precedence", None)
    if base is None or prec is None:
        return ast.unparse

    class _AstorLike(base):  # type: ignore[misc, valid-type]
        def visit_Return(self, node: ast.Return) -> None:
            if isinstance(node.value, ast.Tuple) and node.value.elts:
                self.set_precedence(prec.TUPLE, node.value)
            super().visit_Return(node)

        def visit_Assign(self, node: ast.Assign) -> None:
            if isinstance(node.value, ast.Tuple) and node.value.elts:
                self.set_precedence(prec.TUPLE, node.value)
            super().visit_Assign(node)

        def visit_Call(self, node: ast.Call) -> None:
            if len(node.args) == 1 and not node.keywords and isinstance(node.args[0], ast.GeneratorExp):
                self.set_precedence(prec.ATOM, node.func)
                self.traverse(node.func)
                with self.delimit("(", ")"):
                    self.traverse(node.args[0].elt)
                    for gen in node.args[0].generators:
                        self.traverse(gen)
                return
            super().visit_Call(node)

        def visit_ListComp(self, node: ast.ListComp) -> None:
            # astor puts an operator element of a list comprehension in parentheses: [(e + 1) for e in l]
            with self.delimit("[", "]"):
                if isinstance(node.elt, _PAREN_EXPR):
                    with self.delimit("(", ")"):
                        self.traverse(node.elt)
                else:
                    self.traverse(node.elt)
                for gen in node.generators:
                    self.traverse(gen)

        def visit_BoolOp(self, node: ast.BoolOp) -> None:
            operator = self.boolops[node.op.__class__.__name__]
            level = self.boolop_precedence[operator]
            with self.require_parens(level, node):
                for i, value in enumerate(node.values):
                    if i:
                        self.write(f" {operator} ")
                    self.set_precedence(level.next(), value)
                    self.traverse(value)

    def render(node: ast.AST) -> str:
        return _AstorLike().visit(node)

    try:
        if render(ast.parse("return (a and b and c, sum(x for x in y))").body[0]) != (
            "return a and b and c, sum(x for x in y)"
        ):
            return ast.unparse
    except Exception:  # a future CPython changed the private unparser: keep the public one
        return ast.unparse
    return render


_unparse = _make_renderer()

# compound statements: a unit shows only their header, and a corrected simple statement may not become one
_COMPOUND = (ast.If, ast.For, ast.While, ast.FunctionDef, ast.AsyncFunctionDef)


# ----------------------------------------------------------------------------------------------------------------
# Program: cleaned, normalised source and its AST


def _strip_docstrings(tree: ast.AST) -> None:
    """Drop statement-level string expressions (docstrings), as the official tokenizer pass does."""
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if not isinstance(body, list) or not body or not isinstance(body[0], ast.stmt):
                continue
            kept = [
                s
                for s in body
                if not (
                    isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)
                )
            ]
            if not kept and name == "body":
                kept = [ast.Pass()]  # a body that held only a docstring stays valid
            setattr(node, name, kept)


@dataclass
class Program:
    """A Python program, cleaned (docstrings and comments removed) and normalised by `ast.unparse`.

    Attributes:
        source (`str`): the normalised source; every simple statement sits on one line.
        tree (`ast.Module`): its AST (do not mutate; `apply_fix` works on copies).
    """

    source: str
    tree: ast.Module

    @classmethod
    def parse(cls, source: str) -> Program:
        """Parse and normalise `source`. Raises `ValueError` with the syntax error when it does not parse."""
        try:
            tree = ast.parse(source)
        except SyntaxError as e:
            raise ValueError(f"program does not parse: {e.msg} (line {e.lineno})") from None
        _strip_docstrings(tree)
        normalised = _unparse(tree)
        return cls(normalised, ast.parse(normalised))

    def __hash__(self) -> int:
        return hash(self.source)


def _node_paths(tree: ast.AST) -> dict[int, tuple[tuple[str, int | None], ...]]:
    """id(node) -> path of (field, index) steps from the root, for every node of `tree`."""
    paths: dict[int, tuple[tuple[str, int | None], ...]] = {id(tree): ()}
    stack = [tree]
    while stack:
        node = stack.pop()
        base = paths[id(node)]
        for name, value in ast.iter_fields(node):
            if isinstance(value, ast.AST):
                paths[id(value)] = (*base, (name, None))
                stack.append(value)
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, ast.AST):
                        paths[id(item)] = (*base, (name, i))
                        stack.append(item)
    return paths


def _follow(tree: ast.AST, path: Sequence[tuple[str, int | None]]) -> Any:
    node: Any = tree
    for name, index in path:
        node = getattr(node, name)
        if index is not None:
            node = node[index]
    return node


# ----------------------------------------------------------------------------------------------------------------
# Units and fragments


@dataclass(frozen=True)
class Fragment:
    """One code snippet of a unit and where it came from.

    Attributes:
        text (`str`): the snippet as shown in the unit (``if x < y``, ``return ans``, ``for i in range(n)``).
        kind (`str`): how a corrected snippet is written back: ``stmt`` (a simple statement), ``if`` / ``while`` /
            ``for`` (a header), ``comp_for`` / ``comp_if`` / ``comp_elt`` / ``comp_kv`` (a desugared comprehension),
            ``ifexp_test`` / ``ifexp_body`` / ``ifexp_orelse`` (a desugared conditional return) or ``opaque``.
        path (`tuple`): path of the owner node in `Program.tree` (empty for ``opaque``).
        elif_ (`bool`): the header is written ``elif`` in the source (line units only).
    """

    text: str
    kind: str
    path: tuple[tuple[str, int | None], ...] = ()
    elif_: bool = False


@dataclass(frozen=True)
class LogicUnit:
    """A unit string (exactly what the judge sees) and its fragments (empty: the unit cannot be written back)."""

    text: str
    fragments: tuple[Fragment, ...] = ()

    def __str__(self) -> str:
        return self.text


_RUN_BLOCK = re.compile(r"RUN \[:?\n(.*?)\n\]", re.DOTALL)
_TICKS = re.compile(r"`([^`\n]*)`")


def _code_spans(unit: str) -> list[tuple[int, int]]:
    """Character spans of ``RUN [...]`` lines (stripped) and back-ticked code in a unit string, in order."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while pos < len(unit):
        block = _RUN_BLOCK.search(unit, pos)
        tick = _TICKS.search(unit, pos)
        nxt = min((m for m in (block, tick) if m is not None), key=lambda m: m.start(), default=None)
        if nxt is None:
            break
        if nxt is block:
            offset = block.start(1)
            for line in block.group(1).split("\n"):
                stripped = line.strip()
                if stripped:
                    start = offset + line.index(stripped)
                    spans.append((start, start + len(stripped)))
                offset += len(line) + 1
        else:
            spans.append((tick.start(1), tick.end(1)))
        pos = nxt.end()
    return spans


def text_fragments(unit: str, mode: str = "cfg") -> list[str]:
    """The code snippets of a unit string, in order: ``RUN [...]`` lines and back-ticked code (``line``: the line).

    Args:
        unit (`str`): a unit string.
        mode (`str`, defaults to ``"cfg"``): ``cfg`` / ``whole`` (parse the unit grammar) or ``line`` (the unit is
            one code line).
    """
    if mode == "line":
        return [unit.strip()] if unit.strip() else []
    return [unit[a:b] for a, b in _code_spans(unit)]


def _checked(text: str, frags: tuple[Fragment, ...], mode: str = "cfg") -> LogicUnit:
    """A unit whose fragments agree with what `text_fragments` reads from its text (else it cannot be fixed)."""
    if [f.text for f in frags] != text_fragments(text, mode):
        return LogicUnit(text, ())
    return LogicUnit(text, frags)
