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
(conflict-free ldmatrix); a 16-byte chunk whose global address is not 16-byte aligned is copied element-wise.
Q waits in the second K/V stage until its fragments are in registers (36 KB of static shared memory at d = 64).
"""

from __future__ import annotations

from typing import Any

from loopir import nodes as N
from loopir.errors import CudaCodegenError
from loopir.visit import free_vars
from schedules.primitives.flash import THREADS, FlashMismatch, FlashParts, affine_conjuncts, flash_parts, loop_indices

from .body import BodyEmitter
from .expr import _FROM_FLOAT
from .mma import _ldmatrix_a, _ldmatrix_b2, _mma

__all__ = ["render_flash", "PRELUDE_FLASH", "THREADS"]

_PTX = {"float16": "f16", "bfloat16": "bf16"}

PRELUDE_FLASH = r"""
__device__ __forceinline__ void loopir_flash_copy16(unsigned short* dst, const unsigned short* src) {
  if ((((unsigned long long)src) & 15ULL) == 0ULL) { loopir_cp_async16(dst, src); }
  else {
#pragma unroll
    for (int e = 0; e < 8; ++e) dst[e] = src[e];
  }
}
__device__ __forceinline__ void loopir_flash_zero16(unsigned short* dst) {
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


def render_flash(r: Any, f: N.For) -> None:
    """Emit the kernel body of the marked pass `f` with renderer `r` (codegen.cuda.kernel's)."""
    try:
        p = flash_parts(f)
    except FlashMismatch as e:
        raise CudaCodegenError(f"the pass marked attention.m16n8k16 at loop {f.var.name!r} changed shape before "
                               f"rendering: {e}") from None
    for ld in (p.q, p.k, p.v):
        if ld.buffer.scope != "global":
            raise CudaCodegenError(f"attention.m16n8k16 reads {ld.buffer.name!r} from {ld.buffer.scope} memory; "
                                   "it stages global rows itself")
    r.uses_async = r.uses_half = r.uses_flash = True
    _Emit(r, p).emit()


class _Emit(BodyEmitter):
    def __init__(self, r: Any, p: FlashParts) -> None:
        super().__init__(r)
        self.p = p
        self.rows, self.mt, self.keys = p.shape.rows, p.shape.mt, p.shape.keys
        self.D, self.DV = p.depth, p.width
        self.KS, self.VS = p.depth + 8, p.width + 8  # shared row strides in halves: 16 bytes of padding
        # one shared array of two stages (K tile, then V tile); Q waits in stage 1 until its fragments are loaded
        self.stage = self.keys * (self.KS + self.VS)
        self.n = {k: r.names.fresh(f"fa_{k}") for k in (
            "kv", "lane", "warp", "lo", "hi", "c", "row", "ch", "dst", "load", "dead", "full", "next", "o",
            "m", "l", "qf", "kt", "nk", "stage", "first", "s", "vis", "mx", "sc", "k0", "k1", "fs", "any", "kk", "np",
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
        self.open(f"{{  // attention.m16n8k16: rows {p.row.name} ({self.rows} per block, a warp per {16 * self.mt}), "
                  f"keys {p.key.var.name} in tiles of {self.keys}; S = Q K^T and O += P V on tensor cores "
                  "(codegen.cuda.flash)")
        self.line(f"__shared__ __align__(16) unsigned short {n['kv']}[{total}];  // two stages of K and V; Q in the "
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

    def copy_rows(self, rows: int, width: int, stride: int, ld: N.Load, row_var: N.Var, row0: str,
                  chunk_var: N.Var, ok: N.Expr | str | None, base: str) -> None:
        """Rows `rows` x `width` of `ld` (row r: `row_var` = row0 + r, `chunk_var` the 8-element chunk) into the
        shared array from `base`; zeros where `ok` fails."""
        r, n = self.r, self.n
        chunks = width // 8
        self.open(f"for (int {n['c']} = threadIdx.x; {n['c']} < {rows * chunks}; {n['c']} += {THREADS}) {{")
        self.line(f"const int {n['row']} = {n['c']} / {chunks}, {n['ch']} = {n['c']} % {chunks};")
        self.line(f"unsigned short* {n['dst']} = &{n['kv']}[{base} + {n['row']} * {stride} + {n['ch']} * 8];")
        self.let(row_var, f"{row0} + {n['row']}")
        self.open(f"if ({ok if isinstance(ok, str) else self.cond(ok)}) {{")
        self.let(chunk_var, f"{n['ch']} * 8")
        self.line(f"loopir_flash_copy16({n['dst']}, &{r.buf(ld.buffer)}[{r.expr(r.flat(ld.buffer, ld.indices))}]);")
        self.close(f"}} else {{ loopir_flash_zero16({n['dst']}); }}")
        self.close()

    def loader(self) -> None:
        """fa_load(k0, stage): the K and V rows of the keys k0 .. k0 + 63 (zeros past the key loop's end)."""
        p, n, ix = self.p, self.n, self.ix
        self.open(f"auto {n['load']} = [&]({ix} {n['k0']}, int {n['stage']}) {{")
        key_ok = f"{self.r.var(p.key.var)} < {n['hi']}"
        base = f"{n['stage']} * {self.stage}"
        self.copy_rows(self.keys, self.D, self.KS, p.k, p.key.var, n["k0"], p.red, key_ok, base)
        self.copy_rows(self.keys, self.DV, self.VS, p.v, p.key.var, n["k0"], p.col, key_ok,
                       f"{base} + {self.keys * self.KS}")
        self.close("};")

    def tiles(self) -> None:
        """fa_dead(k0): an affine conjunct of the mask fails at the four corners of (the block's rows) x (keys k0..);
        fa_full(k0): the tile lies inside the key loop and every conjunct (all affine) holds at its corners;
        fa_next(k0): the first tile from k0 that is not dead."""
        p, n, ix, r = self.p, self.n, self.ix, self.r
        affine, every = affine_conjuncts(p.mask, p.row, p.key.var)
        corners = [(row, key) for row in ("0", str(self.rows - 1)) for key in (n["k0"], n["k1"])]

        def corner_lines(c: N.Expr, op: str) -> None:
            for row, key in corners:
                self.line(f"{{ const {ix} {r.var(p.row)} = {row}; const {ix} {r.var(p.key.var)} = {key}; "
                          f"{n['any']} {op}= {r.expr(c)}; }}")

        self.open(f"auto {n['dead']} = [&]({ix} {n['k0']}) -> bool {{")
        self.line(f"const {ix} {n['k1']} = loopir_min({n['k0']} + {self.keys - 1}, {n['hi']} - 1);")
        for c in affine:
            self.open(f"{{ bool {n['any']} = false;")
            corner_lines(c, "|")
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
            corner_lines(c, "&")
            self.close(f"if (!{n['any']}) return false; }}")
        self.close("return true; };")
        self.open(f"auto {n['next']} = [&]({ix} {n['k0']}) -> {ix} {{")
        self.line(f"while ({n['k0']} < {n['hi']} && {n['dead']}({n['k0']})) {n['k0']} += {self.keys};")
        self.close(f"return {n['k0']}; }};")

    def main_loop(self) -> None:
        p, n, ix = self.p, self.n, self.ix
        D, DV, KS, VS = self.D, self.DV, self.KS, self.VS
        tq, tv = _PTX[p.q.buffer.dtype], _PTX[p.v.buffer.dtype]
        if p.k.buffer.dtype != p.q.buffer.dtype:
            raise CudaCodegenError(f"attention.m16n8k16: Q ({p.q.buffer.dtype}) and K ({p.k.buffer.dtype}) differ")
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
        self.unrolled(mt, self.mt)
        self.unrolled(kk, D // 16)
        _ldmatrix_a(self.r, [f"{qf}[{mt}][{kk}][{j}]" for j in range(4)],
                    _shared(f"&{kv}[{self.stage} + ({warp} * {16 * self.mt} + {mt} * 16 + ({lane} & 15)) * {KS} + "
                            f"{kk} * 16 + ({lane} >> 4) * 8]"))
        self.close()
        self.close()
        self.line("__syncthreads();")
        self.close()
        self.line(f"const {ix} {n['nk']} = {n['next']}({n['kt']} + {self.keys});")
        self.line(f"if ({n['nk']} < {n['hi']}) {n['load']}({n['nk']}, {n['stage']} ^ 1);")
        self.line("loopir_cp_async_commit();")
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
        self.line(f"{n['stage']} ^= 1;")
        self.line(f"{n['kt']} = {n['nk']};")
        self.close()

    def scores(self) -> None:
        """s = g(S) per element, the mask, the rows' new maximum, the rescale of l and O, P = exp(s - m). Two
        copies: a tile inside the key loop whose corners satisfy the mask tests nothing per element."""
        n = self.n
        self.line(f"unsigned {n['vis']}[{self.mt}];")
        self.line(f"float {n['mx']}[{self.mt}][2];")
        self.open(f"if ({n['full']}({n['kt']})) {{")
        self.scores_of(True)
        self.close("} else {")
        self.r.ind += 1
        self.scores_of(False)
        self.close()

    def scores_of(self, whole: bool) -> None:
        p, n, r = self.p, self.n, self.r
        s, o, mt = n["s"], n["o"], n["mt"]
        nt, e, h, pr, vis, mx = n["nt"], n["e"], n["h"], n["pr"], n["vis"], n["mx"]
        bit = "" if whole else f"(({vis}[{mt}] >> ({nt} * 4 + {e})) & 1u)"
        m, l_ = n["m"], n["l"]
        uses = {id(v) for v in free_vars(p.score)}
        self.line(f"bool {n['grew']} = false;")
        self.line(f"float {n['sca']}[{self.mt}][2], {n['ml']}[{self.mt}][2];")
        self.unrolled(mt, self.mt)
        self.line(f"{vis}[{mt}] = 0xffffffffu; {mx}[{mt}][0] = {m}[{mt}][0]; {mx}[{mt}][1] = {m}[{mt}][1];")
        self.unrolled(nt, self.keys // 8)
        self.unrolled(e, 4)
        if not whole or id(p.row) in uses:
            self.let(p.row, self.row_of(mt, f"({e} >> 1)"))
        if not whole or id(p.key.var) in uses:
            self.let(p.key.var, f"{n['kt']} + {nt} * 8 + ({n['lane']} & 3) * 2 + ({e} & 1)")
        self.line(f"const float {r.var(p.dot)} = {s}[{mt}][{nt}][{e}];")
        self.line(f"{s}[{mt}][{nt}][{e}] = {r.expr(p.score)};")
        if not whole:
            mask = "true" if p.mask is None else r.expr(p.mask)
            self.line(f"if (!({r.var(p.key.var)} < {n['hi']} && {mask})) {vis}[{mt}] &= ~(1u << ({nt} * 4 + {e}));")
        self.line(f"{'if ' + bit + ' ' if bit else ''}{mx}[{mt}][{e} >> 1] = loopir_max({mx}[{mt}][{e} >> 1], "
                  f"{s}[{mt}][{nt}][{e}]);")
        self.close()
        self.close()
        self.unrolled(h, 2)
        for d in (1, 2):
            self.line(f"{mx}[{mt}][{h}] = loopir_max({mx}[{mt}][{h}], __shfl_xor_sync(0xffffffffu, {mx}[{mt}][{h}], "
                      f"{d}));")
        self.line(f"const float {n['sc']} = {m}[{mt}][{h}] == {mx}[{mt}][{h}] ? 1.0f : "
                  f"loopir_flash_exp({m}[{mt}][{h}] - {mx}[{mt}][{h}]);")
        self.line(f"{m}[{mt}][{h}] = {mx}[{mt}][{h}];")
        self.line(f"{n['ml']}[{mt}][{h}] = {m}[{mt}][{h}] * 1.4426950408889634f;  // exp(s - m) = 2^(s L - m L)")
        self.line(f"{l_}[{mt}][{h}] *= {n['sc']};")
        self.line(f"{n['sca']}[{mt}][{h}] = {n['sc']};")
        self.line(f"{n['grew']} |= {n['sc']} != 1.0f;")
        self.close()
        self.close()
        # O is rescaled only when some row of the warp saw a larger maximum (a factor of exactly 1 changes nothing)
        self.open(f"if (__any_sync(0xffffffffu, {n['grew']})) {{")
        self.unrolled(mt, self.mt)
        self.unrolled(e, self.DV // 8)
        self.line(f"{o}[{mt}][{e}][0] *= {n['sca']}[{mt}][0]; {o}[{mt}][{e}][1] *= {n['sca']}[{mt}][0];")
        self.line(f"{o}[{mt}][{e}][2] *= {n['sca']}[{mt}][1]; {o}[{mt}][{e}][3] *= {n['sca']}[{mt}][1];")
        self.close()
        self.close()
        self.close()
        self.unrolled(mt, self.mt)
        self.unrolled(nt, self.keys // 8)
        self.unrolled(e, 4)
        val = f"loopir_flash_exp2(fmaf({s}[{mt}][{nt}][{e}], 1.4426950408889634f, -{n['ml']}[{mt}][{e} >> 1]))"
        self.line(f"const float {pr} = {f'{bit} ? {val} : 0.0f' if bit else val};")
        self.line(f"{s}[{mt}][{nt}][{e}] = {pr};")
        self.line(f"{l_}[{mt}][{e} >> 1] += {pr};")
        self.close()
        self.close()
        self.close()

    def epilogue(self) -> None:
        p, n, r = self.p, self.n, self.r
        lane, h, e, o, mt, l_ = n["lane"], n["h"], n["e"], n["o"], n["mt"], n["l"]
        self.unrolled(mt, self.mt)
        self.unrolled(h, 2)
        for d in (1, 2):
            self.line(f"{l_}[{mt}][{h}] += __shfl_xor_sync(0xffffffffu, {l_}[{mt}][{h}], {d});")
        self.let(p.row, self.row_of(mt, h))
        self.open(f"if ({self.cond(p.guard)}) {{")
        self.unrolled(e, self.DV // 8)
        for el in (0, 1):
            self.open("{")
            self.let(p.col, f"{e} * 8 + ({lane} & 3) * 2 + {el}")
            self.line(_store(r, p.out, f"{o}[{mt}][{e}][2 * {h} + {el}]"))
            self.close()
        self.close()
        self.open(f"if (({lane} & 3) == 0) {{")
        if p.total is not None:
            self.line(_store(r, p.total, f"{l_}[{mt}][{h}]"))
        self.line(_store(r, p.maximum, f"{n['m']}[{mt}][{h}]"))
        self.close()
        self.close()
        self.close()
        self.close()
        for st in (p.out, p.total, p.maximum):
            if st is not None:
                r._invalidate(st.buffer)
