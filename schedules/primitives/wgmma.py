"""A block's GEMM tile on Hopper's warpgroup tensor cores (intrinsic "gemm.wgmma").

`tensorize(loop, "gemm.wgmma")` marks the loop over the rows of a block's output tile whose body computes each
element of the tile as a float16 / bfloat16 dot product and stores it through an elementwise epilogue. The loops
stay in the IR as the reference semantics (the interpreters, the CPU target and every check read them); the CUDA
renderer (codegen/cuda/wgmma.py) prints the tile as one kernel body instead: A and B tiles of 64 along the
reduction streamed by cp.async through a ring of 128-byte-swizzled shared stages, `wgmma.mma_async` m64nNk16 per
warpgroup of 64 rows with float32 accumulators in registers, and the epilogue applied to the accumulators before
the one store. The nest it accepts, in the loops' variables (after split, `i = i_o * BM + i_i`, `j = j_o * BN +
j_i`, and cache_write of the accumulator at j_i)::

    for i_i in range(0, BM):                                  ->  for i_i in gemm.wgmma(0, BM):
      for j_i in range(0, BN):                                      (unchanged)
        allocate acc: float32[1, 1] local
          if <row guard (i_i)> and <column guard (j_i)>:
            acc[0, 0] = 0
            for k in range(0, K): acc[0, 0] += A[.., i, k] * B[.., k, j]        (A, B float16 / bfloat16)
          for q0, q1 in range(0, 1):
            if <guard>: C[.., i, j] = epilogue(acc[0, 0], loads not of acc)      (one or more stores)

Precondition (checked by `wgmma_parts`, TensorizeError naming the part otherwise): BM in 64, 128 (a warpgroup
per 64 rows), BN a multiple of 64 up to 256, lo = 0 for both; A read contiguously along k (its last index is
k + c), at rows that depend on i_i only; B read contiguously along j_i (its last index j_i + c), at k; each
operand's row stride and the start of its rows provably a multiple of 8 elements (16-byte cp.async chunks; a
base pointer that is not 16-byte aligned is copied element-wise at run time); the guards split into conditions of
i_i and conditions of j_i (the edge tiles of sizes the tile does not divide); the epilogue reads the accumulator
only at the same element.

What changes is the order of the arithmetic, as for every tensor-core reduction: the products (exact in float32)
are summed by the instruction in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from loopir.affine import linear_form, multiple_of, polynomial, row_major
from loopir.nodes import (Allocate, Binary, Compare, Const, Expr, For, If, Load, Select, Seq, Stmt, Store, Var,
                          conjunction, conjuncts)
from loopir.visit import free_vars, subst_coords, substitute, walk

from . import const_extent, only_stmt
from .flash import half_operand, replace_load

__all__ = ["WGMMA", "WgmmaShape", "WgmmaParts", "WgmmaMismatch", "wgmma_parts", "shape_for", "BLOCK_ROWS",
           "BLOCK_COLS", "K_TILE", "SHARED_MAX", "TmaPlan", "tma_plan", "TMA_THREADS",
           "PERSISTENT_BLOCKS", "kernel_tile", "a_view", "StorePlan", "store_plan", "STORE_BOX", "STAGING_BYTES"]

WGMMA = "gemm.wgmma"
BLOCK_ROWS = (64, 128)
BLOCK_COLS = (64, 128, 192, 256)
K_TILE = 64  # one 128-byte swizzled row of halves per tile row
SHARED_MAX = 227 * 1024  # the opt-in shared memory of a block on sm_90


@dataclass(frozen=True)
class WgmmaShape:
    """The kernel's tiling: `rows` x `cols` per block, one warpgroup (128 threads) per 64 rows, `stages` shared
    stages of K_TILE along the reduction (shape_for)."""

    rows: int
    cols: int
    stages: int
    staging: int = 0  # bytes of the TMA store's staging boxes after the stages and barriers (StorePlan)

    @property
    def warpgroups(self) -> int:
        return self.rows // 64

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    @property
    def stage_bytes(self) -> int:
        return (self.rows + self.cols) * K_TILE * 2

    @property
    def shared_bytes(self) -> int:  # the stages, and 1024 bytes to align the first to the swizzle's atom
        return self.stages * self.stage_bytes + 1024

    @property
    def staging_offset(self) -> int:  # from the aligned base: the stages, the barriers, up to the swizzle's atom
        return -(-(self.stages * (self.stage_bytes + 16)) // 1024) * 1024

    @property
    def tma_shared_bytes(self) -> int:  # with TMA also two mbarriers per stage (full, empty), and the staging
        if not self.staging:
            return self.shared_bytes + 16 * self.stages
        return 1024 + self.staging_offset + self.staging


def shape_for(rows: int, cols: int, staging: int = 0) -> WgmmaShape:
    """As many stages as fit (with the TMA kernel's barriers and `staging` bytes of store boxes), at most 6
    (128 x 128 tiles: 6 measured best on an H200, benchmarks/tmp/wg_gemm_ws.py), at least 3 (the cp.async
    ring's prefetch distance is stages - 2)."""
    per = (rows + cols) * K_TILE * 2
    room = SHARED_MAX - 1024 - (staging + 1024 if staging else 0)
    return WgmmaShape(rows, cols, max(3, min(6, room // (per + 16))), staging)


@dataclass(frozen=True)
class WgmmaParts:
    """The parts of a marked tile the renderer needs, every expression in the loops' variables.

    row / col: the row (marked) and column loop variables; k: the reduction loop; row_ok / col_ok: the guards'
    conjuncts on the row and on the column; a / b: the operand loads (A rows x k, B k x columns); acc: the
    accumulator variable the epilogue values use; stores: the epilogue stores (indices and values in the loops'
    variables, `acc` in place of the accumulator) with each one's guard (None: always)."""

    row: Var
    col: Var
    k: For
    row_ok: tuple[Expr, ...]
    col_ok: tuple[Expr, ...]
    a: Load
    b: Load
    acc: Var
    stores: tuple[tuple[Store, tuple[Expr, ...], Expr, Expr | None], ...]
    shape: WgmmaShape


class WgmmaMismatch(Exception):
    """Internal: the nest is not the tile (the caller turns it into its own error)."""


def _need(cond: bool, why: str) -> None:
    if not cond:
        raise WgmmaMismatch(why)


def _uses(e: Expr, v: Var) -> bool:
    return v in free_vars(e)


def _flatten(s: Stmt, guards: tuple[Expr, ...], sub: dict[Var, Expr], out: list) -> None:
    """The leaves of the column loop's body: (statement, guards, unit-loop substitution) for each Store and the
    reduction's For; Seqs, Ifs without else, allocations and loops of one iteration are looked through."""
    if isinstance(s, Seq):
        for c in s.body:
            _flatten(c, guards, sub, out)
    elif isinstance(s, Allocate):
        _need(s.buffer.scope == "local", f"the tile allocates {s.buffer.name}, a {s.buffer.scope} buffer")
        _flatten(s.body, guards, sub, out)
    elif isinstance(s, If):
        _need(s.orelse is None, "a condition inside the tile has an else branch")
        _flatten(s.then, (*guards, *(substitute(c, sub) for c in conjuncts(s.cond))), sub, out)
    elif isinstance(s, For) and const_extent(s) == 1:
        _flatten(s.body, guards, {**sub, s.var: s.lo}, out)
    elif isinstance(s, (Store, For)):
        out.append((s, guards, sub))
    else:
        raise WgmmaMismatch(f"the tile holds a {type(s).__name__} statement")


def _split_guards(guards: tuple[Expr, ...], row: Var, col: Var, what: str) -> tuple[list[Expr], list[Expr]]:
    rows, cols = [], []
    for c in guards:
        r, q = _uses(c, row), _uses(c, col)
        _need(not (r and q), f"the condition {c} of {what} ties the row to the column (not a rectangular tile)")
        (cols if q else rows).append(c)
    return rows, cols


def wgmma_parts(f: For) -> WgmmaParts:
    """Check that `f` heads the tile of the module docstring and return its parts; WgmmaMismatch naming the
    first part that differs."""
    rows = const_extent(f, from_zero=True)
    _need(rows in BLOCK_ROWS, f"the row loop {f.var.name!r} has extent {rows}, not "
          f"{' or '.join(map(str, BLOCK_ROWS))} (split the rows by the block's rows)")
    body = only_stmt(f.body)
    _need(isinstance(body, For), "the row loop's body is not the loop over the tile's columns")
    assert isinstance(body, For)
    cl = body
    cols = const_extent(cl, from_zero=True)
    _need(cols in BLOCK_COLS, f"the column loop {cl.var.name!r} has extent {cols}, not one of "
          f"{', '.join(map(str, BLOCK_COLS))}")
    assert rows is not None and cols is not None
    _need(cl.kind == "serial", f"the column loop {cl.var.name!r} is {cl.kind}")
    leaves: list = []
    _flatten(cl.body, (), {}, leaves)
    red = [x for x in leaves if isinstance(x[0], For)]
    _need(len(red) == 1, "the tile holds no single reduction loop")
    kf, rguards, rsub = red[0]
    _need(kf.kind == "serial" and not rsub, f"the reduction loop {kf.var.name!r} is {kf.kind}")
    pos = leaves.index(red[0])
    _need(pos == 1 and isinstance(leaves[0][0], Store) and leaves[0][1] == rguards,
          "the reduction is not preceded by its initialisation under the same guard")
    init = leaves[0][0]
    acc_buf = init.buffer
    _need(acc_buf.scope == "local" and isinstance(init.value, Const) and float(init.value.value) == 0.0,
          "the reduction does not start its accumulator (a local buffer: cache_write it) at 0")
    kb = only_stmt(kf.body)
    kguards: tuple[Expr, ...] = ()
    if isinstance(kb, If) and kb.orelse is None:
        kguards, kb = tuple(conjuncts(kb.cond)), only_stmt(kb.then)
    _need(isinstance(kb, Store) and kb.buffer is acc_buf, "the reduction loop holds not only its update")
    assert isinstance(kb, Store)
    _need(not any(_uses(c, kf.var) for c in kguards), "a condition inside the reduction depends on k")
    val = substitute(kb.value, subst_coords(kb))
    acc_idx = tuple(substitute(i, subst_coords(kb)) for i in kb.indices)
    _need(isinstance(val, Binary) and val.op == "add" and isinstance(val.a, Load) and val.a.buffer is acc_buf
          and val.a.indices == acc_idx and isinstance(val.b, Binary) and val.b.op == "mul",
          "the update is not acc = acc + a * b")
    assert isinstance(val, Binary) and isinstance(val.b, Binary)
    x, y = half_operand(val.b.a), half_operand(val.b.b)
    _need(x is not None and y is not None and x.buffer.dtype == y.buffer.dtype,
          "the operands are not both float16 or both bfloat16 loads")
    assert x is not None and y is not None
    row, col, k = f.var, cl.var, kf.var
    a, b = (x, y) if _uses(x.indices[-1], k) else (y, x)
    for name, ld, inner, other in (("A", a, k, col), ("B", b, col, row)):
        last = ld.indices[-1]
        lin = linear_form(last)
        _need(lin is not None and lin.get(inner) == 1, f"{name} ({ld.buffer.name}) is not read contiguously "
              f"along {inner.name!r} (its last index is {last})")
        _need(not any(_uses(i, other) for i in ld.indices), f"{name} ({ld.buffer.name}) is read at {other.name!r}")
        _need(not any(_uses(i, inner) for i in ld.indices[:-1]),
              f"{name} ({ld.buffer.name}) depends on {inner.name!r} in more than its last index")
        _need(ld.buffer.scope == "global", f"{name} ({ld.buffer.name}) is a {ld.buffer.scope} buffer; the kernel "
              "stages global tiles itself (tensorize before cache_read)")
        _need(multiple_of(ld.buffer.shape[-1], 8) and multiple_of(substitute(last, {inner: Const(0, "int64")}), 8),
              f"{name} ({ld.buffer.name}) rows are not provably 16-byte aligned (row length "
              f"{ld.buffer.shape[-1]} and start {last} at {inner.name} = 0 must be multiples of 8)")
    _need(not _uses(a.indices[-2], k) and any(_uses(i, row) for i in a.indices[:-1]),
          f"A ({a.buffer.name}) does not select its row by {row.name!r}")
    _need(any(_uses(i, k) for i in b.indices[:-1]), f"B ({b.buffer.name}) does not select its row by k")
    row_ok, col_ok = _split_guards(rguards + kguards, row, col, "the reduction")
    acc = Var("acc", "float32")
    stores = []
    for st, guards, sub in leaves[2:]:
        _need(isinstance(st, Store), "statements other than stores follow the reduction")
        s_sub = {**subst_coords(st)}
        idx = tuple(substitute(substitute(i, s_sub), sub) for i in st.indices)
        v = substitute(substitute(st.value, s_sub), sub)
        reads = [n for n in walk(v) if isinstance(n, Load) and n.buffer is acc_buf]
        _need(bool(reads) and all(n.indices == acc_idx for n in reads),
              f"the store to {st.buffer.name} does not read the accumulator at its element")
        _need(st.buffer is not acc_buf and st.buffer.scope == "global",
              f"the epilogue stores {st.buffer.name}, a {st.buffer.scope} buffer")
        v = replace_load(v, acc_buf, acc_idx, acc)
        _need(not any(_uses(i, k) for i in idx) and not _uses(v, k), "the epilogue depends on k")
        stores.append((st, idx, v, conjunction(list(guards)) if guards else None))
    _need(bool(stores), "no store follows the reduction: the accumulator is never written")
    free = set().union(*(free_vars(e) for e in (*row_ok, *col_ok)) or [set()])
    _need(kf.var not in free, "a guard of the reduction depends on k")
    return WgmmaParts(row, col, kf, tuple(row_ok), tuple(col_ok), a, b, acc, tuple(stores), shape_for(rows, cols))




# ----------------------------------------------------------------------------- TMA and a persistent grid

TMA_THREADS = 384  # a producer warpgroup (one thread issues the TMA copies) and two consumer warpgroups
PERSISTENT_BLOCKS = 132  # the multiprocessors of an H100 SXM / H200: one resident block each walks the tiles


@dataclass(frozen=True)
class TmaPlan:
    """How a marked tile runs with TMA loads on a persistent grid: the block loops over the tiles' rows (`bi`,
    blockIdx.y) and columns (`bj`, blockIdx.x), and over the batch (`bz`, blockIdx.z; None: none), the first
    row of A's 2-d view and the first column of B that a tile reads (at row 0 and column 0, in the block loops'
    variables) and the rows of A's 2-d view (`a_rows`, the product of its leading extents: `a_view`)."""

    bi: For
    bj: For
    row0: Expr
    col0: Expr
    bz: For | None
    a_rows: Expr
    store: StorePlan | None = None

    @property
    def tiles(self) -> Expr:
        n = Binary("mul", Binary("sub", self.bi.hi, self.bi.lo, "int64"),
                   Binary("sub", self.bj.hi, self.bj.lo, "int64"), "int64")
        if self.bz is not None:
            n = Binary("mul", Binary("sub", self.bz.hi, self.bz.lo, "int64"), n, "int64")
        return n

    @property
    def grid(self) -> Expr:
        return Binary("min", self.tiles, Const(PERSISTENT_BLOCKS, "int64"), "int64")


def a_view(ld: Load) -> tuple[Expr, Expr]:
    """A load of a row-major buffer of rank >= 2 as a load of its 2-d view: (the view's row index, its number of
    rows). The view of X[d0, .., dn-1, c] is the (d0 * .. * dn-1) x c matrix whose row i0 * d1 * .. + in-1 is
    X[i0, .., in-1, :] (the same bytes); a collapsed row index `(f // d) * d + f % d` folds back to `f`
    (loopir.affine.row_major)."""
    shape = ld.buffer.shape
    rows: Expr = shape[0]
    for d in shape[1:-1]:
        rows = Binary("mul", rows, d, "int64")
    return row_major(shape[:-1], ld.indices[:-1]), rows


def _unit_in(e: Expr, v: Var, others: tuple[Var, ...]) -> bool:
    """`e` is a polynomial (sizes may multiply loop variables: `b * T + i`) in which `v` appears only as the
    term `v` itself (coefficient 1) and none of `others` appears."""
    poly = polynomial(e)
    if poly is None:
        return False
    banned = {id(x) for x in others}
    for mono, c in poly.items():
        if banned & set(mono) or (id(v) in mono and (mono != (id(v),) or c != 1)):
            return False
    return poly.get((id(v),)) == 1


def tma_plan(p: WgmmaParts, kernel_body: Stmt) -> TmaPlan | None:
    """The TMA plan of tile `p` when the kernel `kernel_body` allows it, else None (the cp.async kernel runs).

    TMA copies boxes of a 2-d tensor and zero-fills past its edges, so: B is 2-d and read at (k, col0 + col); A is
    read at k in its last index and, as its 2-d view (`a_view`: an activation X[b, t, k] of a linear layer is the
    (B*T) x K matrix), at row0 + row of the view, the row index a polynomial in which the tile's row appears with
    coefficient 1 (`b * T + i_o * 128 + i_i`); the reduction runs over all of A's columns and B's rows (k from 0
    to both lengths: a zero past the tensor is then a zero the reference never adds). Rows of a box past the
    tile's own rows (past T, into the next batch's rows of the view) are loaded and multiplied but never stored:
    a row of the product depends on that row of A alone, and the epilogue's stores keep the tile's row guards.
    128 rows a tile (two consumer warpgroups). A persistent grid takes over the block indices, so the kernel is
    exactly the block loops (optionally a batch loop on blockIdx.z outermost, then rows on blockIdx.y, columns on
    blockIdx.x, all from 0) around the tile."""
    if p.shape.rows != 128:
        return None
    a, b, k = p.a, p.b, p.k
    if len(a.buffer.shape) < 2 or len(b.buffer.shape) != 2 or a.indices[-1] is not k.var or b.indices[0] is not k.var:
        return None
    row, rows = a_view(a)
    lin_b = linear_form(b.indices[1])
    if not _unit_in(row, p.row, (p.col, k.var)) or lin_b is None or lin_b.get(p.col) != 1:
        return None
    if not (isinstance(k.lo, Const) and k.lo.value == 0 and _same(k.hi, a.buffer.shape[-1])
            and _same(k.hi, b.buffer.shape[0])):
        return None
    loops = []
    node = only_stmt(kernel_body)
    while isinstance(node, For) and node.kind == "thread" and node.var is not p.row:
        loops.append(node)
        node = only_stmt(node.body)
    if not (isinstance(node, For) and node.var is p.row):
        return None
    axes = [f.thread for f in loops]
    if axes not in (["blockIdx.y", "blockIdx.x"], ["blockIdx.z", "blockIdx.y", "blockIdx.x"]) or any(
            not (isinstance(f.lo, Const) and f.lo.value == 0) for f in loops):
        return None
    zero = Const(0, "int64")
    bz = loops[0] if len(loops) == 3 else None
    return TmaPlan(loops[-2], loops[-1], substitute(row, {p.row: zero}), substitute(b.indices[1], {p.col: zero}),
                   bz, rows)


def _same(x: Expr, y: Expr) -> bool:
    d = linear_form(Binary("sub", x, y, "int64"))
    return d is not None and all(v == 0 for v in d.values())


STORE_BOX = 64  # rows and columns of a TMA store box: 64 halves are 128 bytes, the 128-byte swizzle's width
BOX_BYTES = STORE_BOX * STORE_BOX * 2
STAGING_BYTES = 2 * 2 * BOX_BYTES + 64  # per consumer warpgroup two boxes of halves in flight, and their mbarriers


@dataclass(frozen=True)
class StorePlan:
    """The epilogue's store as TMA boxes of STORE_BOX x STORE_BOX elements, staged in shared memory: the store's
    buffer seen as a map of `rank` 2, (rows, columns) of its 2-d view, or 3, (the product of its leading
    extents, its last two); the box of a warpgroup's 64 rows and columns c * 64 .. of the tile starts at
    (`outer`, `row0` + 64 g, `col0` + 64 c) (row0 / col0 at tile row and column 0, in the block loops'
    variables; `outer` None for rank 2). `aux`: a load of the value from a float16 / bfloat16 tensor of the same
    shape at the same element (SwiGLU's gate, a residual), whose box is loaded by TMA into the same shared box
    before the values are computed (each lane then reads its elements where it writes its results)."""

    store: Store
    rank: int
    row0: Expr
    col0: Expr
    outer: Expr | None
    aux: Load | None = None  # a half tensor the value reads at the stored element: loaded by TMA into the box


def _as_bound(c: Expr) -> Expr | None:
    """The condition `c` as `L >= 0` (its L), for a comparison of integers."""
    if not isinstance(c, Compare):
        return None
    x, y, k = {"lt": (c.b, c.a, -1), "le": (c.b, c.a, 0), "gt": (c.a, c.b, -1), "ge": (c.a, c.b, 0)}.get(
        c.op, (None, None, 0))
    if x is None or y is None:
        return None
    return Binary("add", Binary("sub", x, y, "int64"), Const(k, "int64"), "int64")


def _is_bound(c: Expr, index: Expr, extent: Expr) -> bool:
    """`c` is exactly `index < extent` (as polynomials: `-1 + T - 128 * t_o - t_i >= 0` is `128 * t_o + t_i < T`)."""
    lhs = _as_bound(c)
    if lhs is None:
        return False
    want = Binary("sub", Binary("sub", extent, index, "int64"), Const(1, "int64"), "int64")
    d = polynomial(Binary("sub", lhs, want, "int64"))
    return d is not None and not d


def store_plan(p: WgmmaParts) -> StorePlan | None:
    """The TMA store plan of the tile's epilogue, or None (each lane stores its own elements).

    TMA writes a box's elements inside the map's extents and drops the others, so: one store, to a float16 /
    bfloat16 global buffer (rows a multiple of 8 elements: TMA's 16-byte strides) that is not an operand and that
    its value does not read; its last index the tile's column plus terms of the block loops (coefficient 1), its
    row index (the second-to-last index, else the row of its 2-d view: `a_view`) the tile's row plus such terms;
    and each conjunct of its guard exactly one of the map's bounds (row < rows, column < columns). Then the
    elements the reference stores are the box's elements inside the map (every element it stores is inside the
    buffer, and each bound it does not test holds), which TMA writes."""
    if len(p.stores) != 1:
        return None
    st, idx, val, cond = p.stores[0]
    b = st.buffer
    if (b.dtype not in ("float16", "bfloat16") or b.scope != "global" or len(b.shape) < 2
            or not multiple_of(b.shape[-1], 8) or b is p.a.buffer or b is p.b.buffer
            or any(isinstance(x, Load) and x.buffer is b for x in walk(val))):
        return None
    row, col = p.row, p.col
    if not _unit_in(idx[-1], col, (row, p.k.var)):
        return None
    zero = Const(0, "int64")
    col0 = substitute(idx[-1], {col: zero})
    conds = conjuncts(cond) if cond is not None else []
    col_ok = [c for c in conds if _is_bound(c, idx[-1], b.shape[-1])]
    lead = idx[:-2]
    if _unit_in(idx[-2], row, (col, p.k.var)) and not any(_uses(i, row) or _uses(i, col) for i in lead):
        if all(c in col_ok or _is_bound(c, idx[-2], b.shape[-2]) for c in conds):
            outer = row_major(b.shape[:-2], lead) if lead else None
            return StorePlan(st, 3 if lead else 2, substitute(idx[-2], {row: zero}), col0, outer, _aux(p, idx, val))
    view, rows = a_view(Load(b, idx))
    if not _unit_in(view, row, (col, p.k.var)) or not all(c in col_ok or _is_bound(c, view, rows) for c in conds):
        return None
    return StorePlan(st, 2, substitute(view, {row: zero}), col0, None, _aux(p, idx, val))


def _aux(p: WgmmaParts, idx: tuple[Expr, ...], val: Expr) -> Load | None:
    """The first load of `val` (outside selects) from a float16 / bfloat16 global tensor, not an operand, of the
    stored buffer's extents at the stored element's indices: its box is the store's box of that tensor."""
    out = p.stores[0][0].buffer
    for ld in walk(val, prune=lambda e: isinstance(e, Select)):
        if (isinstance(ld, Load) and ld.buffer is not out and ld.buffer.dtype in ("float16", "bfloat16")
                and ld.buffer.scope == "global" and ld.buffer is not p.a.buffer and ld.buffer is not p.b.buffer
                and len(ld.buffer.shape) == len(out.shape) and ld.indices == idx
                and all(_same(x, y) for x, y in zip(ld.buffer.shape, out.shape))):
            return ld
    return None


def kernel_tile(body: Stmt) -> tuple[For, WgmmaParts, TmaPlan | None] | None:
    """The marked tile of a kernel's body, its parts and its TMA plan (None: none marked). The launch, the shared
    memory plan and the renderer all read it, so they decide alike. WgmmaMismatch when the marked nest is no
    longer a tile."""
    f = next((x for x in walk(body) if isinstance(x, For) and x.kind == WGMMA), None)
    if f is None:
        return None
    p = wgmma_parts(f)
    plan = tma_plan(p, body)
    if plan is None:
        return f, p, None
    store = store_plan(p)
    if store is None:
        return f, p, plan
    return f, replace(p, shape=shape_for(p.shape.rows, p.shape.cols, STAGING_BYTES)), replace(plan, store=store)
