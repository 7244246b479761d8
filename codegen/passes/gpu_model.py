"""How a kernel's statements map onto a CUDA block: the facts the GPU passes share.

One kernel is a `Kernel` node (made by `codegen.passes.launch`, which decided its launch, its
guards and its cross-thread reductions). Inside it:

- a loop bound to `blockIdx.*` enumerates blocks; blocks never synchronise with each other;
- a loop bound to `threadIdx.*` is `v = lo + threadIdx` with a guard `v < hi` when `Kernel.guarded`
  says so; a guard around a barrier or a cross-thread reduction is a predicate (every thread reaches);
- every thread runs the rest (SPMD): statements outside every thread loop run on every thread;
- a "parallel" nest inside thread loops (a cooperative copy) is spread over the block's threads,
  so which thread runs one of its instances is not known here: "any thread";
- a loop bound to threadIdx.x holding `C[idx] = C[idx] op e` with `idx` free of the loop's
  variables is a *cross-thread reduction*: the threads' shares meet in one synchronising
  all-reduce, then one thread applies the total to `C[idx]`.

Control flow is *lockstep* where every thread of the block reaches the same barriers equally often:
inside no loop whose trip count depends on the thread and no cooperative copy (guards and
conditions on a thread index become predicates there). A block barrier may only stand in lockstep
control flow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from loopir import nodes as N
from loopir.gpu import is_block_loop, is_thread_loop
from loopir.visit import free_vars, loops_of

THREAD_AXES = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
BLOCK_AXES = ("blockIdx.x", "blockIdx.y", "blockIdx.z")


def by_thread_depth(nest: N.Stmt, visit: Callable[[N.Stmt, int], bool]) -> None:
    """Call `visit(s, depth)` on every Store and For of `nest` in textual order, `depth` the number of
    threadIdx loops around `s`; a For whose visit returns True is not entered."""
    def go(s: N.Stmt, depth: int) -> None:
        if isinstance(s, N.Store):
            visit(s, depth)
        elif isinstance(s, N.For):
            if not visit(s, depth):
                go(s.body, depth + is_thread_loop(s))
        elif isinstance(s, N.Seq):
            for c in s.body:
                go(c, depth)
        elif isinstance(s, N.If):
            go(s.then, depth)
            if s.orelse is not None:
                go(s.orelse, depth)
        elif isinstance(s, N.Allocate):
            go(s.body, depth)

    go(nest, 0)


@dataclass(frozen=True)
class KernelModel:
    """The block-level facts of one kernel that barrier placement reads (see the module docstring)."""

    kernel: N.Kernel
    thread_axes: frozenset[str]  # threadIdx axes some loop of the kernel is bound to
    block_axes: frozenset[str]
    divergent_vars: frozenset[N.Var]  # thread loop variables and cooperative copy loop variables

    @property
    def reduction_loops(self) -> frozenset[N.Var]:
        return self.kernel.reductions

    @property
    def block_sync(self) -> bool:
        """Cross-thread reductions synchronise the whole block (not so for sub-warp rows: shuffles only)."""
        return self.kernel.subwarp == 0

    def is_coop(self, f: N.For, inside_thread: bool) -> bool:
        """A parallel nest inside thread loops: its iterations are spread over the block's threads (or, when
        not cooperative, every thread runs all of them): which thread runs an instance is not known here."""
        return f.kind == "parallel" and inside_thread

    def uniform(self, e: N.Expr) -> bool:
        """True when `e` has the same value on every thread of a block."""
        return not (free_vars(e) & self.divergent_vars)


def kernel_model(k: N.Kernel) -> KernelModel:
    loops = loops_of(k.body)
    div: set[N.Var] = {f.var for f in loops if is_thread_loop(f)}

    def coop(s: N.Stmt, depth: int) -> bool:
        if isinstance(s, N.For) and s.kind == "parallel" and depth > 0:
            div.add(s.var)
        return False

    by_thread_depth(k.body, coop)
    return KernelModel(
        k,
        frozenset(f.thread for f in loops if is_thread_loop(f) and f.thread),
        frozenset(f.thread for f in loops if is_block_loop(f) and f.thread),
        frozenset(div))


__all__ = ["by_thread_depth", "kernel_model", "KernelModel", "THREAD_AXES", "BLOCK_AXES"]
