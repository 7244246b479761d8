"""The online-softmax pass of a block of query rows as one tensor-core kernel body (intrinsic "attention.m16n8k16").

`tensorize(loop, "attention.m16n8k16")` marks the loop over the query rows of a block whose body is the pass that
`online_softmax` wrote (see schedules/primitives/online.py); the loops stay in the IR as the reference semantics
(the interpreters, the CPU target and every check read them), and the CUDA renderer (codegen/cuda/flash.py) prints
FlashAttention's kernel instead: four warps of 32 rows each, K and V tiles of 64 keys double-buffered in shared
memory by cp.async, S = Q K^T and O += P V on mma.sync m16n8k16 with P kept in registers, the running maximum and
sum in registers. The nest it accepts, in the loops' variables (after split, `i = i_o * 128 + i_i`)::

    for i_i in range(0, 128):                                  ->  for i_i in attention.m16n8k16(0, 128):
      if <row guard>:                                                (unchanged)
        mx[.., i] = -inf; O[.., i, c] = 0 (for c); sm[.., i] = 0
        for j in range(lo, hi):
          if <mask>:
            S[.., i] = 0
            for r in range(0, D): S[.., i] += Q[.., i, r] * K[.., j, r]        (Q, K: float16 / bfloat16 rows)
            mx_new[.., i] = max(mx[.., i], g(S[.., i]))                     (g: any score of the dot product)
            mx_scale[.., i] = where(mx == mx_new, 1, exp(mx - mx_new))
            for c in range(0, Dv): O[.., i, c] = O * mx_scale + exp(g(S) - mx_new) * V[.., j, c]
            sm[.., i] = sm * mx_scale + exp(g(S) - mx_new)
            mx[.., i] = mx_new[.., i]
        for c in range(0, Dv): Y[.., i, c] = f(O[.., i, c], sm[.., i], ...)     (optional: the epilogue)

The epilogue, a loop over the columns after the keys (the division of softmax(S) V, its loops fused with the
pass's), reads the row's final O and sum at its own row and column only, and otherwise buffers the pass does not
write; the kernel computes it on the registers. Of O, sm and mx, what nothing outside the pass reads is never
stored (`FlashParts.dead`).

`tensorize(loop, "attention.wgmma")` marks the same nest, with the same precondition and head dimensions of 64 or
128 (whole 128-byte shared rows), for Hopper's warpgroup tensor cores (codegen/cuda/flash_wgmma.py, sm_90a): 128
rows a block, a warpgroup per 64, S = Q K^T and O += P V on wgmma, the softmax of a tile overlapping the previous
tile's P V. `schedules/attention.py` offers the pass to it first.

`tensorize(loop, "attention.tf32x3")` marks the same nest over float32 Q, K and V (head dimensions multiples of 16
up to 64), for mma.sync m16n8k8 on TF32 operands (codegen/cuda/flash_tf32.py): 64 rows a block, a warp per 16.
Each product a b is computed in three: a = a_hi + a_lo with a_hi = a rounded to TF32 (10 mantissa bits) and a_lo
the exact remainder, a b ~ a_hi b_hi + a_hi b_lo + a_lo b_hi (the dropped a_lo b_lo and a_lo's own truncation to TF32
are below 2^-20 of |a b|): float32-class accuracy at tensor-core speed, the split CUTLASS calls 3xTF32. P is not
rounded (V is float32).

What changes is the order of the arithmetic, as for every tensor-core reduction: the products are summed by the
instruction; the maximum is raised once per tile of 64 keys and the sums rescaled once per tile (equal, by the
identity exp(a - m1) = exp(a - m2) * exp(m2 - m1) that `online_softmax` rests on); P is rounded to the type of V
for the P V product (FlashAttention's choice; the vector sum's factor exp(g(S) - mx_new) may be cast to that type or
to float32 in the program, as PyTorch's `softmax(s.float()).half()` does, and to no other); the per-key state (S,
mx_new, mx_scale) lives in registers, so its buffers are not written: tensorize refuses when anything outside the pass
reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from loopir.affine import access_pattern, linear_form
from loopir.gpu import BLOCK_PASS
from loopir.nodes import (Binary, Call, Cast, Compare, Const, Expr, For, If, Load, Program, Select, Seq, Stmt, Store,
                          Var, binary, conjuncts)
from loopir.visit import Transformer, substitute, subst_coords, walk

from . import const_extent, only_stmt

__all__ = ["half_operand", "replace_load", "FLASH", "FlashParts", "FlashMismatch", "FlashShape", "flash_parts",
           "shape_for", "ROWS", "ROW_CHOICES", "MT", "THREADS", "KEYS", "MAX_DEPTH", "affine_conjuncts",
           "loop_indices", "FLASH_WGMMA", "FLASH_TF32", "FLASH_KINDS", "WGMMA_DEPTHS", "TF32_MAX_DEPTH", "slack",
           "stored_value"]

FLASH = BLOCK_PASS  # "attention.m16n8k16": the block runs the marked nest once, as one kernel body
# the same pass on Hopper's warpgroup tensor cores (codegen/cuda/flash_wgmma.py, sm_90a): the same precondition, and
# head dimensions of whole 128-byte rows (the swizzled shared layout wgmma reads)
FLASH_WGMMA = "attention.wgmma"
# float32 data on TF32 tensor cores, three products per product (codegen/cuda/flash_tf32.py)
FLASH_TF32 = "attention.tf32x3"
FLASH_KINDS = (FLASH, FLASH_WGMMA, FLASH_TF32)
WARPS = 4
THREADS = 32 * WARPS
MAX_DEPTH = 128
WGMMA_DEPTHS = (64, 128)
TF32_MAX_DEPTH = 64  # Q's split fragments (64 registers at 64) and the 32-key shared tiles fit


@dataclass(frozen=True)
class FlashShape:
    """The kernel's tiling for a head dimension: `mt` m16 tiles per warp (each K and V fragment read from shared
    memory serves mt instructions), `rows` = 16 * mt * WARPS query rows per block, `keys` per shared tile. Two
    stages of K and V tiles plus Q (staged in the second) fit 48 KB of static shared memory, and the accumulators
    (O: mt * width / 2 registers, S: mt * keys / 2) fit 255 registers."""

    rows: int
    mt: int
    keys: int
    threads: int = THREADS
    depth: int = 64  # Q and K's row length, V's (the shared tiles of the warpgroup kernel)
    width: int = 64
    wgmma: bool = False
    stages: int = 2  # shared stages of K and V
    tf32: bool = False  # float32 operands, three TF32 products each (attention.tf32x3)

    @property
    def shared_bytes(self) -> int:
        """The warpgroup kernel's dynamic shared memory: Q's rows, the stages of K and V, an mbarrier per stage
        (full and empty: its TMA copies), 1024 bytes to align the first to the swizzle's atom."""
        tiles = self.rows * self.depth + self.stages * self.keys * (self.depth + self.width)
        return 2 * tiles + 16 * self.stages + 1024

    @property
    def blocks_per_sm(self) -> int:
        """Blocks of the warpgroup kernel resident per multiprocessor (its launch bound: at head dimension 64 the
        registers of two blocks of 256 threads, 128 each, hold S, O and P); of the TF32 kernel, three (167 registers
        a thread at d 64: Q's split fragments, O, the tile's P V and S; no launch bound, which spilled and was
        slower)."""
        if self.tf32:
            return 3
        return 2 if max(self.depth, self.width) <= 64 else 1


def shape_for(depth: int, width: int, wgmma: bool = False, tf32: bool = False) -> FlashShape:
    """mma.sync: 64 or fewer: 128 rows (2 m-tiles per warp), 64 keys; up to 128: 64 rows, 32 keys. wgmma: 128 rows
    (two warpgroups of 64), 64 keys in three stages, at every head dimension. tf32: 64 rows (a warp per 16: Q's
    fragments, split in two, take 64 registers), 32 keys (two stages of float32 rows in 48 KB of static shared
    memory)."""
    if tf32:
        return FlashShape(16 * WARPS, 1, 32, THREADS, depth, width, tf32=True)
    if wgmma:
        return FlashShape(128, 1, 64 if max(depth, width) <= 64 else 128, 256, depth, width, True, 3)
    mt, keys = (2, 64) if max(depth, width) <= 64 else (1, 32)
    return FlashShape(16 * mt * WARPS, mt, keys, THREADS, depth, width)


MT, KEYS = shape_for(64, 64).mt, shape_for(64, 64).keys  # the tiling of head dimensions up to 64
ROWS = shape_for(64, 64).rows
ROW_CHOICES = tuple(sorted({shape_for(d, d).rows for d in (64, MAX_DEPTH)}, reverse=True))
HALF = ("float16", "bfloat16")
FLOATS = (*HALF, "float32")
_OPERANDS = {FLASH: "float16 / bfloat16", FLASH_WGMMA: "float16 / bfloat16", FLASH_TF32: "float32"}


@dataclass(frozen=True)
class FlashParts:
    """The parts of a marked pass the renderer needs, every expression in the loops' variables.

    row: the marked loop's variable (row within the block); guard: the rows' condition (or None); key: the key
    loop; mask: the per-key condition (or None); q, k: the dot product's loads, `red` its variable, `depth` its
    extent; score: g with the dot product as the variable `dot`; v: V's load, `col` its column variable, `width`
    its extent; out / total / maximum: the stores of O (indices in `col`), of the scalar sum (or None) and of the
    running maximum (the advance); epilogue: a store after the key loop, per column `epi_col`, of the row's final O
    and sum (the division of a softmax fused into the pass), or None; dead: which of O, sm and mx no statement
    outside the pass reads, so the kernel need not store them."""

    row: Var
    guard: Expr | None
    key: For
    mask: Expr | None
    q: Load
    k: Load
    red: Var
    depth: int
    dot: Var
    score: Expr
    v: Load
    col: Var
    width: int
    out: Store
    total: Store | None
    maximum: Store
    state: tuple[str, ...]  # the per-key buffers that stay in registers (S, mx_new, mx_scale)
    shape: FlashShape = FlashShape(128, 2, 64)
    epilogue: Store | None = None  # after the keys: Y[.., i, c] = f(O[.., i, c], sm[.., i]) (its column: epi_col)
    epi_col: Var | None = None
    dead: frozenset[str] = frozenset()  # of O, sm, mx: the buffers nothing outside the pass reads (not stored)


class FlashMismatch(Exception):
    """Internal: the nest is not the pass (the caller turns it into its own error, naming `what`)."""



def _stmts(s: Stmt) -> list[Stmt]:
    s = only_stmt(s)
    return list(s.body) if isinstance(s, Seq) else [s]



def stored_value(st: Store) -> Expr:
    """The value `st` stores, in the loops' variables (its iteration variables replaced by their coordinates)."""
    return substitute(st.value, subst_coords(st))


def loop_indices(st: Store) -> tuple[Expr, ...]:
    """The indices of `st` in the loops' variables (its iteration variables replaced by their coordinates)."""
    sub = subst_coords(st)
    return tuple(substitute(i, sub) for i in st.indices)


def half_operand(e: Expr, types: tuple[str, ...] = HALF) -> Load | None:
    """The load of one of `types` (default: half precision) under an optional cast (the float32-accumulation
    idiom)."""
    if isinstance(e, Cast) and isinstance(e.a, Load):
        e = e.a
    return e if isinstance(e, Load) and e.buffer.dtype in types else None


def _is(e: Expr, v: float) -> bool:
    return isinstance(e, Const) and float(e.value) == v


def _same_load(e: Expr, buf: object, idx: tuple[Expr, ...]) -> bool:
    return isinstance(e, Load) and e.buffer is buf and e.indices == idx


def _need(cond: bool, why: str) -> None:
    if not cond:
        raise FlashMismatch(why)


def replace_load(e: Expr, buf: object, idx: tuple[Expr, ...], by: Var) -> Expr:
    """`e` with every load of buf[idx] replaced by `by`."""
    class _R(Transformer):
        def visit_Load(self, n: Load) -> Expr:  # noqa: N802 - the visitor's naming
            return by if n.buffer is buf and n.indices == idx else n

    return _R().visit(e)


def slack(c: Compare) -> Expr:
    """d of the comparison `a op b`: it holds iff d > 0 (lt, gt) or d >= 0 (le, ge); d = b - a (lt, le) or a - b."""
    return binary("sub", c.b, c.a) if c.op in ("lt", "le") else binary("sub", c.a, c.b)


def affine_conjuncts(mask: Expr | None, row: Var, key: Var) -> tuple[list[Expr], bool]:
    """The conjuncts of `mask` that are affine inequalities in (row, key) (a box's corners decide them) and
    whether every conjunct is one."""
    if mask is None:
        return [], True
    out, every = [], True
    for c in conjuncts(mask):
        ok = (isinstance(c, Compare) and c.op in ("lt", "le", "gt", "ge")
              and linear_form(Binary("sub", c.a, c.b, "int64")) is not None)
        if ok:
            out.append(c)
        every &= ok
    return out, every


def flash_parts(f: For, program: Program | None = None, intrinsic: str | None = None) -> FlashParts:
    """Check that `f` heads the pass of the module docstring and return its parts; FlashMismatch naming the first
    part that differs. With `program`, also check that nothing outside `f` reads the per-key state. `intrinsic`
    (default: f's own kind when it is one of FLASH_KINDS, else FLASH) picks the kernel's tiling."""
    intrinsic = intrinsic or (f.kind if f.kind in FLASH_KINDS else FLASH)
    ext = const_extent(f, from_zero=True)
    _need(ext in ROW_CHOICES, f"the row loop {f.var.name!r} has extent {ext}, not {' or '.join(map(str, ROW_CHOICES))} "
          "(split the rows by the kernel's rows per block)")
    scratch = next((n.buffer for n in walk(f) if isinstance(n, (Load, Store)) and n.buffer.scope != "global"), None)
    if scratch is not None:
        raise FlashMismatch(f"the pass uses {scratch.name}, a {scratch.scope} buffer; the kernel stages the rows and "
                            "keeps the state itself (tensorize before cache_read / cache_write)")
    body = only_stmt(f.body)
    guard = None
    if isinstance(body, If) and body.orelse is None:
        guard, body = body.cond, body.then
    top = _stmts(body)
    keys = [s for s in top if isinstance(s, For)
            and any(isinstance(n, Store) and isinstance(stored_value(n), Binary) and stored_value(n).op == "max"
                    for n in walk(s))]
    _need(len(keys) == 1, "the row's body holds no single loop over the keys with a running maximum")
    kf = keys[0]
    after = top[top.index(kf) + 1:]
    _need(len(after) <= 1, "statements follow the loop over the keys inside the row's body (beyond one epilogue "
          "loop over the columns)")
    _need(kf.kind == "serial", f"the key loop {kf.var.name!r} is {kf.kind}")
    inits = top[:top.index(kf)]
    kb = only_stmt(kf.body)
    mask = None
    if isinstance(kb, If) and kb.orelse is None:
        mask, kb = kb.cond, kb.then
    upd = _stmts(kb)
    _need(len(upd) >= 5, "the key's update is not the online form (score, max, rescale, sums, advance)")
    s_init, red, mx_new, rescale, *rolling, advance = upd
    _need(isinstance(s_init, Store) and _is(s_init.value, 0.0), "the key's update does not start the dot product at 0")
    assert isinstance(s_init, Store)
    sbuf, ridx = s_init.buffer, loop_indices(s_init)
    # the dot product: for r: S[..] = S[..] + Q[.., r] * K[.., j, r]
    _need(isinstance(red, For) and const_extent(red, from_zero=True) is not None,
          "the dot product's loop has no constant extent")
    assert isinstance(red, For)
    depth = const_extent(red, from_zero=True) or 0
    upd_s = only_stmt(red.body)
    _need(isinstance(upd_s, Store) and upd_s.buffer is sbuf, "the dot product's loop holds not only its update")
    assert isinstance(upd_s, Store)
    val = stored_value(upd_s)
    _need(isinstance(val, Binary) and val.op == "add" and _same_load(val.a, sbuf, ridx)
          and isinstance(val.b, Binary) and val.b.op == "mul", "the dot product is not S = S + a * b")
    assert isinstance(val, Binary) and isinstance(val.b, Binary)
    tf32 = intrinsic == FLASH_TF32
    types = ("float32",) if tf32 else HALF
    a, b = half_operand(val.b.a, types), half_operand(val.b.b, types)
    _need(a is not None and b is not None, f"the dot product's operands are not {_OPERANDS[intrinsic]} loads")
    assert a is not None and b is not None
    kv = kf.var
    uses_key = [any(isinstance(n, Var) and n is kv for i in ld.indices for n in walk(i)) for ld in (a, b)]
    _need(uses_key.count(True) == 1, "exactly one operand of the dot product must be read at the key (K)")
    q, k = (b, a) if uses_key[0] else (a, b)
    for name, ld in (("query", q), ("key", k)):
        _need(access_pattern(ld.indices, red.var) == "contig",
              f"the {name} row {ld.buffer.name} is not read contiguously along {red.var.name!r}")
    _need(not any(n is f.var for i in k.indices for n in walk(i)), f"K ({k.buffer.name}) is read at the query row")
    # the running maximum: mx_new = max(mx, g(S))
    _need(isinstance(mx_new, Store) and loop_indices(mx_new) == ridx, "no running maximum after the dot product")
    assert isinstance(mx_new, Store)
    mv = stored_value(mx_new)
    _need(isinstance(mv, Binary) and mv.op == "max" and isinstance(mv.a, Load) and mv.a.indices == ridx,
          "the running maximum is not max(mx, score)")
    assert isinstance(mv, Binary) and isinstance(mv.a, Load)
    mbuf, xbuf, g = mv.a.buffer, mx_new.buffer, mv.b
    dot = Var("dot")
    score = replace_load(g, sbuf, ridx, dot)
    _need(score is not g and not any(isinstance(n, Load) and n.buffer in (sbuf, mbuf, xbuf) for n in walk(score)),
          "the score does not read the dot product (or reads the running state)")
    lm, lx = Load(mbuf, ridx), Load(xbuf, ridx)
    # the rescale factor: where(mx == mx_new, 1, exp(mx - mx_new))
    _need(isinstance(rescale, Store) and loop_indices(rescale) == ridx, "no rescale factor after the running maximum")
    assert isinstance(rescale, Store)
    rv = stored_value(rescale)
    _need(isinstance(rv, Select) and isinstance(rv.cond, Compare) and rv.cond.op == "eq"
          and (rv.cond.a, rv.cond.b) == (lm, lx) and _is(rv.a, 1.0) and isinstance(rv.b, Call) and rv.b.fn == "exp"
          and isinstance(rv.b.args[0], Binary) and rv.b.args[0].op == "sub" and rv.b.args[0].a == lm
          and rv.b.args[0].b == lx,
          "the rescale factor is not where(mx == mx_new, 1, exp(mx - mx_new))")
    zbuf = rescale.buffer
    lz = Load(zbuf, ridx)
    _need(isinstance(advance, Store) and advance.buffer is mbuf and loop_indices(advance) == ridx
          and stored_value(advance) == lx, "the key's update does not end with mx = mx_new")
    assert isinstance(advance, Store)

    def prob(e: Expr) -> bool:  # exp(g - mx_new)
        return (isinstance(e, Call) and e.fn == "exp" and isinstance(e.args[0], Binary) and e.args[0].op == "sub"
                and e.args[0].a == g and e.args[0].b == lx)

    out = total = v = col = None
    width = 0
    for st in rolling:
        if isinstance(st, For):
            _need(out is None, "more than one vector sum (the kernel keeps one P V accumulator)")
            width = const_extent(st, from_zero=True) or 0
            inner = only_stmt(st.body)
            _need(isinstance(inner, Store) and width > 0, "the vector sum's loop holds not only its update")
            assert isinstance(inner, Store)
            oi, ov = loop_indices(inner), stored_value(inner)
            _need(oi[:-1] == ridx and oi[-1] is st.var, "the vector sum is not indexed by the row, then its column")
            ok = (isinstance(ov, Binary) and ov.op == "add" and isinstance(ov.a, Binary) and ov.a.op == "mul"
                  and _same_load(ov.a.a, inner.buffer, oi) and ov.a.b == lz and isinstance(ov.b, Binary)
                  and ov.b.op == "mul")
            _need(ok, "the vector sum is not O = O * rescale + exp(score - max) * V")
            assert isinstance(ov, Binary) and isinstance(ov.b, Binary)
            e, vv = (ov.b.a, ov.b.b) if prob(_uncast(ov.b.a)[0]) else (ov.b.b, ov.b.a)
            e, casts = _uncast(e)
            _need(prob(e), "the vector sum's product is not exp(score - max) * V")
            v = half_operand(vv, types)
            _need(v is not None, f"the vector sum's second factor is not a {_OPERANDS[intrinsic]} load (V)")
            assert v is not None
            # the kernel rounds P to V's type for the P V product whether or not the program does
            odd = [t for t in casts if t not in ("float32", v.buffer.dtype)]
            _need(not odd, f"the vector sum's probabilities are cast to {odd[0] if odd else ''}, neither float32 nor "
                  f"V's type {v.buffer.dtype} (the kernel rounds them to V's type)")
            _need(access_pattern(v.indices, st.var) == "contig" and not any(n is f.var for i in v.indices
                                                                             for n in walk(i)),
                  f"V ({v.buffer.name}) is not read contiguously along the column, at the key only")
            out, col = inner, st.var
        else:
            _need(total is None and isinstance(st, Store) and loop_indices(st) == ridx, "a rolling sum is not per row")
            assert isinstance(st, Store)
            tv = stored_value(st)
            _need(isinstance(tv, Binary) and tv.op == "add" and isinstance(tv.a, Binary) and tv.a.op == "mul"
                  and _same_load(tv.a.a, st.buffer, ridx) and tv.a.b == lz and prob(tv.b),
                  "the scalar sum is not sm = sm * rescale + exp(score - max)")
            total = st
    _need(out is not None, "no vector sum P V in the key's update")
    assert out is not None and v is not None and col is not None
    _need(depth % 16 == 0 and 0 < depth <= MAX_DEPTH and width % 16 == 0 and 0 < width <= MAX_DEPTH,
          f"head dimensions {depth} (Q K) and {width} (V) must be multiples of 16 up to {MAX_DEPTH}")
    wg = intrinsic == FLASH_WGMMA
    _need(not wg or (depth in WGMMA_DEPTHS and width in WGMMA_DEPTHS),
          f"head dimensions {depth} (Q K) and {width} (V) are not {' or '.join(map(str, WGMMA_DEPTHS))} (rows of whole "
          "128-byte swizzle atoms, which attention.wgmma reads)")
    _need(not tf32 or max(depth, width) <= TF32_MAX_DEPTH,
          f"head dimensions {depth} (Q K) and {width} (V) are above {TF32_MAX_DEPTH}, the most {FLASH_TF32} holds")
    shape = shape_for(depth, width, wg, tf32)
    _need(ext == shape.rows, f"the row loop {f.var.name!r} has extent {ext}, not {shape.rows} (head dimension "
          f"{max(depth, width)}: split the rows by {shape.rows})")
    # the state starts empty: mx = -inf, the sums 0 (any order)
    started: dict[object, Stmt] = {}
    for st in inits:
        inner = only_stmt(st.body) if isinstance(st, For) else st
        _need(isinstance(inner, Store), "the row's body starts with more than the state's initialisation")
        assert isinstance(inner, Store)
        started[inner.buffer] = inner
    _need(mbuf in started and _is(stored_value(started[mbuf]), float("-inf")),
          "the running maximum does not start at -inf")
    for st in (out, total):
        if st is not None:
            _need(st.buffer in started and _is(stored_value(started[st.buffer]), 0.0),
                  f"{st.buffer.name} does not start at 0")
    _need(set(started) <= {mbuf, out.buffer, *([total.buffer] if total else [])},
          "the row's body initialises buffers other than the running state")
    state = (sbuf.name, xbuf.name, zbuf.name)
    epilogue, epi_col = _epilogue(after[0], ridx, out, total, width, f) if after else (None, None)
    dead: frozenset[str] = frozenset()
    if program is not None:
        loads = [n for n in _walk_outside(program.body, f) if isinstance(n, Load)]
        outside = [n for n in loads if n.buffer.name in state]
        _need(not outside, f"{outside[0].buffer.name} is read outside the pass" if outside else "")
        _need(all(b.name not in state for b in program.args), "the per-key state is an argument of the program")
        read = {n.buffer for n in loads}
        dead = frozenset(b.name for b in (out.buffer, mbuf, *([total.buffer] if total else []))
                         if b not in read and b not in program.args)
    return FlashParts(f.var, guard, kf, mask, q, k, red.var, depth, dot, score, v, col, width, out, total, advance,
                      state, shape, epilogue, epi_col, dead)


def _uncast(e: Expr) -> tuple[Expr, tuple[str, ...]]:
    """`e` without the conversions between float types around it, and their types (outermost first)."""
    casts: list[str] = []
    while isinstance(e, Cast) and e.dtype in FLOATS and e.a.dtype in FLOATS:
        casts.append(e.dtype)
        e = e.a
    return e, tuple(casts)


def _epilogue(st: Stmt, ridx: tuple[Expr, ...], out: Store, total: Store | None, width: int,
              f: For) -> tuple[Store, Var]:
    """The epilogue after the key loop: `for c in 0..width: Y[.., i, c] = f(O[.., i, c], sm[.., i], inputs)`,
    reading the row's final O and sum at its own row and column only, and otherwise buffers the pass does not
    write (the division of softmax(S) V, fused into the pass's row loops)."""
    _need(isinstance(st, For) and const_extent(st, from_zero=True) == width,
          f"the statement after the key loop is not a loop over the {width} columns of O")
    assert isinstance(st, For)
    inner = only_stmt(st.body)
    _need(isinstance(inner, Store), "the epilogue loop holds more than one store")
    assert isinstance(inner, Store)
    written = {n.buffer for n in walk(f) if isinstance(n, Store)} - {inner.buffer}
    _need(loop_indices(inner) == (*ridx, st.var) and inner.buffer not in written,
          f"the epilogue store {inner.buffer.name} is not indexed by the row, then its column")
    value = stored_value(inner)
    for n in walk(value):
        if isinstance(n, Load) and n.buffer in written:
            at = (*ridx, st.var) if n.buffer is out.buffer else ridx
            _need((n.buffer is out.buffer or (total is not None and n.buffer is total.buffer)) and n.indices == at,
                  f"the epilogue reads {n.buffer.name} other than as the row's final O and sum")
    _need(any(isinstance(n, Load) and n.buffer is out.buffer for n in walk(value)),
          f"the epilogue does not read {out.buffer.name}")
    return inner, st.var


def _walk_outside(s: Stmt, skip: Stmt):  # noqa: ANN202 - a generator of nodes
    """The nodes of `s` outside the subtree `skip`."""
    if s is skip:
        return
    yield s
    for child in _children(s):
        if isinstance(child, Stmt):
            yield from _walk_outside(child, skip)
        else:
            yield from walk(child)


def _children(s: Stmt) -> list[object]:
    if isinstance(s, Seq):
        return list(s.body)
    if isinstance(s, For):
        return [s.lo, s.hi, s.body]
    if isinstance(s, If):
        return [s.cond, s.then] + ([s.orelse] if s.orelse is not None else [])
    if isinstance(s, Store):
        return [*s.indices, s.value]
    body = getattr(s, "body", None)
    return [body] if isinstance(body, Stmt) else []
