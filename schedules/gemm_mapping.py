"""auto_schedule's mapping of a GEMM group: which recipe (Hopper's warpgroup wgmma, mma.sync tensor cores, the SIMT
tiles, the CPU's) and with which tiles, from the plan's parameters (`FusionGroup.gemm`) and the matmul's shape."""

from __future__ import annotations

import math
from typing import Any

from loopir.affine import multiple_of, same_value, simplify
from loopir.errors import ArgumentError
from loopir.nodes import Const, Expr, Load, Store
from loopir.visit import free_vars, substitute, walk

from .cost import H200
from .errors import InexactCheckError, ScheduleError
from .fusion import Decision, FusionGroup
from .primitives import find_loop
from .primitives.tensorize import HALF, half_load
from .primitives.wgmma import BLOCK_COLS
from .recipes import MMA_TILES, SIMT_KEYS, matmul_stage, schedule_gemm, schedule_gemm_cuda, simt_default
from .recipes.gemm import resolve_stage
from .recipes.gemm_mma import mma_applicable, mma_dtype, mma_tiles, schedule_gemm_mma
from .recipes.gemm_wgmma import schedule_gemm_wgmma, tile_cols
from .schedule import Schedule

__all__ = ["map_gemm"]


def map_gemm(s: Schedule, g: FusionGroup, target: str) -> None:
    """The tiled GEMM recipe on the group's matmul, its other stages as the epilogue (in order)."""
    mm, eps = g.stages[0].name, [t.name for t in g.stages[1:]]
    if mm not in matmul_stage(s.program):
        raise ArgumentError(f"auto_schedule: the plan maps {mm!r} as a GEMM but its lowered update statement is not "
                            "matmul-shaped")
    prm = dict(g.gemm or {})
    if g.collapse_rows:  # the plan's skinny linear layer: its batches' rows as one 2-d GEMM, if every step holds
        try:
            with s.attempt():
                if not _collapse_rows(s, g, mm):
                    raise ArgumentError(f"the batch loops of {mm!r} do not fold into its rows")
                _apply_recipe(s, g, mm, eps, prm, target)
            g.log.append(Decision("note", (mm,), None, "skinny linear layer: the batch loops collapsed into the "
                                  "rows (one 2-d row-major A over all batches, addresses folded)"))
            return
        except (ScheduleError, InexactCheckError, ArgumentError) as e:  # a GEMM per batch, no split
            why = str(e).splitlines()[0]
            g.log.append(Decision("note", (mm,), None, "skinny linear layer: its batches' rows not collapsed "
                                  f"({why[:100] + '...' if len(why) > 100 else why}); a GEMM per batch on "
                                  "blockIdx.z, no split"))
            prm = dict(g.gemm_batched or prm, split_k=None)
    _apply_recipe(s, g, mm, eps, prm, target)


def _apply_recipe(s: Schedule, g: FusionGroup, mm: str, eps: list[str], prm: dict[str, Any], target: str) -> None:
    """The recipe the group's parameters and the matmul's shape pick, applied (`map_gemm`)."""
    tensor_cores = target == "cuda" and _tensor_cores(s, g, prm)
    wg = _wgmma_block(s, g, prm) if tensor_cores else None
    if wg is not None:
        block, collapse = wg
        loops = s.loops(mm)
        nb = len(loops) - 3
        shape = "a plain 2-d matmul"
        if collapse:  # checked: quasi-affine (constant inner extents), recorded in the trace
            row = loops[0]
            try:
                for h in loops[1:nb + 1]:
                    row = s.collapse(row, h)
            except (ScheduleError, InexactCheckError, ArgumentError):
                collapse = False  # not expected (collapse keeps the order); the recipe takes the batch loops apart
        if collapse:
            shape = (f"a linear layer (the weight not read by the batch loops), batch loops collapsed into the rows "
                     f"({row.name}: one 2-d row-major A, addresses folded)")
        elif nb:
            shape = "a linear layer (the weight not read by the batch loop), the batch loop on blockIdx.z"
        g.gemm_plan = schedule_gemm_wgmma(s, mm, epilogue=eps, block=block)
        if collapse:
            g.gemm_plan.steps.insert(0, f"collapse the batch loops into the row loop: {row.name}")
        g.log.append(Decision("note", (mm,), None, f"tensor cores: float16/bfloat16 inputs, {shape}, whose A and B "
                              "rows are 16-byte aligned (lengths multiples of 8) -> Hopper's warpgroup recipe (wgmma "
                              "+ TMA or a cp.async ring, sm_90a; schedules/recipes/gemm_wgmma.py), tile "
                              f"{block}"))
    elif tensor_cores:
        dt = mma_dtype(s.program, mm)
        dims = [_costed(simplify(f.hi - f.lo), s) for f in (find_loop(s.program, h.var) for h in s.loops(mm)[:-1])]
        grid = (math.prod(dims[:-2]) if None not in dims[:-2] else None, *dims[-2:])  # type: ignore[arg-type]
        tiles = _fit_tiles(mma_tiles(dt, prm.get("mma"), grid, getattr(getattr(s, "plan", None), "device",
                                                                       H200).sm_count), dims[-2:])
        g.gemm_plan = schedule_gemm_mma(s, mm, epilogue=eps, **tiles, split_k=prm.get("split_k"))
        why = ("asked for (gemm tensor_cores=True)" if prm.get("tensor_cores") else
               f"{dt} inputs, the reduction a known multiple of 8 and at least 32 long (a last k tile "
               "past K zero-padded), rows and columns symbolic or at least one block tile")
        how = ("mma.sync m16n8k8 tf32, three products per product (float32-class accuracy; an infinite input gives "
               "NaN: gemm tensor_cores=False keeps float32 arithmetic)" if dt == "float32" else "mma.sync m16n8k16")
        g.log.append(Decision("note", (mm,), None, f"tensor cores: {why} -> {how} recipe "
                              f"(schedules/recipes/gemm_mma.py; edge tiles guarded), tiles {tiles}"))
    elif target == "cuda":
        g.gemm_plan = schedule_gemm_cuda(s, mm, epilogue=eps, **{k: prm[k] for k in SIMT_KEYS if k in prm})
    else:
        g.gemm_plan = schedule_gemm(s, mm, epilogue=eps, target="cpu", cpu_tile=prm.get("cpu_tile"))


def _collapse_rows(s: Schedule, g: FusionGroup, mm: str) -> bool:
    """The batch loops of a skinny linear layer (`FusionGroup.collapse_rows`) collapsed into its row loop (checked
    steps), so that the recipes see one 2-d GEMM over all batches' rows; False when its accesses do not fold
    (`_rows_collapse`)."""
    loops = s.loops(mm)
    nb = len(loops) - 3
    upd, _ = resolve_stage(s.program, mm, [], "auto_schedule")
    if nb < 1 or not _rows_collapse(s, g, upd, nb):
        return False
    row = loops[0]
    for h in loops[1:nb + 1]:
        row = s.collapse(row, h)
    return True


def _fit_tiles(tiles: dict[str, Any], dims: list[Any]) -> dict[str, Any]:
    """The tensor-core tiles with the block no larger than a matrix side of known size (the fragments read whole
    tiles, and a shared tile is clipped to the matrix: schedule_gemm_mma refuses one smaller than the block):
    16 x 8 multiples, the warp tile cut to the block."""
    block, warp = list(tiles["block"]), list(tiles["warp"])
    for d, (ext, unit) in enumerate(zip(dims, (16, 8))):
        if ext is not None and unit <= ext < block[d]:
            block[d] = max(x for x in (unit << i for i in range(5)) if x <= ext and x <= block[d])
            warp[d] = min(warp[d], block[d])
            while block[d] % warp[d]:
                warp[d] //= 2
    return {**tiles, "block": tuple(block), "warp": tuple(warp)}


def _tensor_cores(s: Schedule, g: FusionGroup, prm: dict[str, Any]) -> bool:
    """The tensor-core recipe applies: half inputs read A[.., i, k] and B[.., k, j] (mma_applicable), batch loops
    or none (they go on blockIdx.z: a linear layer over (B, T, C) activations), the SIMT tiles not chosen by the
    caller (gemm tensor_cores=False: never), the reduction a known multiple of 8 (`16*p16` after call-time
    specialization; a last k tile past K is zero-padded by the CUDA pipeline, codegen.passes.pad); unless asked
    for (tensor_cores=True), rows and columns at least one block tile where known (skinny shapes keep the SIMT
    skinny tiles; symbolic ones are taken: edge tiles are guarded; a linear layer's rows are all its batches' at
    the plan's sizes) and the reduction at least one k tile long."""
    mm = g.stages[0]
    forced = prm.get("tensor_cores")
    if forced is False or (not forced and prm and not simt_default(prm)):
        return False
    if mma_applicable(s.program, mm.name) is not None:
        return False
    loops = s.loops(mm.name)
    if len(loops) != len(mm.shape) + 1:
        return False
    dims = [simplify(f.hi - f.lo) for f in (find_loop(s.program, h.var) for h in loops[-3:])]
    # a K that is not a known multiple of 8 leaves A's rows off 16-byte boundaries, and its element-wise copies
    # made the tensor-core kernel slower than the SIMT one (H200, float16 1001 x 1003 x 999 at symbolic sizes:
    # 0.71 ms vs 0.48 ms)
    if not multiple_of(dims[2], 8):
        return False
    if forced:
        return True
    tiles = mma_tiles(mma_dtype(s.program, mm.name), prm.get("mma"))
    if isinstance(dims[2], Const) and int(dims[2].value) < tiles["k_tile"]:
        return False
    nb = len(loops) - 3
    upd, _ = resolve_stage(s.program, mm.name, [], "auto_schedule")
    if nb and _linear_layer(upd, nb):  # all batches' rows meet one weight (wgmma collapses them into its rows)
        ext = [_costed(simplify(f.hi - f.lo), s) for f in (find_loop(s.program, h.var) for h in loops[:nb + 1])]
        if None not in ext:  # (at sizes the plan was not given, the rows of one batch decide, as before)
            dims[0] = Const(math.prod(ext), "int64")  # type: ignore[arg-type]
    return all(not isinstance(d, Const) or int(d.value) >= t for d, t in zip(dims, tiles["block"]))


def _wgmma_block(s: Schedule, g: FusionGroup, prm: dict[str, Any]) -> tuple[tuple[int, int], bool] | None:
    """The tile of Hopper's warpgroup recipe when it applies to a matmul `_tensor_cores` took, and whether its batch
    loops are first collapsed into its rows (`_rows_collapse`); else None: not turned off (gemm wgmma=False), no
    mma.sync tiles nor split_k chosen by the caller, a plain (i, j, k) matmul or a linear layer (batch loops around
    it that the weight, the operand read along j, does not read: X[b, t, k] @ W[k, j]; a true batched matmul keeps
    mma.sync),
    rows of A and B of a length that is a known multiple of 8 (16-byte cp.async chunks), and rows and columns at
    least 64 where known. Batch loops that are not collapsed stay apart, one loop (the recipe's blockIdx.z); more
    than one that cannot be collapsed: None. The tile: 128 x 256 (measured fastest, H200), fewer rows or columns
    where the matrix has fewer (the rows of a collapsed nest: all batches')."""
    wg = prm.get("wgmma")
    if wg is False or (wg is None and prm.get("mma") not in (None, MMA_TILES)) or prm.get("split_k"):
        return None  # (split-K: the mma.sync recipe takes it, the warpgroup one does not)
    mm = g.stages[0]
    loops = s.loops(mm.name)
    nb = len(loops) - 3
    upd, _ = resolve_stage(s.program, mm.name, [], "auto_schedule")
    ops = [half_load(x) for x in (upd.value.b.a, upd.value.b.b)]  # type: ignore[attr-defined]
    if nb < 0 or not all(isinstance(x, Load) and x.buffer.dtype in HALF and multiple_of(x.buffer.shape[-1], 8)
                         for x in ops):
        return None  # (float32 operands: mma.sync tf32x3; wgmma's TF32 takes K-major B only)
    if nb and not _linear_layer(upd, nb):
        return None  # a weight read at b: a batched matmul (each batch its own B), mma.sync on blockIdx.z
    collapse = nb > 0 and _rows_collapse(s, g, upd, nb)
    if nb > 1 and not collapse:
        return None
    fors = [find_loop(s.program, h.var) for h in loops]
    row_ext = [simplify(f.hi - f.lo) for f in fors[:nb + 1]]
    rows = row_ext[-1]
    if collapse:  # all batches' rows (the inner extents are constants; a symbolic B leaves them symbolic)
        rows = Const(math.prod(int(e.value) for e in row_ext), "int64") if all(
            isinstance(e, Const) for e in row_ext) else row_ext[0]
    if isinstance(wg, dict):
        return wg["block"], collapse
    cols = simplify(fors[nb + 1].hi - fors[nb + 1].lo)
    r = 128 if not isinstance(rows, Const) or int(rows.value) >= 128 else 64 if int(rows.value) >= 64 else 0
    c = 256 if not isinstance(cols, Const) else max((x for x in BLOCK_COLS if x <= int(cols.value)), default=0)
    batches = Const(1, "int64") if collapse or nb == 0 else row_ext[0]  # the batch loop on blockIdx.z
    each = [_costed(e, s) for e in (row_ext if collapse else [rows])]  # all batches' rows when collapsed
    known = [None if None in each else math.prod(each), _costed(cols, s), _costed(batches, s)]  # type: ignore[arg-type]
    if c == 256 and all(x is not None for x in known):
        c = tile_cols(*known, r)  # type: ignore[arg-type]
    return ((r, c), collapse) if r and c else None


def _linear_layer(upd: Store, nb: int) -> bool:
    """The matmul update under `nb` batch loops reads its weight (the operand that does not read the row iterator)
    at no batch iterator: X[b, t, k] @ W[k, j], all batches' rows against one W."""
    ops = [half_load(x) for x in (upd.value.b.a, upd.value.b.b)]  # type: ignore[attr-defined]
    weight = [x for x in ops if x is not None and upd.iters[nb] not in free_vars(x)]
    return len(weight) == 1 and not set(upd.iters[:nb]) & free_vars(weight[0])


def _costed(e: Expr, s: Schedule) -> int | None:
    """`e`'s value: a constant, or a symbolic size at the sizes the plan was costed at (None: unknown)."""
    plan = getattr(s, "plan", None)
    sizes = getattr(plan, "sizes", None) or {}
    got = simplify(substitute(e, {v: Const(int(sizes[v.name]), "int64") for v in free_vars(e) if v.name in sizes}))
    return int(got.value) if isinstance(got, Const) else None


def _rows_collapse(s: Schedule, g: FusionGroup, upd: Store, nb: int) -> bool:
    """The `nb` batch loops of a linear layer fold into its row loop: one (B*T) x K matrix A, its tiles across
    batches. Precondition for each loop after the first (the divisors of the collapsed index): a constant extent,
    so that `collapse` is quasi-affine and checked exactly (with a symbolic T it refuses a nest with dependences;
    the batch loop then stays apart). And every use of the batch and row iterators in the group's statements (the
    matmul's, its epilogue's) is as the leading indices, in order, of an access to a buffer whose following extents
    are those loops' extents, so that each address `((f // T) * T + f % T) * C + c` folds back to `f * C + c`
    (loopir.affine.row_major) and no element pays a division or a modulo (a guard or a value using t, a table
    read at [t, c], would)."""
    loops = s.loops(upd.name)[:nb + 1]
    fors = [find_loop(s.program, h.var) for h in loops]
    ext = [simplify(f.hi - f.lo) for f in fors]
    if any(not _zero(f.lo) for f in fors) or not all(isinstance(e, Const) for e in ext[1:]):
        return False
    names = [t.name for t in g.stages[1:]]
    nests = [fors[0]] + [find_loop(s.program, s.loops(n)[0].var) for n in names if s.loops(n)]
    stores = [n for nest in nests for n in walk(nest) if isinstance(n, Store)]
    return bool(stores) and all(_leading_rows(st, nb + 1, ext) for st in stores)


def _leading_rows(st: Store, n: int, ext: list[Expr]) -> bool:
    """Every occurrence of the first `n` iterators of the unscheduled statement `st` (coordinates = iterators) is
    as the leading indices, in order, of a load or of the store, into a buffer whose extents after the first are
    `ext[1:]` (the access folds to a 2-d one: `_rows_collapse`)."""
    lead = st.iters[:n]
    if len(st.iters) <= n or any(c is not v for c, v in zip(st.coords, lead)):
        return False

    def leading(buf: Any, idx: tuple[Expr, ...]) -> bool:  # the iterators lead idx, in order, and only there
        return (len(idx) > n and all(a is v for a, v in zip(idx, lead))
                and not any(set(lead) & free_vars(i) for i in idx[n:])
                and len(buf.shape) > n and all(same_value(a, b) for a, b in zip(buf.shape[1:n], ext[1:])))

    if not leading(st.buffer, st.indices):
        return False
    loads = [x for x in walk(st.value) if isinstance(x, Load) and set(lead) & free_vars(x)]
    # no other use: each iterator occurs once in each load that reads it, nowhere else in the value
    return all(leading(x.buffer, x.indices) for x in loads) and all(
        sum(1 for x in walk(st.value) if x is v) == len(loads) for v in lead)


def _zero(e: Expr) -> bool:
    e = simplify(e)
    return isinstance(e, Const) and e.value == 0

