"""Tensor-core kernels (CUDA pipeline): the shared layout ldmatrix reads, the cp.async ring, fragment reuse.

For each kernel holding a tensorized nest (For kind "mma.m16n8k16", schedules/primitives/tensorize.py):

1. **Padded operand tiles.** ldmatrix reads 8 rows of 16 bytes per phase; rows whose byte stride is a
   multiple of 128 (a 32 x 64 half tile: 128 B) land in the same four banks, an 8-way conflict (64 B rows:
   4-way). Each shared operand tile gets its rows padded to the next length whose byte stride is 16 times an
   odd number (32 halves -> 40, 128 -> 136): then the 8 rows of a phase start in 8 distinct 16-byte bank
   groups, conflict-free. The padding is recorded in the IR as the buffer's shape (`A_shared[128, 40]`);
   every index stays below the original row length, so the padding columns are never read or written.

        allocate A_shared: float16[128, 32] shared   ==>   allocate A_shared: float16[128, 40] shared

2. **A cp.async ring of `MMA_STAGES` stages.** The staged k loop (`allocate A_sh, B_sh: copies; barrier;
   mma; barrier`) is marked pipelined (`Kernel.pipelined`, rendered by codegen.cuda.staging: 16-byte
   cp.async for whole 8-half chunks, tile k + S - 1 issued while tile k is computed on) with
   `Kernel.pipeline_stages`; when the stages pass the 48 KiB of static shared memory they are laid out in
   the kernel's dynamic shared array (`Kernel.dynamic_shared`: each ring at its offset, then the total).

3. **Fragment reuse.** An unrolled `for mi: for ni: <mma nest>` whose A operand does not depend on ni and B
   operand not on mi is recorded in `Kernel.mma_grids`: the renderer loads each A fragment once per mi and
   each B fragment once per ni (per k step) instead of once per instruction.

identity on the executed instances: the padding changes where a shared element is stored, not which
elements are read or written; the other two are rendering decisions recorded on the Kernel.
"""

from __future__ import annotations

import dataclasses
import math

from loopir import nodes as N
from loopir.target import MMA_STAGES, padded_row
from loopir.subst import replace_buffers
from loopir.visit import free_vars, loops_of, path_to, walk
from schedules.primitives.tensorize import MMA_TF32, TensorizeError, mma_operands

from .gpu_model import by_thread_depth
from .kernels import map_kernels
from .shared import DYNAMIC_SHARED_MAX, STATIC_SHARED_MAX
from .staging import pipeline_parts

__all__ = ["plan_mma", "MMA_STAGES", "padded_row", "tf32_b_row"]

REGISTERS_PER_SM = 65536
# registers a lane needs besides its accumulators (A / B fragments, copy and ldmatrix addresses): sizes the
# __launch_bounds__ minimum of blocks per multiprocessor (Kernel.min_blocks)
MMA_EXTRA_REGISTERS = 64


def plan_mma(program: N.Program) -> N.Program:
    """Pad the shared operand tiles of tensorized nests, pipeline their staged k loop, record fragment reuse.

    identity on the executed instances: the padded rows' extra columns are never accessed; the rest are marks."""
    return map_kernels(program, _plan)


def _mma_nests(body: N.Stmt) -> list[N.For]:
    return [f for f in walk(body) if isinstance(f, N.For) and f.kind.startswith("mma.")]


def _operands(k: N.Kernel, f: N.For):
    lanes = {x.var: x for x in loops_of(k.body) if x.kind == "thread" and x.thread == "threadIdx.x"}
    try:
        return mma_operands(f, lanes, what="plan_mma")
    except TensorizeError:
        return None  # not the instruction's shape any more: the renderer reports it


def _pad(k: N.Kernel) -> N.Kernel:
    new: dict[N.Buffer, N.Buffer] = {}
    for f in _mma_nests(k.body):
        ops = _operands(k, f)
        if ops is None:
            continue
        for ld in (ops.a, ops.b):
            b = ld.buffer
            row = getattr(b.shape[-1], "value", None)
            if b in new or not isinstance(row, int):
                continue
            want = tf32_b_row(row) if ops.tf32 and ld is ops.b else padded_row(row, _itemsize(b))
            if want != row:
                new[b] = dataclasses.replace(b, shape=(*b.shape[:-1], N.const(want)))
    return dataclasses.replace(k, body=replace_buffers(k.body, new)) if new else k


def _tf32(f: N.For) -> bool:
    return any(x.kind == MMA_TF32 for x in _mma_nests(f.body))


def _grids(k: N.Kernel) -> frozenset[N.Var]:
    out: set[N.Var] = set()
    for f in _mma_nests(k.body):
        ops = _operands(k, f)
        path = path_to(k.body, f)
        if ops is None or path is None:
            continue
        fors = [s for s in path if isinstance(s, N.For)]
        if len(fors) < 2:
            continue
        mi, ni = fors[-2], fors[-1]
        if not all(x.kind == "unroll" and isinstance(x.lo, N.Const) and isinstance(x.hi, N.Const)
                   for x in (mi, ni)):
            continue
        if _body(mi) is not ni or _body(ni) is not f:
            continue
        if ni.var in free_vars(ops.a) or mi.var in free_vars(ops.b):
            continue
        out.add(mi.var)
    return frozenset(out)


def _body(f: N.For) -> N.Stmt:
    s = f.body
    while isinstance(s, N.Seq) and len(s.body) == 1:
        s = s.body[0]
    return s


def _itemsize(b: N.Buffer) -> int:
    return 4 if b.dtype == "float32" else 2


def _bytes(b: N.Buffer) -> int:
    return math.prod(int(d.value) for d in b.shape) * _itemsize(b)  # type: ignore[attr-defined]


def tf32_b_row(length: int) -> int:
    """The smallest row length >= `length` of a float32 B tile read by mma.m16n8k16.tf32x3's shared loads, in whole
    16-byte chunks (cp.async), at 8 or 24 floats mod 32: lane l reads row l % 4 at column l / 4, so banks
    8 (l % 4) + l / 4 are the warp's 32 distinct banks."""
    n = -(-length // 4) * 4
    while n % 32 not in (8, 24):
        n += 4
    return n


def _pipeline(k: N.Kernel) -> N.Kernel:
    loops: list[N.For] = []

    def visit(s: N.Stmt, depth: int) -> bool:
        if isinstance(s, N.For) and s.kind == "serial" and depth > 0 and _mma_nests(s.body):
            loops.append(s)
        return False

    by_thread_depth(k.body, visit)
    marks, rings = [], []
    for f in loops:
        parts = pipeline_parts(k, f, half=not _tf32(f), budget=False)
        if parts is None or any(not all(isinstance(d, N.Const) for d in b.shape) or _bytes(b) % 16
                                for b in parts[0]):
            continue
        marks.append(f.var)
        rings.extend(parts[0])
    if not marks:
        return k
    ring_ids = {id(b) for b in rings}
    others = [n.buffer for n in walk(k.body) if isinstance(n, N.Allocate) and n.buffer.scope == "shared"
              and id(n.buffer) not in ring_ids]
    per_stage = sum(_bytes(b) for b in rings)
    stages = MMA_STAGES
    while stages > 2 and per_stage * stages > DYNAMIC_SHARED_MAX:
        stages -= 1
    dyn: tuple[tuple[N.Buffer | None, N.Expr], ...] = ()
    if per_stage * stages + sum(_bytes(b) for b in others) > STATIC_SHARED_MAX:
        if others or k.dynamic_shared or per_stage * stages > DYNAMIC_SHARED_MAX:
            return k  # other shared buffers would need a joint layout: keep the plain copies
        off, layout = 0, []
        for b in rings:  # each ring of `stages` tiles at a 16-byte aligned offset (tiles are 16-byte multiples)
            layout.append((b, N.const(off)))
            off += _bytes(b) * stages
        dyn = (*layout, (None, N.const(off)))
    # no more blocks than the shared memory holds
    smem = per_stage * stages + sum(_bytes(b) for b in others)
    mb = min(k.min_blocks, max(1, (DYNAMIC_SHARED_MAX + 1024) // (smem + 1024))) if k.min_blocks else 0
    return dataclasses.replace(k, pipelined=k.pipelined | frozenset(marks), pipeline_stages=stages, min_blocks=mb,
                               dynamic_shared=dyn or k.dynamic_shared)


def _min_blocks(k: N.Kernel, grids: frozenset[N.Var]) -> int:
    """Blocks per multiprocessor the registers should allow: (accumulators + MMA_EXTRA_REGISTERS) per lane,
    the accumulators being 4 per instruction of the warp's grid; 0 (no bound) when not known."""
    threads = [getattr(e, "value", None) for e in k.block]
    loops = {f.var: f for f in loops_of(k.body)}
    if not grids or not all(isinstance(t, int) for t in threads):
        return 0
    accs = 0
    for g in grids:
        mi = loops[g]
        ni = _body(mi)
        accs = max(accs, 4 * (int(mi.hi.value) - int(mi.lo.value)) * (int(ni.hi.value) - int(ni.lo.value)))  # type: ignore[attr-defined, union-attr]
    per_block = math.prod(threads) * min(255, accs + MMA_EXTRA_REGISTERS)  # type: ignore[arg-type]
    return max(1, REGISTERS_PER_SM // per_block)


def _plan(k: N.Stmt) -> N.Stmt:
    if not isinstance(k, N.Kernel) or not _mma_nests(k.body):
        return k
    k = _pad(k)
    grids = _grids(k)
    if grids:
        k = dataclasses.replace(k, mma_grids=k.mma_grids | grids, min_blocks=_min_blocks(k, grids))
    return _pipeline(k)
