"""Loop-IR queries the LLVM emitter reads while it renders: reduction updates, size variables, the
top-level statements. (Guard tightening is a pass of the CPU pipeline: `codegen.passes.guards`.)"""

from __future__ import annotations

from loopir.nodes import (
    Binary,
    Const,
    Expr,
    For,
    Load,
    Program,
    Seq,
    Stmt,
    Store,
    Var,
)
from loopir.visit import walk

from .types import FLT


def is_reduction(st: Store) -> Binary | None:
    """The update `C[idx] = C[idx] op x` (op add/max/min) of a reduction, else None."""
    v = st.value
    if not isinstance(v, Binary) or v.op not in ("add", "max", "min") or v.dtype not in FLT:
        return None
    for side in (v.a, v.b):
        if isinstance(side, Load) and side.buffer is st.buffer and side.indices == st.indices:
            return v
    return None


def _loads(e: Expr) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load)]


def _is_parallel_top(s: Stmt) -> bool:
    # a loop bound to blockIdx has independent iterations by construction: run it in parallel too
    if not isinstance(s, For):
        return False
    return s.kind == "parallel" or (s.kind == "thread" and (s.thread or "").startswith("block"))



def size_vars(program: Program) -> tuple[Var, ...]:
    """program.params, then any other free variable (not a loop variable, not an iteration variable)."""
    bound: set[Var] = set()
    order: list[Var] = list(program.params)
    seen = set(order)
    for n in walk(program.body):
        if isinstance(n, For):
            bound.add(n.var)
        elif isinstance(n, Store):
            bound.update(n.iters)
    for b in (*program.args, *program.temps):
        for e in b.shape:
            for n in walk(e):
                if isinstance(n, Var) and n not in seen:
                    seen.add(n)
                    order.append(n)
    for n in walk(program.body):
        if isinstance(n, (Load, Store)):
            for e in n.buffer.shape:
                for m in walk(e):
                    if isinstance(m, Var) and m not in seen and m not in bound:
                        seen.add(m)
                        order.append(m)
        if isinstance(n, Var) and n not in seen and n not in bound:
            seen.add(n)
            order.append(n)
    return tuple(order)



def _const_extent(f: For) -> int | None:
    if isinstance(f.lo, Const) and isinstance(f.hi, Const):
        return max(int(f.hi.value) - int(f.lo.value), 0)
    return None



def _top_level(body: Stmt) -> list[Stmt]:
    return list(body.body) if isinstance(body, Seq) else [body]

