"""Logic units of a Python program: the official control-flow-graph serializer, line units, and fix reassembly.

RaLU (Li et al., ICML 2025, https://arxiv.org/abs/2502.07803) splits a program into *logic units* by static analysis:
a staticfg-style control-flow graph (basic blocks, If/For/While edges, called functions) serialized into
natural-language-like unit strings separated by ``$``:

- basic blocks: ``RUN [ <statements> ]`` or ``RUN `stmt```;
- branches: ``#BRANCH# If Condition `c` is satisfied, then ...`` and
  ``#BRANCH# Otherwise, when Condition `c` is not satisfied, then ...``;
- loops: ``#LOOP BEGIN# If looping Condition `c` is satisfied, then enter the loop:`` and
  ``#LOOP END# If not satisfying the looping Condition `c`, then jump out of the loop.``;
- defined functions: ``#ENTER FUNCTION# name{ ... } #EXIT FUNCTION#``.

This module is lmlab's own implementation of the algorithm of the official ``src/cfg/cfg_build.py`` and
``src/cfg/cfg.py`` (github.com/DeepAccept/RaLU), written on the standard library (`ast.unparse` instead of astor,
an AST pass instead of the tokenizer-based docstring stripper and autopep8). It keeps the official traversal, so it
also keeps its quirks, which shape the unit strings a judge sees: a join block is printed under the first branch that
reaches it (so an ``Otherwise`` unit can be empty and runs into the next unit), list/set/dict comprehensions assigned
to a name are desugared into loops (the last generator outermost), ``return a if c else b`` becomes a branch,
``continue``/``del``/``global`` leave no trace, and the loop stack is never popped after a ``for``.

Each unit also carries its *fragments* (the code snippets inside back-ticks or ``RUN [...]`` lines) with a pointer to
the AST node each came from, so a corrected unit can be written back into the program (`apply_fix`): the
deterministic synthesis that replaces the official LLM rewrite at small scale.
"""

from __future__ import annotations

import ast
import copy
import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CFGError",
    "Fragment",
    "LogicUnit",
    "Program",
    "apply_fix",
    "apply_fixes",
    "cfg_units",
    "extract_units",
    "line_units",
    "split_thirds",
    "text_fragments",
    "whole_unit",
]

UNIT_MODES: tuple[str, ...] = ("cfg", "line", "whole")


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


class CFGError(ValueError):
    """The control-flow graph could not be built or serialized (the official builder raises here too)."""


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


# ----------------------------------------------------------------------------------------------------------------
# The control-flow graph (our port of the official staticfg-derived builder)


@dataclass
class _Block:
    bid: int
    stmts: list[ast.AST] = field(default_factory=list)
    prev: list[int] = field(default_factory=list)
    next: list[int] = field(default_factory=list)

    def remove_from_prev(self, bid: int) -> None:
        if bid in self.prev:
            self.prev.remove(bid)

    def remove_from_next(self, bid: int) -> None:
        if bid in self.next:
            self.next.remove(bid)


@dataclass
class _CFG:
    name: str
    start: _Block | None = None
    blocks: dict[int, _Block] = field(default_factory=dict)
    edges: dict[tuple[int, int], ast.AST | None] = field(default_factory=dict)
    func_cfgs: dict[str, _CFG] = field(default_factory=dict)


_INVERT_CMP: dict[type, type] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE,
    ast.LtE: ast.Gt,
    ast.Gt: ast.LtE,
    ast.GtE: ast.Lt,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}


def _invert(node: ast.AST) -> ast.AST:
    """The negated condition of a false edge, as the official builder forms it."""
    if isinstance(node, ast.Compare):
        if len(node.ops) == 1:
            return ast.Compare(left=node.left, ops=[_INVERT_CMP[type(node.ops[0])]()], comparators=node.comparators)
        chain = ast.BoolOp(
            op=ast.And(), values=[ast.Compare(left=node.left, ops=[node.ops[0]], comparators=[node.comparators[0]])]
        )
        for i in range(len(node.ops) - 1):
            chain.values.append(
                ast.Compare(left=node.comparators[i], ops=[node.ops[i + 1]], comparators=[node.comparators[i + 1]])
            )
        return _invert(chain)
    if isinstance(node, ast.BoolOp):
        return ast.BoolOp(
            values=[_invert(v) for v in node.values], op=ast.Or() if isinstance(node.op, ast.And) else ast.And()
        )
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.UAdd):
            return ast.UnaryOp(op=ast.USub(), operand=node.operand)
        if isinstance(node.op, ast.USub):
            return ast.UnaryOp(op=ast.UAdd(), operand=node.operand)
        if isinstance(node.op, ast.Invert):
            return ast.UnaryOp(op=ast.Not(), operand=node)
        return node.operand
    return ast.UnaryOp(op=ast.Not(), operand=node)


def _edge_text(node: ast.AST, rendered: set[int]) -> str:
    # astor remembers the precedence context of every node it rendered inside a statement; a node it never saw
    # (an inverted or combined condition) is an expression of its own and gets parentheses
    text = _unparse(node)
    return f"({text})" if isinstance(node, _PAREN_EXPR) and id(node) not in rendered else text


def _first_line(node: ast.AST) -> str:
    if isinstance(node, ast.Try) and not node.body:
        return "try:"
    return _unparse(node).split("\n")[0].strip()


def _def_line(node: ast.AST) -> str:
    # astor writes "->bool" without the space; keep its spelling so entry-point detection matches the official one
    return _first_line(node).replace(") -> ", ") ->").replace("def", "[DEFINE FUNCTION]").rstrip(":")


_COMPOUND = (ast.If, ast.For, ast.While, ast.FunctionDef, ast.AsyncFunctionDef)


class _Builder:
    """Builds one function-level CFG, exactly as the official ``CFGVisitor`` (registers and all)."""

    def __init__(self, counter: Any, origin: dict[int, tuple[str, ast.AST]]):
        self.counter = counter
        self.origin = origin
        self.loop_stack: list[_Block] = []
        self.if_exp = False
        self.list_comp_reg: tuple[str | None, ast.AST] | None = None
        self.set_comp_reg: tuple[str | None, ast.AST] | None = None
        self.dict_comp_reg: tuple[str | None, ast.AST] | None = None
        self.gen_exp_reg: tuple[str, ast.AST] | None = None
        self.lambda_reg: tuple[str, ast.AST] | None = None

    # -- graph primitives ---------------------------------------------------------------------------------------
    def build(self, name: str, tree: ast.AST) -> _CFG:
        self.cfg = _CFG(name)
        self.curr = self.new_block()
        self.cfg.start = self.curr
        self.visit(tree)
        self.remove_empty_blocks(self.cfg.start, set())
        return self.cfg

    def new_block(self) -> _Block:
        bid = next(self.counter)
        self.cfg.blocks[bid] = _Block(bid)
        return self.cfg.blocks[bid]

    def add_stmt(self, block: _Block, stmt: ast.AST) -> None:
        block.stmts.append(stmt)

    def add_edge(self, frm: int, to: int, condition: ast.AST | None = None) -> _Block:
        self.cfg.blocks[frm].next.append(to)
        self.cfg.blocks[to].prev.append(frm)
        self.cfg.edges[(frm, to)] = condition
        return self.cfg.blocks[to]

    def add_loop_block(self) -> _Block:
        if not self.curr.stmts and not self.curr.next:
            return self.curr
        loop = self.new_block()
        self.add_edge(self.curr.bid, loop.bid)
        return loop

    def add_subgraph(self, node: ast.AST) -> None:
        sub = _Builder(self.counter, self.origin)
        self.cfg.func_cfgs[node.name] = sub.build(node.name, ast.Module(body=node.body, type_ignores=[]))

    def remove_empty_blocks(self, block: _Block, visited: set[int]) -> None:
        # the list iterations below run while the lists change, as in the official code (it decides which
        # blocks get cleaned), so they are kept exactly in this form
        if block.bid in visited:
            return
        visited.add(block.bid)
        blocks, edges = self.cfg.blocks, self.cfg.edges
        if not block.stmts:
            for prev_bid in block.prev:
                prev_block = blocks[prev_bid]
                for next_bid in block.next:
                    next_block = blocks[next_bid]
                    c1, c2 = edges.get((prev_bid, block.bid)), edges.get((block.bid, next_bid))
                    cond = ast.BoolOp(op=ast.And(), values=[c1, c2]) if c1 and c2 else (c1 if c1 else c2)
                    self.add_edge(prev_bid, next_bid, cond)
                    edges.pop((block.bid, next_bid), None)
                    next_block.remove_from_prev(block.bid)
                edges.pop((prev_bid, block.bid), None)
                prev_block.remove_from_next(block.bid)
            block.prev.clear()
            for next_bid in block.next:
                self.remove_empty_blocks(blocks[next_bid], visited)
            block.next.clear()
        else:
            for next_bid in block.next:
                self.remove_empty_blocks(blocks[next_bid], visited)

    def populate_body(self, body: Sequence[ast.AST], to_bid: int) -> None:
        for child in body:
            self.visit(child)
        if not self.curr.next:
            self.add_edge(self.curr.bid, to_bid)

    def synthetic(self, node: ast.AST, kind: str, owner: ast.AST) -> ast.AST:
        for attr in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
            if attr in node._attributes and not hasattr(node, attr):
                setattr(node, attr, 0)
        if "type_comment" in node._fields and not hasattr(node, "type_comment"):
            node.type_comment = None
        self.origin[id(node)] = (kind, owner)
        return node

    # -- visiting -----------------------------------------------------------------------------------------------
    def visit(self, node: ast.AST) -> None:
        method = getattr(self, f"visit_{type(node).__name__}", None)
        if method is None:
            self.generic_visit(node)
        else:
            method(node)

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            self.add_stmt(self.curr, node)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            self.add_stmt(self.curr, node)
            self.add_subgraph(node)
            return
        if isinstance(node, ast.AnnAssign | ast.AugAssign):
            self.add_stmt(self.curr, node)
        for child in ast.iter_child_nodes(node):
            self.visit(child)

    def visit_Assert(self, node: ast.Assert) -> None:
        self.add_stmt(self.curr, node)
        self.curr = self.add_edge(self.curr.bid, self.new_block().bid, node.test)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        value = node.value
        simple = len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        comp = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda)
        if isinstance(value, comp) and simple:
            name = node.targets[0].id
            if isinstance(value, ast.ListComp):
                init: ast.AST = ast.List(elts=[], ctx=ast.Load())
                self.list_comp_reg = (name, value)
            elif isinstance(value, ast.SetComp):
                init = ast.Call(func=ast.Name(id="set", ctx=ast.Load()), args=[], keywords=[])
                self.set_comp_reg = (name, value)
            elif isinstance(value, ast.DictComp):
                init = ast.Dict(keys=[], values=[])
                self.dict_comp_reg = (name, value)
            elif isinstance(value, ast.GeneratorExp):
                gen = ast.Name(id=f"__{name}Generator__", ctx=ast.Load())
                init = ast.Call(func=gen, args=[], keywords=[])
                self.gen_exp_reg = (name, value)
            else:
                self.lambda_reg = (name, value)
                init = None
            if init is not None:
                stmt = ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=init)
                self.add_stmt(self.curr, self.synthetic(stmt, "opaque", node))
        else:
            self.add_stmt(self.curr, node)
        self.generic_visit(node)

    def visit_Await(self, node: ast.Await) -> None:
        after = self.new_block()
        self.add_edge(self.curr.bid, after.bid)
        self.generic_visit(node)
        self.curr = after

    def visit_Break(self, node: ast.Break) -> None:
        if not self.loop_stack:
            raise CFGError("found break not inside loop")
        self.add_edge(self.curr.bid, self.loop_stack[-1].bid, ast.Break())

    def visit_Call(self, node: ast.Call) -> None:
        # called names are only drawn in the official graph, never serialized: nothing to record here
        if isinstance(node.func, ast.Lambda):
            self.lambda_reg = ("Anonymous Function", node.func)
            self.generic_visit(node)

    def visit_Continue(self, node: ast.Continue) -> None:
        pass

    def _comp_loops(self, generators: list[ast.comprehension], leaf: Callable[[], list[ast.AST] | None]):
        """The official desugaring: the *last* generator becomes the outermost loop."""
        if not generators:
            return leaf()
        g = generators[-1]
        inner = self._comp_loops(generators[:-1], leaf)
        if g.ifs:
            test = g.ifs[0] if len(g.ifs) == 1 else ast.BoolOp(op=ast.And(), values=list(g.ifs))
            body = [self.synthetic(ast.If(test=test, body=inner, orelse=[]), "comp_if", g)]
        else:
            body = inner
        return [self.synthetic(ast.For(target=g.target, iter=g.iter, body=body, orelse=[]), "comp_for", g)]

    def _visit_comp(self, attr: str, leaf: Callable[[tuple[Any, ast.AST]], list[ast.AST] | None]) -> None:
        reg = getattr(self, attr)
        try:
            if reg is None:
                raise TypeError("unregistered comprehension")
            body = self._comp_loops(list(reg[1].generators), lambda: leaf(reg))
            self.generic_visit(ast.Module(body=body, type_ignores=[]))
        except Exception:  # the official visitor swallows every failure here, keeping partial blocks
            pass
        finally:
            setattr(self, attr, None)

    def visit_ListComp(self, node: ast.ListComp) -> None:
        def leaf(reg: tuple[Any, ast.AST]) -> list[ast.AST]:
            self.generic_visit(reg[1].elt)
            if reg[0]:
                call = ast.Call(
                    func=ast.Attribute(value=ast.Name(id=reg[0], ctx=ast.Load()), attr="append", ctx=ast.Load()),
                    args=[reg[1].elt],
                    keywords=[],
                )
                return [self.synthetic(ast.Expr(value=call), "comp_elt", reg[1])]
            return [self.synthetic(ast.Expr(value=reg[1].elt), "comp_elt", reg[1])]

        self._visit_comp("list_comp_reg", leaf)

    def visit_SetComp(self, node: ast.SetComp) -> None:
        def leaf(reg: tuple[Any, ast.AST]) -> list[ast.AST]:
            self.generic_visit(reg[1].elt)
            if reg[0]:
                call = ast.Call(
                    func=ast.Attribute(value=ast.Name(id=reg[0], ctx=ast.Load()), attr="add", ctx=ast.Load()),
                    args=[reg[1].elt],
                    keywords=[],
                )
                return [self.synthetic(ast.Expr(value=call), "comp_elt", reg[1])]
            return [self.synthetic(ast.Expr(value=reg[1].elt), "comp_elt", reg[1])]

        self._visit_comp("set_comp_reg", leaf)

    def visit_DictComp(self, node: ast.DictComp) -> None:
        def leaf(reg: tuple[Any, ast.AST]) -> list[ast.AST] | None:
            if not reg[0]:
                return None
            target = ast.Subscript(value=ast.Name(id=reg[0], ctx=ast.Load()), slice=reg[1].key, ctx=ast.Store())
            return [self.synthetic(ast.Assign(targets=[target], value=reg[1].value), "comp_kv", reg[1])]

        self._visit_comp("dict_comp_reg", leaf)

    def visit_GeneratorExp(self, node: ast.GeneratorExp) -> None:
        reg = self.gen_exp_reg
        try:
            if reg is None:
                raise TypeError("unregistered generator")

            def leaf() -> list[ast.AST]:
                self.generic_visit(reg[1].elt)
                return [self.synthetic(ast.Expr(value=ast.Yield(value=reg[1].elt)), "opaque", reg[1])]

            fn = ast.FunctionDef(
                name=f"__{reg[0]}Generator__",
                args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
                body=self._comp_loops(list(reg[1].generators), leaf),
                decorator_list=[],
                returns=None,
                type_params=[],
            )
            self.generic_visit(fn)
        except Exception:
            pass
        finally:
            self.gen_exp_reg = None

    def visit_Expr(self, node: ast.Expr) -> None:
        value = node.value
        if isinstance(value, ast.ListComp) and isinstance(value.elt, ast.Call):
            self.list_comp_reg = (None, value)
        elif isinstance(value, ast.Lambda):
            self.lambda_reg = ("Anonymous Function", value)
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Lambda):
            self.lambda_reg = ("Anonymous Function", value.func)
        else:
            self.add_stmt(self.curr, node)
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        guard = self.add_loop_block()
        self.curr = guard
        self.add_stmt(self.curr, node)
        body_block = self.add_edge(self.curr.bid, self.new_block().bid)
        if not node.orelse:
            after = self.add_edge(self.curr.bid, self.new_block().bid)
            self.loop_stack.append(after)  # never popped after a for loop, as in the official builder
            self.curr = body_block
            self.populate_body(node.body, guard.bid)
        else:
            after = self.new_block()
            orelse = self.add_edge(self.curr.bid, self.new_block().bid, ast.Name(id="else", ctx=ast.Load()))
            self.loop_stack.append(after)
            self.curr = body_block
            self.populate_body(node.body, guard.bid)
            self.curr = orelse
            for child in node.orelse:
                self.visit(child)
            self.add_edge(orelse.bid, after.bid)
        self.curr = after

    visit_AsyncFor = visit_For

    def visit_If(self, node: ast.If) -> None:
        self.add_stmt(self.curr, node)
        after = self.new_block()
        if_block = self.add_edge(self.curr.bid, self.new_block().bid, node.test)
        if node.orelse:
            self.curr = self.add_edge(self.curr.bid, self.new_block().bid, _invert(node.test))
            self.populate_body(node.orelse, after.bid)
        else:
            self.add_edge(self.curr.bid, after.bid, _invert(node.test))
        self.curr = if_block
        self.populate_body(node.body, after.bid)
        self.curr = after

    def _if_exp_stmts(self, node: ast.IfExp) -> list[ast.AST]:
        body = [self.synthetic(ast.Return(value=node.body), "ifexp_body", node)]
        if isinstance(node.orelse, ast.IfExp):
            orelse = self._if_exp_stmts(node.orelse)
        else:
            orelse = [self.synthetic(ast.Return(value=node.orelse), "ifexp_orelse", node)]
        return [self.synthetic(ast.If(test=node.test, body=body, orelse=orelse), "ifexp_test", node)]

    def visit_IfExp(self, node: ast.IfExp) -> None:
        if self.if_exp:
            self.generic_visit(ast.Module(body=self._if_exp_stmts(node), type_ignores=[]))

    def visit_Lambda(self, node: ast.Lambda) -> None:
        name = self.lambda_reg[0] if self.lambda_reg is not None else "Anonymous Function"
        fn = ast.FunctionDef(
            name=name,
            args=node.args,
            body=[self.synthetic(ast.Return(value=node.body), "opaque", node)],
            decorator_list=[],
            returns=None,
            type_params=[],
        )
        self.add_subgraph(fn)
        self.lambda_reg = None

    def visit_Pass(self, node: ast.Pass) -> None:
        self.add_stmt(self.curr, node)

    def visit_Raise(self, node: ast.Raise) -> None:
        self.add_stmt(self.curr, node)
        self.curr = self.new_block()

    def visit_Return(self, node: ast.Return) -> None:
        if isinstance(node.value, ast.IfExp):
            self.if_exp = True
            self.generic_visit(node)
            self.if_exp = False
        else:
            self.add_stmt(self.curr, node)
        self.curr = self.new_block()  # code after a return is unreachable: a fresh block with no way in

    def visit_Try(self, node: ast.Try) -> None:
        guard = self.add_loop_block()
        self.curr = guard
        self.add_stmt(guard, self.synthetic(ast.Try(body=[], handlers=[], orelse=[], finalbody=[]), "opaque", node))
        after_try = self.new_block()
        self.add_stmt(after_try, self.synthetic(ast.Name(id="handle errors", ctx=ast.Load()), "opaque", node))
        self.populate_body(node.body, after_try.bid)
        self.curr = after_try
        for handler in node.handlers:
            before = self.new_block()
            self.curr = before
            cond = handler.type if handler.type else ast.Name(id="Error", ctx=ast.Load())
            self.add_edge(after_try.bid, before.bid, cond)
            after_handler = self.new_block()
            self.add_stmt(after_handler, self.synthetic(ast.Name(id="end except", ctx=ast.Load()), "opaque", node))
            self.populate_body(handler.body, after_handler.bid)
            self.add_edge(after_handler.bid, after_try.bid)
        if node.orelse:
            before = self.new_block()
            self.curr = before
            self.add_edge(after_try.bid, before.bid, ast.Name(id="No Error", ctx=ast.Load()))
            after_else = self.new_block()
            self.add_stmt(after_else, self.synthetic(ast.Name(id="end no error", ctx=ast.Load()), "opaque", node))
            self.populate_body(node.orelse, after_else.bid)
            self.add_edge(after_else.bid, after_try.bid)
        final = self.new_block()
        self.curr = final
        if node.finalbody:
            self.add_edge(after_try.bid, final.bid, ast.Name(id="Finally", ctx=ast.Load()))
            after_final = self.new_block()
            self.populate_body(node.finalbody, after_final.bid)
            self.curr = after_final
        else:
            self.add_edge(after_try.bid, final.bid)

    def visit_While(self, node: ast.While) -> None:
        guard = self.add_loop_block()
        self.curr = guard
        self.add_stmt(guard, node)
        after = self.new_block()
        self.loop_stack.append(after)
        inverted = _invert(node.test)
        # the official "skip the exit edge of `while True`" test never fires (the inverted test is a UnaryOp)
        if not node.orelse:
            self.add_edge(self.curr.bid, after.bid, inverted)
            self.curr = self.add_edge(self.curr.bid, self.new_block().bid, node.test)
            self.populate_body(node.body, guard.bid)
        else:
            orelse = self.new_block()
            self.add_edge(self.curr.bid, orelse.bid, inverted)
            self.curr = self.add_edge(self.curr.bid, self.new_block().bid, node.test)
            self.populate_body(node.body, guard.bid)
            self.curr = orelse
            for child in node.orelse:
                self.visit(child)
            self.add_edge(orelse.bid, after.bid)
        self.curr = after
        self.loop_stack.pop()

    def visit_Yield(self, node: ast.Yield) -> None:
        self.curr = self.add_edge(self.curr.bid, self.new_block().bid)


# ----------------------------------------------------------------------------------------------------------------
# Serialization: the official traverse_print, with fragment bookkeeping


@dataclass
class _Piece:
    text: str
    frags: list[tuple[int, str, ast.AST]]  # (offset in text, snippet, stmt node it was rendered from)


class _Printer:
    def __init__(self) -> None:
        self.visited: set[int] = set()
        self.rendered: set[int] = set()

    def stmt_code(self, stmt: ast.AST) -> str:
        """One statement as the official ``stmts_to_code`` renders it (compound statements: header only)."""
        self.rendered.update(id(n) for n in ast.walk(stmt))
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            return _def_line(stmt)
        if isinstance(stmt, _COMPOUND) or (isinstance(stmt, ast.Try) and not stmt.body):
            return _first_line(stmt)
        return _unparse(stmt)

    def serialize(self, cfg: _CFG) -> list[_Piece]:
        source: list[_Piece] = []
        self._traverse(cfg, cfg.start, source)
        for name, sub in cfg.func_cfgs.items():
            sub_source = [p for p in self.serialize(sub) if p.text.strip()]
            if sub_source:
                head = f"\n\n#ENTER FUNCTION# {name}{{\n"
                first = sub_source[0]
                sub_source[0] = _Piece(head + first.text, [(o + len(head), s, n) for o, s, n in first.frags])
                last = sub_source[-1]
                sub_source[-1] = _Piece(last.text.rstrip().rstrip("$") + "} #EXIT FUNCTION#$", last.frags)
            source += sub_source
        return source

    def _run_piece(self, stmts: list[ast.AST], *, suffix: str) -> _Piece:
        codes = [self.stmt_code(s) for s in stmts]
        if len(stmts) == 1:
            return _Piece(f"RUN `{codes[0]}`{suffix}", [(5, codes[0], stmts[0])])
        frags, offset = [], len("RUN [\n")
        for code, stmt in zip(codes, stmts):
            frags.append((offset, code, stmt))
            offset += len(code) + 1
        return _Piece("RUN [\n" + "\n".join(codes) + "\n]" + suffix, frags)

    def _traverse(self, cfg: _CFG, block: _Block, source: list[_Piece]) -> None:
        if block.bid in self.visited:
            return
        self.visited.add(block.bid)
        if len(block.next) > 2:
            raise CFGError("Too many children")
        if len(block.next) == 2:
            if not block.stmts:
                raise CFGError("a branching block without statements")
            last = block.stmts[-1]
            if len(block.stmts) > 1:
                if not isinstance(last, ast.If | ast.For | ast.While):
                    raise CFGError(f"a branching block ends with {type(last).__name__}")
                if len(block.stmts) == 2:
                    source.append(_Piece(f"RUN `{_unparse(block.stmts[0]).strip()}`\n$", []))
                    source[-1].frags.append((5, source[-1].text[5:-3], block.stmts[0]))
                else:
                    source.append(self._run_piece(block.stmts[:-1], suffix="$"))
            header = self.stmt_code(last).rstrip(":")
            code = f"`{header}`"
            true_false = [0, 1]
            try:
                e0, e1 = cfg.edges[(block.bid, block.next[0])], cfg.edges[(block.bid, block.next[1])]
            except KeyError as e:
                raise CFGError(f"missing edge {e}") from None
            if e0 is not None and e1 is not None:
                t0, t1 = _edge_text(e0, self.rendered), _edge_text(e1, self.rendered)
                if t0 in code and t1 in code:
                    if t0 in t1:
                        true_false = [1, 0]
                elif t0 not in code and t1 in code:
                    true_false = [1, 0]
            yes, no = cfg.blocks[block.next[true_false[0]]], cfg.blocks[block.next[true_false[1]]]
            frag = (None, header, last)
            if isinstance(block.stmts[0], ast.For | ast.While):
                begin = "#LOOP BEGIN# If looping Condition "
                end = "#LOOP END# If not satisfying the looping Condition "
                source.append(
                    _Piece(begin + code + " is satisfied, then enter the loop:\n$", [(len(begin) + 1, *frag[1:])])
                )
                self._traverse(cfg, yes, source)
                source.append(_Piece(end + code + ", then jump out of the loop.\n$", [(len(end) + 1, *frag[1:])]))
                self._traverse(cfg, no, source)
            else:
                begin = "#BRANCH# If Condition "
                other = "#BRANCH# Otherwise, when Condition "
                source.append(_Piece(begin + code + " is satisfied, then ", [(len(begin) + 1, *frag[1:])]))
                self._traverse(cfg, yes, source)
                source.append(_Piece(other + code + " is not satisfied, then ", [(len(other) + 1, *frag[1:])]))
                self._traverse(cfg, no, source)
        else:
            if block.stmts:
                source.append(self._run_piece(block.stmts, suffix="\n$"))
            else:
                source.append(_Piece("RUN ``\n$", []))
            for next_bid in block.next:
                self._traverse(cfg, cfg.blocks[next_bid], source)


def _fragment(snippet: str, stmt: ast.AST, origin: dict[int, tuple[str, ast.AST]], paths: dict) -> Fragment:
    """Map a rendered snippet back to the program node it came from."""
    kind, owner = origin.get(id(stmt), (None, stmt))
    if kind is None:
        if isinstance(stmt, ast.If):
            kind = "if"
        elif isinstance(stmt, ast.While):
            kind = "while"
        elif isinstance(stmt, ast.For | ast.AsyncFor):
            kind = "for"
        elif isinstance(stmt, ast.stmt) and not isinstance(
            stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
        ):
            kind = "stmt" if "\n" not in snippet else "opaque"
        else:
            kind = "opaque"
    path = paths.get(id(owner))
    if path is None or kind == "opaque":
        return Fragment(snippet, "opaque")
    return Fragment(snippet, kind, path)


def cfg_units(program: str | Program, entry_point: str | None = None) -> list[LogicUnit]:
    """The official CFG logic units of a program (``cfg_to_natural_language(build_from_file(...), entry_point)``).

    Post-processing as in the official code: when `entry_point` is given and the first unit is its definition
    (``RUN `[DEFINE FUNCTION] entry(...)```), that unit is dropped; only when `entry_point` is None (the math path)
    and the whole program is one ``RUN [...]`` block of more than 9 lines, it is split into three ``RUN [:`` chunks.

    Args:
        program (`str | Program`): source code or a parsed `Program`.
        entry_point (`str`, *optional*): name of the function under test (code tasks).

    Returns:
        `list[LogicUnit]`: unit strings with their fragments.

    Raises:
        `CFGError`: when the graph cannot be built or serialized (e.g. a block with more than two successors).
    """
    prog = program if isinstance(program, Program) else Program.parse(program)
    origin: dict[int, tuple[str, ast.AST]] = {}
    try:
        cfg = _Builder(itertools.count(1), origin).build("program", prog.tree)
        pieces = _Printer().serialize(cfg)
    except CFGError:
        raise
    except (RecursionError, AssertionError, AttributeError, TypeError, IndexError, KeyError) as e:
        raise CFGError(f"{type(e).__name__}: {e}") from None
    paths = _node_paths(prog.tree)

    joined, frag_at = "", []
    for piece in pieces:
        for offset, snippet, stmt in piece.frags:
            frag_at.append((len(joined) + offset, snippet, stmt))
        joined += piece.text
    units: list[LogicUnit] = []
    start = 0
    for segment in joined.split("$"):
        end = start + len(segment)
        text = segment.strip()
        if text:
            lead = len(segment) - len(segment.lstrip())
            frags = tuple(_fragment(s, n, origin, paths) for o, s, n in frag_at if start + lead <= o < end)
            units.append(_checked(text, frags))
        start = end + 1

    if entry_point is not None:
        if units and units[0].text.startswith(f"RUN `[DEFINE FUNCTION] {entry_point}"):
            return units[1:]
    elif len(units) == 1:
        only = units[0]
        lines = only.text.splitlines()
        if len(lines) > 9 and only.text.startswith("RUN ["):
            block = lines[1:-1]
            div = math.ceil(len(lines) / 3)
            chunks = [block[:div], block[div : 2 * div], block[2 * div :]]
            frags, out = list(only.fragments), []
            for chunk in chunks:
                n = len([line for line in chunk if line.strip()])
                out.append(_checked("RUN [:\n" + "\n".join(chunk) + "\n]", tuple(frags[:n]) if frags else ()))
                frags = frags[n:]
            return out
    return units


def _checked(text: str, frags: tuple[Fragment, ...], mode: str = "cfg") -> LogicUnit:
    """A unit whose fragments agree with what `text_fragments` reads from its text (else it cannot be fixed)."""
    if [f.text for f in frags] != text_fragments(text, mode):
        return LogicUnit(text, ())
    return LogicUnit(text, frags)


# ----------------------------------------------------------------------------------------------------------------
# Line units, whole-program unit, fallback


def _line_fragments(prog: Program) -> list[Fragment]:
    """One fragment per non-empty line of the normalised source, mapped to the statement that starts there."""
    paths = _node_paths(prog.tree)
    starts: dict[int, ast.AST] = {}
    for node in ast.walk(prog.tree):
        if isinstance(node, ast.stmt):
            starts.setdefault(node.lineno, node)
    frags = []
    for lineno, line in enumerate(prog.source.splitlines(), start=1):
        text = line.strip()
        if not text:
            continue
        node = starts.get(lineno)
        kind = "opaque"
        elif_ = False
        if node is not None:
            if isinstance(node, ast.If):
                kind, elif_ = "if", text.startswith("elif ")
            elif isinstance(node, ast.While):
                kind = "while"
            elif isinstance(node, ast.For | ast.AsyncFor):
                kind = "for"
            elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Try | ast.With):
                kind = "stmt"
        # "else:" / "try:" lines carry no statement of their own
        if kind != "opaque" and text in ("else:", "try:", "finally:"):
            kind = "opaque"
        frags.append(Fragment(text, kind, paths[id(node)] if kind != "opaque" else (), elif_))
    return frags


def line_units(program: str | Program) -> list[LogicUnit]:
    """The official line-by-line ablation: every stripped, non-empty line of the program is a unit."""
    prog = program if isinstance(program, Program) else Program.parse(program)
    return [LogicUnit(f.text, (f,)) for f in _line_fragments(prog)]


def whole_unit(program: str | Program) -> list[LogicUnit]:
    """The whole program as one ``RUN [...]`` unit (lmlab's whole-program refine baseline, indentation kept)."""
    prog = program if isinstance(program, Program) else Program.parse(program)
    return [_checked("RUN [\n" + prog.source + "\n]", tuple(_line_fragments(prog)))]


def split_thirds(program: str | Program) -> list[LogicUnit]:
    """The official fallback when the CFG cannot be built: the program's lines in three ``RUN [...]`` chunks."""
    prog = program if isinstance(program, Program) else Program.parse(program)
    frags = _line_fragments(prog)
    third, remainder = len(frags) // 3, len(frags) % 3
    cuts = [0, third, 2 * third + (remainder >= 1), len(frags)]
    out = []
    for a, b in itertools.pairwise(cuts):
        chunk = tuple(frags[a:b])
        out.append(_checked("RUN [\n" + "\n".join(f.text for f in chunk) + "\n]", chunk))
    return out


def extract_units(
    program: str | Program, mode: str = "cfg", entry_point: str | None = None
) -> tuple[list[LogicUnit], str]:
    """Units of a program in one of `UNIT_MODES`, with the line-split fallback for ``cfg``.

    Returns:
        `(units, used)`: the units and the mode actually used (``"thirds"`` when the CFG failed or gave no unit).
    """
    if mode not in UNIT_MODES:
        raise ValueError(f"mode must be one of {', '.join(UNIT_MODES)}, got {mode!r}")
    prog = program if isinstance(program, Program) else Program.parse(program)
    if mode == "line":
        return line_units(prog), "line"
    if mode == "whole":
        return whole_unit(prog), "whole"
    try:
        units = cfg_units(prog, entry_point)
    except CFGError:
        units = []
    if not units:
        return split_thirds(prog), "thirds"
    return units, "cfg"


# ----------------------------------------------------------------------------------------------------------------
# Writing a corrected unit back into the program


def _parse_stmt(text: str) -> ast.AST | None:
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return None
    return body[0] if len(body) == 1 else None


def _parse_header(text: str, keyword: str) -> ast.AST | None:
    text = text.strip().rstrip(":").strip()
    if text.startswith("elif "):
        text = text[2:]
    if not text.startswith(keyword + " "):
        return None
    node = _parse_stmt(text + ":\n    pass")
    expected = {"if": ast.If, "while": ast.While, "for": ast.For}[keyword]
    return node if isinstance(node, expected) else None


def _write(tree: ast.Module, frag: Fragment, new: str) -> bool:
    """Write snippet `new` into the node `frag` points to, in place. False when it does not fit."""
    owner = _follow(tree, frag.path)
    kind = frag.kind
    if kind in ("if", "while", "comp_if", "ifexp_test"):
        node = _parse_header(new, "while" if kind == "while" else "if")
        if node is None:
            return False
        if kind == "comp_if":
            # several `if`s of one generator were shown joined by `and`: split them back when the count still fits
            test = node.test
            split = (
                isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and len(test.values) == len(owner.ifs)
            )
            owner.ifs = list(test.values) if split and len(owner.ifs) > 1 else [test]
        else:
            owner.test = node.test
        return True
    if kind in ("for", "comp_for"):
        node = _parse_header(new, "for")
        if node is None:
            return False
        owner.target, owner.iter = node.target, node.iter
        return True
    node = _parse_stmt(new)
    if node is None:
        return False
    if kind == "stmt":
        if isinstance(node, _COMPOUND) or not isinstance(node, ast.stmt):
            return False
        parent = _follow(tree, frag.path[:-1])
        name, index = frag.path[-1]
        getattr(parent, name)[index] = node
        return True
    if kind in ("ifexp_body", "ifexp_orelse"):
        if not isinstance(node, ast.Return) or node.value is None:
            return False
        setattr(owner, "body" if kind == "ifexp_body" else "orelse", node.value)
        return True
    if kind == "comp_elt":
        if not isinstance(node, ast.Expr):
            return False
        value = node.value
        # "x.append(e)" / "x.add(e)" carry the element as the only argument; a bare element is itself
        if isinstance(owner, ast.ListComp | ast.SetComp) and isinstance(value, ast.Call) and len(value.args) == 1:
            if isinstance(value.func, ast.Attribute) and value.func.attr in ("append", "add"):
                value = value.args[0]
        owner.elt = value
        return True
    if kind == "comp_kv":
        if not isinstance(node, ast.Assign) or not isinstance(node.targets[0], ast.Subscript):
            return False
        owner.key, owner.value = node.targets[0].slice, node.value
        return True
    return False


def apply_fixes(
    program: str | Program, fixes: Sequence[tuple[LogicUnit, str]], mode: str = "cfg"
) -> tuple[str, list[bool]]:
    """Write corrected units back into a program (the deterministic synthesis).

    Only fragments whose text changed are written, so a unit judged correct changes nothing, and two units that
    share a node (a loop's BEGIN and END) do not undo each other.

    Args:
        program (`str | Program`): the program the units were extracted from.
        fixes (`Sequence[tuple[LogicUnit, str]]`): ``(unit, corrected unit string)`` pairs, applied in order.
        mode (`str`, defaults to ``"cfg"``): how to read fragments from the corrected strings (see `text_fragments`).

    Returns:
        `(source, applied)`: the new normalised source, and per fix whether it could be written back (a corrected
        unit with a different number of fragments, an unparsable snippet or an opaque fragment is skipped whole).
    """
    prog = program if isinstance(program, Program) else Program.parse(program)
    tree = copy.deepcopy(prog.tree)
    applied = []
    for unit, fixed in fixes:
        new = text_fragments(fixed, "line" if mode == "line" else "cfg")
        old = unit.fragments
        if fixed.strip() == unit.text.strip():
            applied.append(True)
            continue
        if not old or len(new) != len(old):
            applied.append(False)
            continue
        trial = copy.deepcopy(tree)
        ok = True
        for frag, snippet in zip(old, new):
            if snippet == frag.text:
                continue
            if frag.kind == "opaque" or not _write(trial, frag, snippet):
                ok = False
                break
        if ok:
            try:
                ast.parse(_unparse(trial))
            except (SyntaxError, ValueError, AttributeError, TypeError):
                ok = False
        if ok:
            tree = trial
        applied.append(ok)
    return _unparse(tree), applied


def apply_fix(program: str | Program, unit: LogicUnit, fixed: str, mode: str = "cfg") -> str | None:
    """`program` with one corrected unit written back, or None when it cannot be."""
    source, (ok,) = apply_fixes(program, [(unit, fixed)], mode)
    return source if ok else None
