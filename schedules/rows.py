"""Row kernels on CUDA: which strategy a group of row phases gets, and what it keeps in shared memory.

The fusion planner (`schedules.fusion`) groups a reduction with its prologue and epilogue under a shared
row loop (row softmax: max, sum of exp, normalize). How those rows map to the GPU depends on the row
length L and the row count R, evaluated at the plan's sizes (`auto_schedule(..., sizes=)`; a symbolic size
not given is unknown, and then the safe block-per-row strategy is kept):

* **warp** — L shorter than a block's threads (128): W lanes of a warp per row (W = 16, half a warp, or a
  smaller power of two for rows shorter than 32), THREADS // W rows per block on threadIdx.y; the reductions
  are shuffles within the row's lanes (`Kernel.subwarp`), with no shared scratch. This is also strategy (d)
  of issue 11, several rows per block for short rows. A kernel planned so is correct at every size (each
  lane strides over the row). Longer rows measured slower this way than with a block per row (each phase
  re-reads the row; see `choose_row_strategy`).
* **block** — one block per row: THREADS threads, WIDE_THREADS from WIDE_ROW elements on; block all-reduces,
  128-bit accesses where the row length is a constant multiple of 4; a row read by several phases is kept
  in shared memory when the kernel's whole shared-memory budget allows it (`plan_row_caches`), in dynamic
  shared memory when it is symbolic or above 48 KiB.

Very wide rows with few of them (vocabulary-sized softmax over a handful of rows) would want a row split
over several blocks with a combine kernel; that is not built yet: they get `block`, and the plan says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from loopir.nodes import Binary, Load, Var
from loopir.te import ComputeOp, Reduce, Tensor
from loopir.visit import walk

from . import cost as C

WIDE_ROW = 8192  # rows at least this long get WIDE_THREADS threads per block (unmeasured: see explain)
WIDE_THREADS = 512
SPLIT_ROW_MIN = 32768  # rows at least this long and fewer than the SMs would want a split over blocks
# lanes per row: the shuffle-only reduction (`Kernel.subwarp`, codegen.passes.launch.subwarp_width) takes rows
# of up to 16 lanes; two rows share a warp then, each load instruction still reading 2 x 64 contiguous bytes
MAX_LANES = 16
RED_SCRATCH_SLOTS = 32  # the block all-reduce's shared scratch: one slot per warp (codegen.cuda.reduce)


@dataclass(frozen=True)
class RowStrategy:
    """How one row group maps to the GPU: `name` "warp" or "block", `lanes` threads per row, `rows`
    rows per block, and the numbers that chose it (for explain())."""

    name: str
    lanes: int
    rows: int
    why: str


def _pow2_floor(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def choose_row_strategy(row_len: int, rows: int, symbolic: list[str], given: bool, threads: int,
                        dev: C.Device) -> RowStrategy:
    """The strategy of a row group with rows of `row_len` elements (at the plan's sizes) and `rows` rows.
    `symbolic`: the row length's sizes that are symbolic; `given`: whether the plan was given their values."""
    nums = f"row length {row_len:,}, {rows:,} row{'s' if rows != 1 else ''}"
    if symbolic and not given:
        return RowStrategy("block", threads, 1, f"{nums} at the costed size, but the row length "
                           f"({', '.join(symbolic)}) is symbolic and no sizes were given: a block per row, "
                           "which holds up at every length")
    if row_len < threads:
        # measured on the H200 (benchmarks/rows_gpu.py): a warp-per-row kernel re-reads its row from L1/L2 in
        # each phase and lost to a block per row with the row in shared memory at 768 and 1000 elements
        # (1.96x / 2.76x torch.compile); it is kept for rows shorter than a block, which would idle threads
        lanes = min(MAX_LANES, max(2, _pow2_floor(max(1, row_len // 2))))
        per_block = threads // lanes
        return RowStrategy("warp", lanes, per_block,
                           f"{nums}: rows shorter than a block's {threads} threads get {lanes} lanes each "
                           f"({per_block} rows per block; shuffle reductions within a row)")
    wide = row_len >= WIDE_ROW
    per_row = WIDE_THREADS if wide and threads < WIDE_THREADS else threads
    why = f"{nums}: rows of {threads} elements or more get a block of {per_row} threads each"
    if wide and per_row != threads:
        why += (f" (at least {WIDE_ROW:,} elements: more threads per row, since a block's shared row leaves "
                "room for few blocks per SM)")
    if row_len >= SPLIT_ROW_MIN and rows < dev.sm_count:
        why += (f"; only {rows} block{'s' if rows != 1 else ''} for {dev.sm_count} SMs: a split of each row over "
                "several blocks would fill the GPU (not built yet)")
    return RowStrategy("block", per_row, 1, why)


def fit_shared(candidates: list[tuple[str, int, int]], scratch: int, budget: int) -> tuple[list[str], list[str]]:
    """Which of the `candidates` (name, bytes, bytes of DRAM traffic saved) stay in shared memory when the
    kernel also needs `scratch` bytes (reduction slots, staging) and may use `budget` bytes per block: the
    most saving first, each only while the running total fits. Returns (kept names, dropped names)."""
    kept, dropped, total = [], [], scratch
    for name, nbytes, _ in sorted(candidates, key=lambda c: -c[2]):
        if total + nbytes <= budget:
            kept.append(name)
            total += nbytes
        else:
            dropped.append(name)
    return kept, dropped


def reduction_scratch(stages: list[Tensor]) -> int:
    """Bytes of the block all-reduce scratch a row kernel of `stages` declares: one array of
    RED_SCRATCH_SLOTS per C type of its reductions (float and double kept apart)."""
    types = {C.itemsize(t.dtype) if t.dtype != "float16" else 4 for t in stages if isinstance(t.op.body, Reduce)}
    return sum(RED_SCRATCH_SLOTS * s for s in types)


def operands_split(t: Tensor) -> bool:
    """A matmul's operands each read at most one of its two output axes (X[i, k] * Y[k, j]); a sum of
    products whose factors both read the whole output point (a variance, sum of (x[i, t, q] - m)^2) is a
    row reduction, not a GEMM, and its tiles would not be what the GEMM recipe sizes."""
    op = t.op
    if not isinstance(op, ComputeOp) or not isinstance(op.body, Reduce) or len(op.axis) != 2:
        return False
    body = op.body.body
    if not isinstance(body, Binary):
        return False
    i, j = op.axis

    def axes(e) -> set[Var]:
        return {n for ld in walk(e) if isinstance(ld, Load) for ix in ld.indices for n in walk(ix)
                if isinstance(n, Var) and n in (i, j)}

    a, b = axes(body.a), axes(body.b)
    return len(a) <= 1 and len(b) <= 1 and a != b


def plan_row_caches(stages: list[Tensor], depth: int, loads: Callable[[Tensor], list[tuple[Tensor, tuple]]],
                    ev: dict, dev: C.Device, given: set[str]) -> list[tuple[Tensor, bool, int, str]]:
    """The rows a block-per-row kernel of `stages` (sharing `depth` outer loops; `loads(t)`: what t reads,
    producers inlined) keeps in shared memory: an input row read by several phases, while everything the
    kernel keeps there (these rows and the reduction scratch) fits one block's budget. A row of symbolic
    length is a candidate only when its sizes are `given` (the plan is for sizes up to those): it lives in
    dynamic shared memory sized per launch, and a launch whose row the device cannot hold is refused
    (codegen.cuda.runtime.SharedMemoryError). Returns (tensor, kept, bytes, why) per candidate."""
    readers: dict[int, tuple[Tensor, set[str]]] = {}
    ids = {id(t) for t in stages}
    for t in stages:
        for p, idx in loads(t):
            if id(p) in ids or len(p.shape) <= depth:
                continue
            if all(idx[k] is t.op.axis[k] for k in range(depth)):
                readers.setdefault(id(p), (p, set()))[1].add(t.name)
    # above the static 48 KiB a row lives in dynamic shared memory (codegen.passes.shared); at most half the
    # opt-in maximum, so that two blocks still share an SM (one block per SM would leave the row loads idle)
    scratch, budget = reduction_scratch(stages), max(dev.smem_per_block, dev.smem_per_block_optin // 2)
    out: list[tuple[Tensor, bool, int, str]] = []
    cands: dict[str, tuple[Tensor, int, str]] = {}
    for p, users in readers.values():
        if len(users) < 2:
            continue
        row_shape = p.shape[depth:]
        nbytes = C.buffer_bytes(row_shape, p.dtype, ev)
        sym = sorted({n.name for s in row_shape for n in walk(s) if isinstance(n, Var)})
        users_s = ", ".join(sorted(users))
        if sym and not set(sym) <= given:
            out.append((p, False, nbytes, f"its row ({C.fmt_bytes(nbytes)} at the costed size) is read by {users_s}, "
                        f"but its length {', '.join(sym)} is symbolic and a shared buffer needs a constant size — "
                        "re-read from global memory (L2-resident)"))
        else:
            cands[p.name] = (p, nbytes, users_s)
    kept, _ = fit_shared([(n, b, b * u.count(",")) for n, (_, b, u) in cands.items()], scratch, budget)
    used = scratch + sum(cands[n][1] for n in kept)
    dyn = " (dynamic shared memory above the static 48 KiB)" if used > dev.smem_per_block else ""
    for name, (p, nbytes, users_s) in cands.items():
        if name in kept:
            symbolic = any(isinstance(n, Var) for d in p.shape[depth:] for n in walk(d))
            at = " at the given sizes; symbolic: dynamic shared memory sized per launch" if symbolic else ""
            out.append((p, True, nbytes, f"its row ({C.fmt_bytes(nbytes)}{at}) is read by {users_s}; the kernel's "
                        f"shared memory ({C.fmt_bytes(used)} with {scratch} B of reduction scratch) fits the "
                        f"{C.fmt_bytes(budget)} per block (shared-memory budget){dyn}: "
                        "loaded once per row"))
        else:
            out.append((p, False, nbytes, f"its row ({C.fmt_bytes(nbytes)}) is read by {users_s}, but the kernel's "
                        f"shared memory with it ({C.fmt_bytes(used + nbytes)}) exceeds the {C.fmt_bytes(budget)} "
                        "per block (shared-memory budget) — re-read from global memory"))
    return out


__all__ = ["RowStrategy", "choose_row_strategy", "fit_shared", "reduction_scratch", "operands_split",
           "WIDE_ROW", "SPLIT_ROW_MIN", "plan_row_caches"]
