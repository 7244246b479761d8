"""The warpgroup GEMM tile with TMA on a persistent grid (codegen.cuda.wgmma's `_Emit`, warp-specialized):
a producer warpgroup loads the A and B tiles by TMA into a ring of stages, two consumer warpgroups issue the
wgmma and run the epilogue, which stores through TMA boxes where `store_plan` allows
(schedules/primitives/wgmma.py), and `render_wgmma`, which picks this kernel or the cp.async one."""

from __future__ import annotations

from typing import Any

from loopir import nodes as N
from loopir.errors import CudaCodegenError
from loopir.visit import walk
from schedules.primitives.wgmma import (BOX_BYTES, K_TILE, STORE_BOX, TmaPlan, WgmmaMismatch, WgmmaParts,
                                         kernel_tile)

from .expr import _TO_FLOAT
from .wgmma import _cond, _Emit, _slope, wait_wgmma

__all__ = ["render_wgmma", "PRELUDE_WGMMA_TMA"]

PRELUDE_WGMMA_TMA = r"""
struct __align__(64) loopir_tmap { unsigned long long v[16]; };  // the 128 opaque bytes of a CUtensorMap
__device__ __forceinline__ void loopir_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void loopir_mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
__device__ __forceinline__ bool loopir_mbar_try(unsigned bar, unsigned parity) {
  unsigned ok;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
  return ok != 0;
}
// Wait for the phase of `parity` of `bar`. A wait that lasts seconds is a bug of this kernel's protocol: trap (the
// launch fails with an error) instead of hanging the device.
__device__ __forceinline__ void loopir_mbar_wait(unsigned bar, unsigned parity) {
  if (loopir_mbar_try(bar, parity)) return;
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (unsigned n = 1; !loopir_mbar_try(bar, parity); ++n) {
    if ((n & 1023u) == 0) {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      if (t - t0 > 8000000000ull) asm volatile("trap;");
    }
  }
}
__device__ __forceinline__ void loopir_mbar_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
// a box of this block's shared memory into a 2-d / 3-d tensor (elements past its extents are not written), one
// bulk group; the issuing thread waits for its groups' reads of shared memory (wait_read) or for all of them
__device__ __forceinline__ void loopir_tma_store2d(const loopir_tmap* map, unsigned src, int x, int y) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
               "cp.async.bulk.commit_group;\n"
               :: "l"((unsigned long long)map), "r"(x), "r"(y), "r"(src) : "memory");
}
__device__ __forceinline__ void loopir_tma_store3d(const loopir_tmap* map, unsigned src, int x, int y, int z) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n"
               "cp.async.bulk.commit_group;\n"
               :: "l"((unsigned long long)map), "r"(x), "r"(y), "r"(z), "r"(src) : "memory");
}
// a 3-d TMA box into this block's shared memory; its bytes complete the barrier's transaction count
__device__ __forceinline__ void loopir_tma3d(unsigned dst, const loopir_tmap* map, int x, int y, int z, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3, %4}], [%5];\n"
               :: "r"(dst), "l"((unsigned long long)map), "r"(x), "r"(y), "r"(z), "r"(bar) : "memory");
}
__device__ __forceinline__ unsigned loopir_ld_shared_u32(unsigned src) {
  unsigned v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(src) : "memory");
  return v;
}
// a 2-d TMA box into this block's shared memory; its bytes complete the barrier's transaction count
__device__ __forceinline__ void loopir_tma2d(unsigned dst, const loopir_tmap* map, int x, int y, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3}], [%4];\n"
               :: "r"(dst), "l"((unsigned long long)map), "r"(x), "r"(y), "r"(bar) : "memory");
}
"""


def render_wgmma(r: Any, f: N.For) -> None:
    """Emit the kernel body of the marked tile `f` with renderer `r` (codegen.cuda.kernel's): TMA loads on a
    persistent grid where `tma_plan` allows (the kernel is the tile alone, B 2-d, A 2-d or read as its 2-d view,
    both read whole along k), else the cp.async ring."""
    try:
        found = kernel_tile(r.nest)
    except WgmmaMismatch as e:
        raise CudaCodegenError(f"the tile marked gemm.wgmma at loop {f.var.name!r} changed shape before "
                               f"rendering: {e}") from None
    if found is None or found[0] is not f:
        raise CudaCodegenError(f"the tile marked gemm.wgmma at loop {f.var.name!r} is not its kernel's tile")
    r.uses_half = r.uses_wgmma = True
    if found[2] is not None:
        r.uses_wgmma_tma = True
        _EmitTma(r, found[1], found[2]).emit()
    else:
        _Emit(r, found[1]).emit()


class _EmitTma(_Emit):
    """The tile with TMA loads, warp-specialized, on a persistent grid (tma_plan's conditions hold):

        warpgroup 0, the producer (40 registers): its thread 0 walks the block's tiles and k tiles; per k tile it
            waits until the ring stage is free (empty[s]), announces its bytes (full[s], expect_tx) and issues one
            TMA box of A (64 k x 128 rows) and cols / 64 boxes of B (64 columns x 64 k), 128-byte swizzled
        warpgroups 1, 2, the consumers (232 registers), 64 rows each: per k tile wait full[s], 4 wgmma, keep one
            group in flight, release the previous k tile's stage (one arrival per warp: empty[s] counts 8); after
            the tile, the epilogue from the accumulators while the producer already loads the next tile
        tiles: blockIdx.x, + gridDim.x, ... in grouped order (GROUP rows of tiles share B's column tiles in L2); with
            a batch loop (blockIdx.z in the IR) the rows of tiles of all batches are one sequence, batch-major

    TMA zero-fills a box past the tensor's edges (tma_plan: the reduction covers A's columns and B's rows exactly,
    so those zeros are the terms the reference does not add); a box wholly past the rows (or columns) is read from
    row (column) 0 instead: those rows are never stored. A of rank 3 or more is mapped as its 2-d view (rows: the
    product of its leading extents; codegen.cuda.tensor_map.view_extents): a box's rows past a batch's T are the
    next batch's, multiplied but never stored (the epilogue keeps the tile's row guards). Stage s's u-th use
    completes phase u of full[s]; the producer waits for phase u - 1 of empty[s] (parity u + 1: passes at once for
    u = 0).

    With a store plan (plan.store) the epilogue goes through shared boxes stored by TMA (`epilogue_tma`): per
    consumer warpgroup two boxes of 64 x 64 halves after the stages and barriers (WgmmaShape.staging_offset), and,
    with an aux tensor, one mbarrier per box: the box's u-th aux load completes its phase u (parity of box count
    >> 1), issued by the warpgroup's thread 0 only after that thread's earlier stores from the box were read
    (`cp.async.bulk.wait_group.read`)."""

    def __init__(self, r: Any, p: WgmmaParts, plan: TmaPlan) -> None:
        super().__init__(r, p)
        self.plan = plan
        self.n.update({k: r.names.fresh(f"wg_{k}") for k in (
            "full0", "empty0", "tm", "tn", "nt", "tile", "s", "ph", "prev", "m0", "n0", "bar", "x", "rt")})
        self.maps = []
        for ld, box in ((p.a, (K_TILE, self.rows)), (p.b, (64, K_TILE))):
            if ld.buffer not in r.tmaps:
                r.tmaps[ld.buffer] = (r.names.fresh(f"{ld.buffer.name}_tmap"), box)
            self.maps.append(r.tmaps[ld.buffer][0])
        if r.tmaps[p.a.buffer][1] != (K_TILE, self.rows) or r.tmaps[p.b.buffer][1] != (64, K_TILE):
            raise CudaCodegenError(f"gemm.wgmma: {p.a.buffer.name} and {p.b.buffer.name} must be different buffers "
                                   "for TMA (one tensor map each)")
        self.store = plan.store
        if self.store is not None:
            self.n.update({k: r.names.fresh(f"wg_{k}") for k in ("stg", "ep", "ec", "eb", "i0")})
            out = self.store.store.buffer
            box = (STORE_BOX, STORE_BOX) + ((1,) if self.store.rank == 3 else ())
            if out in r.tmaps:
                raise CudaCodegenError(f"gemm.wgmma: {out.name} is stored through TMA and has another tensor map")
            r.tmaps[out] = (r.names.fresh(f"{out.name}_tmap"), box)
            aux = self.store.aux
            if aux is not None:
                if aux.buffer in r.tmaps:
                    raise CudaCodegenError(f"gemm.wgmma: {aux.buffer.name} is loaded into the store's boxes and has "
                                           "another tensor map")
                r.tmaps[aux.buffer] = (r.names.fresh(f"{aux.buffer.name}_tmap"), box)
                self.n.update({k: r.names.fresh(f"wg_{k}") for k in ("abar", "ax", "ldr")})

    def emit(self) -> None:
        r, p, n, s = self.r, self.p, self.n, self.stages
        pl = self.plan
        self.open(f"{{  // gemm.wgmma: {self.rows} x {self.cols} tiles (rows {p.row.name}, columns {p.col.name}) on a "
                  f"persistent grid, k {p.k.var.name} in tiles of {K_TILE}: TMA into {s} swizzled stages, a producer "
                  "warpgroup and two wgmma warpgroups (codegen.cuda.wgmma_tma)")
        self.line(f"unsigned char* {n['sm']} = (unsigned char*)((((unsigned long long)loopir_dyn_smem) + 1023ull) "
                  "& ~1023ull);  // the swizzle's 1024-byte atom")
        self.line(f"const unsigned {n['base']} = (unsigned)__cvta_generic_to_shared({n['sm']});")
        self.line(f"const unsigned {n['full0']} = {n['base']} + {s * self.stage_bytes}u, {n['empty0']} = "
                  f"{n['full0']} + {8 * s}u;  // mbarriers full[s], empty[s]: 8 bytes each")
        self.open("if (threadIdx.x == 0) {")
        self.unrolled(n["s"], s)
        self.line(f"loopir_mbar_init({n['full0']} + 8 * {n['s']}, 1);")
        self.line(f"loopir_mbar_init({n['empty0']} + 8 * {n['s']}, 8);  // one arrival per consumer warp")
        self.close()
        if self.store is not None and self.store.aux is not None:
            self.unrolled(n["s"], 4)
            self.line(f"loopir_mbar_init({n['base']} + {self.p.shape.staging_offset + 4 * BOX_BYTES}u + 8 * "
                      f"{n['s']}, 1);  // the store boxes' loads of {self.store.aux.buffer.name}")
            self.close()
        self.line('asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");')
        self.close()
        self.line("__syncthreads();  // the last block-wide barrier: from here the roles meet at the mbarriers")
        ext = [r.expr(N.binary("sub", f.hi, f.lo)) for f in (pl.bi, pl.bj)]
        self.line(f"const int {n['tm']} = (int)({ext[0]}), {n['tn']} = (int)({ext[1]}), {n['nt']} = "
                  f"{self.batches()}{n['tm']} * {n['tn']};")
        self.line(f"const {self.ix} {n['hi']} = {r.expr(p.k.hi)};")
        self.line(f"const int {n['nk']} = (int)(({n['hi']} + {K_TILE - 1}) / {K_TILE});")
        self.open("if (threadIdx.x < 128) {  // the producer warpgroup")
        self.line('asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\\n" ::: "memory");')
        self.open("if (threadIdx.x == 0) {")
        for m in self.maps:
            self.line(f'asm volatile("prefetch.tensormap [%0];\\n" :: "l"((unsigned long long)&{m}) : "memory");')
        self.line(f"int {n['s']} = 0; unsigned {n['ph']} = 0;")
        self.tiles()
        self.line(f"const int {n['m0']} = (int)({r.expr(pl.row0)}), {n['n0']} = (int)({r.expr(pl.col0)});")
        self.open(f"for (int {n['kt']} = 0; {n['kt']} < {n['nk']}; ++{n['kt']}) {{")
        self.line(f"loopir_mbar_wait({n['empty0']} + 8 * {n['s']}, {n['ph']} ^ 1);")
        self.line(f"const unsigned {n['sa']} = {n['base']} + {n['s']} * {self.stage_bytes}u, {n['sb']} = {n['sa']} + "
                  f"{self.a_bytes}u, {n['bar']} = {n['full0']} + 8 * {n['s']};")
        self.line(f"loopir_mbar_expect({n['bar']}, {self.stage_bytes}u);  // every box counts whole, zeros included")
        rows_a, cols_b = (r.expr(d) for d in (pl.a_rows, p.b.buffer.shape[1]))  # A: rows of its 2-d view
        self.line(f"loopir_tma2d({n['sa']}, &{self.maps[0]}, {n['kt']} * {K_TILE}, "
                  f"{n['m0']} < {rows_a} ? {n['m0']} : 0, {n['bar']});")
        self.unrolled(n["c"], self.cols // 64)
        self.line(f"const int {n['x']} = {n['n0']} + 64 * {n['c']};")
        self.line(f"loopir_tma2d({n['sb']} + {n['c']} * {K_TILE * 128}u, &{self.maps[1]}, {n['x']} < {cols_b} ? "
                  f"{n['x']} : 0, {n['kt']} * {K_TILE}, {n['bar']});")
        self.close()
        self.line(f"if (++{n['s']} == {s}) {{ {n['s']} = 0; {n['ph']} ^= 1; }}")
        self.close()
        self.close()  # tiles
        self.close()  # thread 0
        self.close("} else {  // the consumer warpgroups: 64 rows each")
        self.r.ind += 1
        self.line('asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\\n" ::: "memory");')
        self.line(f"const int {n['g']} = (threadIdx.x >> 7) - 1, {n['w']} = (threadIdx.x >> 5) & 3, {n['l']} = "
                  "threadIdx.x & 31;")
        self.line(f"int {n['s']} = 0; unsigned {n['ph']} = 0;")
        self.line(f"float {n['d']}[{self.cols // 2}];")
        if self.store is not None:
            self.line(f"const unsigned {n['stg']} = {n['base']} + {self.p.shape.staging_offset}u;  // the store "
                      f"boxes: {STORE_BOX} x {STORE_BOX} halves, two per warpgroup")
            self.line(f"unsigned {n['ep']} = 0;  // boxes this warpgroup stored")
            if self.store.aux is not None:
                self.line(f"const unsigned {n['abar']} = {n['stg']} + {4 * BOX_BYTES}u + 16 * {n['g']};  // its "
                          "boxes' mbarriers")
                self.line(f"const bool {n['ldr']} = ({n['w']} | {n['l']}) == 0;  // the thread issuing its copies")
        self.tiles()
        self.unrolled(n["i"], self.cols // 2)
        self.line(f"{n['d']}[{n['i']}] = 0.0f;")
        self.close()
        self.line(f"int {n['prev']} = 0;")
        self.open(f"for (int {n['kt']} = 0; {n['kt']} < {n['nk']}; ++{n['kt']}) {{")
        self.line(f"loopir_mbar_wait({n['full0']} + 8 * {n['s']}, {n['ph']});")
        self.line("__syncwarp();  // the lanes may leave the wait at different tries; wgmma needs the whole warp")
        self.line(f"const unsigned {n['sa']} = {n['base']} + {n['s']} * {self.stage_bytes}u, {n['sb']} = {n['sa']} + "
                  f"{self.a_bytes}u;")
        self.issue()
        self.wait_previous()
        if self.store is not None and self.store.aux is not None:
            self.open(f"if ({n['kt']} == ({n['nk']} > 1 ? 1 : 0)) {{  // the MMAs are under way: the first boxes' "
                      f"{self.store.aux.buffer.name}")
            self.aux_first()
            self.close()
        self.open(f"if ({n['kt']} > 0) {{")
        self.line("__syncwarp();")
        self.line(f"if ({n['l']} == 0) loopir_mbar_arrive({n['empty0']} + 8 * {n['prev']});")
        self.close()
        self.line(f"{n['prev']} = {n['s']};")
        self.line(f"if (++{n['s']} == {s}) {{ {n['s']} = 0; {n['ph']} ^= 1; }}")
        self.close()
        wait_wgmma(self.r, 0, (f"{n['d']}[{i}]" for i in range(self.cols // 2)))
        if self.store is not None and self.store.aux is not None:
            self.open(f"if ({n['nk']} == 0) {{")
            self.aux_first()
            self.close()
        self.open(f"if ({n['nk']} > 0) {{  // the last stage too: the producer may be loading the next tile already")
        self.line("__syncwarp();")
        self.line(f"if ({n['l']} == 0) loopir_mbar_arrive({n['empty0']} + 8 * {n['prev']});")
        self.close()
        if self.store is None:
            self.epilogue()
        else:
            self.epilogue_tma()
        self.close()  # tiles
        if self.store is not None:
            self.line('if ((threadIdx.x & 127) == 0) asm volatile("cp.async.bulk.wait_group 0;\\n" ::: "memory");'
                      "  // the boxes written before the block exits")
        self.close()  # consumers
        self.close()

    def epilogue_tma(self) -> None:
        """The epilogue through TMA stores (plan.store): per box of the warpgroup's 64 rows and 64 columns, the
        lanes write their values into a shared box (128-byte swizzled rows, as the map reads them), then one thread
        stores the box with TMA and the warpgroup goes on without waiting for it: the next box, and after the last
        the next tile's MMAs, overlap the store. Two boxes per warpgroup alternate; before a box is written again
        its store of two boxes ago must have read it (wait_group.read 1 by the thread that issued it, then the
        warpgroup's named barrier). The guards are the map's bounds (store_plan): the elements they refuse are
        dropped by TMA; the lanes still skip their values (a load there may be out of bounds).

        Measured on an H100 before this (relu(A @ B + bias), 8192 x 2048 x 768 float16): 67.8 us with each lane
        storing its elements, 37.1 us with the epilogue skipped, cuBLAS's matmul 43.8 us."""
        r, p, n, sp = self.r, self.p, self.n, self.store
        assert sp is not None
        rows, rest = self.row_guards()
        hoist = self.hoisted()
        conds = [N.conjunction(c) if c else None for c in rest] if rows else [cond for *_, cond in p.stores]
        boxes = self.cols // STORE_BOX
        self.unrolled(n["ec"], boxes)
        self.line(f"const unsigned {n['eb']} = {self.slot(n['ep'])};")
        bar = f'asm volatile("bar.sync %0, 128;\\n" :: "r"({n["g"]} + 1) : "memory");  // this warpgroup'
        if sp.aux is None:
            self.line(f'if (({n["w"]} | {n["l"]}) == 0) asm volatile("cp.async.bulk.wait_group.read 1;\\n" ::: '
                      '"memory");')
            self.line(bar)
        else:  # the box's load landed: its store of two boxes ago had read it before the load was issued
            self.line(f"loopir_mbar_wait({self.slot_bar(n['ep'])}, ({n['ep']} >> 1) & 1u);")
        full = self.box_inside(conds)
        self.unrolled(n["h"], 2)
        self.open("{")
        self.let(p.row, self.row_of())
        if rows:
            self.open(f"if ({_cond(r, rows)}) {{")
        if full:
            self.open(f"if ({full}) {{  // every column of the box passes the guards: no test per element")
            self.box_values([None] * len(conds), hoist)
            self.close("} else {")
            self.r.ind += 1
        self.box_values(conds, hoist)
        if full:
            self.close()
        if rows:
            self.close()
        self.close()
        self.close()
        self.line('asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");  // the box, seen by TMA')
        self.line(bar)
        at = ", ".join(self.box_coords(n["ec"]))
        self.line(f"if (({n['w']} | {n['l']}) == 0) loopir_tma_store{sp.rank}d(&{r.tmaps[sp.store.buffer][0]}, "
                  f"{n['eb']}, {at});")
        if sp.aux is not None:
            self.open(f"if ({n['ldr']} && {n['ec']} + 2 < {boxes}) {{  // this box's next load, once its store read it")
            self.line('asm volatile("cp.async.bulk.wait_group.read 0;\\n" ::: "memory");')
            self.aux_load(f"{n['ec']} + 2", n["ep"])
            self.close()
        self.line(f"++{n['ep']};")
        self.close()

    def aux_first(self) -> None:
        """The loads of the tile's first two boxes of `aux` (by the warpgroup's issuing thread, after the stores
        that read those boxes before)."""
        n = self.n
        self.open(f"if ({n['ldr']}) {{")
        self.line('asm volatile("cp.async.bulk.wait_group.read 0;\\n" ::: "memory");')
        for e in range(min(2, self.cols // STORE_BOX)):
            self.aux_load(str(e), f"({n['ep']} + {e}u)")
        self.close()

    def aux_load(self, box: str, count: str) -> None:
        """The TMA load of box `box` of the tile's aux tensor into the warpgroup's shared box of number `count`."""
        r, sp = self.r, self.store
        assert sp is not None and sp.aux is not None
        bar = self.slot_bar(count)
        self.line(f"loopir_mbar_expect({bar}, {BOX_BYTES}u);")
        # a box wholly past the columns (rows) is read at column (row) 0 instead, as the operands' boxes are: its
        # elements are never stored
        shape = sp.aux.buffer.shape
        rows = shape[-2] if sp.rank == 3 else N.binary("mul", N.const(1), shape[0])
        for d in ([] if sp.rank == 3 else shape[1:-1]):
            rows = N.binary("mul", rows, d)
        coords = self.box_coords(box)
        x, y = r.names.fresh("wg_x"), r.names.fresh("wg_y")
        self.line(f"const int {x} = {coords[0]}, {y} = {coords[1]};")
        coords[:2] = f"{x} < {r.expr(shape[-1])} ? {x} : 0", f"{y} < {r.expr(rows)} ? {y} : 0"
        self.line(f"loopir_tma{sp.rank}d({self.slot(count)}, &{r.tmaps[sp.aux.buffer][0]}, {', '.join(coords)}, "
                  f"{bar});")

    def slot(self, count: str) -> str:
        """The shared address of the warpgroup's box number `count` (its two boxes alternate)."""
        n = self.n
        return f"{n['stg']} + ((({n['g']} << 1) | (({count}) & 1u)) << {BOX_BYTES.bit_length() - 1})"

    def slot_bar(self, count: str) -> str:
        """The mbarrier of the warpgroup's box number `count`: its aux loads complete it."""
        return f"{self.n['abar']} + 8 * (({count}) & 1u)"

    def box_coords(self, box: str) -> list[str]:
        """The map coordinates (innermost first) of box `box` of this warpgroup's 64 rows of the tile."""
        r, n, sp = self.r, self.n, self.store
        assert sp is not None
        at = [f"(int)({r.expr(sp.col0)}) + {STORE_BOX} * ({box})", f"(int)({r.expr(sp.row0)}) + {STORE_BOX} * {n['g']}"]
        if sp.rank == 3:
            assert sp.outer is not None
            at.append(f"(int)({r.expr(sp.outer)})")
        return at

    def box_values(self, conds: list[N.Expr | None], hoist: list[list[N.Load]]) -> None:
        """The lane's values of box wg_ec in row wg_h into the shared box, element k under conds[k]."""
        n = self.n
        if any(hoist):
            self.chunks(conds, hoist, f"{STORE_BOX // 8} * {n['ec']}", STORE_BOX // 8)
            return
        self.unrolled(n["i0"], STORE_BOX // 8)
        self.line(f"const int {n['i']} = {STORE_BOX // 8} * {n['ec']} + {n['i0']};")
        self.elements(conds)
        self.close()

    def box_inside(self, conds: list[N.Expr | None]) -> str:
        """A C condition (declared once per box as wg_full) that every column of box wg_ec passes the store's
        guards, or "" when there are none or they are not all affine in the column alone: a guard that can only
        turn false as the column grows is tested at the box's last column, one that can only turn true at its
        first. Inside such boxes (all but the last of a row of tiles) the values need no test per element; at
        symbolic sizes those tests took the epilogue of a 8192 x 2048 x 768 GEMM from 47 to 59 us."""
        r, p, n = self.r, self.p, self.n
        terms = [c for cond in conds if cond is not None for c in N.conjuncts(cond)]
        if not terms or any(x is p.row for c in terms for x in walk(c) if isinstance(x, N.Var)):
            return ""
        slopes = [_slope(c, p.col) for c in terms]
        if any(d is None for d in slopes):
            return ""
        full = r.names.fresh("wg_full")
        self.line(f"bool {full};")
        self.open("{")
        falling = [c for c, d in zip(terms, slopes) if d is not None and d <= 0]
        rising = [c for c, d in zip(terms, slopes) if d is not None and d > 0]
        self.let(p.col, f"{STORE_BOX} * {n['ec']} + {STORE_BOX - 1}")
        self.line(f"{full} = {_cond(r, falling)};")
        self.close()
        if rising:
            self.open("{")
            self.let(p.col, f"{STORE_BOX} * {n['ec']}")
            self.line(f"{full} = {full} && {_cond(r, rising)};")
            self.close()
        return full

    def sink(self) -> bool:
        """The lane's two halves into the warpgroup's shared box: row 16 w + lane / 4 + 8 h of its 64, 16-byte
        chunk i % 8 of the row XOR-swizzled by the row's last 3 bits (TMA's 128-byte swizzle), 4 bytes per lane."""
        if self.store is None:
            return False
        n = self.n
        self.line(f"loopir_wg_st32({self.box_at()}, (unsigned){n['v0']} | ((unsigned){n['v1']} << 16));")
        return True

    def box_at(self) -> str:
        """The shared address of the lane's two elements (i, h) in the warpgroup's box wg_eb."""
        n = self.n
        rw = f"(16 * {n['w']} + ({n['l']} >> 2) + 8 * {n['h']})"
        return f"{n['eb']} + {rw} * 128u + ((({n['i']} & 7) ^ ({rw} & 7)) << 4) + 4 * ({n['l']} & 3)"

    def pair_lanes(self) -> dict[N.Load, list[str]]:
        """The aux load's two elements, read from the box where the lane writes its results."""
        if self.store is None or self.store.aux is None:
            return {}
        n, aux = self.n, self.store.aux
        self.line(f"const unsigned {n['ax']} = loopir_ld_shared_u32({self.box_at()});")
        f = _TO_FLOAT[aux.buffer.dtype]
        return {aux: [f"{f}((unsigned short)({n['ax']} & 0xffffu))", f"{f}((unsigned short)({n['ax']} >> 16))"]}

    def tiles(self) -> None:
        """for each tile of this block (blockIdx.x, + gridDim.x, ...): the block loops' variables, in grouped
        order (GROUP rows of tiles at a time), declared in the loop's scope (they shadow the launch's)."""
        n, pl, r = self.n, self.plan, self.r
        self.open(f"for (int {n['tile']} = blockIdx.x; {n['tile']} < {n['nt']}; {n['tile']} += gridDim.x) {{")
        if pl.bz is None:
            self.grouped(n["tile"], n["tm"], n["tn"], pl.bi.var, pl.bj.var)
            return
        # a batch loop: the rows of tiles of every batch in one sequence (batch-major), so that the groups of rows
        # share B's column tiles across batches too; one division per tile, not per element
        self.grouped(n["tile"], f"{n['nt']} / {n['tn']}", n["tn"], None, pl.bj.var, n["rt"])
        self.line(f"const {self.ix} {r.var(pl.bz.var)} = {n['rt']} / {n['tm']};")
        self.line(f"const {self.ix} {r.var(pl.bi.var)} = {n['rt']} % {n['tm']};")

    def batches(self) -> str:
        """The batch loop's extent as a factor of the number of tiles ("" without one)."""
        bz = self.plan.bz
        return "" if bz is None else f"(int)({self.r.expr(N.binary('sub', bz.hi, bz.lo))}) * "
