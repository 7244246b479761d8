"""Rendering of a block's GEMM tile marked "gemm.wgmma" (schedules/primitives/wgmma.py) as a Hopper kernel body:
the cp.async form here, and the epilogue both forms share; the TMA form on a persistent grid, and the choice
between them (`render_wgmma`), in codegen/cuda/wgmma_tma.py.

Per block of `rows` x `cols` outputs (a warpgroup of 128 threads per 64 rows; sm_90a):

    a ring of `stages` shared stages, each the A tile (rows x 64 halves) and the B tile (64 x cols, in panels of
    64 columns), rows of 128 bytes whose 16-byte chunks are XOR-swizzled by (row % 8): the layout wgmma reads
    with its 128-byte swizzle mode, and bank-conflict-free for the copies
    prologue: cp.async of the first stages - 2 k tiles (16-byte chunks; zeros past the guards)
    for each k tile kt:
        wait for tile kt's copies; fence them into the async proxy; __syncthreads
        4 x wgmma.mma_async m64n{cols}k16 per warpgroup (A K-major, B MN-major: descriptors below)
        commit; wait until at most one group is in flight (tile kt - 1's is done)
        cp.async of tile kt + stages - 2 into the stage tile kt - 2 used: every warpgroup passed this
        iteration's barrier after finishing tile kt - 2, so no wgmma still reads it (one barrier per tile)
    the epilogue: each accumulator (row 16 w + lane / 4 + 8 h, column 8 j + 2 (lane % 4) + e of the warpgroup's
    64 rows) through the pass's own store expressions and guards

Descriptors (matched against a float64 reference on an H200 by benchmarks/wgmma_probe.py): A K-major with the
128-byte swizzle: start = tile + 64-row block * 8192 + 32 bytes per k16 step, SBO 1024 (8 rows), LBO unused;
B MN-major (transpose flag): start = tile + 2048 bytes per k16 step (16 rows), LBO = the panel stride (64 rows of
128 bytes), SBO 1024. Every address is rendered from the pass's own index expressions with the loop variables
bound to the element the copy or the accumulator holds, so the kernel reads and writes what the reference does.
A chunk whose global address is not 16-byte aligned, or that a guard cuts, is copied element-wise.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from loopir import nodes as N
from loopir.affine import linear_form
from loopir.errors import CudaCodegenError
from loopir.visit import walk
from schedules.primitives.wgmma import K_TILE, StorePlan, WgmmaMismatch, WgmmaParts, wgmma_parts

from .body import BodyEmitter
from .expr import _FROM_FLOAT, unrounded

__all__ = ["wait_wgmma", "PRELUDE_WGMMA", "wgmma_shape", "asm_regs", "asm_accumulators"]

_PTX = {"float16": "f16", "bfloat16": "bf16"}
GROUP = 8  # rows of tiles per group of the tile order (measured on an H200: 0.343 ms at 4096^3 vs 0.405 without)

PRELUDE_WGMMA = r"""
__device__ __forceinline__ unsigned long long loopir_wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
  // start address, leading / stride byte offsets (all >> 4), 128-byte swizzle (mode 1, bits 62-63)
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16)
       | ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
__device__ __forceinline__ void loopir_wg_cp16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void loopir_wg_fill16(unsigned dst, const void* any) {
  // 16 zero bytes through the same async copy path (source size 0: nothing is read from `any`)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, 0;\n" :: "r"(dst), "l"(any) : "memory");
}
__device__ __forceinline__ void loopir_wg_zero16(unsigned dst) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" :: "r"(dst), "r"(0) : "memory");
}
__device__ __forceinline__ void loopir_wg_st16(unsigned dst, unsigned short v) {
  asm volatile("st.shared.u16 [%0], %1;\n" :: "r"(dst), "h"(v) : "memory");
}
__device__ __forceinline__ void loopir_wg_st32(unsigned dst, unsigned v) {
  asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(dst), "r"(v) : "memory");
}
__device__ __forceinline__ void loopir_wg_copy16(unsigned dst, const unsigned short* src) {
  // 8 halves: one cp.async when the source is 16-byte aligned, else element by element
  if ((((unsigned long long)src) & 15ull) == 0ull) { loopir_wg_cp16(dst, src); }
  else {
#pragma unroll
    for (int e = 0; e < 8; ++e) loopir_wg_st16(dst + 2 * e, src[e]);
  }
}
"""




def asm_regs(first: int, count: int) -> str:
    """The inline-asm operand list %first, ..., %(first + count - 1)."""
    return ", ".join(f"%{i}" for i in range(first, first + count))


def asm_accumulators(elements: Iterable[str]) -> str:
    """Read-write float operands of inline asm, one per accumulator element (C lvalues)."""
    return ", ".join(f'"+f"({x})' for x in elements)


def wait_wgmma(r: Any, pending: int, done: Iterable[str], note: str = "") -> None:
    """wgmma.wait_group `pending`, then an empty asm that reads and writes `done`, the accumulators the awaited
    wgmma write. The wait names no register, so without the second the compiler may move a read of an accumulator
    above it (the wgmma asm wrote it, as far as the compiler knows), and reading one before its wgmma completes is
    undefined (CUTLASS's warpgroup_fence_operand). This orders the compiler's reads (NVVM); ptxas still scheduled a
    GEMM epilogue's conversions above the wait that followed the k loop: see _Emit.wait_previous."""
    r.line(f'asm volatile("wgmma.wait_group.sync.aligned {pending};\\n" ::: "memory");{"  // " + note if note else ""}')
    r.line(f'asm volatile("" : {asm_accumulators(done)} :: "memory");  // the accumulators after the wait')


def wgmma_shape(f: N.For) -> Any:
    """The tiling of the marked tile `f` (its WgmmaShape), for the launch and the shared-memory plan."""
    try:
        return wgmma_parts(f).shape
    except WgmmaMismatch as e:
        raise CudaCodegenError(f"the tile marked gemm.wgmma at loop {f.var.name!r} changed shape before "
                               f"rendering: {e}") from None


def _cond(r: Any, terms: tuple[N.Expr, ...] | list[N.Expr]) -> str:
    return " && ".join(f"({r.expr(c)})" for c in terms) or "true"


def _slope(c: N.Expr, v: N.Var) -> int | None:
    """How condition `c` moves as `v` grows: a positive number when it can only turn true, a negative one when it
    can only turn false, 0 when `v` does not change it (None: not an affine comparison in `v`)."""
    if not any(x is v for x in walk(c)):
        return 0
    if not (isinstance(c, N.Compare) and c.op in ("lt", "le", "gt", "ge")):
        return None
    lin = linear_form(N.binary("sub", c.b, c.a))  # b - a: lt / le hold while it is large
    if lin is None or not isinstance(lin.get(v, 0), int):
        return None
    d = lin.get(v, 0)
    return d if c.op in ("lt", "le") else -d


class _Emit(BodyEmitter):
    store: StorePlan | None = None  # the TMA store of the epilogue (codegen.cuda.wgmma_tma); none in this form

    def __init__(self, r: Any, p: WgmmaParts) -> None:
        super().__init__(r)
        self.p = p
        sh = p.shape
        self.rows, self.cols, self.stages, self.threads = sh.rows, sh.cols, sh.stages, sh.threads
        self.a_bytes = sh.rows * K_TILE * 2
        self.stage_bytes = sh.stage_bytes
        self.n = {k: r.names.fresh(f"wg_{k}") for k in (
            "sm", "base", "t", "g", "w", "l", "lo", "hi", "nk", "load", "kt", "sa", "sb", "c", "row", "ch", "dst",
            "src", "e", "d", "ks", "da", "db", "i", "h", "q", "k0", "full", "cc", "p", "pid", "grp", "first", "gs",
            "v0", "v1", "ok0", "ok1", "at0", "at1", "al")}

    def emit(self) -> None:
        r, p, n = self.r, self.p, self.n
        self.open(f"{{  // gemm.wgmma: a {self.rows} x {self.cols} tile (rows {p.row.name}, columns {p.col.name}), "
                  f"k {p.k.var.name} in tiles of {K_TILE} through {self.stages} swizzled shared stages; "
                  "wgmma.mma_async per warpgroup of 64 rows (codegen.cuda.wgmma)")
        self.raster()
        self.line(f"unsigned char* {n['sm']} = (unsigned char*)((((unsigned long long)loopir_dyn_smem) + 1023ull) "
                  "& ~1023ull);  // the swizzle's 1024-byte atom")
        self.line(f"const unsigned {n['base']} = (unsigned)__cvta_generic_to_shared({n['sm']});")
        self.line(f"const int {n['t']} = threadIdx.x, {n['g']} = threadIdx.x >> 7, {n['w']} = (threadIdx.x >> 5) & 3, "
                  f"{n['l']} = threadIdx.x & 31;")
        self.line(f"const {self.ix} {n['lo']} = {r.expr(p.k.lo)}, {n['hi']} = {r.expr(p.k.hi)};")
        self.line(f"const int {n['nk']} = {n['hi']} > {n['lo']} ? (int)(({n['hi']} - {n['lo']} + {K_TILE - 1}) / "
                  f"{K_TILE}) : 0;")
        self.line("__syncthreads();  // a serial loop around the tile: every warp is done with the last stages")
        a, b = (r.buf(x.buffer) for x in (p.a, p.b))
        self.line(f"const bool {n['al']} = ((((unsigned long long){a}) | ((unsigned long long){b})) & 15ull) == 0ull;"
                  "  // every chunk then is: the rows' lengths and starts are multiples of 8")
        self.loader()
        self.main_loop()
        self.epilogue()
        self.close()

    def raster(self) -> None:
        """Grouped tile order: when the tile's block indices are exactly blockIdx.y / x over the whole grid, the
        blocks take the tiles in groups of GROUP rows of tiles, so that the blocks running together share B's
        column tiles in L2 (a permutation of the tiles: each is still computed once)."""
        r, n = self.r, self.n
        loops = {f.thread: f for f in walk(r.nest) if isinstance(f, N.For) and f.kind == "thread"
                 and (f.thread or "").startswith("blockIdx")}
        bi, bj = loops.get("blockIdx.y"), loops.get("blockIdx.x")
        if (set(loops) != {"blockIdx.x", "blockIdx.y"} or bi is None or bj is None
                or any(f.var in r.kern.guarded or not (isinstance(f.lo, N.Const) and f.lo.value == 0)
                       for f in (bi, bj))
                or not any(x is self.p.row for x in walk(bj.body)) or not any(x is bj for x in walk(bi.body))):
            return
        self.line(f"// grouped tile order: {GROUP} rows of tiles at a time share B's column tiles in L2")
        self.line(f"const int {n['pid']} = blockIdx.y * gridDim.x + blockIdx.x;")
        self.grouped(n["pid"], "(int)gridDim.y", "(int)gridDim.x", bi.var, bj.var)

    def grouped(self, tile: str, tiles_m: str, tiles_n: str, bi: N.Var | None, bj: N.Var, row: str = "") -> None:
        """Declare the block loops' variables `bi`, `bj` of tile number `tile` of a tiles_m x tiles_n grid of
        tiles in grouped order: GROUP rows of tiles walk the columns together (a permutation of the tiles). With
        `bi` None the row of tiles is declared as the int `row` instead (the caller splits it)."""
        n, r = self.n, self.r
        self.line(f"const int {n['grp']} = {GROUP} * {tiles_n}, {n['first']} = ({tile} / {n['grp']}) * {GROUP};")
        self.line(f"const int {n['gs']} = min({tiles_m} - {n['first']}, {GROUP});")
        lhs = f"const int {row}" if bi is None else f"const {self.ix} {r.var(bi)}"
        self.line(f"{lhs} = {n['first']} + ({tile} % {n['grp']}) % {n['gs']};")
        self.line(f"const {self.ix} {r.var(bj)} = ({tile} % {n['grp']}) / {n['gs']};")

    # ------------------------------------------------------------------ copies
    def chunk(self, ld: N.Load, var: N.Var, first: str, conds: list[N.Expr], dst: str) -> None:
        """The 8 elements of `ld` at `var` = first .. first + 7 into the shared chunk at `dst` (a shared address),
        zeros where a condition of `conds` fails. One cp.async when the operands are 16-byte aligned (tested once,
        at the tile's start: the rows' lengths and starts are multiples of 8) and every condition holds at both
        ends (they are affine in `var`, so they hold in between; a condition that can only turn false as `var`
        grows is tested at the last element alone); a zero fill when such a condition fails at the first; else
        element by element."""
        r, n = self.r, self.n
        buf, at = r.buf(ld.buffer), r.expr(r.flat(ld.buffer, ld.indices))
        slopes = [_slope(c, var) for c in conds]
        falling = [c for c, d in zip(conds, slopes) if d is not None and d <= 0]
        rising = [c for c, d in zip(conds, slopes) if d is not None and d > 0]
        affine = len(falling) + len(rising) == len(conds)
        self.open("{")
        self.line(f"bool {n['full']} = {n['al']};")
        if affine:
            self.open("{")
            self.let(var, f"{first} + 7")
            self.line(f"{n['full']} = {n['full']} && {_cond(r, falling)};")
            self.close()
        self.let(var, first)
        if not affine:
            self.line(f"{n['full']} = false;")
        elif rising:
            self.line(f"{n['full']} = {n['full']} && {_cond(r, rising)};")
        self.open(f"if ({n['full']}) {{")
        self.line(f"loopir_wg_cp16({dst}, &{buf}[{at}]);")
        self.close(f"}} else if (!({_cond(r, falling)})) {{  // past the edge from its first element on: zeros")
        self.r.ind += 1
        self.line(f"loopir_wg_fill16({dst}, {buf});")
        self.close("} else {")
        self.r.ind += 1
        self.line(f"loopir_wg_zero16({dst});")
        self.unrolled(n["e"], 8)
        self.let(var, f"{first} + {n['e']}")
        self.line(f"if ({_cond(r, conds)}) loopir_wg_st16({dst} + 2 * {n['e']}, {buf}[{at}]);")
        self.close()
        self.close()
        self.close()

    def loader(self) -> None:
        """wg_load(kt): the A and B tiles of k tile kt into stage kt % stages, one cp.async group (empty past
        the reduction's end, so that the group count stays uniform)."""
        p, n, ix = self.p, self.n, self.ix
        k, kc = p.k.var, f"{n['lo']} + ({ix}){n['kt']} * {K_TILE}"
        k_in = N.Compare("lt", k, p.k.hi, "bool")
        self.open(f"auto {n['load']} = [&](int {n['kt']}) {{")
        self.open(f"if ({n['kt']} < {n['nk']}) {{")
        self.line(f"const unsigned {n['sa']} = {n['base']} + ({n['kt']} % {self.stages}) * {self.stage_bytes}u, "
                  f"{n['sb']} = {n['sa']} + {self.a_bytes}u;")
        # A: rows x 8 chunks of 8 halves along k
        self.line("#pragma unroll")
        self.open(f"for (int {n['c']} = {n['t']}; {n['c']} < {self.rows * 8}; {n['c']} += {self.threads}) {{")
        self.line(f"const int {n['row']} = {n['c']} >> 3, {n['ch']} = {n['c']} & 7;")
        self.let(p.row, n["row"])
        self.chunk(p.a, k, f"{kc} + {n['ch']} * 8", [*p.row_ok, k_in],
                   f"{n['sa']} + {n['row']} * 128 + (({n['ch']} ^ ({n['row']} & 7)) << 4)")
        self.close()
        # B: 64 rows (k) x cols / 8 chunks along the columns, in panels of 64 columns
        cpr = self.cols // 8
        self.line("#pragma unroll")
        self.open(f"for (int {n['c']} = {n['t']}; {n['c']} < {K_TILE * cpr}; {n['c']} += {self.threads}) {{")
        self.line(f"const int {n['row']} = {n['c']} / {cpr}, {n['cc']} = {n['c']} % {cpr};")
        self.let(k, f"{kc} + {n['row']}")
        self.chunk(p.b, p.col, f"{n['cc']} * 8", [*p.col_ok, k_in],
                   f"{n['sb']} + ({n['cc']} >> 3) * {K_TILE * 128} + {n['row']} * 128 + "
                   f"((({n['cc']} & 7) ^ ({n['row']} & 7)) << 4)")
        self.close()
        self.close()
        self.line('asm volatile("cp.async.commit_group;\\n" ::: "memory");')
        self.close("};")

    # ------------------------------------------------------------------ the k loop
    def main_loop(self) -> None:
        n, s = self.n, self.stages
        nacc = self.cols // 2
        self.line(f"float {n['d']}[{nacc}];")
        self.unrolled(n["i"], nacc)
        self.line(f"{n['d']}[{n['i']}] = 0.0f;")
        self.close()
        self.line("#pragma unroll")
        self.open(f"for (int {n['kt']} = 0; {n['kt']} < {s - 2}; ++{n['kt']}) {{")
        self.line(f"{n['load']}({n['kt']});")
        self.close()
        self.open(f"for (int {n['kt']} = 0; {n['kt']} < {n['nk']}; ++{n['kt']}) {{")
        self.line(f'asm volatile("cp.async.wait_group {s - 3};\\n" ::: "memory");')
        self.line('asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");  // the copies, seen by wgmma')
        self.line("__syncthreads();")
        self.line(f"const unsigned {n['sa']} = {n['base']} + ({n['kt']} % {s}) * {self.stage_bytes}u, "
                  f"{n['sb']} = {n['sa']} + {self.a_bytes}u;")
        self.issue()
        self.wait_previous()
        self.line(f"{n['load']}({n['kt']} + {s - 2});")
        self.close()
        wait_wgmma(self.r, 0, (f"{n['d']}[{i}]" for i in range(nacc)))
        self.line('asm volatile("cp.async.wait_group 0;\\n" ::: "memory");')

    def wait_previous(self) -> None:
        """In the k loop, after issuing tile kt: wait for tile kt - 1 (one group stays in flight), and after the
        last tile for every one. With the wait for the last group only after the loop (wait_wgmma), ptxas scheduled
        the epilogue's conversions of the accumulators above it (in the SASS, above WARPGROUP.DEPBAR.LE gsb0, 0x0),
        so they read registers the last wgmma was still writing: the llama block at fixed sizes (its w2 GEMM, 6 k
        tiles) returned different, wrong bits from call to call. The wait after the loop stays, then a no-op."""
        n = self.n
        self.line(f'if ({n["kt"]} + 1 < {n["nk"]}) asm volatile("wgmma.wait_group.sync.aligned 1;\\n" ::: "memory");')
        self.line('else asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");  // the last k tile')

    def issue(self) -> None:
        """The k tile in stage (wg_sa, wg_sb) into the accumulators: 4 wgmma k16 steps of this warpgroup's 64 rows
        (A K-major: 32 bytes a step inside the swizzled row; B MN-major: 16 rows of 128 bytes a step, panels of
        64 columns one LBO apart), committed as one group."""
        n, nacc = self.n, self.cols // 2
        t = _PTX[self.p.a.buffer.dtype]
        self.line('asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");')
        self.unrolled(n["ks"], K_TILE // 16)
        self.line(f"const unsigned long long {n['da']} = loopir_wg_desc({n['sa']} + {n['g']} * 8192u + {n['ks']} * "
                  "32u, 16u, 1024u);")
        self.line(f"const unsigned long long {n['db']} = loopir_wg_desc({n['sb']} + {n['ks']} * 2048u, "
                  f"{K_TILE * 128}u, 1024u);")
        regs = asm_regs(0, nacc)
        outs = asm_accumulators(f"{n['d']}[{i}]" for i in range(nacc))
        self.line(f'asm volatile("wgmma.mma_async.sync.aligned.m64n{self.cols}k16.f32.{t}.{t} {{{regs}}}, '
                  f'%{nacc}, %{nacc + 1}, 1, 1, 1, 0, 1;\\n" : {outs} : "l"({n["da"]}), "l"({n["db"]}));')
        self.close()
        self.line('asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");')

    # ------------------------------------------------------------------ the epilogue
    def epilogue(self) -> None:
        """Each accumulator through the tile's stores: a lane holds columns 2 (lane % 4) + {0, 1} of a row, so a
        half-precision store whose two elements are adjacent in memory (and 4-byte aligned) is one 32-bit store.

        Conditions of the row that every store shares (the tail of a symbolic row count) are tested once per row,
        around the row's columns. Inside a per-element branch the epilogue's loads (a bias, a residual) could not
        be issued ahead of it, and each waited out its latency alone: the GELU epilogue of a 8192 x 3072 GEMM at
        symbolic T took 0.177 ms against 0.105 with T fixed, whose row guard folds away; now 0.113. Without such
        conditions the columns stay outside the rows, so a lane's two rows share each column's bias loads (the
        rows outside took 0.136 ms at fixed T). Measured against two other forms: the elements twice, with and
        without the row test (0.123 ms, and 50% more NVRTC time for a GPT-2 block), and the value of a refused row
        computed at the tile's row 0 to keep the loads unconditional (0.127 ms; 0.138 for fc2 + residual).

        An epilogue that reads another tensor at the accumulator's row (a residual, a second GEMM's output) loads
        a chunk of columns into registers before it computes them (`hoisted`): rendered element by element, each
        such load waited out its DRAM latency alone (ptxas did not move it across the previous element's stores),
        and SwiGLU's epilogue reading w1 took 0.206 ms of a 8192 x 2048 x 768 GEMM whose plain form took 0.099."""
        r, p, n = self.r, self.p, self.n
        rows, rest = self.row_guards()
        hoist = self.hoisted()
        if not rows and not any(hoist):
            self.unrolled(n["i"], self.cols // 8)
            self.unrolled(n["h"], 2)
            self.elements([cond for *_, cond in p.stores])
            self.close()
            self.close()
            return
        conds = [N.conjunction(c) if c else None for c in rest] if rows else [cond for *_, cond in p.stores]
        self.unrolled(n["h"], 2)
        self.open("{")
        self.let(p.row, self.row_of())
        self.open(f"if ({_cond(r, rows)}) {{")
        if any(hoist):
            self.chunks(conds, hoist)
        else:
            self.unrolled(n["i"], self.cols // 8)
            self.elements(conds)
            self.close()
        self.close()
        self.close()
        self.close()

    def hoisted(self) -> list[list[N.Load]]:
        """Per store, the loads of its value worth issuing ahead: float loads that read at the accumulator's row
        (a bias read by column alone stays in L1 and keeps the elements' order), outside any select (a load
        there may be out of bounds where the select does not take it) and not of a buffer this epilogue stores
        (a later store's read of an earlier one must see it)."""
        p = self.p
        stored = {id(st.buffer) for st, *_ in p.stores}
        if self.store is not None and self.store.aux is not None:
            stored.add(id(self.store.aux.buffer))  # read from the store's box instead
        out: list[list[N.Load]] = []
        for _, _, val, _ in p.stores:
            found: list[N.Load] = []
            for ld in walk(val, prune=lambda e: isinstance(e, N.Select)):
                if (isinstance(ld, N.Load) and ld not in found and id(ld.buffer) not in stored
                        and ld.buffer.dtype in ("float16", "bfloat16", "float32")
                        and any(x is p.row for x in walk(ld) if isinstance(x, N.Var))):
                    found.append(ld)
            out.append(found)
        return out

    def chunks(self, conds: list[N.Expr | None], hoist: list[list[N.Load]], first: str = "0",
               per: int = 0) -> None:
        """The row's columns (`per` groups of 8 from group `first`; all of them by default) in chunks: first each
        hoisted load of the chunk's elements into registers (under the element's store condition, as the element
        would read it), then the elements, which read those."""
        r, p, n = self.r, self.p, self.n
        count = max(len(h) for h in hoist)
        per = per or self.cols // 8
        chunk = max(c for c in (1, 2, 4, 8, 16) if c <= max(1, 16 // count) and per % c == 0)
        names = [[r.names.fresh(f"wg_e{s}_{k}") for k in range(len(h))] for s, h in enumerate(hoist)]
        i0, ii = r.names.fresh("wg_i0"), r.names.fresh("wg_ii")
        self.line("#pragma unroll")
        self.open(f"for (int {i0} = 0; {i0} < {per}; {i0} += {chunk}) {{")
        for s, h in enumerate(hoist):
            if h:
                self.line(f"float {', '.join(f'{x}[{2 * chunk}]' for x in names[s])};")
        self.unrolled(ii, chunk)
        for s, h in enumerate(hoist):
            for q in (0, 1) if h else ():
                self.open("{")
                self.let(p.col, f"8 * ({first} + {i0} + {ii}) + 2 * ({n['l']} & 3) + {q}")
                ok = "true" if conds[s] is None else r.expr(conds[s])
                for x, ld in zip(names[s], h):
                    self.line(f"{x}[2 * {ii} + {q}] = ({ok}) ? {r.expr(ld)} : 0.0f;")
                self.close()
        self.close()
        self.unrolled(ii, chunk)
        self.line(f"const int {n['i']} = {first} + {i0} + {ii};")
        lanes = {ld: [f"{x}[2 * {ii} + {q}]" for q in (0, 1)] for s, h in enumerate(hoist)
                 for x, ld in zip(names[s], h)}
        self.elements(conds, lanes)
        self.close()
        self.close()

    def elements(self, conds: list[N.Expr | None], lanes: dict[N.Load, list[str]] | None = None) -> None:
        """The stores of the lane's two elements (i, h, q = 0, 1), store k under `conds[k]`; a load of `lanes`
        reads the register given for element q instead of memory."""
        r, p, n = self.r, self.p, self.n
        for (st, idx, val, _), cond in zip(p.stores, conds):
            b = st.buffer
            if b.dtype not in _FROM_FLOAT and b.dtype not in ("float32", "float64"):
                raise CudaCodegenError(f"gemm.wgmma: the epilogue stores {b.name!r} as {b.dtype}; a float type is "
                                       "needed")
            ctype = "unsigned short" if b.dtype in _FROM_FLOAT else "float" if b.dtype == "float32" else "double"
            self.open("{")
            lanes = {**(lanes or {}), **self.pair_lanes()}
            for q in (0, 1):
                v, ok, at = n[f"v{q}"], n[f"ok{q}"], n[f"at{q}"]
                self.line(f"{ctype} {v} = 0; bool {ok}; {self.ix} {at};")
                self.open("{")
                self.let(p.row, self.row_of())
                self.let(p.col, f"8 * {n['i']} + 2 * ({n['l']} & 3) + {q}")
                self.line(f"const float {r.var(p.acc)} = {n['d']}[4 * {n['i']} + 2 * {n['h']} + {q}];")
                self.line(f"{ok} = {'true' if cond is None else r.expr(cond)};")
                self.line(f"{at} = {r.expr(r.flat(b, idx))};")
                saved = r.vec_lanes
                r.vec_lanes = {**saved, **{ld: names[q] for ld, names in (lanes or {}).items()}}
                value = r.expr(unrounded(val, b.dtype))
                r.vec_lanes = saved
                value = f"{_FROM_FLOAT[b.dtype]}({value})" if b.dtype in _FROM_FLOAT else f"({ctype})({value})"
                self.line(f"if ({ok}) {v} = {value};")
                self.close()
            if self.sink():
                self.close()
                continue
            buf = r.buf(b)
            if ctype == "unsigned short":
                self.open(f"if ({n['ok0']} && {n['ok1']} && {n['at1']} == {n['at0']} + 1 && "
                          f"((((unsigned long long)&{buf}[{n['at0']}]) & 3ull) == 0ull)) {{")
                self.line(f"*reinterpret_cast<unsigned*>(&{buf}[{n['at0']}]) = (unsigned){n['v0']} | "
                          f"((unsigned){n['v1']} << 16);")
                self.close("} else {")
                self.r.ind += 1
            self.line(f"if ({n['ok0']}) {buf}[{n['at0']}] = {n['v0']};")
            self.line(f"if ({n['ok1']}) {buf}[{n['at1']}] = {n['v1']};")
            if ctype == "unsigned short":
                self.close()
            self.close()

    def sink(self) -> bool:
        """Where the lane's two values (wg_v0, wg_v1) go instead of the store's own elements: nowhere here (the
        caller stores them); a TMA store stages them in shared memory (_EmitTma)."""
        return False

    def pair_lanes(self) -> dict[N.Load, list[str]]:
        """Loads whose two elements the lane already holds (C expressions, element q = 0, 1): none here."""
        return {}

    def row_of(self) -> str:
        """The tile row of this lane's accumulator elements of half `h`."""
        n = self.n
        return f"{n['g']} * 64 + 16 * {n['w']} + ({n['l']} >> 2) + 8 * {n['h']}"

    def row_guards(self) -> tuple[list[N.Expr], list[list[N.Expr]]]:
        """The conjuncts every store's condition has that do not read the column (tested once per row), and each
        store's other conjuncts."""
        col = self.p.col
        each = [N.conjuncts(cond) if cond is not None else [] for _, _, _, cond in self.p.stores]
        rows = [c for c in each[0] if all(c in e for e in each[1:])
                and not any(x is col for x in walk(c) if isinstance(x, N.Var))]
        return rows, [[c for c in e if c not in rows] for e in each]
