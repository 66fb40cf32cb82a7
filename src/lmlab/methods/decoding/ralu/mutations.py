"""Single-edit mutation operators: the injected bugs of lmlab's RaLU experiment and the candidate fixes of a unit.

The experiment replaces an LLM's first draft by HumanEval's canonical solution with one injected mutation (a
controlled stand-in; see the README). The operators are closed under inversion, so the inverse of an injected bug is
always among the mutations of the buggy snippet, and the same function provides the candidate fixes a constrained
small-model judge picks from:

- ``cmp``: ``<`` <-> ``<=`` and ``>`` <-> ``>=``;
- ``off_by_one``: an integer literal c -> c + 1, or c - 1 when c >= 1;
- ``and_or``: ``and`` <-> ``or``;
- ``swap_const``: ``True`` <-> ``False``, or two distinct literals of one type exchanged within the snippet (only
  for snippets with at most `MAX_SWAP_LITERALS` literals of that type);
- ``wrong_return``: ``return x`` -> ``return y`` for another variable y in `names`.

Everything works on code *snippets* (a unit's fragments): simple statements and the headers ``if c``, ``elif c``,
``while c`` and ``for t in it`` (with or without the trailing colon).
"""

from __future__ import annotations

import ast
import copy
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lmlab.methods.decoding.ralu.program import _code_spans, _unparse

__all__ = [
    "MAX_SWAP_LITERALS",
    "OPERATORS",
    "Mutation",
    "Site",
    "context_names",
    "injection_sites",
    "local_names",
    "mutate_snippet",
    "reachable",
    "snippet_spans",
    "unit_candidates",
]

OPERATORS: tuple[str, ...] = ("cmp", "off_by_one", "and_or", "swap_const", "wrong_return")
MAX_SWAP_LITERALS = 4

_CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_HEADER = re.compile(r"^(el)?(if|while|for)\b")


@dataclass(frozen=True)
class Mutation:
    """One mutated snippet: the operator and the new text."""

    op: str
    text: str


def _parse(snippet: str) -> tuple[ast.AST, str, bool, bool] | None:
    """``(statement, header keyword or "", was elif, had colon)`` of a snippet, or None when it does not parse."""
    text = snippet.strip()
    m = _HEADER.match(text)
    if m:
        colon = text.endswith(":")
        body = text.rstrip(":").rstrip()
        if m.group(1):
            body = body[2:]
        try:
            (node,) = ast.parse(body + ":\n    pass").body
        except (SyntaxError, ValueError):
            return None
        return node, m.group(2), bool(m.group(1)), colon
    if text.startswith(("def ", "class ", "[DEFINE FUNCTION]", "else", "try", "except", "finally", "with ")):
        return None
    try:
        body = ast.parse(text).body
    except (SyntaxError, ValueError):
        return None
    if len(body) != 1 or isinstance(body[0], ast.If | ast.For | ast.While | ast.FunctionDef | ast.ClassDef):
        return None
    return body[0], "", False, False


def _render(node: ast.AST, keyword: str, elif_: bool, colon: bool) -> str:
    if not keyword:
        return _unparse(node)
    line = _unparse(node).split("\n")[0].rstrip(":")
    if elif_:
        line = "el" + line
    return line + (":" if colon else "")


def _scope(node: ast.AST, keyword: str) -> list[ast.AST]:
    """The sub-trees a header's mutations may touch (never the placeholder body)."""
    if keyword in ("if", "while"):
        return [node.test]
    if keyword == "for":
        return [node.target, node.iter]
    return [node]


def _sites(roots: Sequence[ast.AST]) -> list[ast.AST]:
    return [n for root in roots for n in ast.walk(root)]


def mutate_snippet(snippet: str, names: Iterable[str] = ()) -> list[Mutation]:
    """Every single-edit mutation of a code snippet, deduplicated, in a fixed order.

    Args:
        snippet (`str`): a simple statement or a header (``if c``, ``elif c:``, ``while c``, ``for t in it``).
        names (`Iterable[str]`): variables a ``return x`` may be redirected to (``wrong_return``).

    Returns:
        `list[Mutation]`: mutated snippets (never the snippet itself); empty when it does not parse.
    """
    parsed = _parse(snippet)
    if parsed is None:
        return []
    node, keyword, elif_, colon = parsed
    original = _render(node, keyword, elif_, colon)
    out: list[Mutation] = []
    seen = {original, snippet.strip()}

    def emit(op: str, tree: ast.AST) -> None:
        text = _render(tree, keyword, elif_, colon)
        if text not in seen:
            seen.add(text)
            out.append(Mutation(op, text))

    def variants(op: str, select, change) -> None:
        """For each site `select` picks in a fresh copy, apply `change` (which may yield several edits)."""
        count = len([n for n in _sites(_scope(node, keyword)) if select(n)])
        for i in range(count):
            for j in itertools.count():
                tree = copy.deepcopy(node)
                site = [n for n in _sites(_scope(tree, keyword)) if select(n)][i]
                if not change(site, j):
                    break
                emit(op, tree)

    def change_cmp(site: ast.Compare, j: int) -> bool:
        idx = [k for k, o in enumerate(site.ops) if type(o) in _CMP_SWAP]
        if j >= len(idx):
            return False
        site.ops[idx[j]] = _CMP_SWAP[type(site.ops[idx[j]])]()
        return True

    variants("cmp", lambda n: isinstance(n, ast.Compare) and any(type(o) in _CMP_SWAP for o in n.ops), change_cmp)

    def is_int(n: ast.AST) -> bool:
        return isinstance(n, ast.Constant) and type(n.value) is int

    def change_int(site: ast.Constant, j: int) -> bool:
        steps = [1] + ([-1] if site.value >= 1 else [])
        if j >= len(steps):
            return False
        site.value = site.value + steps[j]
        return True

    variants("off_by_one", is_int, change_int)

    def change_boolop(site: ast.BoolOp, j: int) -> bool:
        if j:
            return False
        site.op = ast.Or() if isinstance(site.op, ast.And) else ast.And()
        return True

    variants("and_or", lambda n: isinstance(n, ast.BoolOp), change_boolop)

    def change_bool(site: ast.Constant, j: int) -> bool:
        if j:
            return False
        site.value = not site.value
        return True

    variants("swap_const", lambda n: isinstance(n, ast.Constant) and type(n.value) is bool, change_bool)

    literals = [n for n in _sites(_scope(node, keyword)) if isinstance(n, ast.Constant) and type(n.value) is not bool]
    by_type: dict[type, list[int]] = {}
    for k, n in enumerate(literals):
        if n.value is not None and n.value is not Ellipsis:
            by_type.setdefault(type(n.value), []).append(k)
    for positions in by_type.values():
        if len(positions) > MAX_SWAP_LITERALS:
            continue  # pairs grow quadratically: long literal tables are not a place for a swapped constant
        for a, b in itertools.combinations(positions, 2):
            if literals[a].value == literals[b].value:
                continue
            tree = copy.deepcopy(node)
            lits = [
                n for n in _sites(_scope(tree, keyword)) if isinstance(n, ast.Constant) and type(n.value) is not bool
            ]
            lits[a].value, lits[b].value = lits[b].value, lits[a].value
            emit("swap_const", tree)

    if isinstance(node, ast.Return) and isinstance(node.value, ast.Name):
        for other in sorted(set(names)):
            if other != node.value.id:
                tree = copy.deepcopy(node)
                tree.value.id = other
                emit("wrong_return", tree)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Unit level


def snippet_spans(unit: str) -> list[tuple[int, int]]:
    """Character spans of the code snippets of a unit string (``RUN [...]`` lines, back-ticked code, as
    `lmlab.methods.decoding.ralu.program.text_fragments` reads them); a unit with neither (a line unit) is one
    snippet."""
    spans = _code_spans(unit)
    if not spans and unit.strip():
        start = unit.index(unit.strip())
        spans.append((start, start + len(unit.strip())))
    return spans


_SIGNATURE = re.compile(r"Format of Target Function:\s*(.+)")


def context_names(texts: Iterable[str]) -> set[str]:
    """Variables visible in a conversation: assigned names, loop targets and parameters found in its code snippets,
    plus the parameters of a ``Format of Target Function: f(a, b)`` line (the official `clean_spec` writes it)."""
    names: set[str] = set()
    for text in texts:
        for m in _SIGNATURE.finditer(text):
            try:
                fn = ast.parse(f"def {m.group(1).strip().rstrip(':')}:\n    pass").body[0]
            except (SyntaxError, ValueError, IndexError):
                continue
            names.update(a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs))
        for start, end in snippet_spans(text):
            snippet = text[start:end].strip()
            if snippet.startswith("def ") or snippet.startswith("[DEFINE FUNCTION]"):
                head = snippet.replace("[DEFINE FUNCTION]", "def", 1).rstrip(":")
                try:
                    fn = ast.parse(head + ":\n    pass").body[0]
                    names.update(a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs))
                except (SyntaxError, ValueError, IndexError):
                    pass
                continue
            parsed = _parse(snippet)
            if parsed is None:
                continue
            for n in ast.walk(parsed[0]):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    names.add(n.id)
    return names


def unit_candidates(unit: str, names: Iterable[str] = ()) -> list[tuple[str, str]]:
    """Candidate fixes of a unit: the unit with one snippet replaced by one of its mutations.

    Args:
        unit (`str`): a unit string (CFG, line or whole-program).
        names (`Iterable[str]`): variables for ``wrong_return`` (see `context_names`).

    Returns:
        `list[tuple[str, str]]`: ``(operator, candidate unit string)``, deduplicated, in snippet order.
    """
    names = sorted(set(names))
    out: list[tuple[str, str]] = []
    seen = {unit}
    for start, end in snippet_spans(unit):
        for m in mutate_snippet(unit[start:end], names):
            text = unit[:start] + m.text + unit[end:]
            if text not in seen:
                seen.add(text)
                out.append((m.op, text))
    return out


# ----------------------------------------------------------------------------------------------------------------
# Injection (the experiment's controlled "first drafts")


@dataclass(frozen=True)
class Site:
    """One single-edit mutant of a program, reached through one of its CFG units.

    Attributes:
        unit_index (`int`): 1-based index of the CFG unit of the original program that was edited.
        op (`str`): the operator (one of `OPERATORS`).
        before (`str`), after (`str`): the unit string before and after the edit.
        program (`str`): the mutated program (normalised source).
    """

    unit_index: int
    op: str
    before: str
    after: str
    program: str


def local_names(program: Any, entry_point: str | None) -> set[str]:
    """Parameters and assigned names of the function `entry_point` (all functions when None)."""
    tree = program.tree if hasattr(program, "tree") else ast.parse(program)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and entry_point in (None, node.name):
            args = node.args
            names.update(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
    return names


def injection_sites(
    program: Any, entry_point: str | None, operators: Sequence[str] = OPERATORS
) -> dict[int, list[Site]]:
    """Every single-edit mutant of the entry function, grouped by the CFG unit it edits.

    Args:
        program (`Program`): the (correct) program.
        entry_point (`str`, *optional*): the function to mutate (its definition unit is not part of the units).
        operators (`Sequence[str]`): operators to use.

    Returns:
        `dict[int, list[Site]]`: unit index -> sites, in a fixed order (units without a site are absent).
    """
    from lmlab.methods.decoding.ralu.cfg import cfg_units
    from lmlab.methods.decoding.ralu.units import apply_fix

    names = local_names(program, entry_point)
    out: dict[int, list[Site]] = {}
    for k, unit in enumerate(cfg_units(program, entry_point), start=1):
        if not unit.fragments:
            continue
        for op, text in unit_candidates(unit.text, names):
            if op not in operators:
                continue
            mutated = apply_fix(program, unit, text)
            if mutated is not None and mutated != program.source:
                out.setdefault(k, []).append(Site(k, op, unit.text, text, mutated))
    return out


def reachable(mutant: Any, original: str, entry_point: str | None, spec_text: str, mode: str) -> bool:
    """Whether some unit of `mutant` (in unit `mode`) has a candidate fix that restores `original` exactly, with
    the variable names a judge would have seen up to that unit (the oracle's and the model judge's pool)."""
    from lmlab.methods.decoding.ralu.units import apply_fix, extract_units

    units, _ = extract_units(mutant, mode, entry_point)
    seen = [spec_text]
    read = "line" if mode == "line" else "cfg"
    for unit in units:
        seen.append(unit.text)
        for _, cand in unit_candidates(unit.text, context_names(seen)):
            if apply_fix(mutant, unit, cand, read) == original:
                return True
    return False
