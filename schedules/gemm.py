"""The classic tiled GEMM as a sequence of checked Schedule steps (the handle for tuning later).

    schedule_gemm(s, "matmul", epilogue=["C"], target="cuda", block=(64, 128), thread_tile=(8, 8), k_tile=16)
    schedule_gemm(s, "matmul", epilogue=["C"], target="cpu", cpu_tile=(6, 64))

On "cuda" this is `schedules.gemm_cuda.schedule_gemm_cuda` (one CUDA GEMM recipe: block tiles staged in
shared memory, a register tile per thread, the elementwise epilogue on the register tile; tile sizes
not given take that recipe's defaults, the measured best on an H200). On "cpu" (cpu_tile=(6, 64) on
AVX-512, see `default_cpu_tile`):

    for jo in parallel:                                # a column panel of B (n x 64) stays in L2
      for io:                                          # a 6-row strip of A streams past it
        allocate C_local[6, 64] local                  # cache_write: lives in 24 vector registers
        for ii (unroll), ji (vectorize): C_local = 0
        for k: for ii (unroll): for ji (vectorize): C_local[ii, ji] += A[.., k] * B[k, ..]   # FMAs
        for q0 (unroll), q1 (vectorize): out[..] = epilogue(C_local[q0, q1])

`matmul_stage(program)` finds matmul-shaped reductions (`auto_schedule` schedules each with this recipe):
a statement `C[i, j] = C[i, j] + X * Y` inside loops (i, j, k) with an initialising statement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loopir.nodes import Binary, Buffer, Load, Program, Store
from loopir.target import vector_bits, vector_registers
from loopir.visit import statements

import schedules.primitives.cache_write  # noqa: F401  (registers Schedule.cache_write)

__all__ = ["GemmPlan", "matmul_stage", "schedule_gemm", "elementwise_consumers"]


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
    raise ValueError(f"schedule_gemm: no matmul-shaped reduction statement named {stage!r} in {program.name!r}")


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
    """Names of the statements of `program` that are matmul-shaped: C[i, j] += X[.., k] * Y[k, ..]
    (2-d accumulator, one more loop than the output rank, product of two loads)."""
    out = []
    for c in statements(program):
        st = c.store
        if not _is_update(st) or len(st.indices) != 2 or len(st.iters) != 3:
            continue
        rhs = st.value.b  # type: ignore[attr-defined]
        if isinstance(rhs, Binary) and rhs.op == "mul" and _loads(rhs.a) and _loads(rhs.b):
            out.append(st.name)
    return out


def _loads(e: Any) -> bool:
    from loopir.visit import walk

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
    from loopir.visit import walk

    return list(walk(e))


def _pos_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def _check_tiles(block: tuple[int, int], thread_tile: tuple[int, int], k_tile: int) -> None:
    for name, v in (("block", block), ("thread_tile", thread_tile)):
        if not (isinstance(v, tuple) and len(v) == 2 and all(_pos_int(x) for x in v)):
            raise ValueError(f"schedule_gemm: {name} must be two positive ints, got {v!r}")
    if not _pos_int(k_tile):
        raise ValueError(f"schedule_gemm: k_tile must be a positive int, got {k_tile!r}")
    for d in range(2):
        if block[d] % thread_tile[d]:
            raise ValueError(f"schedule_gemm: block {block} is not a multiple of thread_tile {thread_tile}")
    if (block[0] // thread_tile[0]) * (block[1] // thread_tile[1]) > 1024:
        raise ValueError(f"schedule_gemm: block {block} / thread_tile {thread_tile} needs more than 1024 threads")


def schedule_gemm(s: Any, stage: str | Any = None, epilogue: Any = "auto", target: str = "cuda",
                  block: tuple[int, int] | None = None, thread_tile: tuple[int, int] | None = None,
                  k_tile: int | None = None, shared: bool = True, cpu_tile: tuple[int, int] | None = None,
                  **cuda_opts: Any) -> GemmPlan:
    """Apply the tiled-GEMM recipe to the matmul-shaped reduction `stage` of Schedule `s`.

    `stage`: the update statement's name (or tensor); None picks the only matmul-shaped one.
    `epilogue`: elementwise consumers fused into the single store ("auto": every elementwise
    consumer chain found by `elementwise_consumers`; [] for none). Tile sizes are parameters:
    on "cuda" `block`, `thread_tile`, `k_tile`, `shared` and `cuda_opts` (`strided`, `unroll_k`) go to
    `schedule_gemm_cuda` (None: its defaults); on "cpu" `cpu_tile` (None: `default_cpu_tile()`).
    Returns a GemmPlan (`.explain()`); the schedule `s` is modified in place.
    """
    if target not in ("cuda", "cpu"):
        raise ValueError(f"schedule_gemm: target must be 'cuda' or 'cpu', got {target!r}")
    if target == "cuda":
        from schedules.gemm_cuda import schedule_gemm_cuda

        tiles = {k: v for k, v in (("block", block), ("thread_tile", thread_tile), ("k_tile", k_tile))
                 if v is not None}
        return schedule_gemm_cuda(s, stage, epilogue, shared=shared, **tiles, **cuda_opts)
    if cuda_opts:
        raise ValueError(f"schedule_gemm: {', '.join(sorted(cuda_opts))} only apply to target 'cuda'")
    if cpu_tile is not None and not (isinstance(cpu_tile, tuple) and len(cpu_tile) == 2 and all(
            _pos_int(x) for x in cpu_tile)):
        raise ValueError(f"schedule_gemm: cpu_tile must be two positive ints, got {cpu_tile!r}")
    upd, eps = resolve_stage(s.program, stage, epilogue, "schedule_gemm")
    plan = GemmPlan(upd.name, list(eps), target)
    _cpu(s, upd, eps, cpu_tile, plan)
    return plan


def resolve_stage(program: Program, stage: Any, epilogue: Any, who: str) -> tuple[Store, list[str]]:
    """The matmul's update statement (`stage`: a name, a tensor, or None for the only matmul-shaped
    reduction) and the names of its epilogue stages; ValueError naming `who` otherwise."""
    if stage is None:
        found = matmul_stage(program)
        if len(found) != 1:
            raise ValueError(f"{who}: expected one matmul-shaped reduction, found {found or 'none'}")
        stage = found[0]
    if not isinstance(stage, str):
        stage = stage.name
    upd = _update(program, stage)
    return upd, _epilogue_names(program, upd.name, epilogue)


def _epilogue_names(program: Program, stage: str, epilogue: Any) -> list[str]:
    if epilogue == "auto":
        return elementwise_consumers(program, stage)
    return [e if isinstance(e, str) else e.name for e in ([epilogue] if isinstance(epilogue, str) else epilogue)]


def _operands(upd: Store) -> list[Buffer]:
    out: list[Buffer] = []
    for n in _walk(upd.value.b):  # type: ignore[attr-defined]
        if isinstance(n, Load) and n.buffer not in out and n.buffer is not upd.buffer:
            out.append(n.buffer)
    return out


def default_cpu_tile() -> tuple[int, int]:
    """The register tile of this host: 6 rows x 4 vector registers (6x64 floats on AVX-512, 6x32 on AVX2):
    24 accumulators + 4 row-of-B vectors + 1 broadcast fit in the 32 (16 on AVX2: 6x16) vector registers."""
    try:
        bits = vector_bits()
        regs = vector_registers()
    except ImportError:  # no LLVM: a tile that is reasonable anywhere
        bits, regs = 256, 16
    lanes = bits // 32
    return (6, 4 * lanes) if regs == 32 else (6, 2 * lanes)


def _cpu(s: Any, upd: Store, eps: list[str], tile: tuple[int, int] | None, plan: GemmPlan) -> None:
    """for jo (parallel): for io: C_local[tile] = 0; for k: for ii (unroll): for ji (vectorize): C_local += A*B;
    then the copy-out / epilogue. B's column panel (n x tile[1]) stays in L2 while every row strip of A
    streams past it; the tile lives in vector registers (the code generator keeps `local` scratch that is
    only touched by unrolled, vectorized loops in SSA values)."""
    name = upd.name
    tile = default_cpu_tile() if tile is None else tile
    i, j, k = s.loops(name)[-3:]
    io, ii = s.split(i, tile[0])
    jo, ji = s.split(j, tile[1])
    s.reorder(jo, io, ii, ji)
    plan.steps.append(f"tile (i, j) by {tile}; reorder(jo, io, ii, ji): column panels of B outermost")
    # before cache_write: the checker does not treat the scratch buffer as private to each iteration
    s.parallel(jo)
    plan.steps.append("parallel(jo)")
    s.cache_write(upd.buffer.name, "local", io, epilogue=eps)
    plan.steps.append(f"cache_write({upd.buffer.name}, 'local', io, epilogue={eps}): {tile[0]}x{tile[1]} register tile")
    ii, ji, k = s.loops(name)[-3:]
    s.reorder(k, ii, ji)
    plan.steps.append("reorder(k, ii, ji): the register tile is updated by one k at a time")
    s.unroll(ii)
    s.vectorize(ji)
    plan.steps.append("unroll(ii), vectorize(ji): one broadcast of A and tile[1]/VL loads of B per row and k")
    local = f"{upd.buffer.name}_local"
    others = [c.store.name for c in statements(s.program)
              if c.store.name != name and (c.store.buffer.name == local or any(
                  isinstance(n, Load) and n.buffer.name == local for n in _walk(c.store.value)))]
    for st in others:
        a, b = s.loops(st)[-2:]
        s.unroll(a)
        s.vectorize(b)
    plan.steps.append(f"unroll + vectorize the tile loops of {', '.join(others)}")


# ----------------------------------------------------------------------------- for the fusion planner


def is_matmul_tensor(t: Any) -> bool:
    """The te mirror of `matmul_stage`: t = sum over one reduce axis of (X * Y), X and Y reading tensors,
    with a 2-d output (what lowers to a matmul-shaped update statement)."""
    from loopir.te import ComputeOp, Reduce

    op = getattr(t, "op", None)
    if not isinstance(op, ComputeOp) or not isinstance(op.body, Reduce) or op.body.op != "sum":
        return False
    body = op.body.body
    return (len(t.shape) == 2 and len(op.reduce_axis) == 1 and isinstance(body, Binary) and body.op == "mul"
            and _loads(body.a) and _loads(body.b))


GEMM_KEYS = {"cuda": ("block", "thread_tile", "k_tile", "shared", "strided", "unroll_k"), "cpu": ("cpu_tile",)}


def gemm_params(target: str, gemm: dict[str, Any] | None = None) -> dict[str, Any]:
    """The tile parameters of the GEMM recipe for `target`: the recipe's defaults, overridden by `gemm`.
    cuda: block, thread_tile, k_tile (and shared, strided, unroll_k) of `schedule_gemm_cuda`;
    cpu: cpu_tile (default `default_cpu_tile()`). ValueError naming an unknown key or a bad size."""
    import inspect

    if target not in GEMM_KEYS:
        raise ValueError(f"gemm_params: target must be 'cuda' or 'cpu', got {target!r}")
    given = dict(gemm or {})
    bad = [k for k in given if k not in GEMM_KEYS[target]]
    if bad:
        raise ValueError(f"auto_schedule: unknown gemm parameter {', '.join(map(repr, bad))} for target {target!r}; "
                         f"expected some of {', '.join(GEMM_KEYS[target])}")
    for k in ("block", "thread_tile", "cpu_tile"):
        if isinstance(given.get(k), list):
            given[k] = tuple(given[k])
    if target == "cpu":
        tile = given.get("cpu_tile") or default_cpu_tile()
        if not (isinstance(tile, tuple) and len(tile) == 2 and all(_pos_int(x) for x in tile)):
            raise ValueError(f"auto_schedule: gemm cpu_tile must be two positive ints, got {tile!r}")
        return {"cpu_tile": tile}
    from schedules.gemm_cuda import schedule_gemm_cuda

    sig = inspect.signature(schedule_gemm_cuda).parameters
    out = {k: given.get(k, sig[k].default) for k in GEMM_KEYS["cuda"]}
    _check_tiles(out["block"], out["thread_tile"], out["k_tile"])
    return out


def gemm_resources(params: dict[str, Any], itemsize: int = 4) -> tuple[int, int, int]:
    """(threads per block, bytes of one stage of the shared A and B tiles, accumulator registers per thread)
    of the CUDA recipe with `params` (from `gemm_params`)."""
    (b0, b1), (t0, t1), kt = params["block"], params["thread_tile"], params["k_tile"]
    smem = (b0 * kt + kt * b1) * itemsize if params.get("shared", True) else 0
    return (b0 // t0) * (b1 // t1), smem, t0 * t1
