"""GPU facts of a loop nest that the CUDA lowering decides and the GPU interpreter must decide the same way.

Pure functions of the IR, here so that `codegen.passes` (gpu_model, launch), the CUDA renderer and
`loopir.interp_gpu` (which may not import codegen) read one definition:

- `is_thread_loop` / `is_block_loop`: a For bound to a threadIdx / blockIdx axis;
- `reduction_stores(f)` and `is_reduction_loop(f)`: the cross-thread reductions of a threadIdx.x loop;
- `reduction_parts(st)`: `C[idx] = C[idx] op e` as (op, e);
- `upper_extent(ext, allowed)`: an upper bound of a loop extent over allowed variables (launch sizes);
- `cluster_pragmas(loops)`: the thread-block cluster sizes the loops bound to blockIdx.x ask for (the `cluster`
  pragma; `CLUSTER_MAX` the portable largest);
- `BLOCK_PASS`: the loop kind of a nest that the whole block runs once (its loops are the reference semantics,
  executed as if by thread 0; the CUDA renderer prints one block-wide kernel body: codegen/cuda/flash.py).
"""

from __future__ import annotations

from .nodes import Binary, Const, Expr, For, Load, Stmt, Store, Var
from .visit import free_vars, loops_of, subst_coords, substitute, walk

__all__ = ["REDUCE_OPS", "BLOCK_PASS", "BLOCK_PASSES", "CLUSTER_MAX", "cluster_pragmas", "is_fill",
           "is_block_loop", "is_reduction_loop",
           "is_thread_loop", "reduction_parts", "reduction_stores", "upper_extent"]

REDUCE_OPS = ("add", "mul", "max", "min")
BLOCK_PASS = "attention.m16n8k16"  # tensorize's FlashAttention intrinsic (schedules/primitives/flash.py)
# every intrinsic of that kind: the same pass on warpgroup tensor cores and on float32 data (TF32), a block's GEMM
# tile on warpgroup tensor cores (schedules/primitives/flash.py, wgmma.py)
BLOCK_PASSES = (BLOCK_PASS, "attention.wgmma", "attention.tf32x3", "gemm.wgmma")


CLUSTER_MAX = 8  # the portable thread-block cluster size (sm_90): the `cluster` pragma's largest


def cluster_pragmas(loops: list[For]) -> set[int]:
    """The cluster sizes that the `loops` bound to blockIdx.x ask for (their `cluster` pragma; empty: none)."""
    return {int(v) for f in loops if f.kind == "thread" and f.thread == "blockIdx.x"
            for k, v in f.pragmas if k == "cluster"}


def is_thread_loop(f: For) -> bool:
    return f.kind == "thread" and (f.thread or "").startswith("threadIdx")


def is_fill(copy: Stmt, other: Stmt) -> bool:
    """`other` is the zero fill codegen.passes.pad gives a clipped copy `copy` (`if clip: copy else other`):
    0 into the same element of the same shared tile."""
    return (isinstance(copy, Store) and isinstance(other, Store) and other.buffer is copy.buffer
            and other.indices == copy.indices and other.iters == copy.iters and other.coords == copy.coords
            and isinstance(other.value, Const) and other.value.value == 0)


def is_block_loop(f: For) -> bool:
    return f.kind == "thread" and (f.thread or "").startswith("blockIdx")


def reduction_stores(f: For) -> list[Store]:
    """The stores inside `f` whose index uses neither f's variable nor a loop inside f (a "local" buffer is
    per thread: every thread writing element 0 of its own registers is no cross-thread reduction)."""
    inner = {x.var for x in loops_of(f)}
    out = []
    for n in walk(f.body):
        if isinstance(n, Store) and n.buffer.scope != "local":
            idx = tuple(substitute(i, subst_coords(n)) for i in n.indices)
            used = set().union(*(free_vars(i) for i in idx)) if idx else set()
            if not (used & inner):
                out.append(n)
    return out


def is_reduction_loop(f: For) -> bool:
    """A threadIdx.x loop with cross-thread reductions inside (the lowering's decision, `Kernel.reductions`)."""
    return f.kind == "thread" and f.thread == "threadIdx.x" and bool(reduction_stores(f))


def reduction_parts(st: Store) -> tuple[str, Expr] | None:
    """(op, e) when st is `C[idx] = C[idx] op e` (either operand order), else None."""
    v = st.value
    if not isinstance(v, Binary) or v.op not in REDUCE_OPS:
        return None
    self_load = Load(st.buffer, st.indices)
    if v.a == self_load:
        return v.op, v.b
    if v.b == self_load:
        return v.op, v.a
    return None


def upper_extent(ext: Expr, allowed: set[Var]) -> Expr | None:
    """An upper bound of `ext` using only `allowed` vars (min(a, b) -> a side that qualifies)."""
    if free_vars(ext) <= allowed:
        return ext
    if isinstance(ext, Binary) and ext.op == "min":
        for side in (ext.a, ext.b):
            ub = upper_extent(side, allowed)
            if ub is not None:
                return ub
    return None
