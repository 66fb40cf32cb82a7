"""CFG logic units: the official control-flow-graph serializer (``traverse_print``), with fragment bookkeeping.

RaLU's logic units are a staticfg-style control-flow graph (basic blocks, If/For/While edges, called functions; built
by `lmlab.methods.decoding.ralu.cfg_build`) serialized into natural-language-like unit strings separated by ``$``:

- basic blocks: ``RUN [ <statements> ]`` or ``RUN `stmt```;
- branches: ``#BRANCH# If Condition `c` is satisfied, then ...`` and
  ``#BRANCH# Otherwise, when Condition `c` is not satisfied, then ...``;
- loops: ``#LOOP BEGIN# If looping Condition `c` is satisfied, then enter the loop:`` and
  ``#LOOP END# If not satisfying the looping Condition `c`, then jump out of the loop.``;
- defined functions: ``#ENTER FUNCTION# name{ ... } #EXIT FUNCTION#``.

This module is lmlab's own implementation of the serializer of the official ``src/cfg/cfg.py``
(github.com/DeepAccept/RaLU). It keeps the official traversal, so it also keeps its quirks: a join block is printed
under the first branch that reaches it (so an ``Otherwise`` unit can be empty and runs into the next unit). Each unit
also carries its fragments, mapped back to the program node each snippet came from.
"""

from __future__ import annotations

import ast
import itertools
import math
from dataclasses import dataclass

from lmlab.methods.decoding.ralu.cfg_build import _CFG, CFGError, _Block, _Builder
from lmlab.methods.decoding.ralu.program import (
    _COMPOUND,
    _PAREN_EXPR,
    Fragment,
    LogicUnit,
    Program,
    _checked,
    _node_paths,
    _unparse,
)

__all__ = ["cfg_units"]


# ----------------------------------------------------------------------------------------------------------------
# Serialization: the official traverse_print, with fragment bookkeeping


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
