"""The part of the GEMM recipes every target shares: finding the matmul-shaped reduction of a program
(`matmul_stage`, `resolve_stage`), its elementwise epilogue (`elementwise_consumers`), tile-size checks,
and `GemmPlan`, the record of what a recipe did. The per-target recipes are `gemm_cpu` and `gemm_cuda`.

A matmul-shaped reduction is a statement `C[i, j] = C[i, j] + X * Y` inside loops (i, j, k) with an
initialising statement; `is_matmul_tensor` is its mirror on te tensors (for the fusion planner).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

from loopir.errors import ArgumentError, LoopirError, NotFoundError, ResourceLimitError
from loopir.nodes import Binary, Buffer, Load, Program, Store
from loopir.te import ComputeOp, Reduce
from loopir.visit import free_vars, statements, walk

from ..primitives.extents import padded_trip

__all__ = [
    "GemmPlan", "check_tiles", "collapse_batch", "elementwise_consumers", "is_matmul_tensor", "matmul_operands",
    "matmul_stage", "pos_int", "resolve_stage", "shared_weight_rows", "split_k_gemm",
]


@dataclass
class GemmPlan:
    """What schedule_gemm did: the steps in words (and the shared-memory staging that applied)."""

    stage: str
    epilogue: list[str]
    target: str
    steps: list[str] = field(default_factory=list)
    staged: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def explain(self) -> str:
        lines = [f"gemm schedule of {self.stage!r} for {self.target} (epilogue: {', '.join(self.epilogue) or 'none'})"]
        lines += [f"  {k + 1}. {s}" for k, s in enumerate(self.steps)]
        lines += [f"  skipped: {s}" for s in self.skipped]
        return "\n".join(lines)


def _update(program: Program, stage: str) -> Store:
    for c in statements(program):
        if c.store.name == stage or (c.store.buffer.name == stage and _is_update(c.store)):
            if _is_update(c.store):
                return c.store
    raise NotFoundError(f"schedule_gemm: no matmul-shaped reduction statement named {stage!r} in {program.name!r}")


def _is_update(st: Store) -> bool:
    v = st.value
    return (
        isinstance(v, Binary)
        and v.op == "add"
        and isinstance(v.a, Load)
        and v.a.buffer is st.buffer
        and v.a.indices == st.indices
    )


def matmul_stage(program: Program) -> list[str]:
    """Names of the statements of `program` that are matmul-shaped: C[.., i, j] += X[.., k] * Y[k, ..]
    (an accumulator of 2 or more dimensions indexed by its loops in order, the leading ones batch loops;
    one more loop, the reduction, innermost; a product of two loads)."""
    out = []
    for c in statements(program):
        st = c.store
        if (not _is_update(st) or len(st.indices) < 2 or len(st.iters) != len(st.indices) + 1
                or tuple(st.indices) != tuple(st.iters[:-1])):
            continue
        rhs = st.value.b  # type: ignore[attr-defined]
        if isinstance(rhs, Binary) and rhs.op == "mul" and _loads(rhs.a) and _loads(rhs.b):
            out.append(st.name)
    return out


def _loads(e: Any) -> bool:
    return any(isinstance(n, Load) for n in walk(e))


def elementwise_consumers(program: Program, stage: str) -> list[str]:
    """The statements that read the stage's buffer at their own iteration (epilogue candidates),
    in program order, followed transitively while each is the only reader of its producer."""
    buf = _update(program, stage).buffer
    out: list[str] = []
    while True:
        rd = [c.store for c in statements(program) if c.store.buffer is not buf and any(
            isinstance(n, Load) and n.buffer is buf for n in _walk(c.store.value))]
        if len(rd) != 1 or any(isinstance(n, Load) and n.buffer is buf and n.indices != rd[0].iters
                               for n in _walk(rd[0].value)):
            return out
        out.append(rd[0].name)
        if rd[0].buffer in program.args:
            return out
        buf = rd[0].buffer


def _walk(e: Any) -> list[Any]:
    return list(walk(e))


def pos_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def check_tiles(block: tuple[int, int], thread_tile: tuple[int, int], k_tile: int) -> None:
    for name, v in (("block", block), ("thread_tile", thread_tile)):
        if not (isinstance(v, tuple) and len(v) == 2 and all(pos_int(x) for x in v)):
            raise ArgumentError(f"schedule_gemm: {name} must be two positive ints, got {v!r}")
    if not pos_int(k_tile):
        raise ArgumentError(f"schedule_gemm: k_tile must be a positive int, got {k_tile!r}")
    for d in range(2):
        if block[d] % thread_tile[d]:
            raise ArgumentError(f"schedule_gemm: block {block} is not a multiple of thread_tile {thread_tile}")
    if (block[0] // thread_tile[0]) * (block[1] // thread_tile[1]) > 1024:
        raise ResourceLimitError(
            f"schedule_gemm: block {block} / thread_tile {thread_tile} needs more than 1024 threads")


def resolve_stage(program: Program, stage: Any, epilogue: Any, who: str) -> tuple[Store, list[str]]:
    """The matmul's update statement (`stage`: a name, a tensor, or None for the only matmul-shaped
    reduction) and the names of its epilogue stages; ValueError naming `who` otherwise."""
    if stage is None:
        found = matmul_stage(program)
        if len(found) != 1:
            raise ArgumentError(f"{who}: expected one matmul-shaped reduction, found {found or 'none'}")
        stage = found[0]
    if not isinstance(stage, str):
        stage = stage.name
    upd = _update(program, stage)
    return upd, _epilogue_names(program, upd.name, epilogue)


def _epilogue_names(program: Program, stage: str, epilogue: Any) -> list[str]:
    if epilogue == "auto":
        return elementwise_consumers(program, stage)
    return [e if isinstance(e, str) else e.name for e in ([epilogue] if isinstance(epilogue, str) else epilogue)]


def matmul_operands(upd: Store) -> list[Buffer]:
    out: list[Buffer] = []
    for n in _walk(upd.value.b):  # type: ignore[attr-defined]
        if isinstance(n, Load) and n.buffer not in out and n.buffer is not upd.buffer:
            out.append(n.buffer)
    return out


def is_matmul_tensor(t: Any) -> bool:
    """The te mirror of `matmul_stage`: t = sum over one reduce axis of (X * Y), X and Y reading tensors,
    with an output of 2 or more dimensions (the leading ones batch axes; what lowers to a matmul-shaped
    update statement)."""
    op = getattr(t, "op", None)
    if not isinstance(op, ComputeOp) or not isinstance(op.body, Reduce) or op.body.op != "sum":
        return False
    body = op.body.body
    return (len(t.shape) >= 2 and len(op.reduce_axis) == 1 and isinstance(body, Binary) and body.op == "mul"
            and _loads(body.a) and _loads(body.b))


def shared_weight_rows(t: Any) -> tuple[Any, ...] | None:
    """The row extents (batch axes and rows) of a matmul tensor `t` whose weight, the operand read along its
    column axis, reads no batch axis (a linear layer, X[b, t, k] @ W[k, j]: all batches' rows meet one W); None
    for a plain or a truly batched matmul."""
    if not is_matmul_tensor(t) or len(t.shape) < 3:
        return None
    j, batch = t.op.axis[-1], set(t.op.axis[:-2])
    weight = [ld for ld in _walk(t.op.body.body) if isinstance(ld, Load) and j in free_vars(ld)]
    return None if not weight or any(batch & free_vars(ld) for ld in weight) else tuple(t.shape[:-1])


def collapse_batch(s: Any, stage: str, who: str) -> Any | None:
    """The batch loops of a batched matmul (the loops of `stage` around its last three, i, j, k) collapsed
    into one handle, or None when there are none. Sizes of the inner batch loops must be constants (a
    symbolic one would make the collapsed coordinates non-affine); ArgumentError naming `who` otherwise."""
    batch = list(s.loops(stage)[:-3])
    if not batch:
        return None
    h = batch[0]
    for nxt in batch[1:]:
        try:
            h = s.collapse(h, nxt)
        except LoopirError as e:
            raise ArgumentError(f"{who}: the batch loops of {stage!r} ({', '.join(b.var.name for b in batch)}) "
                                f"cannot be collapsed into one grid dimension: {e}") from e
    return h


COMBINE_THREADS = 256  # threads per block of split-K's combine kernel (one output column each)
COMBINE_PAD_MAX = 64  # a combine's chunk loop of a symbolic count bounded by at most this many is padded to it


def split_k_gemm(s: Any, upd: Store, eps: list[str], chunk: Any, k_tile: int, recipe: Callable[[str], GemmPlan],
                 who: str) -> GemmPlan:
    """Split-K: the reduction in chunks of `chunk`, each chunk a GEMM of its own on blockIdx.z (`recipe` maps the
    partial stage, a batched matmul over the chunks), whose partial C tiles a second kernel sums (in chunk order)
    before the epilogue. For a GEMM whose tiles of C are too few to fill the GPU (skinny M: 4096 columns make 128
    blocks of 32), so that more blocks stream B at once.

        for i, j:                              for ko in blockIdx.z:            # the recipe, per chunk
          C[i, j] = 0                            for i, j:  C_rf[ko, i, j] = sum over k in chunk ko of A * B
          for k: C[i, j] += A[i, k] * B[k, j]   for i in blockIdx.y, j in (blockIdx.x, threadIdx.x):
        for i, j: out[i, j] = f(C[i, j])   ==>   C_local = 0;  for ko: C_local += C_rf[ko, i, j]   # the combine
                                                 out[i, j] = f(C_local)                          # the epilogue

    Precondition: a plain 2-d matmul (no batch loops) and `chunk` a positive multiple of `k_tile` (ArgumentError
    naming `who` otherwise). The rfactor is checked as any (a float sum reassociated per chunk, as every parallel
    reduction is)."""
    name = upd.name
    if not (pos_int(chunk) and chunk % k_tile == 0):
        raise ArgumentError(f"{who}: split_k must be a positive multiple of k_tile ({k_tile}), got {chunk!r}")
    loops = s.loops(name)
    if len(loops) != 3:
        raise ArgumentError(f"{who}: split_k takes a plain 2-d matmul; {name!r} has {len(loops) - 3} batch loop(s)")
    ko, _ = s.split(loops[2], chunk)
    part = s.rfactor(name, ko, factor_axis=0)
    plan = recipe(part.name)
    plan.stage, plan.epilogue = name, list(eps)
    plan.steps.insert(0, f"split k by {chunk}; rfactor({name}, {ko.var.name}, factor_axis=0): the partials "
                         f"{part.name}[chunk, i, j], each chunk a GEMM of its own (the steps below, its chunks on "
                         "blockIdx.z)")
    i, j, _ = s.loops(name)
    jo, jt = s.split(j, COMBINE_THREADS)
    s.bind(i, "blockIdx.y").bind(jo, "blockIdx.x").bind(jt, "threadIdx.x")
    s.cache_write(upd.buffer.name, "local", jt, epilogue=eps)
    plan.steps.append(f"the combine: i on blockIdx.y, j by {COMBINE_THREADS} on blockIdx.x / threadIdx.x, "
                      f"cache_write({upd.buffer.name}, 'local', epilogue={eps}): each thread sums its column's "
                      "partials in chunk order in a register, then the epilogue")
    # a symbolic chunk count that the program's assumed sizes bound (a call-time variant: p <= 4096): padded to that
    # constant, so that the chunks' loads are unrolled and in flight together as at fixed sizes (a rolled loop of
    # dependent adds waits for each load in turn)
    chunks = s.loops(name)[-1]
    most = padded_trip(s.program, chunks.var, COMBINE_PAD_MAX)
    if most is not None:
        s.pad_loop(chunks, most)
        plan.steps.append(f"pad_loop({chunks.var.name}, {most}): the chunk loop at its assumed bound, unrolled")
    return plan
