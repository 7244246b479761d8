"""Rendering of a tensorized nest (For kind "mma.m16n8k16" or "mma.m16n8k16.tf32x3", see
schedules/primitives/tensorize.py) as tensor-core PTX.

The nest is the reference semantics of one lane's four accumulator elements; here it becomes, per warp:

    ldmatrix.x4        A fragment: lane l gives the address of row r0 + l % 16, column k0 + 8 * (l / 16)
    ldmatrix.x2.trans  B fragment: lane l gives the address of row k0 + l % 16, column c0 (B is k-major in shared)
    mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 on the lane's four accumulators

For "mma.m16n8k16.tf32x3" (float32 tiles; the nest's 16 k are two steps j of m16n8k8, whose fragment layout is
m16n8k16's with half the k columns):

    ldmatrix.x4        A fragment as 32-bit words: lane l gives row r0 + l % 16, column k0 + 8 j + 4 * (l / 16)
    two shared loads   B fragment: B[k0 + 8 j + l % 4, c0 + l / 4] and B[k0 + 8 j + l % 4 + 4, c0 + l / 4]
    split              x = hi + lo per word (loopir_tf32_split_trunc: hi x's TF32 bits, lo the exact rest)
    mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 three times per step (a_lo b_hi, a_hi b_lo, a_hi b_hi)
                       into a fragment from zero; then the accumulators += it (rounded float32 adds)

Float32 products lose only a_lo b_lo and the lo parts' bits past TF32 (below 2^-20 |a b|); the sums round as
float32's do but for the 6 truncating additions inside a fragment (H200, 4096^3: 8.8e-7 of the largest output
against float64, cuBLAS's float32 GEMM 2.5e-6). Unlike float32 arithmetic, an infinite operand gives NaN (inf * 0
in a lo product) where float32 gives +-inf: a GEMM that must carry IEEE infinities keeps the SIMT recipe
(`gemm={"tensor_cores": False}`).

The addresses are the nest's own index expressions with (lane, eh, el, k) substituted, so they are exactly the
elements the reference reads (tensorize checked the layout). Inline PTX: the pip NVRTC ships no headers.
"""

from __future__ import annotations

from typing import Any

from loopir import nodes as N
from loopir.errors import CudaCodegenError
from loopir.visit import substitute, walk
from schedules.primitives.tensorize import MMA_SHAPES, MMA_TF32, TensorizeError, mma_operands

__all__ = ["render_mma", "render_mma_grid"]

_PTX_TYPE = {"float16": "f16", "bfloat16": "bf16"}

PRELUDE_TF32 = r"""
// x = hi + lo: hi is x rounded to TF32 (the 19 bits a TF32 tensor-core operand holds; to nearest, ties away, on
// the bits: two integer instructions where cvt.rna.tf32.f32 takes four, its guard for inf and NaN left out: a NaN
// stays a NaN or becomes an infinity whose lo is NaN, and only |x| within 2^-11 of FLT_MAX rounds to inf), lo the
// exact rest, which the instruction truncates to TF32 in turn (codegen.cuda.flash_tf32's three-product split)
__device__ __forceinline__ void loopir_tf32_split(float x, unsigned& hi, unsigned& lo) {
  hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi));
}
// the same with hi truncated (x's top 19 bits; lo = x - hi holds up to 13 significant bits, of which the instruction
// reads 11: the lost part is below 2^-21 |x|, and an infinity's lo is NaN as above)
__device__ __forceinline__ void loopir_tf32_split_trunc(float x, unsigned& hi, unsigned& lo) {
  hi = __float_as_uint(x) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi));
}
"""


def _checked(r: Any, f: N.For) -> Any:
    """The checked operands (MmaOperands) of the tensorized nest `f`."""
    lanes = {lf.var: lf for lf in walk(r.nest) if isinstance(lf, N.For) and lf.thread == "threadIdx.x"}
    try:
        ops = mma_operands(f, lanes, what="CUDA mma")
    except TensorizeError as e:
        raise CudaCodegenError(f"tensorized loop {f.var.name!r} changed shape before rendering: {e}") from e
    if ops.store.buffer.dtype != "float32":
        raise CudaCodegenError(f"mma accumulator {ops.store.buffer.name!r} is {ops.store.buffer.dtype}; "
                               "the widen_accumulators pass should have made it float32")
    return ops


def _accumulators(r: Any, ops: Any) -> list[str]:
    """The lane's four accumulator elements (eh, el) = (e // 2, e % 2)."""
    out = []
    for e in range(4):
        at = {ops.eh: N.const(e // 2), ops.el: N.const(e % 2), ops.k: N.const(0)}
        idx = tuple(substitute(i, at) for i in ops.store.indices)
        out.append(f"{r.buf(ops.store.buffer)}[{r.expr(r.flat(ops.store.buffer, idx))}]")
    return out


def _address(r: Any, ld: N.Load, at: dict[N.Var, N.Expr]) -> str:
    """The shared-memory address of `ld` with the substitutions `at` (an ldmatrix operand)."""
    idx = tuple(substitute(i, at) for i in ld.indices)
    return f"(unsigned)__cvta_generic_to_shared(&{r.buf(ld.buffer)}[{r.expr(r.flat(ld.buffer, idx))}])"


def _a_lanes(ops: Any, k: int) -> dict[N.Var, N.Expr]:
    """ldmatrix.x4 of A: lane l addresses row l % 16 of the 16-row fragment at k column `k` (l / 16) (a row of a
    b16 8 x 8 matrix is 16 bytes: 8 halves, or 4 floats, whose four matrices are then m16n8k8 tf32's a0..a3: rows
    g, g + 8 at columns t, t + 4 with g = l / 4, t = l % 4)."""
    lane, i16 = ops.lane, N.const(16)
    lm = N.binary("mod", lane, i16)
    return {ops.eh: N.binary("floordiv", lm, N.const(8)), lane: N.binary("mul", N.binary("mod", lm, N.const(8)),
                                                                          N.const(4)),
            ops.el: N.const(0), ops.k: N.binary("mul", N.binary("floordiv", lane, i16), N.const(k))}


def _parts(r: Any, f: N.For, b_extra: dict[N.Var, N.Expr] | None = None):
    """The half-precision nest `f`'s operands, the ldmatrix address of A / B and the four accumulators (`b_extra`:
    further substitutions in B's address, e.g. the column block taken from the lane)."""
    ops = _checked(r, f)
    zero = N.const(0)
    b_at = {ops.eh: zero, ops.el: zero, ops.lane: zero, ops.k: N.binary("mod", ops.lane, N.const(16)),
            **(b_extra or {})}
    return ops, _address(r, ops.a, _a_lanes(ops, 8)), _address(r, ops.b, b_at), _accumulators(r, ops)


def _tf32_parts(r: Any, ops: Any) -> list[tuple[str, list[str]]]:
    """Per m16n8k8 step j of the float32 nest (k 8 each): A's ldmatrix address at k + 8 j, and B's fragment
    b0 = B[k0 + 8 j + t, c0 + g], b1 = B[k0 + 8 j + t + 4, c0 + g] as two shared loads (no ldmatrix transposes
    32-bit elements; conflict-free on rows of 8 mod 32 floats: codegen.passes.mma)."""
    lane, zero = ops.lane, N.const(0)
    a_at = _a_lanes(ops, 4)
    steps: list[tuple[str, list[str]]] = []
    for j in range(MMA_SHAPES[ops.kind][2] // 8):
        bs = []
        for h in (0, 4):
            at = {ops.eh: zero, ops.el: zero, lane: zero,
                  ops.k: N.binary("add", N.binary("mod", lane, N.const(4)), N.const(8 * j + h))}
            idx = tuple(substitute(i, at) for i in ops.b.indices)
            idx = (*idx[:-1], N.binary("add", idx[-1], N.binary("floordiv", lane, N.const(4))))
            bs.append(f"{r.buf(ops.b.buffer)}[{r.expr(r.flat(ops.b.buffer, idx))}]")
        steps.append((_address(r, ops.a, {**a_at, ops.k: N.binary("add", a_at[ops.k], N.const(8 * j))}), bs))
    return steps


def _ldmatrix_a(r: Any, regs: list[str], address: str) -> None:
    r.line('asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\\n" '
           f': "=r"({regs[0]}), "=r"({regs[1]}), "=r"({regs[2]}), "=r"({regs[3]}) : "r"({address}));')


def _ldmatrix_b(r: Any, regs: list[str], address: str) -> None:
    r.line('asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\\n" '
           f': "=r"({regs[0]}), "=r"({regs[1]}) : "r"({address}));')


def _ldmatrix_b2(r: Any, regs: list[str], address: str) -> None:
    r.line('asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\\n" '
           f': "=r"({regs[0]}), "=r"({regs[1]}), "=r"({regs[2]}), "=r"({regs[3]}) : "r"({address}));')


def _mma(r: Any, t: str, accs: list[str], a: list[str], b: list[str], shape: str = "m16n8k16",
         zero: bool = False) -> None:
    """accs += A B on one mma.sync of `shape` with operands of type `t` (four A and two B registers: m16n8k16 on
    f16 / bf16, m16n8k8 on tf32), float32 accumulators; `zero`: accs = A B (the instruction's C operand zero)."""
    c = "{%10, %10, %10, %10}" if zero else "{%0, %1, %2, %3}"
    out = "=f" if zero else "+f"
    r.line(f'asm volatile("mma.sync.aligned.{shape}.row.col.f32.{t}.{t}.f32 {{%0, %1, %2, %3}}, '
           f'{{%4, %5, %6, %7}}, {{%8, %9}}, {c};\\n" '
           f': "{out}"({accs[0]}), "{out}"({accs[1]}), "{out}"({accs[2]}), "{out}"({accs[3]}) '
           f': "r"({a[0]}), "r"({a[1]}), "r"({a[2]}), "r"({a[3]}), "r"({b[0]}), "r"({b[1]})'
           + (', "f"(0.0f)' if zero else "") + ");")


def render_mma(r: Any, f: N.For) -> None:
    """Emit the instruction for the tensorized nest `f` with renderer `r` (codegen.cuda.kernel's)."""
    if f.kind == MMA_TF32:
        ops = _checked(r, f)
        steps = _tf32_parts(r, ops)
        accs = _accumulators(r, ops)
    else:
        ops, a_addr, b_addr, accs = _parts(r, f)
    r.line("{  // " + f"{ops.kind}: {ops.store.name} (lane {ops.lane.name})")
    r.ind += 1
    if ops.tf32:
        r.uses_tf32 = True
        n = len(steps)
        r.line(f"unsigned a[4], ah[{n}][4], al[{n}][4], bh[{n}][2], bl[{n}][2];")
        for j, (aj, bj) in enumerate(steps):
            _ldmatrix_a(r, [f"a[{q}]" for q in range(4)], aj)
            _split(r, [f"__uint_as_float(a[{q}])" for q in range(4)], f"ah[{j}]", f"al[{j}]")
            _split(r, bj, f"bh[{j}]", f"bl[{j}]")
        _mma3(r, accs, [(f"ah[{j}]", f"al[{j}]", f"bh[{j}]", f"bl[{j}]") for j in range(n)])
    else:
        r.line("unsigned a0, a1, a2, a3, b0, b1;")
        _ldmatrix_a(r, ["a0", "a1", "a2", "a3"], a_addr)
        _ldmatrix_b(r, ["b0", "b1"], b_addr)
        _mma(r, _PTX_TYPE[ops.a.buffer.dtype], accs, ["a0", "a1", "a2", "a3"], ["b0", "b1"])
    r.ind -= 1
    r.line("}")


def _split(r: Any, xs: list[str], hi: str, lo: str) -> None:
    """`hi[q]`, `lo[q]` = the TF32 split of the float `xs[q]` (loopir_tf32_split_trunc: hi truncated, one
    instruction fewer than rounded; in the issue-bound GEMM 5-9% faster, the error against float64 the same
    within 25%)."""
    for q, x in enumerate(xs):
        r.line(f"loopir_tf32_split_trunc({x}, {hi}[{q}], {lo}[{q}]);")


def _mma3(r: Any, accs: list[str], steps: list[tuple[str, str, str, str]]) -> None:
    """accs += the sum over the k steps (ah, al, bh, bl) of a_lo b_hi + a_hi b_lo + a_hi b_hi on m16n8k8 tf32 (the
    small products first, so that the large one does not absorb them), summed from zero, then added by rounded
    float32 adds: the tensor core's accumulation truncates, and chained over every k step into the accumulators its
    error grew with K (H200, 4096^3: 2.7e-5 of the largest output against float64, cuBLAS's float32 GEMM 2.5e-6;
    summed per 16 k: 8.8e-7). Per 8 k it was 1.25-1.4x slower (the kernel is bound by issue slots: 4 adds per
    3 instructions), per 32 k the fragments of four steps spilled."""
    prods = [([f"{a}[{q}]" for q in range(4)], [f"{b}[{q}]" for q in range(2)])
             for ah, al, bh, bl in steps for a, b in ((al, bh), (ah, bl), (ah, bh))]
    d = r.names.fresh("tf32_d")
    r.line(f"float {d}[4];")
    ds = [f"{d}[{q}]" for q in range(4)]
    for i, (a, b) in enumerate(prods):
        _mma(r, "tf32", ds, a, b, "m16n8k8", zero=i == 0)
    for q in range(4):
        r.line(f"{accs[q]} += {d}[{q}];")


def _unrolled_for(r: Any, header: str) -> None:
    """Open `#pragma unroll` + `for (header) {` one level deeper (the caller closes it)."""
    r.line("#pragma unroll")
    r.line(f"for ({header}) {{")
    r.ind += 1


def render_mma_grid(r: Any, f: N.For) -> None:
    """Emit `for mi: for ni: <tensorized nest>` (`Kernel.mma_grids`, codegen.passes.mma: A does not depend on
    ni, B not on mi) with each A fragment loaded once per mi and each B fragment once per ni, then the grid of
    instructions on the registers: MI + NI ldmatrix per k step instead of 2 * MI * NI."""
    ni = f.body
    while isinstance(ni, N.Seq) and len(ni.body) == 1:
        ni = ni.body[0]
    nest = ni.body if isinstance(ni, N.For) else None
    while isinstance(nest, N.Seq) and len(nest.body) == 1:
        nest = nest.body[0]
    if not (isinstance(ni, N.For) and isinstance(nest, N.For) and nest.kind.startswith("mma.")):
        raise CudaCodegenError(f"loop {f.var.name!r} is marked an mma grid but does not hold `for ni: <mma nest>`")
    ext = []
    for x in (f, ni):
        lo, hi = getattr(x.lo, "value", None), getattr(x.hi, "value", None)
        if not (isinstance(lo, int) and isinstance(hi, int)):
            raise CudaCodegenError(f"mma grid loop {x.var.name!r} has non-constant bounds")
        ext.append((lo, hi))
    (m0, m1), (n0, n1) = ext
    if nest.kind == MMA_TF32:
        return _render_grid_tf32(r, f, ni, nest, (m0, m1), (n0, n1))
    # two B fragments (columns ni, ni + 1) per ldmatrix.x4.trans: lanes 16..31 address the second one
    pair = (n1 - n0) % 2 == 0
    lane16 = {}
    if pair:
        lanes = [lf.var for lf in walk(r.nest) if isinstance(lf, N.For) and lf.thread == "threadIdx.x"]
        lane16 = {ni.var: N.binary("add", ni.var, N.binary("floordiv", lanes[0], N.const(16)))} if lanes else {}
    ops, a_addr, b_addr, accs = _parts(r, nest, lane16)
    t = _PTX_TYPE[ops.a.buffer.dtype]
    mv, nv = r.var(f.var), r.var(ni.var)
    fa, fb = r.names.fresh("frag_a"), r.names.fresh("frag_b")
    nb, j = r.names.fresh(f"{ni.var.name}_b"), r.names.fresh("frag_j")
    step = 2 if lane16 else 1
    ix = r.ix
    r.line(f"{{  // mma grid {f.var.name} x {ni.var.name}: {ops.store.name}, fragments loaded once per row / column")
    r.ind += 1
    # all A fragments of the k step first, then per B fragment (pair) its column of instructions: the live
    # registers are the accumulators, MI x 4 A words and 2 x step B words
    r.line(f"unsigned {fa}[{m1 - m0}][4];")
    _unrolled_for(r, f"{ix} {mv} = {m0}; {mv} < {m1}; ++{mv}")
    _ldmatrix_a(r, [f"{fa}[{mv} - {m0}][{q}]" for q in range(4)], a_addr)
    r.ind -= 1
    r.line("}")
    _unrolled_for(r, f"{ix} {nb} = {n0}; {nb} < {n1}; {nb} += {step}")
    r.line(f"unsigned {fb}[{step}][2];")
    r.line("{")
    r.ind += 1
    r.line(f"const {ix} {nv} = {nb};")
    if lane16:
        _ldmatrix_b2(r, [f"{fb}[{q // 2}][{q % 2}]" for q in range(4)], b_addr)
    else:
        _ldmatrix_b(r, [f"{fb}[0][{q}]" for q in range(2)], b_addr)
    r.ind -= 1
    r.line("}")
    _unrolled_for(r, f"int {j} = 0; {j} < {step}; ++{j}")
    r.line(f"const {ix} {nv} = {nb} + {j};")
    _unrolled_for(r, f"{ix} {mv} = {m0}; {mv} < {m1}; ++{mv}")
    _mma(r, t, accs, [f"{fa}[{mv} - {m0}][{q}]" for q in range(4)], [f"{fb}[{j}][{q}]" for q in range(2)])
    for _ in range(3):
        r.ind -= 1
        r.line("}")
    r.ind -= 1
    r.line("}")


def _render_grid_tf32(r: Any, f: N.For, ni: N.For, nest: N.For, ms: tuple[int, int], ns: tuple[int, int]) -> None:
    """render_mma_grid for the TF32 nest: the A fragments of the nest's k steps loaded (ldmatrix.x4 of 32-bit words)
    and split once per mi, each B fragment (two shared loads per k step) split once per ni, then three instructions
    per k step and (mi, ni): MI + NI splits per k step instead of 2 * MI * NI."""
    ops = _checked(r, nest)
    steps, accs = _tf32_parts(r, ops), _accumulators(r, ops)
    r.uses_tf32 = True
    (m0, m1), (n0, n1) = ms, ns
    ns_ = len(steps)
    mv, nv = r.var(f.var), r.var(ni.var)
    ah, al, bh, bl = (r.names.fresh(x) for x in ("frag_ah", "frag_al", "frag_bh", "frag_bl"))
    a, nb = r.names.fresh("frag_a"), r.names.fresh(f"{ni.var.name}_b")
    ix = r.ix
    r.line(f"{{  // mma grid {f.var.name} x {ni.var.name}: {ops.store.name}, three TF32 products per fragment "
           "(x = hi + lo), fragments loaded and split once per row / column")
    r.ind += 1
    r.line(f"unsigned {ah}[{m1 - m0}][{ns_}][4], {al}[{m1 - m0}][{ns_}][4];")
    _unrolled_for(r, f"{ix} {mv} = {m0}; {mv} < {m1}; ++{mv}")
    r.line(f"unsigned {a}[4];")
    for j, (aj, _) in enumerate(steps):
        _ldmatrix_a(r, [f"{a}[{q}]" for q in range(4)], aj)
        _split(r, [f"__uint_as_float({a}[{q}])" for q in range(4)], f"{ah}[{mv} - {m0}][{j}]",
               f"{al}[{mv} - {m0}][{j}]")
    r.ind -= 1
    r.line("}")
    _unrolled_for(r, f"{ix} {nb} = {n0}; {nb} < {n1}; ++{nb}")
    r.line(f"const {ix} {nv} = {nb};")
    r.line(f"unsigned {bh}[{ns_}][2], {bl}[{ns_}][2];")
    for j, (_, bj) in enumerate(steps):
        _split(r, bj, f"{bh}[{j}]", f"{bl}[{j}]")
    _unrolled_for(r, f"{ix} {mv} = {m0}; {mv} < {m1}; ++{mv}")
    _mma3(r, accs, [(f"{ah}[{mv} - {m0}][{j}]", f"{al}[{mv} - {m0}][{j}]", f"{bh}[{j}]", f"{bl}[{j}]")
                    for j in range(ns_)])
    for _ in range(2):
        r.ind -= 1
        r.line("}")
    r.ind -= 1
    r.line("}")
