"""Rendering of a block's online-softmax pass over float32 data marked "attention.tf32x3"
(schedules/primitives/flash.py) as a FlashAttention kernel body on TF32 tensor cores with float32-class accuracy.

Per block of 64 query rows (128 threads; warp w owns rows 16w .. 16w + 15, one m16 tile):

    Q tile -> shared (cp.async, zeros past the row guard) -> A fragments, split Q = Q_hi + Q_lo, in registers
    for each live tile of 32 keys (tiles that the mask kills at all four corners are skipped):
        prefetch the next live tile of K and V into the other shared stage (cp.async, zeros past the keys)
        S = Q K^T          mma.sync m16n8k8 tf32, three per fragment: Q_lo K_hi + Q_hi K_lo + Q_hi K_hi
        s = g(S), the mask, the rows' new maximum, the rescale of l and O, P = exp(s - m)
                           codegen.cuda.flash's own steps (m16n8k8's accumulator layout is m16n8k16's)
        O = O f + P V      the same three products, P split in registers and V split as it is read; P V of
                           the tile summed from zero, then added by rounded FMAs (main_loop says why)
    O, the sum and the maximum stored as the pass stores them (codegen.cuda.flash's epilogue)

The split (loopir_tf32_split): x_hi = x rounded to TF32, to nearest (two integer instructions on the bits), x_lo =
x - x_hi (exact in float32; the instruction reads its top 19 bits). a b = a_hi b_hi + a_hi b_lo + a_lo b_hi +
a_lo b_lo, the last term and the truncation of the lo parts below 2^-20 |a b|; the sums accumulate in float32. The
small products go first, so that they are not lost to the large one. Measured at 4096 keys: 2.3e-6 of the largest
output against float64, PyTorch's float32 composition 2.9e-6 (benchmarks/attention.py).

Fragment orders (each a permutation of a reduction, so any is exact, chosen for conflict-free wide reads):
  * S's reduction over the head dimension: k-step kk's A column t (and t + 4) is element 16 (kk / 2) + 4 t +
    2 (kk % 2) (and + 1) of the row, in Q and K alike, so one float4 per row and lane feeds two k-steps. Shared rows
    of KS = 16 (mod 32) floats put the two rows of a quarter warp's float4s in distinct halves of the banks.
  * P V's reduction over the keys: A column t (t + 4) of key block kb is key 8 kb + 2 t (+ 1), which is where S's
    accumulator layout holds it (the lane's two adjacent columns), so P goes from S's registers to A's without a
    shuffle; V's B fragment reads keys 8 kb + 2 t and + 1 of column 8 dp + lane / 4. Rows of VS = DV + 4 floats
    (2 VS = 8 mod 32): the warp's 32 reads in distinct banks.
"""

from __future__ import annotations

from typing import Any

from loopir import nodes as N

from .flash import _acc, _Emit, checked_parts
from .mma import _mma

__all__ = ["render_flash_tf32"]


def render_flash_tf32(r: Any, f: N.For) -> None:
    """Emit the kernel body of the pass `f` marked attention.tf32x3 with renderer `r` (codegen.cuda.kernel's)."""
    p = checked_parts(f, r.program)
    r.uses_async = r.uses_flash = r.uses_tf32 = True
    _EmitTf32(r, p).emit()


class _EmitTf32(_Emit):
    ELEM, PER_CHUNK = "float", 4

    def __init__(self, r: Any, p: Any) -> None:
        super().__init__(r, p)
        # shared row strides in floats, KS = 16 mod 32 and VS = 4 mod 16 (module docstring)
        self.KS, self.VS = self.D + (16 if self.D % 32 == 0 else 32), self.DV + 4
        self.stage = self.keys * (self.KS + self.VS)
        names = ("qh", "ql", "x", "bh", "bl", "ph", "pl", "kp", "kb", "pv")
        self.n.update({k: r.names.fresh(f"ft_{k}") for k in names})

    def header(self) -> str:
        p = self.p
        return (f"attention.tf32x3: rows {p.row.name} ({self.rows} per block, a warp per 16), keys {p.key.var.name} "
                f"in tiles of {self.keys}; S = Q K^T and O += P V on TF32 tensor cores, three products each for "
                "float32 accuracy (codegen.cuda.flash_tf32)")

    def mma3(self, acc: str, ah: str, al: str, bh: list[str], bl: list[str]) -> None:
        """acc += a_lo b_hi + a_hi b_lo + a_hi b_hi (the small products first)."""
        for a, b in ((al, bh), (ah, bl), (ah, bh)):
            _mma(self.r, "tf32", _acc(acc), [f"{a}[{j}]" for j in range(4)], b, "m16n8k8")

    def split4(self, x: str, hi: str, lo: str) -> None:
        """`hi[j]`, `lo[j]` = the split of the float4 x's component j."""
        for j in range(4):
            self.line(f"loopir_tf32_split({x}.{'xyzw'[j]}, {hi}[{j}], {lo}[{j}]);")

    def main_loop(self) -> None:
        n = self.n
        D, DV, KS, VS, keys = self.D, self.DV, self.KS, self.VS, self.keys
        lane, warp, o, s, kv = n["lane"], n["warp"], n["o"], n["s"], n["kv"]
        qh, ql, x, bh, bl, ph, pl, kp, kb = (n[k] for k in ("qh", "ql", "x", "bh", "bl", "ph", "pl", "kp", "kb"))
        h, nt, dp = n["h"], n["nt"], n["dp"]
        self.zeros(o, (1, DV // 8, 4))
        self.line(f"float {n['m']}[1][2], {n['l']}[1][2];")
        self.line(f"{n['m']}[0][0] = {n['m']}[0][1] = -LOOPIR_INF_F; {n['l']}[0][0] = {n['l']}[0][1] = 0.0f;")
        self.line(f"unsigned {qh}[{D // 8}][4], {ql}[{D // 8}][4];  // Q's A fragments, Q = hi + lo")
        self.open_tiles()
        self.unrolled(kp, D // 16)
        self.unrolled(h, 2)
        self.line(f"const float4 {x} = *reinterpret_cast<const float4*>(&{kv}[{self.stage} + ({warp} * 16 + "
                  f"({lane} >> 2) + 8 * {h}) * {KS} + {kp} * 16 + ({lane} & 3) * 4]);")
        for c, (step, col) in enumerate(((0, 0), (0, 2), (1, 0), (1, 2))):
            at = f"[2 * {kp} + {step}][{col} + {h}]"
            self.line(f"loopir_tf32_split({x}.{'xyzw'[c]}, {qh}{at}, {ql}{at});")
        self.close()
        self.close()
        self.prefetch()
        ks = f"{kv}[{n['stage']} * {self.stage}"
        vs = f"{kv}[{n['stage']} * {self.stage} + {keys * KS}"
        # S = Q K^T: key row 8 nt + lane / 4 is B's column; one float4 of it serves k-steps 2 kp and 2 kp + 1
        self.zeros(s, (1, keys // 8, 4))
        self.unrolled(kp, D // 16)
        self.unrolled(nt, keys // 8)
        self.line(f"const float4 {x} = *reinterpret_cast<const float4*>(&{ks} + ({nt} * 8 + ({lane} >> 2)) * {KS} + "
                  f"{kp} * 16 + ({lane} & 3) * 4]);")
        self.line(f"unsigned {bh}[4], {bl}[4];")
        self.split4(x, bh, bl)
        for step in (0, 1):
            self.mma3(f"{s}[0][{nt}]", f"{qh}[2 * {kp} + {step}]", f"{ql}[2 * {kp} + {step}]",
                      [f"{bh}[{2 * step}]", f"{bh}[{2 * step + 1}]"], [f"{bl}[{2 * step}]", f"{bl}[{2 * step + 1}]"])
        self.close()
        self.close()
        self.scores(rescale=False)
        # O = O * factor + P V, P V summed from zero per tile: the tensor core's float32 accumulation does not round
        # to nearest, and summed over every key into O its error grew with the sequence (4.8e-5 of the largest
        # output at 4096 keys, PyTorch's float32 2.9e-6); per tile it is 12 accumulations, and the tiles are summed
        # by rounded FMAs (2.3e-6). S's accumulators (keys 2t, 2t + 1 of each row) are A's columns t, t + 4 of key
        # block kb
        self.zeros(n["pv"], (DV // 8, 4))
        self.unrolled(kb, keys // 8)
        self.line(f"unsigned {ph}[4], {pl}[4];")
        for j, e in enumerate((0, 2, 1, 3)):
            self.line(f"loopir_tf32_split({s}[0][{kb}][{e}], {ph}[{j}], {pl}[{j}]);")
        self.unrolled(dp, DV // 8)
        self.line(f"const float* {x} = &{vs} + ({kb} * 8 + ({lane} & 3) * 2) * {VS} + {dp} * 8 + ({lane} >> 2)];")
        self.line(f"unsigned {bh}[2], {bl}[2];")
        self.line(f"loopir_tf32_split({x}[0], {bh}[0], {bl}[0]);")
        self.line(f"loopir_tf32_split({x}[{VS}], {bh}[1], {bl}[1]);")
        self.mma3(f"{n['pv']}[{dp}]", ph, pl, [f"{bh}[0]", f"{bh}[1]"], [f"{bl}[0]", f"{bl}[1]"])
        self.close()
        self.close()
        self.unrolled(dp, DV // 8)
        self.unrolled(n["e"], 4)
        self.line(f"{o}[0][{dp}][{n['e']}] = fmaf({o}[0][{dp}][{n['e']}], {n['sca']}[0][{n['e']} >> 1], "
                  f"{n['pv']}[{dp}][{n['e']}]);")
        self.close()
        self.close()
        self.advance()
