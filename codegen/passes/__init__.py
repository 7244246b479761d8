"""The lowering pipeline: a flat, named list of passes between the scheduled loop IR and a renderer.

    scheduled Program --pass--> ... --pass--> lowered Program --render--> CUDA C / LLVM IR

Each pass is a pure function `Program -> Program` (returning the same object means "unchanged"),
with a docstring that states what it does and a one-line formal condition. A target names its
pipeline as a tuple of `Pass`es; `lower(program, target)` runs it, and `build(..., dump_passes=True)`
prints the program after every pass. Renderers read only what the passes left in the IR (Barrier
nodes, versioned loops, ...): they make no legality or layout decision of their own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from loopir.errors import ArgumentError
from loopir.nodes import Program

from .accumulate import widen_accumulators, widen_staged
from .dead_tiles import skip_dead_tiles
from .barriers import place_barriers
from .bounds import prove_bounds
from .forwarded import forward_row_totals
from .full_tiles import version_full_tiles
from .guards import tighten_guards
from .kernels import split_kernels
from .launch import plan_kernels
from .mma import plan_mma
from .packing import pack_panels
from .pad import pad_reductions
from .private import refuse_split_private
from .registers import promote_register_rows
from .shared import plan_dynamic_shared
from .simplify_indices import simplify_indices
from .staging import plan_staging
from .versioning import version_tiles

PassFn = Callable[[Program], Program]


@dataclass(frozen=True, slots=True)
class Pass:
    """One named step of a target's pipeline."""

    name: str
    fn: PassFn

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""

    def __call__(self, program: Program) -> Program:
        return self.fn(program)


@dataclass(frozen=True, slots=True)
class Assume:
    """Facts about the sizes a program will run with that the caller guarantees (call-time shape
    specialization, codegen.specialize, checks them before every call of the module built so).

    index_int32: every buffer's padded reach stays below 2**31 (see launch.fits_int32), so
    kernels may use 32-bit index arithmetic even with symbolic sizes."""

    index_int32: bool = False


def _with_args(fn: PassFn, **kw: object) -> PassFn:
    out = functools.partial(fn, **kw)
    functools.update_wrapper(out, fn)  # keeps the pass's docstring (Pass.doc, dump_passes)
    return out


def _pipelines(assume: Assume | None = None) -> dict[str, tuple[Pass, ...]]:
    plan = _with_args(plan_kernels, int32_sizes=True) if assume is not None and assume.index_int32 else plan_kernels
    cuda = (Pass("prove_bounds", prove_bounds), Pass("refuse_split_private", refuse_split_private),
            Pass("widen_accumulators", widen_accumulators),
            Pass("simplify_indices", simplify_indices), Pass("pad_reductions", pad_reductions),
            Pass("split_kernels", split_kernels),
            Pass("plan_kernels", plan), Pass("promote_register_rows", promote_register_rows),
            Pass("forward_row_totals", forward_row_totals),
            Pass("place_barriers", place_barriers), Pass("plan_mma", plan_mma),
            Pass("plan_staging", plan_staging), Pass("widen_staged", widen_staged),
            Pass("skip_dead_tiles", skip_dead_tiles), Pass("version_full_tiles", version_full_tiles),
            Pass("plan_dynamic_shared", plan_dynamic_shared))
    cpu = (Pass("prove_bounds", prove_bounds), Pass("widen_accumulators", widen_accumulators),
           Pass("tighten_guards", tighten_guards),
           Pass("version_tiles", version_tiles), Pass("pack_panels", pack_panels),
           Pass("simplify_indices", simplify_indices))
    return {"cuda": cuda, "cpu": cpu}


def pipeline(target: str, assume: Assume | None = None) -> tuple[Pass, ...]:
    """The passes `build` runs for `target`, in order (`assume`: facts the caller guarantees)."""
    pipes = _pipelines(assume)
    if target not in pipes:
        raise ArgumentError(f"no lowering pipeline for target {target!r}; known: {', '.join(pipes)}")
    return pipes[target]


def lower(program: Program, target: str, dump: bool | Callable[[str], None] = False,
          after: Callable[[Pass, Program], None] | None = None, assume: Assume | None = None) -> Program:
    """Run `target`'s pipeline over `program`; with `dump`, print (or hand to `dump`) the program after each
    pass; `after(pass, program)` sees every intermediate program (build collects the passes' notes so);
    `assume`: facts about the sizes the caller guarantees (`Assume`)."""
    out = print if dump is True else dump or None
    for p in pipeline(target, assume):
        new = p(program)
        if out is not None:
            changed = "" if new is program else " (changed)"
            out(f"# ---- after pass {p.name}{changed}: {p.doc}\n{new}")
        if after is not None:
            after(p, new)
        program = new
    return program


__all__ = ["Assume", "Pass", "PassFn", "pipeline", "lower"]
