"""Schedule: a program plus the checked steps applied to it.

    s = Schedule(C)                      # a te tensor, a list of them, or a loopir Program
    i, j, k = s.loops(C)
    io, ii = s.split(i, 32)
    s.reorder(io, j, ii).parallel(io)    # steps that return nothing return the schedule
    print(s)                             # the current nest
    s.trace_json()  ->  Schedule.replay(json_text, C)

Every step is checked exactly against the dependences of the original program (loopir.poly);
an illegal step raises ScheduleError with a witness and leaves the schedule unchanged. The checked
state is the program WITH every loop's kind: after any step, no parallel, vectorized or GPU-bound loop
may carry a dependence (so `parallel` then `reorder` is refused exactly when the reverse order is).
`s.notes` / `s.explain()` say what the schedule will not do as written (a nested parallel loop runs
serially on the CPU). A step
on a nest the analysis can only over-approximate (non-affine bounds, guards or coords, e.g.
after collapse of a symbolic extent) that it cannot prove legal raises InexactCheckError (a
ValueError: no witness is claimed), also leaving the schedule unchanged.
`Schedule(..., check=False)` skips the checks: UNSAFE — an illegal step then silently
produces a program that computes something else. It exists for experts and for testing the
checker.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from loopir import deps_shortcuts, poly, poly_model, reassoc
from loopir.bounds import BoundsError, check_bounds
from loopir.errors import ArgumentError, ArgumentTypeError, NotFoundError, NotNestedError
from loopir.lower import lower
from loopir.te_extern import refuse_extern_args
from loopir.nodes import Buffer, Const, ExternCall, For, Program, Seq, Store, Var
from loopir.target import cpu_vector_fallback
from loopir.visit import deep_recursion, statements, walk, walk_stmts

from .errors import InexactCheckError, ScheduleError, nest_str
from . import nest_scope
from .nest_scope import NestBases, changed_nest, nest_local, nest_program
from .primitives import REGISTRY, CheckContext, PrimitiveSpec, find_loop, loop_path, loop_vars

# the primitive modules: importing one registers its primitives in REGISTRY (and so as methods of Schedule)
from .primitives import annotate as _annotate  # noqa: F401
from .primitives import cache as _cache  # noqa: F401
from .primitives import cache_write as _cache_write  # noqa: F401
from .primitives import compute as _compute  # noqa: F401
from .primitives import loop_fusion as _loop_fusion  # noqa: F401
from .primitives import extents as _extents  # noqa: F401
from .primitives import loops as _loops  # noqa: F401
from .primitives import online as _online  # noqa: F401
from .primitives import rfactor as _rfactor  # noqa: F401
from .primitives import row_cache as _row_cache  # noqa: F401
from .primitives import storage as _storage  # noqa: F401
from .primitives import tensorize as _tensorize  # noqa: F401

__all__ = ["Schedule", "LoopHandle"]


class _Token:
    """The identity of one schedule (handles remember it)."""

    __slots__ = ()


@dataclass(frozen=True, eq=False)
class LoopHandle:
    """A loop of one schedule. Resolved against the schedule's current program by Var identity."""

    owner: _Token
    var: Var

    @property
    def name(self) -> str:
        return self.var.name

    def __repr__(self) -> str:
        return f"LoopHandle({self.var.name!r})"

    def __str__(self) -> str:
        return self.var.name


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "op") and hasattr(x, "buffer") and hasattr(x, "name")


class Schedule:
    """A program being scheduled. See the module docstring."""

    def __init__(self, target: Any, check: bool = True, name: str | None = None) -> None:
        if isinstance(target, Schedule):
            raise ArgumentTypeError("Schedule() takes tensors or a Program, not another Schedule; use s.program")
        if isinstance(target, Program):
            program = target
        elif isinstance(target, (list, tuple)) and not target:
            raise ArgumentError("Schedule() needs at least one tensor to schedule; got an empty list")
        elif _is_tensor(target) or (isinstance(target, (list, tuple)) and target
                                    and all(_is_tensor(t) for t in target)):
            with deep_recursion():
                program = lower(list(target) if isinstance(target, (list, tuple)) else target, name=name)
        else:
            raise ArgumentTypeError(f"Schedule() takes a te tensor, a list of tensors or a loopir Program, "
                                    f"got {type(target).__name__}")
        poly_model.register_products(program)  # products of sizes (B * T) are isl parameters of their own
        self._token = _Token()
        self._nests = NestBases()  # the bases of the nests checked alone (schedules.nest_scope)
        self._original = program
        self._program = program
        # steps never create te.extern stages: without any external call, no step needs refuse_extern_args's walk
        self._has_extern = any(isinstance(n, ExternCall) for n in walk(program.body))
        self._deps: poly.Deps | None = None
        self.check = check
        self.trace: list[dict[str, Any]] = []
        # loops that bind_reduction made cross-thread reductions -> their reduction statements (legality state:
        # those statements' self-dependences may be carried by that loop, see poly.concurrent_violation)
        self._reductions: dict[Var, frozenset[str]] = {}
        # every step since the dependences were computed was checked: the current program is then a legal
        # schedule of the analysed one (checks may derive dependences from them: deps_shortcuts.derived_dependences)
        self._checked = True
        # notes of steps that reassociated a reduction (loopir.reassoc: a float sum's rounding changes)
        self._reassociated: dict[frozenset[str], str] = {}

    # ------------------------------------------------------------------ state

    @property
    def program(self) -> Program:
        """The current program."""
        return self._program

    @property
    def original(self) -> Program:
        return self._original

    @contextlib.contextmanager
    def attempt(self) -> Iterator[Schedule]:
        """Steps that stand or fall together: when the block raises, the schedule is as it was before the block
        (program, dependences, trace, legality state) and the exception propagates. Recipes try a mapping so
        and take another when a step of it is refused::

            try:
                with s.attempt():
                    s.collapse(b, t)
                    schedule_gemm_cuda(s, "y", split_k=512)
            except LoopirError:
                schedule_gemm_cuda(s, "y")
        """
        saved = (self._program, self._original, self._deps, len(self.trace), dict(self._reductions), self._checked,
                 dict(self._reassociated))
        try:
            yield self
        except BaseException:
            (self._program, self._original, self._deps, n, reductions, self._checked, reassociated) = saved
            del self.trace[n:]
            self._reductions, self._reassociated = reductions, reassociated
            self._nests.clear()
            raise

    @property
    def deps(self) -> poly.Deps:
        """The dependences of the original program (computed once)."""
        if self._deps is None:
            self._deps = poly.dependences(self._original)
        return self._deps

    def __str__(self) -> str:
        return nest_str(self._program)

    def __repr__(self) -> str:
        return f"<Schedule of {self._program.name!r}, {len(self.trace)} step(s)>"

    @property
    def notes(self) -> list[str]:
        """What the current schedule will not do as written (e.g. a nested parallel loop run serially on the CPU)."""
        out = []
        top = self._program.body.body if isinstance(self._program.body, Seq) else (self._program.body,)
        for f in _fors(self._program):
            if f.kind == "parallel" and not any(f is t for t in top):
                path = loop_path(self._program, f.var) or []
                around = [a.var.name for a in path[:-1] if isinstance(a, For)]
                where = f"inside loop {', '.join(around)}" if around else "inside an allocation or a guard"
                out.append(f"loop {f.var.name} is parallel but {where}: the CPU target runs only the loops at the top "
                           "of the program on threads, so it runs serially there (reorder it outermost, or "
                           "collapse the loops around it into one parallel loop)")
            why = cpu_vector_fallback(f)
            if why:
                out.append(f"loop {f.var.name} is vectorize but {why}, so the CPU target does not vectorize it "
                           f"(LLVM only warns on stderr; reorder that loop outside {f.var.name}, or vectorize an "
                           "inner loop)")
        return out + list(self._reassociated.values())

    def explain(self) -> str:
        """The steps applied and the notes on the current schedule."""
        def arg(a: Any) -> str:
            return a["loop"] if isinstance(a, dict) and "loop" in a else repr(a)

        def step(t: dict[str, Any]) -> str:
            parts = [arg(a) for a in t["args"]] + [f"{n}={arg(v)}" for n, v in t.get("kwargs", {}).items()]
            return f"{t['primitive']}({', '.join(parts)})"

        lines = [f"{k + 1}. {step(t)}" for k, t in enumerate(self.trace)]
        lines += [f"note: {n}" for n in self.notes]
        plan = getattr(self, "plan", None)
        if plan is not None and hasattr(plan, "explain"):
            lines.append(plan.explain())
        return "\n".join(lines) if lines else "no steps"

    # ------------------------------------------------------------------ handles

    def loops(self, target: Any) -> tuple[LoopHandle, ...]:
        """The loops around a statement, outermost first. `target` is a te tensor, a statement
        name, or a buffer name (then the deepest statement writing it, e.g. the update of a reduction)."""
        name = target.name if (_is_tensor(target) or isinstance(target, Buffer)) else target
        if not isinstance(name, str):
            raise ArgumentTypeError(f"loops() takes a tensor or a statement name, got {type(target).__name__}")
        ctxs = statements(self._program)
        chosen = [c for c in ctxs if c.store.name == name]
        if not chosen:
            chosen = [c for c in ctxs if c.store.buffer.name == name]
        if not chosen:
            known = sorted({c.store.name for c in ctxs})
            raise NotFoundError(f"no statement or tensor named {name!r} in this schedule; "
                                f"statements: {', '.join(known)}")
        best = max(chosen, key=lambda c: len(c.loops))
        return tuple(LoopHandle(self._token, lp.var) for lp in best.loops)

    def loop(self, name: str) -> LoopHandle:
        """The loop with this name (or `name#k` for the k-th of several with that name)."""
        return LoopHandle(self._token, self._var_by_ref(name))

    def _var_by_ref(self, ref: str) -> Var:
        if not isinstance(ref, str):
            raise ArgumentTypeError(f"loop() takes a loop name (str, e.g. 'i' or 'i#1'), "
                                    f"got {type(ref).__name__} {ref!r}")
        base, _, k = ref.partition("#")
        if k and not k.isdigit():
            raise ArgumentError(f"loop reference {ref!r}: after '#' comes the index of the loop among those named "
                                f"{base!r} (0, 1, ...), got {k!r}")
        found = [v for v in loop_vars(self._program) if v.name == base]
        if not found:
            raise NotFoundError(f"no loop named {base!r} in this schedule; loops: "
                                f"{', '.join(v.name for v in loop_vars(self._program))}")
        idx = int(k) if k else 0
        if idx >= len(found):
            raise NotFoundError(f"there is no loop {ref!r}: only {len(found)} loop(s) are named {base!r}")
        return found[idx]

    def _ref(self, var: Var, program: Program | None = None) -> str:
        same = [v for v in loop_vars(program or self._program) if v.name == var.name]
        if len(same) <= 1:
            return var.name
        return f"{var.name}#{next(k for k, v in enumerate(same) if v is var)}"

    def _resolve(self, x: Any, primitive: str) -> Any:
        if isinstance(x, LoopHandle):
            if x.owner is not self._token:
                raise NotFoundError(f"{primitive}: loop {x.name!r} is a handle from another schedule")
            if not any(v is x.var for v in loop_vars(self._program)):
                raise NotFoundError(f"{primitive}: loop {x.name!r} no longer exists in this schedule "
                                    "(an earlier step replaced it; use the handles that step returned)")
            return x.var
        if isinstance(x, Var):
            if any(v is x for v in loop_vars(self._program)):
                return x
            if x in self._program.params:
                return x.name  # a size variable (assume): by its name, which the trace records
            raise NotFoundError(f"{primitive}: {x.name!r} is neither a loop nor a size variable of this schedule")
        if _is_tensor(x) or isinstance(x, Buffer):
            return x.name
        if isinstance(x, (list, tuple)):
            return type(x)(self._resolve(y, primitive) for y in x)
        return x

    def _to_json(self, x: Any) -> Any:
        if isinstance(x, Var):
            return {"loop": self._ref(x)}
        if isinstance(x, (list, tuple)):
            return [self._to_json(y) for y in x]
        if isinstance(x, (str, int, float, bool)) or x is None:
            return x
        raise ArgumentTypeError(f"cannot record argument {x!r} of type {type(x).__name__} in the trace")

    # ------------------------------------------------------------------ the primitives, for type checkers

    if TYPE_CHECKING:  # at run time _install_primitive_methods() makes these from REGISTRY (with docstrings);
        # tests/test_primitive_methods.py checks that these declarations match the registered signatures
        def assume(self, size: str, at_most: int | None = None, at_least: int | None = None) -> Schedule: ...
        def bind(self, loop: LoopHandle, axis: str) -> Schedule: ...
        def bind_reduction(self, loop: LoopHandle, axis: str = "threadIdx.x",
                           threads: int | None = None) -> LoopHandle | tuple[LoopHandle, LoopHandle]: ...
        def cache_read(self, tensor: Any, scope: str, loop: LoopHandle) -> Buffer: ...
        def cache_row(self, tensor: Any, loop: LoopHandle) -> Buffer: ...
        def rfactor(self, stage: Any, loop: LoopHandle, factor_axis: int = -1) -> Buffer: ...
        def cache_write(self, buffer: Any, scope: str, loop: LoopHandle, epilogue: Any = (),
                        hoist_init: bool = True) -> Buffer: ...
        def collapse(self, outer: LoopHandle, inner: LoopHandle) -> LoopHandle: ...
        def compute_at(self, producer: Any, loop: LoopHandle) -> Schedule: ...
        def compute_inline(self, producer: Any) -> Schedule: ...
        def fuse(self, loop_a: LoopHandle, loop_b: LoopHandle, shift: int = 0) -> LoopHandle: ...
        def online_softmax(self, max_buffer: str) -> Schedule: ...
        def pad_loop(self, loop: LoopHandle, extent: int) -> Schedule: ...
        def parallel(self, loop: LoopHandle) -> Schedule: ...
        def pragma(self, loop: LoopHandle, name: str, value: int | None = None) -> Schedule: ...
        def reorder(self, *loops: LoopHandle) -> Schedule: ...
        def sink_guard(self, loop: LoopHandle) -> Schedule: ...
        def skew(self, outer: LoopHandle, inner: LoopHandle, factor: int = 1) -> LoopHandle: ...
        def split(self, loop: LoopHandle, factor: int | None = None, nparts: int | None = None,
                  tail: str = "guard") -> tuple[LoopHandle, LoopHandle]: ...
        def tile(self, i: LoopHandle, j: LoopHandle, ti: int,
                 tj: int) -> tuple[LoopHandle, LoopHandle, LoopHandle, LoopHandle]: ...
        def unroll(self, loop: LoopHandle) -> Schedule: ...
        def tensorize(self, loop: LoopHandle, intrinsic: str = "mma.m16n8k16") -> Schedule: ...
        def vectorize(self, loop: LoopHandle) -> Schedule: ...
        def store_at(self, stage: Any, loop: LoopHandle) -> Schedule: ...
        def store_root(self, stage: Any) -> Schedule: ...
        def compute_root(self, stage: Any) -> Schedule: ...
        def set_scope(self, stage: Any, scope: str) -> Schedule: ...
        def vthread(self, loop: LoopHandle) -> Schedule: ...

    # ------------------------------------------------------------------ applying primitives

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in REGISTRY:
            return functools.partial(self.apply, name)
        raise AttributeError(f"'Schedule' has no attribute or primitive {name!r}; primitives: "
                             f"{', '.join(sorted(REGISTRY))}")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(REGISTRY))

    def apply(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Apply the registered primitive `name` (what `s.<name>(...)` calls)."""
        with deep_recursion():
            return self._apply(name, *args, **kwargs)

    def _apply(self, name: str, *args: Any, **kwargs: Any) -> Any:
        spec = REGISTRY.get(name)
        if spec is None:
            raise NotFoundError(f"unknown primitive {name!r}; known: {', '.join(sorted(REGISTRY))}")
        rargs = tuple(self._resolve(_plain_int(a, name), name) for a in args)
        rkw = {k: self._resolve(_plain_int(v, name), name) for k, v in kwargs.items()}
        _check_loop_args(spec, rargs, rkw, self)
        given = (*rargs, *rkw.values())  # a te.extern stage is opaque: no step names its loops or buffers
        if self._has_extern:
            refuse_extern_args(name, self._program.body, [a for a in given if isinstance(a, Var)],
                               [a for a in given if not isinstance(a, Var)])
        json_args = [self._to_json(a) for a in rargs]
        json_kw = {k: self._to_json(v) for k, v in rkw.items()}
        old = self._program
        before = set(map(id, loop_vars(old)))
        call_args = (old, self.deps, *rargs) if spec.takes_deps else (old, *rargs)
        with _plain_errors(name, rargs):
            out = spec.fn(*call_args, **rkw)
        new, result = (out, None) if isinstance(out, Program) else out
        if not isinstance(new, Program):
            raise ArgumentTypeError(f"primitive {name!r} returned {type(new).__name__}, not a Program")
        rebase = bool(spec.rebase or (hasattr(spec.fn, "rebases_when") and spec.fn.rebases_when(rkw)))
        if self.check and not self._check_nest(spec, old, new, rargs, rkw, result, rebase):
            self._nests.clear()  # a step over several nests may change what a nest's base describes
            with _plain_errors(name, rargs):
                self._check(spec, old, new, rargs, rkw, result)
            if bounds_checked(spec):
                _check_bounds_step(name, rargs, old, new)
        created = [v for v in loop_vars(new) if id(v) not in before]
        self._program = new
        if name == "bind_reduction":
            self._reductions.update(_reduction_loops(new, result if isinstance(result, Var) else
                                                     result[0] if isinstance(result, tuple) else rargs[0]))
        self._checked = self._checked and self.check
        if rebase:
            self._original = new
            self._deps = None
            self._checked = True
        self.trace.append({"primitive": name, "args": json_args, "kwargs": json_kw,
                           "created": [self._ref(v) for v in created]})
        return self._wrap_result(result)

    def _wrap_result(self, result: Any) -> Any:
        if result is None:
            return self
        if isinstance(result, Var):
            return LoopHandle(self._token, result)
        if isinstance(result, tuple):
            return tuple(self._wrap_result(r) if isinstance(r, Var) else r for r in result)
        return result

    def _check_nest(self, spec: PrimitiveSpec, old: Program, new: Program, args: tuple[Any, ...],
                    kwargs: dict[str, Any], result: Any, rebase: bool) -> bool:
        """True when the step changed one nest only and is legal on that nest alone (`schedules.nest_scope`);
        False sends it to the whole-program check (which also gives the refusals their witnesses)."""
        shortcut = self._checked and nest_scope.ENABLED and nest_local(spec.name, rebase)
        run = changed_nest(old, new) if shortcut else None
        if run is None:
            return False
        lo, hi_old, hi_new = run
        old_k, new_k = nest_program(old, lo, hi_old, self._nests.uses), nest_program(new, lo, hi_new, self._nests.uses)
        if old_k is None or new_k is None:
            return False
        base = self._nests.base(old_k)
        try:
            with _plain_errors(spec.name, args):
                self._check(spec, old_k, new_k, args, kwargs, result, deps=lambda: NestBases.deps(base),
                            deps_ready=base[1] is not None)
            if bounds_checked(spec):
                _check_bounds_step(spec.name, args, old_k, new_k)
        except Exception:  # noqa: BLE001 - any doubt (a refusal, an analysis the nest alone cannot do) goes to
            return False   # the whole-program check, which refuses with the full witness or accepts
        self._nests.after(old_k, new_k, rebase)
        return True

    def _check(self, spec: PrimitiveSpec, old: Program, new: Program, args: tuple[Any, ...],
               kwargs: dict[str, Any], result: Any, deps: Any = None, deps_ready: bool | None = None) -> None:
        """Legality of the step old -> new against the dependences `deps()` (default: the whole original
        program's, and a reassociation is recorded; given: a nest's, and a reassociation is left to the
        whole-program check)."""
        local = deps is not None
        get = deps if local else (lambda: self.deps)
        ctx = CheckContext(get, old, new, args, kwargs, result, spec.name,
                           {"checked": self._checked,
                            "deps_ready": deps_ready if local else self._deps is not None, "nest": local})
        w: poly.Witness | None
        if callable(spec.check):
            w = spec.check(ctx)
            # a custom check whose witness is a plain order violation (split's, for a guarded split) may be legal
            # up to reassociating reductions, like the "order" check below
            order_like = getattr(spec.check, "order_like", None)
            if w is not None and not local and order_like is not None and order_like(ctx) and \
                    reassoc.find_violation_reassociated(self.deps, new) is None:
                w = self._reassociate(spec, new, args)
        elif spec.check is None:
            w = None
        else:
            if not spec.rebase:
                # a primitive must run exactly the original statement instances (guards a buggy rewrite)
                bad = poly.instance_mismatch(get(), new)
                if bad is not None:
                    if local:
                        raise _WholeProgram
                    raise RuntimeError(f"internal error in primitive {spec.name!r}: {bad}")
            if spec.check == "order":
                w = poly.find_violation(get(), new)
                if w is not None and not local and reassoc.find_violation_reassociated(self.deps, new) is None:
                    w = self._reassociate(spec, new, args)  # legal up to reassociating reductions (loopir.reassoc)
            else:
                loop = next((a for a in args if isinstance(a, Var)), None)
                if loop is None:
                    raise ArgumentTypeError(f"primitive {spec.name!r} (check='carried') takes a loop as first argument")
                w = poly.carried_by(get(), new, loop)
        if w is None:
            self._check_kinds(spec, new, args, result, get() if local else None)
            return
        if local:  # refusals (and reassociations) are the whole program's to decide
            raise _WholeProgram
        marks = {a: f"<-- {spec.name}" for a in _vars_in(args)}
        shown = [_arg_str(a) for a in args] + [f"{k}={_arg_str(v)}" for k, v in kwargs.items()]
        what = f"{spec.name}({', '.join(shown)})"
        if getattr(w, "notes", ()):
            # the new nest was analysed over-approximately (non-affine bounds, guards or coords, e.g.
            # after collapse of a symbolic extent): the conflict found may not be real, so it is no
            # witness; refuse the step as uncheckable instead of claiming it illegal
            raise InexactCheckError.from_witness(spec.name, w, old, marks, what)
        hint = None
        if spec.hint is not None:
            try:
                hint = spec.hint(ctx, w)
            except Exception:  # noqa: BLE001 - advice is optional; the error it decorates must still be raised
                hint = None
        raise ScheduleError.from_witness(spec.name, w, old, marks, hint, what)

    def _reassociate(self, spec: PrimitiveSpec, new: Program, args: tuple[Any, ...]) -> None:
        # the new program breaks the order of some reductions' updates: derived dependences (which assume every
        # original dependence kept) no longer apply, and a float reduction's rounding changes (explain() says so)
        self._checked = False
        # from now on the checks of parallel / vectorized / bound loops need every pair of updates of one element
        self._deps = reassoc.closed(self.deps)
        what = f"{spec.name}({', '.join(_arg_str(a) for a in args)})"
        for g in reassoc.reassociated_groups(self.deps, new):
            note = reassoc.float_note(self._original, g, what)
            if note is not None:
                self._reassociated.setdefault(g, note)

    def _check_kinds(self, spec: PrimitiveSpec, new: Program, args: tuple[Any, ...], result: Any,
                     nest_deps: poly.Deps | None = None) -> None:
        # legal iff (the order check above and) no parallel / vectorized / bound loop of the new program
        # carries a dependence: loop kinds are part of the checked state, so no order of steps slips past
        if spec.check is None:
            return  # the step changes neither the order nor a loop's kind (unroll)
        skip = tuple(a for a in args[:1] if isinstance(a, Var)) if spec.check == "carried" else ()
        reductions = {v: r for v, r in self._reductions.items() if any(v is u for u in loop_vars(new))}
        if spec.name == "bind_reduction":
            reductions.update(_reduction_loops(new, result if isinstance(result, Var) else
                                               result[0] if isinstance(result, tuple) else args[0]))
        # after a step that changes the instances or accesses, the new program's dataflow analysis is the costly
        # part: a sufficient test on its memory-based dependences (a superset) first, the exact one if it fails
        if spec.rebase and deps_shortcuts.concurrent_free(new, skip, reductions):
            return
        deps = poly.dependences(new) if spec.rebase else nest_deps or self.deps
        found = poly.concurrent_violation(deps, new, skip, reductions)
        if found is not None and nest_deps is not None:
            raise _WholeProgram
        if found is not None:
            loop, w = found
            f = next(n for n in _fors(new) if n.var is loop)
            how = f.thread if f.kind == "thread" else f.kind
            what = f"{spec.name}({', '.join(_arg_str(a) for a in args)})"
            hint = (f"after this step loop {loop.name} ({how}) would carry this dependence, so its iterations "
                    f"could run in the wrong order; a {how} loop must stay free of carried dependences through "
                    "every later step — keep the loops in an order where it carries none, or apply this step "
                    f"before marking {loop.name} {how}")
            marks = {a: f"<-- {spec.name}" for a in _vars_in(args)}
            marks.setdefault(loop, f"<-- {how}")
            if getattr(w, "notes", ()):
                # over-approximated analysis (as in the order check): no witness, the step is uncheckable
                err = InexactCheckError.from_witness(spec.name, w, self._program, marks, what)
                err.analysed = deps.program
                raise err
            err = ScheduleError.from_witness(spec.name, w, self._program, marks, hint, what)
            err.analysed = deps.program
            raise err

    # ------------------------------------------------------------------ trace & replay

    def trace_json(self) -> str:
        return json.dumps({"program": self._original_name(), "steps": self.trace}, indent=1)

    def _original_name(self) -> str:
        return self._program.name

    @classmethod
    def replay(cls, text: str | dict[str, Any] | list[dict[str, Any]], target: Any, check: bool = True) -> Schedule:
        """A fresh schedule of `target` with the recorded steps applied again."""
        try:
            data = json.loads(text) if isinstance(text, str) else text
        except json.JSONDecodeError as e:
            raise ArgumentError(f"Schedule.replay: the trace is not valid JSON ({e})") from None
        if isinstance(data, dict):
            if "steps" not in data:
                fields = ", ".join(data) or "none"
                raise ArgumentError(f"Schedule.replay: the trace has no field 'steps' (fields: {fields})")
            steps = data["steps"]
        else:
            steps = data
        if not isinstance(steps, list):
            raise ArgumentError(f"Schedule.replay: 'steps' must be a list of steps, got {type(steps).__name__}")
        s = cls(target, check=check)
        for k, step in enumerate(steps):
            if not isinstance(step, dict):
                raise ArgumentError(f"Schedule.replay: step {k} must be an object, got {type(step).__name__} {step!r}")
            if "primitive" not in step:
                raise ArgumentError(f"Schedule.replay: step {k} has no field 'primitive' (fields: {', '.join(step)})")
            a, kw = step.get("args", []), step.get("kwargs", {})
            if not isinstance(a, list) or not isinstance(kw, dict):
                raise ArgumentError(f"Schedule.replay: step {k} ({step['primitive']!r}): 'args' must be a list and "
                                    "'kwargs' an object")
            args = [s._from_json(x) for x in a]
            kwargs = {n: s._from_json(v) for n, v in kw.items()}
            s.apply(step["primitive"], *args, **kwargs)
        return s

    def _from_json(self, x: Any) -> Any:
        if isinstance(x, dict) and set(x) == {"loop"}:
            return self._var_by_ref(x["loop"])
        if isinstance(x, list):
            return [self._from_json(y) for y in x]
        return x


# ----------------------------------------------------------------------------- the primitives as methods


def _method_annotation(a: Any) -> Any:
    """A primitive's annotation as the method shows it: loops are LoopHandles (written as strings, the
    module uses postponed annotations)."""
    if a is inspect.Parameter.empty or not isinstance(a, str):
        return a
    return re.sub(r"\bVar\b", "LoopHandle", a)


def _method_return(spec: PrimitiveSpec) -> str:
    """What `s.<name>(...)` returns: the primitive's result as handles, or the schedule (for chaining)."""
    ret = inspect.signature(spec.fn).return_annotation
    if not isinstance(ret, str) or not ret.startswith("tuple[Program, "):
        return "Schedule"
    inner = ret[len("tuple[Program, "):-1]
    return "Any" if inner == "Any" else _method_annotation(inner)


def _primitive_method(spec: PrimitiveSpec) -> Any:
    """A real method of Schedule for a registered primitive: the primitive's signature (less the program,
    and the dependences when it takes them) and its docstring; it calls `self.apply(name, ...)`."""
    name = spec.name

    def method(self: Schedule, *args: Any, **kwargs: Any) -> Any:
        return self.apply(name, *args, **kwargs)

    sig = inspect.signature(spec.fn)
    params = list(sig.parameters.values())[2 if spec.takes_deps else 1:]
    params = [p.replace(annotation=_method_annotation(p.annotation)) for p in params]
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    method.__signature__ = sig.replace(parameters=[self_param, *params],  # type: ignore[attr-defined]
                                       return_annotation=_method_return(spec))
    method.__name__ = name
    method.__qualname__ = f"Schedule.{name}"
    method.__module__ = __name__
    method.__doc__ = spec.fn.__doc__
    method._primitive = name  # type: ignore[attr-defined]
    return method


def _install_primitive_methods() -> None:
    """Every registered primitive becomes a method of Schedule (visible to dir(), help() and IDEs); a name
    Schedule already defines (a real method or attribute) keeps its definition. Primitives registered later
    (by a user, after this import) are still reached through `Schedule.__getattr__`."""
    for name, spec in REGISTRY.items():
        existing = Schedule.__dict__.get(name)
        if existing is None or hasattr(existing, "_primitive"):
            setattr(Schedule, name, _primitive_method(spec))


_install_primitive_methods()


class _WholeProgram(Exception):
    """The check of a step on its nest alone did not accept it: check it on the whole program."""


def _fors(program: Program) -> list[For]:
    return [n for n in walk_stmts(program) if isinstance(n, For)]


def _reduction_loops(program: Program, loop: Var) -> dict[Var, frozenset[str]]:
    """{loop: the statements inside it} for a loop that bind_reduction just made a cross-thread reduction."""
    f = next((n for n in _fors(program) if n.var is loop), None)
    if f is None:
        return {}
    return {loop: frozenset(n.name for n in walk_stmts(f) if isinstance(n, Store))}


INT64 = (-(2**63), 2**63 - 1)
UNROLL_LIMIT = 4096  # iterations one unrolled loop may have (codegen.build refuses more too)
_MULTI_LOOP = ("tile",)  # reorder / collapse / skew say "not nested" themselves


def _plain_int(x: Any, primitive: str) -> Any:
    """numpy integers as Python ints; an int beyond int64 is refused (it would wrap in the generated code)."""
    if isinstance(x, (list, tuple)):
        return type(x)(_plain_int(y, primitive) for y in x)
    if isinstance(x, np.integer):
        x = int(x)
    if isinstance(x, int) and not isinstance(x, bool) and not INT64[0] <= x <= INT64[1]:
        raise ArgumentError(f"{primitive}: integer argument {x} does not fit in 64 bits")
    return x


def _check_loop_args(spec: PrimitiveSpec, args: tuple[Any, ...], kwargs: dict[str, Any], s: Schedule) -> None:
    """Loop parameters get loops; the loops of a multi-loop step lie in one nest; unroll has a limit."""

    try:
        params = list(inspect.signature(spec.fn).parameters.values())[2 if spec.takes_deps else 1:]
    except (TypeError, ValueError):
        return
    loops: list[Var] = []
    for k, p in enumerate(params):
        if p.annotation not in ("Var", Var):  # a loop parameter
            continue
        vals = list(args[k:]) if p.kind == p.VAR_POSITIONAL else (
            [args[k]] if k < len(args) else [kwargs[p.name]] if p.name in kwargs else [])
        for v in vals:
            if not isinstance(v, Var):
                raise ArgumentTypeError(f"{spec.name}: argument {p.name!r} must be a loop handle (from s.loops(...) or "
                                        f"s.loop('name')), got {type(v).__name__} {v!r}")
            loops.append(v)
    if spec.name in _MULTI_LOOP:
        for a_i, a in enumerate(loops):
            for b in loops[a_i + 1:]:
                pa, pb = loop_path(s.program, a) or [], loop_path(s.program, b) or []
                if not any(getattr(x, "var", None) is b for x in pa) and not any(
                        getattr(x, "var", None) is a for x in pb):
                    raise NotNestedError(f"{spec.name}: loops {s._ref(a)!r} and {s._ref(b)!r} are not nested: they "
                                         "are in different loop nests (neither encloses the other); a step over "
                                         "several loops needs them nested in one nest")
    if spec.name == "unroll" and loops:
        f = find_loop(s.program, loops[0])

        if isinstance(f.lo, Const) and isinstance(f.hi, Const) and f.hi.value - f.lo.value > UNROLL_LIMIT:
            raise ArgumentError(f"unroll: loop {s._ref(loops[0])!r} has {f.hi.value - f.lo.value} iterations, more "
                                f"than the limit of {UNROLL_LIMIT} an unrolled loop may have; split it first "
                                f"(s.split(loop, 8)) and unroll the inner loop")


def bounds_checked(spec: PrimitiveSpec) -> bool:
    """Steps after which the bounds proof runs: those that change the statement instances or accesses
    (rebase) or are checked by a custom function. The others are checked to run exactly the original
    instances (poly.instance_mismatch), so their accesses, and the bounds, cannot change. A custom check marked
    `checks_bounds` runs the proof itself where its step needs it (split's, for tail="round_up" only)."""
    return spec.rebase or (callable(spec.check) and not getattr(spec.check, "checks_bounds", False))


def _check_bounds_step(name: str, args: tuple[Any, ...], old: Program, new: Program) -> None:
    # the step is refused iff some access of the new program leaves its buffer (loopir.bounds) and the
    # old program had no such access itself (a program out of bounds from the start is refused by build)

    w = check_bounds(new)
    if w is None or check_bounds(old) is not None:
        return
    raise BoundsError(w, where=f"{name}({', '.join(_arg_str(a) for a in args)}) would make an access leave its "
                      "buffer")


@contextlib.contextmanager
def _plain_errors(name: str, args: tuple[Any, ...]) -> Iterator[None]:
    """Internal analysis exceptions (poly.NonAffine) escaping a primitive or its check become a
    ValueError naming the step: the nest is outside what the analysis handles exactly."""
    try:
        yield
    except poly.NonAffine as e:
        what = f"{name}({', '.join(_arg_str(a) for a in args)})"
        raise ArgumentError(f"{what}: the nest is not affine at {e} (loops {', '.join(v.name for v in _vars_in(args))}"
                            f"); this step cannot be applied or checked exactly here") from e


def _vars_in(args: Sequence[Any]) -> list[Var]:
    out: list[Var] = []
    for a in args:
        if isinstance(a, Var):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out += _vars_in(a)
    return out


def _arg_str(a: Any) -> str:
    if isinstance(a, Var):
        return a.name
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_arg_str(x) for x in a) + "]"
    return repr(a)
