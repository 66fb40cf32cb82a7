"""The control-flow graph of a program: lmlab's port of the official staticfg-derived builder (``CFGVisitor``).

This is lmlab's own implementation of the graph construction of the official ``src/cfg/cfg_build.py``
(github.com/DeepAccept/RaLU), written on the standard library. It keeps the official traversal, so it also keeps its
quirks, which shape the unit strings a judge sees (`lmlab.methods.decoding.ralu.cfg` serializes the graph): list/set/
dict comprehensions assigned to a name are desugared into loops (the last generator outermost), ``return a if c else
b`` becomes a branch, ``continue``/``del``/``global`` leave no trace, and the loop stack is never popped after a
``for``. Every synthetic node the desugaring makes is recorded with the program node it stands for, so its snippet
can still be written back.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CFGError"]


class CFGError(ValueError):
    """The control-flow graph could not be built or serialized (the official builder raises here too)."""


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
