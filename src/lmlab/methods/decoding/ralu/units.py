"""The unit modes of a program (CFG, line, whole, the thirds fallback) and writing corrected units back.

`extract_units` is the entry point: ``cfg`` gives the official CFG units (`lmlab.methods.decoding.ralu.cfg`), falling
back to the official split into three chunks (`split_thirds`) when the graph cannot be built; ``line`` is the
official line-by-line ablation and ``whole`` lmlab's whole-program unit. `apply_fixes` writes corrected units back
into the program through their fragments: the deterministic synthesis that replaces the official LLM rewrite at
small scale.
"""

from __future__ import annotations

import ast
import copy
import itertools
from collections.abc import Sequence

from lmlab.methods.decoding.ralu.cfg import cfg_units
from lmlab.methods.decoding.ralu.cfg_build import CFGError
from lmlab.methods.decoding.ralu.program import (
    _COMPOUND,
    Fragment,
    LogicUnit,
    Program,
    _checked,
    _follow,
    _node_paths,
    _unparse,
    text_fragments,
)

__all__ = [
    "apply_fix",
    "apply_fixes",
    "extract_units",
    "line_units",
    "split_thirds",
    "whole_unit",
]

UNIT_MODES: tuple[str, ...] = ("cfg", "line", "whole")


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
