"""The bounds pass: memory safety proven before any code is generated (see loopir/bounds.py).

Every load and store is checked by isl for all sizes. Proven accesses cost nothing at run time;
a disproved one (or a read of a temporary nothing wrote) makes the build fail with a
`BoundsError` and its witness; an access isl cannot decide (a non-affine index such as
`x[idx[i]]`) is guarded: its statement runs under `if (0 <= index < extent)` for each such
access, so an instance whose index falls outside the buffer is skipped (its element is left
unwritten). That choice is stated in the module's notes (`mod.notes`), never silent.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from contextvars import ContextVar

import islpy as isl

from loopir.bounds import Access, BoundsError, SizePrecondition, analyse, check_initialized
from loopir.nodes import Expr, If, Load, Logical, Program, Select, Stmt, Store, const
from loopir.printer import expr_str
from loopir.visit import Transformer, map_stmts, substitute

__all__ = ["prove_bounds", "notes_for", "preconditions_for", "DEFER_INIT_CHECK", "refuse_uninitialized"]

# True while a build speculates (codegen.build._speculate): the initialisation check, which only refuses and never
# changes the program, is left out of the lowering that NVRTC waits for; the build runs it (`refuse_uninitialized`)
# on the confirmed program while NVRTC works, before it returns the module
DEFER_INIT_CHECK: ContextVar[bool] = ContextVar("DEFER_INIT_CHECK", default=False)

_NOTES: OrderedDict[int, tuple[Program, tuple[str, ...], tuple[SizePrecondition, ...]]] = OrderedDict()
_lock = threading.Lock()


def notes_for(program: Program) -> tuple[str, ...]:
    """The notes `prove_bounds` left about `program` (the program it returned)."""
    with _lock:
        hit = _NOTES.get(id(program))
    return hit[1] if hit is not None and hit[0] is program else ()


def preconditions_for(program: Program) -> tuple[SizePrecondition, ...]:
    """The size preconditions `prove_bounds` found for `program`: the modules check them at each call."""
    with _lock:
        hit = _NOTES.get(id(program))
    return hit[2] if hit is not None and hit[0] is program else ()


def _remember(program: Program, notes: list[str], pre: tuple[SizePrecondition, ...] = ()) -> None:
    with _lock:
        _NOTES[id(program)] = (program, tuple(notes), pre)
        while len(_NOTES) > 256:
            _NOTES.popitem(last=False)


def _in_bounds(acc: Access) -> Expr:
    conds: list[Expr] = []
    for i, d in zip(acc.indices, acc.buffer.shape):
        conds += [i >= const(0, i.dtype), i < d]
    out = conds[0]
    for c in conds[1:]:
        out = Logical("and", out, c)
    return out


def _guard_loads(e: Expr, reads: list[Access]) -> Expr:
    """`e` with each listed load `B[f]` replaced by `select(0 <= f < shape, B[f], 0)` (the renderers branch)."""
    keys = {(id(a.buffer), a.indices) for a in reads}

    class _G(Transformer):
        def visit_Load(self, ld: Load) -> Expr:
            inner = self.generic(ld)
            if (id(ld.buffer), ld.indices) not in keys:
                return inner
            acc = next(a for a in reads if a.buffer is ld.buffer and a.indices == ld.indices)
            return Select(_in_bounds(acc), inner, const(0, ld.dtype), ld.dtype)

    return _G().visit(e)


def prove_bounds(program: Program) -> Program:
    """Refuse out-of-bounds accesses and uninitialised reads (witness); guard accesses isl cannot decide."""
    # safe iff for every access S[i] -> B[f(i)]: f(domain(S)) ⊆ [0, shape(B)) under sizes >= 0, and every read
    # of a temporary has an earlier write of its element (no-source set of the flow analysis empty); an access
    # that leaves its buffer only when some size is below loopir.bounds.LARGE becomes a per-call precondition
    try:
        report = analyse(program, initialized=not DEFER_INIT_CHECK.get())
    except isl.Error as e:  # isl gave up (a model beyond it): say so rather than fail the build obscurely
        note = f"the bounds proof could not run (isl: {e}); no access of this program is proven in bounds"
        _remember(program, [note])
        return program
    if report.witness is not None:
        raise BoundsError(report.witness)
    notes = list(report.notes)
    by_stmt: dict[int, list[Access]] = {}
    for acc in report.unknown:
        by_stmt.setdefault(id(acc.store), []).append(acc)
        idx = ", ".join(expr_str(i) for i in acc.indices)
        ext = ", ".join(expr_str(d) for d in acc.buffer.shape)
        what = ("the instance is skipped (its element left unwritten)" if acc.access == "writes"
                else "the load reads 0 instead")
        notes.append(f"statement {acc.statement} {acc.access} {acc.buffer.name}[{idx}] at an index isl cannot "
                     f"bound ({acc.reason}): guarded at run time; where the index falls outside "
                     f"{acc.buffer.name} ({ext}), {what}")
    new = program
    if by_stmt:
        def guard(s: Stmt) -> Stmt | None:
            accs = by_stmt.get(id(s)) if isinstance(s, Store) else None
            if not accs:
                return None
            assert isinstance(s, Store)
            reads = [a for a in accs if a.access == "reads"]
            st = s
            if reads:
                st = dataclasses.replace(s, value=_guard_loads(s.value, reads),
                                         indices=tuple(_guard_loads(i, reads) for i in s.indices))
            writes = [a for a in accs if a.access == "writes"]
            if not writes:
                return st
            return If(substitute(_in_bounds(dataclasses.replace(writes[0], indices=st.indices)),
                                 dict(zip(s.iters, s.coords))), st)

        new = dataclasses.replace(program, body=map_stmts(program.body, guard))
    if notes or report.precondition is not None:
        _remember(new, notes, () if report.precondition is None else (report.precondition,))
    return new


def refuse_uninitialized(program: Program) -> list[str]:
    """`prove_bounds`'s initialisation check alone (a program lowered under DEFER_INIT_CHECK): BoundsError with
    the witness, else the notes it leaves."""
    notes: list[str] = []
    try:
        witness = check_initialized(program, notes)
    except isl.Error as e:  # as prove_bounds says it
        return [f"the initialisation check could not run (isl: {e}); reads of temporaries are not proven initialised"]
    if witness is not None:
        raise BoundsError(witness)
    return notes
