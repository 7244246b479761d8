"""Rendering of a block's online-softmax pass marked "attention.m16n8k16" (schedules/primitives/flash.py) as
FlashAttention's tensor-core kernel body.

Per block of 128 query rows (128 threads; warp w owns rows 32w..32w+31, two m16 tiles, so that every K and V
fragment read from shared memory feeds two instructions):

    Q tile -> shared (cp.async, zeros past the row guard) -> A fragments in registers (ldmatrix.x4), once
    for each live tile of 64 keys (tiles that the mask kills at all four corners are skipped):
        prefetch the next live tile of K and V into the other shared stage (cp.async, zeros past the keys)
        S = Q K^T                      mma.sync m16n8k16, K fragments by ldmatrix.x4 (K rows are B's columns)
        s = g(S), masked -> no term    g and the mask are the pass's own expressions, per element; a tile inside
                                       the key loop whose four corners satisfy every (affine) conjunct of the mask
                                       runs a copy of this step without any per-element test
        m_new = max(m, rowmax s)       over the four lanes of a row (two shuffles)
        l *= exp(m - m_new); O too, when some row of the warp saw a larger maximum (else the factor is 1)
        P = 2^(s log2e - m_new log2e) (one fma and ex2.approx); l += rowsum P
        O += P V                       P's accumulator registers repacked as A fragments (the C layout of two
                                       m16n8 tiles is the A layout of one m16k16), V by ldmatrix.x4.trans
    O, the sum and the maximum stored as the pass stores them (its buffers, its indices, its row guard)

Every address and condition is rendered from the pass's own expressions, with the loop variables bound to the
element this lane holds, so the kernel reads what the reference reads. Shared rows are padded by 16 bytes
(conflict-free ldmatrix). Rows whose every 16-byte chunk is provably aligned (sizes and pointers tested once at the
kernel's entry) are copied by one cp.async per chunk; otherwise each chunk tests its address and a misaligned one is
copied element-wise. A score `dot * c` (c > 0) is not scaled per element: the maximum is scaled once per row and c
joins the exponent's FMA (`scale_of`).
Q waits in the second K/V stage until its fragments are in registers (36 KB of static shared memory at d = 64).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from loopir import nodes as N
from loopir.errors import CudaCodegenError
from loopir.affine import linear_form
from loopir.nodes import conjuncts
from loopir.visit import free_vars, walk_stmts
from schedules.primitives.flash import (FLASH_KINDS, THREADS, FlashMismatch, FlashParts, affine_conjuncts,
                                       flash_parts, loop_indices, replace_load, slack, stored_value)

from .body import BodyEmitter
from .expr import _FROM_FLOAT, _ROUND
from .mma import _ldmatrix_a, _ldmatrix_b2, _mma

__all__ = ["render_flash", "checked_parts", "PRELUDE_FLASH", "THREADS"]

_PTX = {"float16": "f16", "bfloat16": "bf16"}

PRELUDE_FLASH = r"""
// heavy_first's launch order: launch index v (x fastest) -> (row block, batch) of a grid of gx row blocks x gy
// batches, walked in groups of g = ceil(per_wave / gx) batches, each group's row blocks from the last to the first
// (the block's index within its group; the group's first batch and its number of batches k)
__device__ __forceinline__ unsigned loopir_heavy_in(unsigned per_wave, unsigned& first, unsigned& k) {
  const unsigned g = (per_wave + gridDim.x - 1u) / gridDim.x, v = blockIdx.x + gridDim.x * blockIdx.y;
  first = v / (g * gridDim.x) * g;
  k = min(g, gridDim.y - first);
  return v - first * gridDim.x; }
__device__ __forceinline__ unsigned loopir_heavy_row(unsigned per_wave) {
  unsigned first, k;
  return gridDim.x - 1u - loopir_heavy_in(per_wave, first, k) / k; }
__device__ __forceinline__ unsigned loopir_heavy_batch(unsigned per_wave) {
  unsigned first, k;
  const unsigned in = loopir_heavy_in(per_wave, first, k);
  return first + in % k; }
// a 16-byte chunk of T (16 / sizeof(T) elements): cp.async when src is aligned, else element by element
template <typename T>
__device__ __forceinline__ void loopir_flash_copy16(T* dst, const T* src) {
  if ((((unsigned long long)src) & 15ULL) == 0ULL) { loopir_cp_async16(dst, src); }
  else {
#pragma unroll
    for (int e = 0; e < 16 / (int)sizeof(T); ++e) dst[e] = src[e];
  }
}
__device__ __forceinline__ void loopir_flash_zero16(void* dst) {
  *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
}
__device__ __forceinline__ void loopir_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void loopir_cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ float loopir_flash_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float loopir_flash_exp(float x) { return loopir_flash_exp2(x * 1.4426950408889634f); }
__device__ __forceinline__ unsigned loopir_pack_f16(float lo, float hi) {
  unsigned d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
__device__ __forceinline__ unsigned loopir_pack_bf16(float lo, float hi) {
  unsigned d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
"""


def _shared(address: str) -> str:
    return f"(unsigned)__cvta_generic_to_shared({address})"


def _acc(tile: str) -> list[str]:
    """The four accumulator registers of an m16n8 tile held as `tile[0..3]`."""
    return [f"{tile}[{e}]" for e in range(4)]


def _store(r: Any, st: N.Store, value: str) -> str:
    b = st.buffer
    idx = loop_indices(st)
    if b.dtype in _FROM_FLOAT:
        r.uses_half = True
        value = f"{_FROM_FLOAT[b.dtype]}({value})"
    elif b.dtype == "float64":
        value = f"(double)({value})"
    elif b.dtype != "float32":
        raise CudaCodegenError(f"attention.m16n8k16: the pass stores {b.name!r} as {b.dtype}; a float type is needed")
    return f"{r.buf(b)}[{r.expr(r.flat(b, idx))}] = {value};"


def checked_parts(f: N.For, program: N.Program | None = None) -> FlashParts:
    """The parts of the pass marked at `f` (either flash intrinsic), its operands read from global memory; with
    `program` (the lowered one), which of O, sm and mx nothing outside the pass reads."""
    try:
        p = flash_parts(f, program)
    except FlashMismatch as e:
        raise CudaCodegenError(f"the pass marked {f.kind} at loop {f.var.name!r} changed shape before "
                               f"rendering: {e}") from None
    for ld in (p.q, p.k, p.v):
        if ld.buffer.scope != "global":
            raise CudaCodegenError(f"{f.kind} reads {ld.buffer.name!r} from {ld.buffer.scope} memory; "
                                   "it stages global rows itself")
    if p.k.buffer.dtype != p.q.buffer.dtype:
        raise CudaCodegenError(f"{f.kind}: Q ({p.q.buffer.dtype}) and K ({p.k.buffer.dtype}) differ")
    return p


def render_flash(r: Any, f: N.For) -> None:
    """Emit the kernel body of the marked pass `f` with renderer `r` (codegen.cuda.kernel's)."""
    p = checked_parts(f, r.program)
    r.uses_async = r.uses_half = r.uses_flash = True
    _Emit(r, p).emit()



def heavy_first(body: N.Stmt, program: N.Program) -> dict[str, str]:
    """The block indices with which a kernel holding one attention pass launches its heaviest blocks first, or {}.

    A block's work is the keys its rows see. When a conjunct of the mask bounds the keys from above by a bound that
    grows with the row block bound to blockIdx.x (causal: key <= row), and none bounds them from below by one
    that grows too (a sliding window: every block sees about as many keys), the last row blocks are the heaviest.
    In the hardware's launch order (x fastest, then y) each batch's heaviest blocks then start last, and the grid
    ends on a tail of long blocks: a model of 264 slots over 64 heads x 32 row blocks gives a makespan of 1.15x
    the work spread evenly. Launched in groups of batches, each group's row blocks descending, the long blocks go
    first and the short ones fill in (1.003x). A group holds about two waves of blocks (PER_WAVE), so the K and V
    rows it reads stay in L2 (~17 MB at d 64). Blocks bound to blockIdx are independent (bind checked it), so any
    order is legal; the mapping from the launch index is a bijection onto the same grid."""
    loops = [f for f in walk_stmts(body) if isinstance(f, N.For)]
    passes = [f for f in loops if f.kind in FLASH_KINDS]
    axes = {f.thread: f for f in loops if f.thread and f.thread.startswith("blockIdx")}
    if len(passes) != 1 or "blockIdx.x" not in axes or "blockIdx.z" in axes:
        return {}
    try:
        p = flash_parts(passes[0], program, passes[0].kind)
    except FlashMismatch:
        return {}
    rows = axes["blockIdx.x"].var
    upper = lower = False
    for cj in affine_conjuncts(p.mask, p.row, p.key.var)[0]:
        lin = linear_form(slack(cj)) or {}
        key, row = lin.get(p.key.var, 0), lin.get(rows, 0)
        if isinstance(key, int) and isinstance(row, int):
            upper |= key < 0 < row  # d = A(row) + c key >= 0 with c < 0: key <= A / -c, growing with the row
            lower |= row < 0 < key  # key >= -A / c, growing with the row
    if not upper or lower:
        return {}
    per_wave = 2 * PER_WAVE * p.shape.blocks_per_sm
    return {"blockIdx.x": f"loopir_heavy_row({per_wave}u)", "blockIdx.y": f"loopir_heavy_batch({per_wave}u)"}


PER_WAVE = 132  # blocks a wave holds per block an SM holds (the H200's and H100 SXM's multiprocessors)


LOG2E = 1.4426950408889634
_IN_FLOAT = ("float16", "bfloat16", "float32")  # the types the renderer computes in float


def scale_of(score: N.Expr, dot: N.Var) -> tuple[N.Expr, N.Var, N.Expr, N.Const] | None:
    """(t, a float variable x, the score of x, c) when `score` is t * c with c a finite constant > 0 and the
    product computed in float (the renderer computes float16 and bfloat16 arithmetic in float and rounds at casts
    and stores; a cast to float32 renders as nothing; `dot`, the float dot product, is a plain variable), else
    None."""
    e = score
    while isinstance(e, N.Cast) and e.dtype == "float32" and e.a.dtype in _IN_FLOAT:
        e = e.a
    if not (isinstance(e, N.Binary) and e.op == "mul" and e.dtype in _IN_FLOAT):
        return None
    for t, c in ((e.a, e.b), (e.b, e.a)):
        if (isinstance(c, N.Const) and (t is dot or t.dtype in _IN_FLOAT) and c.dtype in _IN_FLOAT
                and isinstance(c.value, (int, float)) and 0 < c.value < math.inf):
            x = N.Var("fa_tmax", "float32")
            return t, x, N.Binary("mul", *((x, c) if t is e.a else (c, x)), "float32"), c
    return None


class _Emit(BodyEmitter):
    def __init__(self, r: Any, p: FlashParts) -> None:
        super().__init__(r)
        self.p = p
        self.rows, self.mt, self.keys = p.shape.rows, p.shape.mt, p.shape.keys
        # the mask's conjuncts affine in (row, key), and whether they are all of them (tiles, scores)
        self.affine, self.every = affine_conjuncts(p.mask, p.row, p.key.var)
        self.offset_terms = self._offset_terms()  # the mask's conjuncts tested as 32-bit offsets (mask_offsets)
        self.D, self.DV = p.depth, p.width
        self.KS, self.VS = p.depth + 8, p.width + 8  # shared row strides in halves: 16 bytes of padding
        # one shared array of two stages (K tile, then V tile); Q waits in stage 1 until its fragments are loaded
        self.stage = self.keys * (self.KS + self.VS)
        self.n = {k: r.names.fresh(f"fa_{k}") for k in (
            "kv", "lane", "warp", "lo", "hi", "c", "row", "ch", "dst", "load", "dead", "wdead", "full", "next", "o",
            "m", "l", "qf", "kt", "nk", "stage", "first", "s", "mx", "sc", "k0", "k1", "fs", "any", "kk", "np",
            "nt", "e", "h", "dp", "pr", "mt", "grew", "sca", "ml", "a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3")}

    def cond(self, e: N.Expr | None) -> str:
        return "true" if e is None else self.r.expr(e)

    def zeros(self, arr: str, dims: tuple[int, ...]) -> None:
        """`float arr[d0][d1]...` set to 0 by unrolled loops (constant indices: the array stays in registers)."""
        self.line(f"float {arr}{''.join(f'[{d}]' for d in dims)};")
        idx = [self.r.names.fresh("fa_z") for _ in dims]
        for v, d in zip(idx, dims):
            self.unrolled(v, d)
        self.line(f"{arr}{''.join(f'[{v}]' for v in idx)} = 0.0f;")
        for _ in dims:
            self.close()

    def row_of(self, mt: str, half: str) -> str:
        """The block row of this lane's accumulator elements in m-tile `mt`, half `half` (rows g / g + 8)."""
        return f"{self.n['warp']} * {16 * self.mt} + {mt} * 16 + ({self.n['lane']} >> 2) + 8 * {half}"

    def emit(self) -> None:
        r, p, n, ix = self.r, self.p, self.n, self.ix
        total = self.stage + max(self.stage, self.rows * self.KS)
        self.open(f"{{  // {self.header()}")
        self.line(f"__shared__ __align__(16) {self.ELEM} {n['kv']}[{total}];  // two stages of K and V; Q in the "
                  "second until its fragments are in registers")
        self.line(f"const int {n['lane']} = threadIdx.x & 31, {n['warp']} = threadIdx.x >> 5;")
        self.line(f"const {ix} {n['lo']} = {r.expr(p.key.lo)}, {n['hi']} = {r.expr(p.key.hi)};")
        self.line("__syncthreads();  // a serial loop around the pass: every warp is done with the last tile's stages")
        self.copy_rows(self.rows, self.D, self.KS, p.q, p.row, "0", p.red, p.guard, str(self.stage))
        self.loader()
        self.tiles()
        self.main_loop()
        self.epilogue()
        self.close()

    def header(self) -> str:
        p = self.p
        return (f"attention.m16n8k16: rows {p.row.name} ({self.rows} per block, a warp per {16 * self.mt}), keys "
                f"{p.key.var.name} in tiles of {self.keys}; S = Q K^T and O += P V on tensor cores "
                "(codegen.cuda.flash)")

    def copy_rows(self, rows: int, width: int, stride: int, ld: N.Load, row_var: N.Var, row0: str,
                  chunk_var: N.Var, ok: N.Expr | str | None, base: str) -> None:
        """Rows `rows` x `width` of `ld` (row r: `row_var` = row0 + r, `chunk_var` the 8-element chunk) into the
        shared array from `base`; zeros where `ok` fails."""
        aligned = self.aligned(ld, chunk_var)
        if aligned:
            # every chunk 16-byte aligned (a test of sizes and the pointer, once at the kernel's entry): a uniform
            # branch to copies without the per-chunk test and its element-wise fallback, which issue even when
            # predicated off (a quarter of a tile's instructions at d 64)
            self.open(f"if ({aligned}) {{")
            self.copy_chunks(rows, width, stride, ld, row_var, row0, chunk_var, ok, base, self.COPY_ALIGNED)
            self.close("} else {")
            self.r.ind += 1
        self.copy_chunks(rows, width, stride, ld, row_var, row0, chunk_var, ok, base, self.COPY)
        if aligned:
            self.close()

    def aligned(self, ld: N.Load, chunk_var: N.Var) -> str | None:
        """A condition computed at the kernel's entry under which every chunk `ld` reads (8 elements from
        `chunk_var` = 8 ch) starts 16 bytes aligned, or None when the index does not show it (the renderer's proof:
        every other term a multiple of 8 elements, sizes tested at run time, and the pointer)."""
        r, checks = self.r, []
        if r._aligned_base(r.flat(ld.buffer, ld.indices), chunk_var, checks, lanes=self.PER_CHUNK) is None:
            return None
        return " && ".join(dict.fromkeys([*r._pointer_check(ld.buffer), *checks]))

    def copy_chunks(self, rows: int, width: int, stride: int, ld: N.Load, row_var: N.Var, row0: str,
                    chunk_var: N.Var, ok: N.Expr | str | None, base: str, copy: str) -> None:
        r, n = self.r, self.n
        chunks = width // self.PER_CHUNK
        self.chunk_loop(rows * chunks)
        self.line(f"const int {n['row']} = {n['c']} / {chunks}, {n['ch']} = {n['c']} % {chunks};")
        self.line(self.chunk_dest(rows, stride, base))
        self.let(row_var, f"{row0} + {n['row']}")
        self.open(f"if ({ok if isinstance(ok, str) else self.cond(ok)}) {{")
        self.let(chunk_var, f"{n['ch']} * {self.PER_CHUNK}")
        self.line(f"{copy}({n['dst']}, &{r.buf(ld.buffer)}[{r.expr(r.flat(ld.buffer, ld.indices))}]);")
        self.close(f"}} else {{ {self.ZERO}({n['dst']}); }}")
        self.close()

    # a 16-byte chunk: copied (cp.async when aligned, else element-wise), copied when known aligned, zeroed
    COPY, COPY_ALIGNED, ZERO = "loopir_flash_copy16", "loopir_cp_async16", "loopir_flash_zero16"
    ELEM, PER_CHUNK = "unsigned short", 8  # the shared array's element type, elements per 16-byte chunk

    def chunk_loop(self, chunks: int) -> None:
        """Open the loop of this thread's chunks `c` of `chunks`."""
        c = self.n["c"]
        self.open(f"for (int {c} = threadIdx.x; {c} < {chunks}; {c} += {THREADS}) {{")

    def chunk_dest(self, rows: int, stride: int, base: str) -> str:
        """The declaration of chunk (row, ch)'s destination `dst`: padded rows of `stride` halves from `base`."""
        n = self.n
        return f"{self.ELEM}* {n['dst']} = &{n['kv']}[{base} + {n['row']} * {stride} + {n['ch']} * {self.PER_CHUNK}];"

    def stage_at(self, stage: str) -> str:
        """Where shared stage `stage` (its K tile, then its V tile) starts."""
        return f"{stage} * {self.stage}"

    def v_at(self, stage_base: str) -> str:
        return f"{stage_base} + {self.keys * self.KS}"

    def loader(self) -> None:
        """fa_load(k0, stage): the K and V rows of the keys k0 .. k0 + keys - 1 (zeros past the key loop's end)."""
        p, n, ix = self.p, self.n, self.ix
        self.open(f"auto {n['load']} = [&]({ix} {n['k0']}, int {n['stage']}) {{")
        key_ok = f"{self.r.var(p.key.var)} < {n['hi']}"
        base = self.stage_at(n["stage"])
        self.copy_rows(self.keys, self.D, self.KS, p.k, p.key.var, n["k0"], p.red, key_ok, base)
        self.copy_rows(self.keys, self.DV, self.VS, p.v, p.key.var, n["k0"], p.col, key_ok, self.v_at(base))
        self.close("};")

    def tiles(self) -> None:
        """fa_dead(k0): an affine conjunct of the mask fails at the four corners of (the block's rows) x (keys k0..);
        fa_wdead(k0): the same on the warp's rows (its scores are all masked); fa_full(k0): the tile lies inside the
        key loop and every conjunct (all affine) holds at the corners of (the warp's rows) x (the tile's keys);
        fa_next(k0): the first tile from k0 that is not dead. An affine function of (row, key) takes its extremes
        over a box at the corners, so four tests decide the box. Per warp, a causal block's diagonal tiles split
        into whole, dead and masked warps (a quarter, a quarter and half of them at 128 rows x 64 keys) where
        per block all are masked."""
        p, n, ix, r = self.p, self.n, self.ix, self.r
        affine, every = self.affine, self.every
        warp0 = f"{n['warp']} * {16 * self.mt}"
        block_rows, warp_rows = ("0", str(self.rows - 1)), (warp0, f"{warp0} + {16 * self.mt - 1}")

        def corner_lines(c: N.Expr, op: str, rows: tuple[str, str]) -> None:
            for row in rows:
                for key in (n["k0"], n["k1"]):
                    self.line(f"{{ const {ix} {r.var(p.row)} = {row}; const {ix} {r.var(p.key.var)} = {key}; "
                              f"{n['any']} {op}= {r.expr(c)}; }}")

        for name, rows in (("dead", block_rows), ("wdead", warp_rows)):
            self.open(f"auto {n[name]} = [&]({ix} {n['k0']}) -> bool {{")
            self.line(f"const {ix} {n['k1']} = loopir_min({n['k0']} + {self.keys - 1}, {n['hi']} - 1);")
            for c in affine:
                self.open(f"{{ bool {n['any']} = false;")
                corner_lines(c, "|", rows)
                self.close(f"if (!{n['any']}) return true; }}")
            self.line(f"(void){n['k1']};")
            self.close("return false; };")
        self.open(f"auto {n['full']} = [&]({ix} {n['k0']}) -> bool {{")
        self.line(f"const {ix} {n['k1']} = {n['k0']} + {self.keys - 1};")
        self.line(f"if ({n['k1']} >= {n['hi']}) return false;")
        if not every:
            self.line("return false;")
        for c in affine if every else []:
            self.open(f"{{ bool {n['any']} = true;")
            corner_lines(c, "&", warp_rows)
            self.close(f"if (!{n['any']}) return false; }}")
        self.close("return true; };")
        self.open(f"auto {n['next']} = [&]({ix} {n['k0']}) -> {ix} {{")
        self.line(f"while ({n['k0']} < {n['hi']} && {n['dead']}({n['k0']})) {n['k0']} += {self.keys};")
        self.close(f"return {n['k0']}; }};")

    def main_loop(self) -> None:
        p, n = self.p, self.n
        D, DV, KS, VS = self.D, self.DV, self.KS, self.VS
        tq, tv = _PTX[p.q.buffer.dtype], _PTX[p.v.buffer.dtype]
        pack = "loopir_pack_f16" if tv == "f16" else "loopir_pack_bf16"
        lane, warp, o, s, qf, kv = n["lane"], n["warp"], n["o"], n["s"], n["qf"], n["kv"]
        kk, np_, dp, mt = n["kk"], n["np"], n["dp"], n["mt"]
        a = [n[f"a{j}"] for j in range(4)]
        b = [n[f"b{j}"] for j in range(4)]
        self.zeros(o, (self.mt, DV // 8, 4))
        self.line(f"float {n['m']}[{self.mt}][2], {n['l']}[{self.mt}][2];")
        self.unrolled(mt, self.mt)
        self.line(f"{n['m']}[{mt}][0] = {n['m']}[{mt}][1] = -LOOPIR_INF_F; {n['l']}[{mt}][0] = {n['l']}[{mt}][1] = "
                  "0.0f;")
        self.close()
        self.line(f"unsigned {qf}[{self.mt}][{D // 16}][4];")
        self.open_tiles()
        self.unrolled(mt, self.mt)
        self.unrolled(kk, D // 16)
        _ldmatrix_a(self.r, [f"{qf}[{mt}][{kk}][{j}]" for j in range(4)],
                    _shared(f"&{kv}[{self.stage} + ({warp} * {16 * self.mt} + {mt} * 16 + ({lane} & 15)) * {KS} + "
                            f"{kk} * 16 + ({lane} >> 4) * 8]"))
        self.close()
        self.close()
        self.prefetch()
        ks, vs = f"{kv}[{n['stage']} * {self.stage}", f"{kv}[{n['stage']} * {self.stage} + {self.keys * KS}"
        # S = Q K^T: key rows are B's columns (ldmatrix without .trans); each K fragment serves the warp's m-tiles
        self.zeros(s, (self.mt, self.keys // 8, 4))
        self.unrolled(kk, D // 16)
        self.unrolled(np_, self.keys // 16)
        self.line(f"unsigned {', '.join(b)};")
        _ldmatrix_a(self.r, b, _shared(f"&{ks} + ({np_} * 16 + ({lane} & 7) + (({lane} >> 4) << 3)) * {KS} + {kk} * 16"
                                       f" + (({lane} >> 3) & 1) * 8]"))
        self.unrolled(mt, self.mt)
        for half, nt in ((b[:2], f"2 * {np_}"), (b[2:], f"2 * {np_} + 1")):
            _mma(self.r, tq, _acc(f"{s}[{mt}][{nt}]"), [f"{qf}[{mt}][{kk}][{j}]" for j in range(4)], half)
        self.close()
        self.close()
        self.close()
        self.scores()
        # O += P V: P's registers are A fragments; V rows are B's k (ldmatrix .trans), each fragment serving the m-tiles
        self.unrolled(kk, self.keys // 16)
        self.line(f"unsigned {a[0]}[{self.mt}], {a[1]}[{self.mt}], {a[2]}[{self.mt}], {a[3]}[{self.mt}];")
        self.unrolled(mt, self.mt)
        for j, (nt, e0) in enumerate(((0, 0), (0, 2), (1, 0), (1, 2))):
            self.line(f"{a[j]}[{mt}] = {pack}({s}[{mt}][2 * {kk} + {nt}][{e0}], {s}[{mt}][2 * {kk} + {nt}][{e0 + 1}]);")
        self.close()
        self.unrolled(dp, DV // 16)
        self.line(f"unsigned {', '.join(b)};")
        _ldmatrix_b2(self.r, b, _shared(f"&{vs} + ({kk} * 16 + ({lane} & 15)) * {VS} + {dp} * 16 + ({lane} >> 4) * 8]"))
        self.unrolled(mt, self.mt)
        for half, nt in ((b[:2], f"2 * {dp}"), (b[2:], f"2 * {dp} + 1")):
            _mma(self.r, tv, _acc(f"{o}[{mt}][{nt}]"), [f"{x}[{mt}]" for x in a], half)
        self.close()
        self.close()
        self.close()
        self.advance()

    def open_tiles(self) -> None:
        """The first live tile's copy, then open the loop over the live tiles (kt, in shared stage `stage`) and,
        inside it, the block run on the first tile only (Q's fragments into registers), closed by `prefetch`."""
        n, ix = self.n, self.ix
        self.line(f"{ix} {n['kt']} = {n['next']}({n['lo']});")
        self.line(f"if ({n['kt']} < {n['hi']}) {n['load']}({n['kt']}, 0);")
        self.line("loopir_cp_async_commit();")
        self.line(f"int {n['stage']} = 0;")
        self.line(f"bool {n['first']} = true;")
        self.open(f"while ({n['kt']} < {n['hi']}) {{")
        self.line("loopir_cp_async_wait_all();")
        self.line("__syncthreads();  // this tile's K and V (and, the first time, Q) are in shared memory; every "
                  "thread is done with the other stage")
        self.open(f"if ({n['first']}) {{  // Q's fragments into registers, then stage 1 is free for the next tile")
        self.line(f"{n['first']} = false;")

    def prefetch(self) -> None:
        """Close the first tile's block (stage 1, where Q waited, is then free) and start the copy of the next live
        tile (nk) into the other stage."""
        n, ix = self.n, self.ix
        self.line("__syncthreads();")
        self.close()
        self.line(f"const {ix} {n['nk']} = {n['next']}({n['kt']} + {self.keys});")
        self.line(f"if ({n['nk']} < {n['hi']}) {n['load']}({n['nk']}, {n['stage']} ^ 1);")
        self.line("loopir_cp_async_commit();")

    def advance(self) -> None:
        """Close the loop over the live tiles: the next one (nk, copied by `prefetch`) in the other stage."""
        n = self.n
        self.line(f"{n['stage']} ^= 1;")
        self.line(f"{n['kt']} = {n['nk']};")
        self.close()

    def declare_factors(self) -> None:
        """The rows' rescale factors and whether any is not 1 (set by `scores`, read by `rescale_o`)."""
        self.line(f"bool {self.n['grew']} = false;")
        self.line(f"float {self.n['sca']}[{self.mt}][2];")

    def scores(self, rescale: bool = True, declare: bool = True) -> None:
        """s = g(S) per element, the mask, the rows' new maximum, the rescale of l, P = exp(s - m), and (with
        `rescale`, else by a later `rescale_o`) O's. Three cases per warp (uniform in it, so no lane diverges): the
        mask kills all of the warp's scores (P = 0, nothing else changes), a tile whose corners on the warp's rows
        satisfy the mask tests nothing per element, any other tests each. Without `declare`, `declare_factors`
        was called before."""
        n, s, mt, nt, e = self.n, self.n["s"], self.n["mt"], self.n["nt"], self.n["e"]
        self.line(f"float {n['mx']}[{self.mt}][2];")
        if declare:
            self.declare_factors()
        if self.affine:
            self.open(f"if ({n['wdead']}({n['kt']})) {{  // every key of the tile is masked on the warp's rows")
            for idx, d in ((mt, self.mt), (nt, self.keys // 8), (e, 4)):
                self.unrolled(idx, d)
            # asm: with `= 0.0f` ptxas spilled 37 registers of the d 64 wgmma kernel (at its bound of 128)
            self.line(f'asm volatile("mov.b32 %0, 0;" : "=f"({s}[{mt}][{nt}][{e}]));')
            for _ in range(3):
                self.close()
            self.unrolled(mt, self.mt)
            self.line(f"{n['sca']}[{mt}][0] = {n['sca']}[{mt}][1] = 1.0f;")
            self.close()
            self.close(f"}} else if ({n['full']}({n['kt']})) {{")
            self.r.ind += 1
        else:
            self.open(f"if ({n['full']}({n['kt']})) {{")
        self.scores_of(True)
        self.close("} else {")
        self.r.ind += 1
        self.scores_of(False)
        self.close()
        if rescale:
            self.rescale_o()

    def rescale_o(self) -> None:
        """O *= the rows' factors, only when some row of the warp saw a larger maximum (a factor of exactly 1
        changes nothing)."""
        n, o, mt, e = self.n, self.n["o"], self.n["mt"], self.n["e"]
        self.open(f"if (__any_sync(0xffffffffu, {n['grew']})) {{")
        self.unrolled(mt, self.mt)
        self.unrolled(e, self.DV // 8)
        self.line(f"{o}[{mt}][{e}][0] *= {n['sca']}[{mt}][0]; {o}[{mt}][{e}][1] *= {n['sca']}[{mt}][0];")
        self.line(f"{o}[{mt}][{e}][2] *= {n['sca']}[{mt}][1]; {o}[{mt}][{e}][3] *= {n['sca']}[{mt}][1];")
        self.close()
        self.close()
        self.close()

    def _offset_terms(self) -> list[tuple[N.Expr, N.Expr, int]]:
        """The mask's conjuncts `a op b` that are affine in (row, key) with a constant key coefficient c, |c| keys
        below 2^20, as (conjunct, d, c): the conjunct holds iff d > 0 (lt, gt) or d >= 0 (le, ge), d = b - a
        (lt, le) or a - b, and d grows by c per key."""
        out = []
        for cj in self.affine:
            d = slack(cj)
            lin = linear_form(d)
            c = None if lin is None else lin.get(self.p.key.var, 0)
            if (isinstance(c, int) and abs(c) * self.keys < 1 << 20
                    and all(isinstance(v, int) or k is not self.p.row for k, v in lin.items())):
                out.append((cj, d, c))
        return out

    def mask_offsets(self) -> list[str]:
        """Per-element tests of a tile that is not whole, in 32-bit arithmetic: each term of `offset_terms` (and
        the key loop's end) evaluated once per tile at this lane's first key of each of its two rows; an
        element adds its constant key offset. Values are clamped to +-2^30 (an element's offset, |c| times less
        than the keys of a tile, is below 2^20, so the sign of the sum is the sign of the exact value)."""
        p, n, r, mt, nt, e = self.p, self.n, self.r, self.n["mt"], self.n["nt"], self.n["e"]
        key0 = f"{n['kt']} + ({n['lane']} & 3) * 2"
        off = f"({nt} * 8 + ({e} & 1))"
        clamp = "(int)loopir_min(loopir_max((long long)({}), -(1LL << 30)), 1LL << 30)"
        left = clamp.format(f"{n['hi']} - ({key0})")
        self.line(f"const int {n['fs']} = {left};  // keys left from the lane's first")
        tests = [f"{off} < {n['fs']}"]
        for cj, d, c in self.offset_terms:
            t = r.names.fresh("fa_d")
            self.line(f"int {t}[2];")
            self.unrolled(n["h"], 2)
            self.let(p.row, self.row_of(mt, n["h"]))
            self.let(p.key.var, key0)
            self.line(f"{t}[{n['h']}] = {clamp.format(r.expr(d))};")
            self.close()
            strict = ">" if cj.op in ("lt", "gt") else ">="
            tests.append(f"{t}[{e} >> 1] {strict} {-c} * {off}")  # a constant right side once unrolled
        return tests

    def scores_of(self, whole: bool) -> None:
        """With a score t * c, c > 0 a constant (`scale_of`), the maximum is taken over t and scaled once per row
        (rounding is monotone, so max fl(t c) = fl(max t * c)), and P = 2^(t (c log2e) - m log2e): one multiply per
        element fewer (a warp issued about 470 instructions per tile at d 64, 190 of them here). Not `whole`: a
        masked score becomes -inf (P = 2^-inf = 0 once the row has a finite maximum; while it has none, m log2e
        is taken as 0 so that no -inf - -inf makes a NaN), so that the maximum and P test nothing more."""
        p, n, r = self.p, self.n, self.r
        s, mt = n["s"], n["mt"]
        nt, e, h, pr, mx = n["nt"], n["e"], n["h"], n["pr"], n["mx"]
        m, l_ = n["m"], n["l"]
        uses = {id(v) for v in free_vars(p.score)}
        scaled = scale_of(p.score, p.dot)
        score, log2e = p.score, f"{LOG2E!r}f"
        if scaled is not None:
            c = float(np.float32(float(r.const(scaled[3]).rstrip("f"))))  # the literal the kernel multiplies by
            score, log2e = scaled[0], f"{float(np.float32(c * LOG2E))!r}f"
        self.line(f"float {n['ml']}[{self.mt}][2];")
        self.unrolled(mt, self.mt)
        first = ("-LOOPIR_INF_F", "-LOOPIR_INF_F") if scaled else (f"{m}[{mt}][0]", f"{m}[{mt}][1]")
        self.line(f"{mx}[{mt}][0] = {first[0]}; {mx}[{mt}][1] = {first[1]};")
        tests = [] if whole else self.mask_offsets()
        rest = [] if whole or p.mask is None else [
            c for c in conjuncts(p.mask) if not any(c is t for t, _, _ in self.offset_terms)]
        self.unrolled(nt, self.keys // 8)
        self.unrolled(e, 4)
        if rest or id(p.row) in uses:
            self.let(p.row, self.row_of(mt, f"({e} >> 1)"))
        if rest or id(p.key.var) in uses:
            self.let(p.key.var, f"{n['kt']} + {nt} * 8 + ({n['lane']} & 3) * 2 + ({e} & 1)")
        self.line(f"const float {r.var(p.dot)} = {s}[{mt}][{nt}][{e}];")
        self.line(f"{s}[{mt}][{nt}][{e}] = {r.expr(score)};")
        if not whole:
            ok = " && ".join([*tests, *(f"({r.expr(c)})" for c in rest)])
            self.line(f"if (!({ok})) {s}[{mt}][{nt}][{e}] = -LOOPIR_INF_F;")
        self.line(f"{mx}[{mt}][{e} >> 1] = loopir_max({mx}[{mt}][{e} >> 1], {s}[{mt}][{nt}][{e}]);")
        self.close()
        self.close()
        self.unrolled(h, 2)
        for d in (1, 2):
            self.line(f"{mx}[{mt}][{h}] = loopir_max({mx}[{mt}][{h}], __shfl_xor_sync(0xffffffffu, {mx}[{mt}][{h}], "
                      f"{d}));")
        if scaled is not None:
            self.line(f"const float {r.var(scaled[1])} = {mx}[{mt}][{h}];  // the row's largest t")
            self.line(f"{mx}[{mt}][{h}] = loopir_max({m}[{mt}][{h}], {r.expr(scaled[2])});")
        self.line(f"const float {n['sc']} = {m}[{mt}][{h}] == {mx}[{mt}][{h}] ? 1.0f : "
                  f"loopir_flash_exp({m}[{mt}][{h}] - {mx}[{mt}][{h}]);")
        self.line(f"{m}[{mt}][{h}] = {mx}[{mt}][{h}];")
        ml = f"{m}[{mt}][{h}] * {LOG2E!r}f"
        if not whole:
            ml = f"{m}[{mt}][{h}] == -LOOPIR_INF_F ? 0.0f : {ml}"
        self.line(f"{n['ml']}[{mt}][{h}] = {ml};  // exp(s - m) = 2^(s L - m L)")
        self.line(f"{l_}[{mt}][{h}] *= {n['sc']};")
        self.line(f"{n['sca']}[{mt}][{h}] = {n['sc']};")
        self.line(f"{n['grew']} |= {n['sc']} != 1.0f;")
        self.close()
        self.close()
        self.unrolled(mt, self.mt)
        self.unrolled(nt, self.keys // 8)
        self.unrolled(e, 4)
        val = f"loopir_flash_exp2(fmaf({s}[{mt}][{nt}][{e}], {log2e}, -{n['ml']}[{mt}][{e} >> 1]))"
        self.line(f"const float {pr} = {val};")
        self.line(f"{s}[{mt}][{nt}][{e}] = {pr};")
        self.line(f"{l_}[{mt}][{e} >> 1] += {pr};")
        self.close()
        self.close()
        self.close()

    def epilogue(self) -> None:
        """The row's final O, sum and maximum, stored where something outside the pass reads them; and the
        epilogue (the division fused into the pass) on the registers: O and the sum as the program holds them
        (rounded to their buffers' types), the store per column."""
        p, n, r = self.p, self.n, self.r
        lane, h, e, o, mt, l_ = n["lane"], n["h"], n["e"], n["o"], n["mt"], n["l"]
        self.unrolled(mt, self.mt)
        self.unrolled(h, 2)
        for d in (1, 2):
            self.line(f"{l_}[{mt}][{h}] += __shfl_xor_sync(0xffffffffu, {l_}[{mt}][{h}], {d});")
        self.let(p.row, self.row_of(mt, h))
        self.open(f"if ({self.cond(p.guard)}) {{")
        epi, o_var, sum_var = self.epilogue_value()
        if epi is not None and p.total is not None:
            self.line(f"const float {r.var(sum_var)} = {self.rounded(p.total.buffer, f'{l_}[{mt}][{h}]')};")
        self.unrolled(e, self.DV // 8)
        for el in (0, 1):
            self.open("{")
            self.let(p.col, f"{e} * 8 + ({lane} & 3) * 2 + {el}")
            value = f"{o}[{mt}][{e}][2 * {h} + {el}]"
            if p.out.buffer.name not in p.dead:
                self.line(_store(r, p.out, value))
            if epi is not None:
                self.let(p.epi_col, self.r.var(p.col))
                self.line(f"const float {r.var(o_var)} = {self.rounded(p.out.buffer, value)};")
                self.line(_store(r, p.epilogue, r.expr(epi)))
            self.close()
        self.close()
        self.open(f"if (({lane} & 3) == 0) {{")
        if p.total is not None and p.total.buffer.name not in p.dead:
            self.line(_store(r, p.total, f"{l_}[{mt}][{h}]"))
        if p.maximum.buffer.name not in p.dead:
            self.line(_store(r, p.maximum, f"{n['m']}[{mt}][{h}]"))
        self.close()
        self.close()
        self.close()
        self.close()
        for st in (p.out, p.total, p.maximum):
            if st is not None:
                r._invalidate(st.buffer)

    def epilogue_value(self) -> tuple[N.Expr | None, N.Var | None, N.Var | None]:
        """The epilogue's value with its loads of the row's final O and sum replaced by two float variables, and
        those variables, or Nones without an epilogue."""
        p = self.p
        if p.epilogue is None:
            return None, None, None
        o_var, sum_var = N.Var("fa_ov", "float32"), N.Var("fa_lv", "float32")
        ridx = loop_indices(p.out)[:-1]
        value = replace_load(stored_value(p.epilogue), p.out.buffer, (*ridx, p.epi_col), o_var)
        if p.total is not None:
            value = replace_load(value, p.total.buffer, ridx, sum_var)
        return value, o_var, sum_var

    def rounded(self, b: N.Buffer, value: str) -> str:
        """`value` (a float) as buffer `b` holds it: rounded to 16 bits for a half buffer."""
        if b.dtype in _ROUND:
            self.r.uses_half = True
            return f"{_ROUND[b.dtype]}({value})"
        return value

