"""Rendering of a block's online-softmax pass marked "attention.wgmma" (schedules/primitives/flash.py) as a
FlashAttention kernel body on Hopper's warpgroup tensor cores (sm_90a).

Per block of 128 query rows (256 threads: warpgroup g owns rows 64g .. 64g + 63, warp w of the block rows 16w ..):

    Q's rows -> shared, once (cp.async; zeros past the row guard)
    for each live tile of 64 keys (tiles that the mask kills at all four corners are skipped):
        prefetch the tile after next of K and V into a third shared stage: by TMA when K and V are read as whole
        rows of their tensors up to the key loop's end (`tma_maps`: thread 0 waits for the stage's empty mbarrier,
        which each warp arrives on once its P V of the stage's last tile is done, and issues a box per 64 columns;
        the warps wait for the stage's full mbarrier, no block-wide barrier per tile), else by the threads' cp.async
        copies (zeros past the keys) and a block-wide barrier per tile
        S = Q K^T        wgmma m64n64k16, A = Q and B = K both K-major in shared memory
        s = g(S), the mask, the rows' new maximum, the rescale of l and O, P = exp(s - m)
                         codegen.cuda.flash's own steps: wgmma's accumulator layout is, warp by warp, mma.sync's
                         m16n8 layout (row 16w + lane / 4 + 8h, column 8j + 2 (lane % 4) + e)
        O += P V         wgmma m64n{Dv}k16 with A = P from registers (the C layout of two n8 tiles is the A layout
                         of one k16 step, as for mma.sync) and B = V MN-major in shared memory (transposed)
    O, the sum and the maximum stored as the pass stores them (codegen.cuda.flash's epilogue)

Shared memory (dynamic, 1024-byte aligned): every tile is stored in rows of 128 bytes (64 halves), a head
dimension of 128 as two such blocks of rows, and the 16-byte chunks of row r XOR-swizzled by r % 8: the layout
wgmma reads with its 128-byte swizzle mode (descriptors as codegen.cuda.wgmma's, checked there against a float64
reference by benchmarks/wgmma_probe.py: K-major SBO 1024 and 32 bytes per k16 step; MN-major LBO = the block
stride, SBO 1024 and 2048 bytes per k16 step). Every address and condition is the pass's own expression with the
loop variables bound to the element a thread copies or holds.
"""

from __future__ import annotations

from typing import Any

from loopir import nodes as N
from loopir.affine import same_value
from loopir.visit import free_vars

from .flash import _PTX, _Emit, checked_parts
from .wgmma import asm_accumulators, asm_regs, wait_wgmma

__all__ = ["render_flash_wgmma"]

_ROW = 128  # bytes per shared row: one 128-byte swizzle atom row (64 halves)


def render_flash_wgmma(r: Any, f: N.For) -> None:
    """Emit the kernel body of the pass `f` marked attention.wgmma with renderer `r` (codegen.cuda.kernel's)."""
    p = checked_parts(f, r.program)
    r.uses_async = r.uses_half = r.uses_flash = r.uses_wgmma = True  # the flash prelude uses cp.async too
    _EmitWgmma(r, p).emit()



def _column0(index: N.Expr, inner: N.Var, varying: set[N.Var]) -> N.Expr | None:
    """x0 where `index` is inner + x0 (or x0 + inner) with x0 free of the `varying` variables (the first column of
    a head's slice of a wider row, h * 64: the same for every element a block copies), else None."""
    if index == inner:
        return N.const(0)
    if isinstance(index, N.Binary) and index.op == "add":
        for a, x0 in ((index.a, index.b), (index.b, index.a)):
            if a == inner and not varying & set(free_vars(x0)):
                return x0
    return None


class _EmitWgmma(_Emit):
    def __init__(self, r: Any, p: Any) -> None:
        super().__init__(r, p)
        self.threads = p.shape.threads
        self.q_bytes = 2 * self.rows * self.D
        self.k_bytes = 2 * self.keys * self.D
        self.stage_bytes = self.k_bytes + 2 * self.keys * self.DV
        self.n.update({k: r.names.fresh(f"fw_{k}") for k in ("sm", "base", "g", "dq", "dk", "dv", "pa", "full0",
                                                               "ph", "eph")})
        self.maps = self.tma_maps()

    def emit(self) -> None:
        r, p, n, ix = self.r, self.p, self.n, self.ix
        self.open(f"{{  // attention.wgmma: rows {p.row.name} ({self.rows} per block, a warpgroup per 64), keys "
                  f"{p.key.var.name} in tiles of {self.keys}; S = Q K^T and O += P V on warpgroup tensor cores "
                  "(codegen.cuda.flash_wgmma)")
        self.line(f"unsigned char* {n['sm']} = (unsigned char*)((((unsigned long long)loopir_dyn_smem) + 1023ull) "
                  "& ~1023ull);  // the swizzle's 1024-byte atom")
        self.line(f"const unsigned {n['base']} = (unsigned)__cvta_generic_to_shared({n['sm']});")
        self.line(f"const int {n['lane']} = threadIdx.x & 31, {n['warp']} = threadIdx.x >> 5, {n['g']} = "
                  "threadIdx.x >> 7;")
        self.line(f"const {ix} {n['lo']} = {r.expr(p.key.lo)}, {n['hi']} = {r.expr(p.key.hi)};")
        self.line("__syncthreads();  // a serial loop around the pass: every warp is done with the last tile's stages")
        if self.maps:  # (re)made after that barrier: no thread still waits on the last pass's phases
            bars = self.q_bytes + p.shape.stages * self.stage_bytes
            self.line(f"const unsigned {n['full0']} = {n['base']} + {bars}u;  // mbarriers full[stage]: 8 bytes each")
            self.line(f"unsigned {n['ph']} = 0, {n['eph']} = 0;  // bit s: the parity of full[s]'s next phase, of "
                      "the empty[s] phase thread 0 waits for next (its first use waits for none: parity 1)")
            self.open("if (threadIdx.x == 0) {")
            self.unrolled(n["e"], p.shape.stages)
            self.line(f"loopir_mbar_init({n['full0']} + 8 * {n['e']}, 1);")
            self.line(f"loopir_mbar_init({n['full0']} + {8 * p.shape.stages}u + 8 * {n['e']}, {self.threads // 32});"
                      "  // empty[stage]: an arrival per warp")
            self.close()
            self.line('asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");')
            self.close()
            self.line("__syncthreads();  // the barriers are made before any thread waits on one")
        self.copy_rows(self.rows, self.D, self.KS, p.q, p.row, "0", p.red, p.guard, n["base"])
        self.loader()
        self.tiles()
        self.main_loop()
        self.epilogue()
        self.close()

    COPY, COPY_ALIGNED, ZERO = "loopir_wg_copy16", "loopir_wg_cp16", "loopir_wg_zero16"

    def chunk_loop(self, chunks: int) -> None:
        """A whole number of passes of the block's threads over the chunks (unrolled)."""
        n = self.n
        self.unrolled(n["e"], -(-chunks // self.threads))
        self.line(f"const int {n['c']} = threadIdx.x + {n['e']} * {self.threads};")
        if chunks % self.threads:
            self.line(f"if ({n['c']} >= {chunks}) break;")

    def chunk_dest(self, rows: int, stride: int, base: str) -> str:
        """Chunk ch of row r at block ch / 8 (of `rows` rows of 128 bytes) from shared address `base`, position
        (ch % 8) ^ (r % 8) in its row: the 128-byte swizzle (`stride`, the mma.sync kernel's padded row, unused)."""
        n = self.n
        return (f"const unsigned {n['dst']} = {base} + ({n['ch']} >> 3) * {rows * _ROW}u + {n['row']} * {_ROW}u + "
                f"((({n['ch']} & 7) ^ ({n['row']} & 7)) << 4);")

    def stage_at(self, stage: str) -> str:
        return f"{self.n['base']} + {self.q_bytes}u + {stage} * {self.stage_bytes}u"

    def v_at(self, stage_base: str) -> str:
        return f"{stage_base} + {self.k_bytes}u"

    def main_loop(self) -> None:
        """Software-pipelined over the live tiles (FlashAttention 3's order inside a warpgroup): while the tensor
        cores run O += P V of tile t, the warps compute the softmax of tile t + 1, whose S = Q K^T was issued just
        before; O is rescaled by t + 1's factors once P V is done. Three shared stages: the copy into the stage of
        tile t + 2 starts once every warp is done with tile t - 1 (with TMA: the stage's empty mbarrier; else the
        block-wide barrier that every thread passes only then)."""
        n, ix = self.n, self.ix
        o, s, kk, pa, st = n["o"], n["s"], n["kk"], n["pa"], n["stage"]
        tv = _PTX[self.p.v.buffer.dtype]
        pack = "loopir_pack_f16" if tv == "f16" else "loopir_pack_bf16"
        self.zeros(o, (1, self.DV // 8, 4))
        self.line(f"float {n['m']}[1][2], {n['l']}[1][2], {s}[1][{self.keys // 8}][4];")
        self.line(f"{n['m']}[0][0] = {n['m']}[0][1] = -LOOPIR_INF_F; {n['l']}[0][0] = {n['l']}[0][1] = 0.0f;")
        self.line(f"{ix} {n['kt']} = {n['next']}({n['lo']});")
        self.line(f"if ({n['kt']} < {n['hi']}) {n['load']}({n['kt']}, 0);")
        self.line('asm volatile("cp.async.commit_group;\\n" ::: "memory");  // with Q\'s rows')
        self.line(f"{ix} {n['nk']} = {n['kt']} < {n['hi']} ? {n['next']}({n['kt']} + {self.keys}) : {n['hi']};")
        self.line(f"if ({n['nk']} < {n['hi']}) {n['load']}({n['nk']}, 1);")
        self.line('asm volatile("cp.async.commit_group;\\n" ::: "memory");')
        self.line(f"int {st} = 0;  // the stage of tile kt")
        # the descriptors of Q (this warpgroup's rows) and of stage 0's K and V: an operand's is one of these plus
        # its byte offset / 16 (the start address field, bits 0-13, holds every address below 256 KB)
        self.line(f"const unsigned long long {n['dq']} = loopir_wg_desc({n['base']} + {n['g']} * {64 * _ROW}u, 16u, "
                  "1024u);")
        self.line(f"const unsigned long long {n['dk']} = loopir_wg_desc({n['base']} + {self.q_bytes}u, 16u, 1024u), "
                  f"{n['dv']} = loopir_wg_desc({n['base']} + {self.q_bytes + self.k_bytes}u, {self.keys * _ROW}u, "
                  "1024u);")
        # an operand's descriptor differs from these in its low word only (the start address field, no carry out
        # of it): the asm gets the low word + offset and the fixed high word, and pairs them itself, so that no
        # 64-bit add per instruction is issued (a tenth of a tile's instructions at d 64)
        for d in ("dq", "dk", "dv"):
            self.line(f"const unsigned {n[d]}_lo = (unsigned){n[d]}, {n[d]}_hi = (unsigned)({n[d]} >> 32);")
        # every wgmma is issued outside a branch (ptxas serializes the asynchronous ones on a path it cannot prove
        # uniform): with no tile left, S is computed from a stale stage and not read
        self.line('asm volatile("cp.async.wait_group 1;\\n" ::: "memory");')
        self.arrived("0", f"{n['kt']} < {n['hi']}")
        self.line('asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");')
        self.issue_s("0")
        wait_wgmma(self.r, 0, self.s_regs())
        self.open(f"if ({n['kt']} < {n['hi']}) {{")
        self.scores()
        self.close()
        self.open(f"while ({n['kt']} < {n['hi']}) {{  // P of tile kt is in s; tile nk (if any) in the next stage")
        self.line(f"unsigned {pa}[{self.keys // 16}][4];")
        self.unrolled(kk, self.keys // 16)
        for j, (nt, e0) in enumerate(((0, 0), (0, 2), (1, 0), (1, 2))):
            self.line(f"{pa}[{kk}][{j}] = {pack}({s}[0][2 * {kk} + {nt}][{e0}], {s}[0][2 * {kk} + {nt}][{e0 + 1}]);")
        self.close()
        self.line(f"const int {n['np']} = {self.after(st)};  // the stage of tile nk")
        self.open(f"if ({n['nk']} < {n['hi']}) {{")
        if not self.maps:
            self.line('asm volatile("cp.async.wait_group 0;\\n" ::: "memory");')
        self.arrived(n["np"])
        self.close()
        self.line('asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");  // s and P written by the warps')
        self.issue_s(n["np"])
        # O += P V: P's registers are the A fragments of the k16 steps; V MN-major (the transpose flag), its rows
        # of 64 columns a block of keys x 128 bytes apart (LBO), 16 key rows (2048 bytes) per k16 step
        no = self.DV // 2
        outs = asm_accumulators(f"{o}[0][{i // 4}][{i % 4}]" for i in range(no))
        for k in range(self.keys // 16):
            ins = ", ".join(f'"r"({pa}[{k}][{j}])' for j in range(4))
            self.line(f'asm volatile("{{ .reg .b64 fw_b; mov.b64 fw_b, {{%{no + 4}, %{no + 5}}}; '
                      f'wgmma.mma_async.sync.aligned.m64n{self.DV}k16.f32.{tv}.{tv} '
                      f'{{{asm_regs(0, no)}}}, {{{asm_regs(no, 4)}}}, fw_b, 1, 1, 1, 1; }}\\n" : {outs} : '
                      f'{ins}, {self.desc("dv", f"{st} * {self.stage_bytes // 16}u + {k * 16 * _ROW // 16}u")});')
        self.line('asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");')
        # the copy of the tile after next, its address arithmetic under the running wgmma: into the stage of the
        # tile before this one, which every warp finished (the barrier above; with TMA, the stage's empty mbarrier,
        # which the copying thread waits for)
        self.line(f"{ix} {n['k1']} = {n['hi']};")
        self.open(f"if ({n['nk']} < {n['hi']}) {{")
        self.line(f"{n['k1']} = {n['next']}({n['nk']} + {self.keys});")
        self.line(f"if ({n['k1']} < {n['hi']}) {n['load']}({n['k1']}, {self.after(n['np'])});")
        self.line('asm volatile("cp.async.commit_group;\\n" ::: "memory");')
        self.close()
        self.line(f"{n['kt']} = {n['nk']}; {n['nk']} = {n['k1']};")
        wait_wgmma(self.r, 1, self.s_regs(), "S of tile kt is done")
        self.declare_factors()
        self.open(f"if ({n['kt']} < {n['hi']}) {{  // tile kt's softmax while P V runs")
        self.scores(rescale=False, declare=False)
        self.close()
        wait_wgmma(self.r, 0, (f"{o}[0][{i // 4}][{i % 4}]" for i in range(self.DV // 2)), "and P V")
        if self.maps:
            self.line(f"if ({n['lane']} == 0) loopir_mbar_arrive({n['full0']} + {8 * self.p.shape.stages}u + 8 * {st});"
                      "  // the warp is done with the stage: empty[st]")
        self.open(f"if ({n['kt']} < {n['hi']}) {{")
        self.rescale_o()
        self.close()
        self.line(f"{st} = {n['np']};")
        self.close()

    def s_regs(self) -> list[str]:
        """S's accumulator elements (the keys of a tile: keys / 2 a thread)."""
        return [f"{self.n['s']}[0][{i // 4}][{i % 4}]" for i in range(self.keys // 2)]

    def desc(self, d: str, offset: str) -> str:
        """The two 32-bit asm operands of descriptor `d` advanced by `offset` (in 16-byte units)."""
        n = self.n
        return f'"r"({n[d]}_lo + ({offset})), "r"({n[d]}_hi)'

    def after(self, stage: str) -> str:
        """The stage that follows `stage` in the ring."""
        return f"({stage} == {self.p.shape.stages - 1} ? 0 : {stage} + 1)"

    def arrived(self, stage: str, live: str | None = None) -> None:
        """The tile in `stage` is in shared memory (with TMA: the phase of its mbarrier completed; only when `live`
        holds, the tile being loaded), and every warp is done with the stage the next copy fills."""
        n = self.n
        if self.maps is None or live is not None:  # the cp.async copies (with TMA: Q's rows), seen by wgmma
            self.line('asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");')
        if self.maps:
            wait = (f"{{ loopir_mbar_wait({n['full0']} + 8 * {stage}, ({n['ph']} >> {stage}) & 1u); {n['ph']} ^= 1u << "
                    f"{stage}; }}")
            self.line(f"if ({live}) {wait}" if live else wait)
            if live is None:  # the stage the next copy fills is free when its empty barrier says so (loader)
                self.line("__syncwarp();  // the lanes may leave the wait at different tries; wgmma needs the warp")
                return
        self.line("__syncthreads();  // the tile is in shared memory, and every warp is done with the stage the next "
                  "copy fills")

    def tma_maps(self) -> tuple[tuple[str, N.Expr, N.Expr], ...] | None:
        """Per operand (K, then V) the tensor map through which one thread copies its tiles by TMA (rank 3: the
        leading indices flattened, the keys, the last dimension; boxes of 64 columns x the tile's keys, 128-byte
        swizzled: the layout the descriptors read), the first column x0 and the leading coordinate z of its boxes;
        or None for the threads' cp.async copies. TMA needs each to read `buf[lead.., key, x0 + c]` of a half
        tensor whose key extent is the key loop's end (TMA's zeros past it are the zeros the copies write past the
        loop's end), with `lead` and x0 the same for the whole tile (x0: the first column of a head's slice h * 64
        of a row of all heads). K and V may be one tensor: one map serves both."""
        p, r = self.p, self.r
        if not same_value(p.key.lo, N.const(0)):
            return None
        box, plans = (64, self.keys, 1), []
        for ld, inner in ((p.k, p.red), (p.v, p.col)):
            b = ld.buffer
            varying = {p.row, p.key.var, inner}  # what differs between the elements of a block's tile
            x0 = _column0(ld.indices[-1], inner, varying) if len(ld.indices) >= 3 else None
            if (x0 is None or b.dtype not in _PTX or len(b.shape) != len(ld.indices) or ld.indices[-2] != p.key.var
                    or any(varying & set(free_vars(i)) for i in ld.indices[:-2])
                    or not same_value(b.shape[-2], p.key.hi) or r.tmaps.get(b, (None, box))[1] != box):
                return None
            z = ld.indices[0]
            for i, e in zip(ld.indices[1:-2], b.shape[1:-2]):
                z = N.binary("add", N.binary("mul", z, e), i)
            plans.append((b, x0, z))
        for b, _, _ in plans:
            if b not in r.tmaps:
                r.tmaps[b] = (r.names.fresh(f"{b.name}_tmap"), box)
        r.uses_wgmma_tma = True
        return tuple((r.tmaps[b][0], x0, z) for b, x0, z in plans)

    def loader(self) -> None:
        """fa_load(k0, stage): with tensor maps, thread 0 announces the stage's bytes on its mbarrier and issues a
        TMA box per 64 columns of K and of V (every box counts whole: TMA writes zeros past the keys); else the
        threads' copies."""
        if not self.maps:
            super().loader()
            return
        p, n, r, ix = self.p, self.n, self.r, self.ix
        self.open(f"auto {n['load']} = [&]({ix} {n['k0']}, int {n['stage']}) {{")
        self.open("if (threadIdx.x == 0) {")
        self.line(f"const unsigned {n['dst']} = {self.stage_at(n['stage'])}, {n['c']} = {n['full0']} + 8 * "
                  f"{n['stage']};")
        self.line(f"loopir_mbar_wait({n['c']} + {8 * p.shape.stages}u, (({n['eph']} >> {n['stage']}) & 1u) ^ 1u); "
                  f"{n['eph']} ^= 1u << {n['stage']};  // every warp is done with the stage's last tile")
        self.line(f"loopir_mbar_expect({n['c']}, {self.stage_bytes}u);")
        at = 0
        for (tm, x0, z), width in zip(self.maps, (self.D, self.DV)):
            for j in range(width // 64):
                self.line(f"loopir_tma3d({n['dst']} + {at}u, &{tm}, (int)({r.expr(x0)}) + {64 * j}, (int)({n['k0']}), "
                          f"(int)({r.expr(z)}), {n['c']});")
                at += self.keys * _ROW
        self.close()
        self.close("};")

    def issue_s(self, stage: str) -> None:
        """S = Q K^T of the tile in `stage`, one committed group: A = Q (this warpgroup's 64 rows), B = the key
        rows, both K-major, 32 bytes per k16 step inside a 128-byte row, a block of rows per 64 of the head
        dimension; the first step overwrites s (scale-d 0)."""
        tq = _PTX[self.p.q.buffer.dtype]
        ns = self.keys // 2
        outs = asm_accumulators(self.s_regs())
        for ks in range(self.D // 16):
            qa = ((ks >> 2) * self.rows * _ROW + (ks & 3) * 32) // 16
            ka = ((ks >> 2) * self.keys * _ROW + (ks & 3) * 32) // 16
            self.line(f'asm volatile("{{ .reg .b64 fw_a, fw_b; mov.b64 fw_a, {{%{ns}, %{ns + 1}}}; '
                      f'mov.b64 fw_b, {{%{ns + 2}, %{ns + 3}}}; '
                      f'wgmma.mma_async.sync.aligned.m64n{self.keys}k16.f32.{tq}.{tq} '
                      f'{{{asm_regs(0, ns)}}}, fw_a, fw_b, {int(ks > 0)}, 1, 1, 0, 0; }}\\n" : {outs} : '
                      f'{self.desc("dq", f"{qa}u")}, '
                      f'{self.desc("dk", f"{stage} * {self.stage_bytes // 16}u + {ka}u")});')
        self.line('asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");')
