"""Size substitution: the same te graph, or the same loop-IR program, with some size variables replaced.

    n = te.var("n"); n16 = te.var("n16")
    new = substitute_sizes([y], {n: 16 * n16})   # {old tensor: new tensor} for every stage reachable
    y16 = new[y]                                   # y over (16*n16,), reading x over (16*n16,)

Call-time shape specialization (codegen.specialize) builds its variants so: a size known to be 1
becomes the constant 1, a size known to be a multiple of 16 becomes `16 * n16`, and the scheduler
then sees constants and provable multiples instead of a bare symbol. The original graph is left
untouched (tensors are not mutated); every tensor reachable from the outputs gets a new buffer with
the substituted shape, and every load is redirected to the new buffers. Loop and reduce variables
are kept (they are the stages' own and stay unique per stage).

`substitute_program_sizes(program, {n: 16 * n16})` does the same to a scheduled program (a hand-made
schedule is specialized without rescheduling): every expression, and every buffer's shape (each buffer
replaced by one new buffer wherever it appears: arguments, temporaries, loads, stores, allocations).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from .errors import ArgumentError, ArgumentTypeError
import dataclasses

from .nodes import Allocate, Buffer, Const, Expr, Load, Program, Stmt, Store, Var
from .te import ComputeOp, PlaceholderOp, Reduce, Tensor
from .te_reduce import ReduceCall, TupleReduce, tuple_reduce
from .visit import Transformer, free_vars

__all__ = ["cut_at", "substitute_sizes", "substitute_program_sizes", "replace_buffers", "stages_of"]


def stages_of(outputs: Sequence[Tensor], stop: Sequence[Tensor] = ()) -> list[Tensor]:
    """Every tensor reachable from `outputs` (inputs first: a producer precedes its consumers), not going past
    the tensors of `stop` (listed, their inputs not followed)."""
    halt = {id(t) for t in stop}
    order: list[Tensor] = []
    seen: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(t, False) for t in reversed(list(outputs))]
    while stack:  # iterative post-order: long stage chains must not exhaust the recursion limit
        t, done = stack.pop()
        if done:
            if id(t) not in seen:
                seen.add(id(t))
                order.append(t)
            continue
        if id(t) in seen:
            continue
        stack.append((t, True))
        if id(t) in halt:
            continue
        for i in reversed(t.op.inputs):
            if id(i) not in seen:
                stack.append((i, False))
    return order


class _Subst(Transformer):
    def __init__(self, sizes: Mapping[Var, Expr], tensors: dict[int, Tensor]) -> None:
        self.sizes = sizes
        self.tensors = tensors  # id(old buffer) -> new tensor

    def visit_Var(self, v: Var) -> Expr:
        return self.sizes.get(v, v)

    def visit_Load(self, e: Load) -> Expr:
        idx = tuple(self.visit(i) for i in e.indices)
        new = self.tensors.get(id(e.buffer))
        buf = e.buffer if new is None else new.buffer
        if buf is e.buffer and all(a is b for a, b in zip(idx, e.indices)):
            return e
        return Load(buf, idx)

    def visit_Reduce(self, r: Reduce) -> Expr:
        body = self.visit(r.body)
        return r if body is r.body else Reduce(r.op, body, r.axis, r.dtype)

    def visit_TupleReduce(self, r: TupleReduce) -> Expr:
        # the components of one reducer call share one new call (its combine reads the operands' tensors too)
        assert r.call is not None
        calls = self.__dict__.setdefault("calls", {})
        call = calls.get(id(r.call))
        if call is None:
            c = r.call
            call = calls[id(r.call)] = ReduceCall(c.reducer, c.accs, tuple(self.visit(e) for e in c.combined),
                                                  c.identity, c.order)
        return tuple_reduce(call, tuple(self.visit(o) for o in r.operands), r.axis, r.index)


def _checked(sizes: Mapping[Var, Expr | int]) -> dict[Var, Expr]:
    """`sizes` as {Var: Expr}; ArgumentTypeError for a key that is not a Var or a value that is neither
    an int nor an integer expression, ArgumentError for a negative constant size."""
    sub: dict[Var, Expr] = {}
    for v, e in sizes.items():
        if not isinstance(v, Var):
            raise ArgumentTypeError(f"substitute_sizes: keys must be size variables (te.var), got {v!r}")
        if isinstance(e, bool) or not isinstance(e, (int, Expr)):
            raise ArgumentTypeError(f"substitute_sizes: size {v.name!r} must become an int or an integer "
                                    f"expression, got {type(e).__name__} {e!r}")
        if isinstance(e, int):
            if e < 0:
                raise ArgumentError(f"substitute_sizes: size {v.name!r} cannot be negative, got {e}")
            sub[v] = Const(e, "int64")
        else:
            sub[v] = e
    return sub


def substitute_sizes(outputs: Sequence[Tensor], sizes: Mapping[Var, Expr | int]) -> dict[Tensor, Tensor]:
    """{old: new} for every tensor reachable from `outputs`, with the size variables of `sizes`
    (Var -> integer expression or int) replaced in shapes, bodies and reduction bounds.

    ArgumentTypeError for a key that is not a Var or a value that is neither an int nor an integer
    expression; ArgumentError for a negative constant size."""
    sub = _checked(sizes)
    out: dict[Tensor, Tensor] = {}
    by_buf: dict[int, Tensor] = {}
    tr = _Subst(sub, by_buf)
    for t in stages_of(outputs):
        if t in out:
            continue  # an output of a multi-output stage made with its first one
        shape = tuple(tr.visit(d) for d in t.shape)
        op = t.op
        if isinstance(op, PlaceholderOp):
            new_op: PlaceholderOp | ComputeOp = PlaceholderOp(op.name)
        else:
            assert isinstance(op, ComputeOp)
            new_op = ComputeOp(op.name, op.axis, tr.visit(op.body), op.reduce_axis,
                               tuple((tr.visit(lo), tr.visit(hi)) for lo, hi in op.reduce_dom),
                               tuple(out[i] for i in op.inputs))
            if op.outputs:  # a multi-output stage (te_reduce): one new op, every output rebuilt on it
                new_op.bodies = tuple(tr.visit(b) for b in op.bodies)
                new_op.body = new_op.bodies[0]
                for o in op.outputs:
                    n = Tensor(o.name, shape, o.dtype, new_op)
                    n.value_index = o.value_index
                    out[o] = n
                    by_buf[id(o.buffer)] = n
                new_op.outputs = tuple(out[o] for o in op.outputs)
                continue
        new = Tensor(t.name, shape, t.dtype, new_op)
        out[t] = new
        by_buf[id(t.buffer)] = new
    return out



def cut_at(output: Tensor, cuts: Sequence[Tensor]) -> tuple[Tensor, list[Tensor]]:
    """The stages computing `output` from the tensors `cuts` as a graph of its own: each cut tensor it reads
    (and each input) becomes a placeholder of the same name, shape and dtype; returns (the new output, its
    placeholders in the order first read). What a user writing one operator at a time has (one `build` per
    operator, the activations passed between them). The sizes are the same variables."""
    others = [c for c in cuts if c is not output]
    stop = {id(c) for c in others}
    order = stages_of([output], others)
    by_buf: dict[int, Tensor] = {}
    new: dict[int, Tensor] = {}
    tr = _Subst({}, by_buf)
    inputs: list[Tensor] = []
    for t in order:
        op = t.op
        if id(t) in stop or isinstance(op, PlaceholderOp):
            n = Tensor(t.name, t.shape, t.dtype, PlaceholderOp(t.name))
            inputs.append(n)
        else:
            if not isinstance(op, ComputeOp) or op.outputs:
                raise ArgumentError(f"cut_at: stage {t.name!r} is not a single-output compute stage")
            n = Tensor(t.name, t.shape, t.dtype, ComputeOp(op.name, op.axis, tr.visit(op.body), op.reduce_axis,
                                                           op.reduce_dom, tuple(new[id(i)] for i in op.inputs)))
        new[id(t)] = n
        by_buf[id(t.buffer)] = n
    return new[id(output)], inputs


class _BufferSwap(Transformer):
    """Every load, store and allocation of a buffer `b` rewritten to `buffer(b)` (`b` itself: unchanged)."""

    def buffer(self, b: Buffer) -> Buffer:
        return b

    def visit_Load(self, e: Load) -> Expr:
        out = self.generic(e)
        buf = self.buffer(e.buffer)
        return out if buf is e.buffer else dataclasses.replace(out, buffer=buf)

    def visit_Store(self, s: Store) -> Store:
        out = self.generic(s)
        buf = self.buffer(s.buffer)
        return out if buf is s.buffer else dataclasses.replace(out, buffer=buf)

    def visit_Allocate(self, s: Allocate) -> Allocate:
        out = self.generic(s)
        buf = self.buffer(s.buffer)
        return out if buf is s.buffer else dataclasses.replace(out, buffer=buf)

    def program(self, p: Program) -> Program:
        """`p` with its body, arguments and temporaries rewritten."""
        return dataclasses.replace(p, body=self.visit(p.body), args=tuple(self.buffer(b) for b in p.args),
                                   temps=tuple(self.buffer(b) for b in p.temps),
                                   assume=tuple(self.visit(c) for c in p.assume))


class _ProgramSubst(_BufferSwap):
    def __init__(self, sizes: Mapping[Var, Expr]) -> None:
        self.sizes = sizes
        self.bufs: dict[int, Buffer] = {}

    def buffer(self, b: Buffer) -> Buffer:
        new = self.bufs.get(id(b))
        if new is None:
            shape = tuple(self.visit(d) for d in b.shape)
            new = b if all(x is y for x, y in zip(shape, b.shape)) else dataclasses.replace(b, shape=shape)
            self.bufs[id(b)] = new
        return new

    def visit_Var(self, v: Var) -> Expr:
        return self.sizes.get(v, v)


class _Replace(_BufferSwap):
    def __init__(self, new: Mapping[Buffer, Buffer]) -> None:
        self.new = new

    def buffer(self, b: Buffer) -> Buffer:
        return self.new.get(b, b)


_Node = TypeVar("_Node", Program, Stmt)


def replace_buffers(node: _Node, new: Mapping[Buffer, Buffer]) -> _Node:
    """`node` (a program or a statement) with each buffer of `new` replaced by its image (e.g. the same array with
    another shape or scope) in every load, store and allocation, and a program's among its arguments and
    temporaries."""
    if not new:
        return node
    tr = _Replace(new)
    return tr.program(node) if isinstance(node, Program) else tr.visit(node)  # type: ignore[return-value]


def substitute_program_sizes(program: Program, sizes: Mapping[Var, Expr | int]) -> Program:
    """`program` with the size variables of `sizes` replaced everywhere (expressions and buffer shapes);
    a replaced variable leaves `program.params`, the variables of its replacement join them when
    it had been a parameter. Errors as `substitute_sizes`."""
    sub = _checked(sizes)
    if not sub:
        return program
    new = _ProgramSubst(sub).program(program)
    params: list[Var] = []
    for v in program.params:
        for p in ([v] if v not in sub else sorted(free_vars(sub[v]), key=lambda x: x.name)):
            if p not in params:
                params.append(p)
    return dataclasses.replace(new, params=tuple(params))
