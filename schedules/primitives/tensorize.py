"""tensorize: map a warp's 16x8x16 register-tile update onto one tensor-core instruction (mma.sync m16n8k16).

The instruction is warp-wide: lane `l` of a warp holds four elements of the 16x8 accumulator tile, rows
`l // 4 + 8 * eh` and columns `2 * (l % 4) + el` for (eh, el) in {0, 1}^2 (PTX ISA, "Matrix Fragments for
mma.m16n8k16"). The nest this primitive accepts is exactly what one lane computes::

    for eh in range(0, 2):
      for el in range(0, 2):
        for k in range(0, 16):
          acc[.., eh, .., el] += A_sh[r0 + lane // 4 + 8 * eh, k0 + k] * B_sh[k0 + k, c0 + 2 * (lane % 4) + el]
    ->
    for eh in mma.m16n8k16(0, 2):        # the same nest, marked: its loops are the instruction's reference semantics
      ...

The loops stay in the IR, so the interpreters, bounds proofs, race and barrier checks read the reference
semantics; the CUDA renderer (codegen/cuda/mma.py) prints `ldmatrix` + `mma.sync` instead of the nest and
the CPU target runs the loops. The only change of meaning is the order of the 16-term sum of each element
(the instruction reassociates it, as every parallel reduction does).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np

from loopir.affine import eval_index
from loopir.errors import ArgumentError
from loopir.nodes import Binary, Cast, Const, Expr, For, If, Load, Program, Store, Var, conjunction, conjuncts
from loopir.visit import free_vars

from . import const_extent, find_loop_path, only_stmt, primitive, replace_loop
from .flash import FLASH_KINDS, FlashMismatch, flash_parts
from .wgmma import WGMMA, WgmmaMismatch, wgmma_parts

__all__ = ["MMA_SHAPES", "MMA_TF32", "MMA_TYPES", "mma_kind", "INTRINSICS", "TensorizeError", "tensorize",
           "mma_operands", "is_tensorized"]

# the instruction's (m, n, k) and the operand types it takes; "mma.m16n8k16.tf32x3" runs a float32 fragment as three
# TF32 products (a_lo b_hi + a_hi b_lo + a_hi b_hi, each operand split x = hi + lo: codegen.cuda.mma), float32-class
# accuracy on tensor cores
MMA_SHAPES = {"mma.m16n8k16": (16, 8, 16), "mma.m16n8k16.tf32x3": (16, 8, 16)}
MMA_TF32 = "mma.m16n8k16.tf32x3"
MMA_TYPES = {"mma.m16n8k16": ("float16", "bfloat16"), MMA_TF32: ("float32",)}
# FLASH_KINDS: a block's online-softmax pass (schedules/primitives/flash.py); WGMMA: a block's GEMM tile on Hopper's
# warpgroup tensor cores (schedules/primitives/wgmma.py)
INTRINSICS = (*MMA_SHAPES, *FLASH_KINDS, WGMMA)
HALF = ("float16", "bfloat16")


class TensorizeError(ArgumentError):
    """tensorize refused: the nest is not what the instruction computes (the message says which part)."""


@dataclasses.dataclass(frozen=True)
class MmaOperands:
    """The parts of a tensorized nest the renderer needs: the three loops (eh, el, k), the lane variable,
    the update statement and its two operand loads (A rows x k, B k x columns)."""

    eh: Var
    el: Var
    k: Var
    lane: Var
    store: Store
    a: Load
    b: Load
    guard: Expr | None = None
    kind: str = "mma.m16n8k16"  # the instruction (MMA_SHAPES)

    @property
    def tf32(self) -> bool:
        return self.kind == MMA_TF32



def is_tensorized(f: object) -> bool:
    """`f` is a loop marked by tensorize (its nest runs as an intrinsic on the CUDA target)."""
    return isinstance(f, For) and f.kind in INTRINSICS


def half_load(e: Expr) -> Expr:
    """The load under `cast(float32, load)` of a float16 / bfloat16 tile (the float32-accumulation idiom: the
    product of two halves is exact in float32, so the instruction's float32 products are the same values), else
    `e` itself."""
    if isinstance(e, Cast) and e.dtype == "float32" and isinstance(e.a, Load) and e.a.buffer.dtype in HALF:
        return e.a
    return e


def mma_kind(dtype: str) -> str:
    """The mma instruction for operands of `dtype`: m16n8k16 for float16 / bfloat16, three TF32 m16n8k8 for float32."""
    return MMA_TF32 if dtype == "float32" else "mma.m16n8k16"


def mma_operands(f: For, lanes: dict[Var, For], what: str = "tensorize", k_guard: bool = False,
                 intrinsic: str | None = None) -> MmaOperands:
    """Check that `f` heads the nest one lane computes for `intrinsic` (None: `f`'s own kind when it is marked, else
    the instruction of the operands' type: `mma_kind`; see the module docstring) and return its parts.
    `lanes`: the loops bound to threadIdx.x around it. TensorizeError naming the first mismatch otherwise.
    `k_guard`: a guard on k (the last k tile of a K that 32 does not divide) is accepted, for the CUDA pipeline to
    remove (codegen.passes.pad zero-fills the operand tiles); the lowered nest must have none."""
    el_f = only_stmt(f.body)
    k_f = only_stmt(el_f.body) if isinstance(el_f, For) else None
    st = only_stmt(k_f.body) if isinstance(k_f, For) else None
    conds: list[Expr] = []
    while isinstance(st, If) and st.orelse is None and isinstance(k_f, For):
        conds += conjuncts(st.cond)
        st = only_stmt(st.then)
    # an edge tile's guard on the output element (row < n and column < m), not on k: the instruction computes
    # the element anyway into an accumulator whose C element lies outside the matrix, and the epilogue's
    # store is guarded by the same condition, so that value is never observed
    on_k = [c for c in conds if isinstance(k_f, For) and k_f.var in free_vars(c)]
    rest = [c for c in conds if c not in on_k]
    guard = conjunction(rest) if rest else None
    if on_k and not k_guard:
        raise TensorizeError(f"{what}: the update is guarded on k ({' and '.join(map(str, on_k))}); the instruction "
                             "adds all 16 terms of a fragment, so the terms past K must be zeros in the shared tiles "
                             "(codegen.passes.pad, which applies to acc += A_tile * B_tile with A and B staged in the "
                             "k loop)")
    if not (isinstance(el_f, For) and isinstance(k_f, For) and isinstance(st, Store)):
        raise TensorizeError(f"{what}: loop {f.var.name!r} must head a perfect nest of three loops (eh, el, k) "
                             "around one update statement")
    v = st.value
    prod = v.b if isinstance(v, Binary) and v.op == "add" else None
    fa, fb = (half_load(prod.a), half_load(prod.b)) if isinstance(prod, Binary) else (None, None)
    if not (isinstance(v.a, Load) and v.a.buffer is st.buffer and v.a.indices == st.indices  # type: ignore[union-attr]
            and isinstance(prod, Binary) and prod.op == "mul"
            and isinstance(fa, Load) and isinstance(fb, Load)):
        raise TensorizeError(f"{what}: statement {st.name!r} is not a matmul-shaped update "
                             "C[..] = C[..] + A[..] * B[..]")
    a, b = fa, fb
    if st.buffer.scope != "local":
        raise TensorizeError(f"{what}: the accumulator {st.buffer.name!r} is {st.buffer.scope}; the instruction "
                             "accumulates in registers (cache_write it to 'local' first)")
    for x in (a, b):
        if x.buffer.scope != "shared":
            raise TensorizeError(f"{what}: operand {x.buffer.name!r} is in {x.buffer.scope} memory; ldmatrix "
                                 "reads shared memory (cache_read it to 'shared' first)")
        if len(x.indices) < 2 or any(getattr(d, "value", None) != 1 for d in x.buffer.shape[:-2]):
            raise TensorizeError(f"{what}: operand {x.buffer.name!r} must be a 2-d shared tile (leading dimensions "
                                 "of extent 1, e.g. the batch of a batched GEMM, are accepted)")
    kind = intrinsic or (f.kind if f.kind in MMA_SHAPES else mma_kind(a.buffer.dtype))
    types = MMA_TYPES[kind]
    if a.buffer.dtype not in types or b.buffer.dtype != a.buffer.dtype:
        want = "both float16 or both bfloat16" if len(types) > 1 else f"both {types[0]}"
        other = mma_kind(a.buffer.dtype)  # the instruction for A's type, where one takes it
        hint = (f"; {' / '.join(MMA_TYPES[other])} operands take {other!r}"
                if other != kind and a.buffer.dtype in MMA_TYPES[other] else "")
        raise TensorizeError(f"{what}: operands {a.buffer.name!r} ({a.buffer.dtype}) and {b.buffer.name!r} "
                             f"({b.buffer.dtype}) of {kind} must be {want}{hint}")
    kx = MMA_SHAPES[kind][2]
    ext = tuple(const_extent(x, from_zero=True) for x in (f, el_f, k_f))
    if ext != (2, 2, kx):
        raise TensorizeError(f"{what}: the nest {f.var.name}, {el_f.var.name}, {k_f.var.name} has extents {ext}; "
                             f"{kind} needs (2, 2, {kx}): split the tile by 16 x 8 x {kx} first")
    if st.buffer.dtype not in ("float32", a.buffer.dtype):
        raise TensorizeError(f"{what}: accumulator {st.buffer.name!r} is {st.buffer.dtype}; the instruction "
                             "accumulates in float32")
    lane_vars = [lv for lv, lf in lanes.items() if const_extent(lf, from_zero=True) == 32]
    if len(lanes) != 1 or not lane_vars:
        raise TensorizeError(f"{what}: the nest must sit inside exactly one loop bound to threadIdx.x of extent 32 "
                             "(the lanes of one warp); warps go on threadIdx.y / threadIdx.z")
    lane = lane_vars[0]
    eh, el, k = f.var, el_f.var, k_f.var
    _check_lane_map(what, st, a, b, lane, eh, el, k, kx)
    return MmaOperands(eh, el, k, lane, st, a, b, guard, kind)


_GRID_OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "floordiv": np.floor_divide, "mod": np.mod,
             "max": np.maximum, "min": np.minimum}


def _grid(e: Expr, env: dict[Var, Any]) -> Any:
    """`e` evaluated at every point of the numpy grids in `env` (integer index arithmetic, Python's floor semantics,
    as numpy's); None for anything else (the caller then evaluates point by point)."""
    if isinstance(e, Const) and isinstance(e.value, int):
        return np.int64(e.value)
    if isinstance(e, Var):
        return env.get(e)
    if isinstance(e, Binary) and e.op in _GRID_OPS:
        x, y = _grid(e.a, env), _grid(e.b, env)
        return None if x is None or y is None else _GRID_OPS[e.op](x, y)
    return None


def _check_lane_map(what: str, st: Store, a: Load, b: Load, lane: Var, eh: Var, el: Var, k: Var, kx: int) -> None:
    """Evaluate the indices at every (lane, eh, el, k) for two random values of the outer variables and
    compare them with the instruction's fragment layout."""
    own = {lane, eh, el, k}
    per = 16 // (2 if a.buffer.dtype in HALF else 4)  # elements per 16 bytes
    outer = sorted((free_vars(a) | free_vars(b) | free_vars(st)) - own, key=lambda x: x.name)
    rng = random.Random(12)
    ln, h, e, kk = np.meshgrid(np.arange(32), np.arange(2), np.arange(2), np.arange(kx), indexing="ij")
    for trial in range(2):
        env = {x: (0 if trial == 0 else rng.randrange(0, 7)) for x in outer}
        base = {**env, lane: 0, eh: 0, el: 0, k: 0}
        r0, ka = (eval_index(i, base) for i in a.indices[-2:])
        kb, c0 = (eval_index(i, base) for i in b.indices[-2:])
        if ka % per or c0 % per or kb % per:
            raise TensorizeError(f"{what}: the tile origins (A[{r0}, {ka}], B[{kb}, {c0}]) are not multiples of "
                                 f"{per} elements: ldmatrix needs 16-byte aligned rows")
        genv = {**{x: np.int64(v) for x, v in env.items()}, lane: ln, eh: h, el: e, k: kk}
        got = [_grid(i, genv) for i in (*a.indices[-2:], *b.indices[-2:], *st.indices)]
        if any(g is None for g in got):  # an index outside integer arithmetic: point by point
            got = [np.vectorize(lambda p, q, r, t, i=i, env=env: eval_index(i, {**env, lane: p, eh: q, el: r, k: t}))(
                ln, h, e, kk) for i in (*a.indices[-2:], *b.indices[-2:], *st.indices)]
        got = [np.broadcast_to(g, ln.shape) for g in got]
        want = [r0 + ln // 4 + 8 * h, ka + kk, kb + kk, c0 + 2 * (ln % 4) + e]
        bad = np.argwhere(np.any([g != w for g, w in zip(got[:4], want)], axis=0))
        if len(bad):
            p = tuple(int(x) for x in bad[0])
            ai, bi = [int(g[p]) for g in got[:2]], [int(g[p]) for g in got[2:4]]
            want_a, want_b = [int(w[p]) for w in want[:2]], [int(w[p]) for w in want[2:]]
            raise TensorizeError(
                f"{what}: at lane {p[0]}, {eh.name}={p[1]}, {el.name}={p[2]}, {k.name}={p[3]} the nest reads "
                f"{a.buffer.name}{ai} and {b.buffer.name}{bi}; the m16n8k{kx} fragment "
                f"layout reads {a.buffer.name}{want_a} and {b.buffer.name}{want_b}")
        cells: dict[tuple[int, ...], tuple[int, int]] = {}
        for ci, he in zip(zip(*(g.ravel().tolist() for g in got[4:])), zip(h.ravel().tolist(), e.ravel().tolist())):
            if cells.setdefault(ci, he) != he:
                raise TensorizeError(f"{what}: accumulator element {st.buffer.name}{list(ci)} is updated "
                                     "by two of the lane's four fragment elements")
    for ln_sh in (a.buffer.shape[-1], b.buffer.shape[-1]):
        if getattr(ln_sh, "value", 0) % per:
            raise TensorizeError(f"{what}: shared rows of {ln_sh} elements are not 16-byte multiples (ldmatrix)")


@primitive("tensorize", check=None)
def tensorize(program: Program, loop: Var, intrinsic: str = "mma.m16n8k16") -> Program:
    """Run the nest headed by `loop` as one warp-wide tensor-core instruction `intrinsic` ("mma.m16n8k16").

    Precondition (refused with TensorizeError naming the part that does not match): `loop` heads a perfect
    nest (eh: 2, el: 2, k: 16) around one update (optionally under an edge guard, and a guard on k that the CUDA
    pipeline removes by zero-filling the operand tiles: codegen.passes.pad)
    `acc[..] = acc[..] + A[..] * B[..]` with acc a local float32
    (or the half type, widened by the CUDA passes) accumulator, A and B float16 (or both bfloat16) shared
    2-d tiles, inside one threadIdx.x loop of 32 lanes, and the indices are the m16n8k16 fragment layout::

        for eh in range(0, 2):                 ->   for eh in mma.m16n8k16(0, 2):
          for el in range(0, 2):                      for el in range(0, 2):
            for k in range(0, 16):                      for k in range(0, 16):
              acc[eh, el] += A[r0 + lane//4 + 8*eh, k0 + k] * B[k0 + k, c0 + 2*(lane%4) + el]   (unchanged)

    Only the order of each element's 16-term sum changes (reassociated by the instruction).

    `intrinsic` "mma.m16n8k16.tf32x3": the same nest over float32 tiles, run as two m16n8k8 TF32 steps (its fragment
    layout is m16n8k16's with half the k columns) of three products each, the operands split x = hi + lo (hi x's
    TF32 bits, lo = x - hi exact): a_lo b_hi + a_hi b_lo + a_hi b_hi drops a_lo b_lo and the bits of the lo parts
    past TF32's, below 2^-20 |a b| per product (float32 rounds at 2^-24): float32-class accuracy, as CUTLASS's
    3xTF32 GEMMs (codegen/cuda/mma.py says how the sums round).

    `intrinsic` "attention.m16n8k16": `loop` runs the 64 query rows of a block through the online-softmax pass,
    as FlashAttention's tensor-core kernel (precondition and change: schedules/primitives/flash.py).
    `intrinsic` "attention.wgmma": the same pass on Hopper's warpgroup tensor cores (sm_90a; head dimensions 64 or
    128, 128 rows a block).

    `intrinsic` "gemm.wgmma": `loop` runs the rows of a block's GEMM tile (dot products of float16 / bfloat16 rows
    and columns, then an elementwise epilogue) on Hopper's warpgroup tensor cores, sm_90a (precondition and
    change: schedules/primitives/wgmma.py).
    """
    if intrinsic not in INTRINSICS:
        raise TensorizeError(f"tensorize: unknown intrinsic {intrinsic!r}; known: {', '.join(INTRINSICS)}")
    found = find_loop_path(program.body, loop)
    if found is None:
        raise TensorizeError(f"tensorize: loop {loop.name!r} is not in program {program.name!r}")
    f, path = found
    if f.kind != "serial":
        raise TensorizeError(f"tensorize: loop {loop.name!r} is already {f.thread or f.kind}")
    if intrinsic in (*FLASH_KINDS, WGMMA):
        if any(isinstance(p, For) and p.kind == "thread" and (p.thread or "").startswith("threadIdx") for p, _ in path):
            raise TensorizeError(f"tensorize: loop {loop.name!r} is inside a threadIdx loop; {intrinsic} runs the "
                                 "block's own threads (bind only the blocks around it)")
    if intrinsic == WGMMA:
        try:
            wgmma_parts(f)
        except WgmmaMismatch as e:
            raise TensorizeError(f"tensorize {WGMMA}: loop {loop.name!r} is not a block's GEMM tile: {e}") from None
        return replace_loop(program, loop, dataclasses.replace(f, kind=intrinsic))
    if intrinsic in FLASH_KINDS:
        try:
            flash_parts(f, program, intrinsic)
        except FlashMismatch as e:
            raise TensorizeError(f"tensorize {intrinsic}: loop {loop.name!r} is not the online-softmax pass of a "
                                 f"block: {e}") from None
        return replace_loop(program, loop, dataclasses.replace(f, kind=intrinsic))
    lanes = {p.var: p for p, _ in path if isinstance(p, For) and p.kind == "thread" and p.thread == "threadIdx.x"}
    mma_operands(f, lanes, k_guard=True, intrinsic=intrinsic)
    return replace_loop(program, loop, dataclasses.replace(f, kind=intrinsic))
