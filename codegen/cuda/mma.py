"""Rendering of a tensorized nest (For kind "mma.m16n8k16", see schedules/primitives/tensorize.py) as tensor-core PTX.

The nest is the reference semantics of one lane's four accumulator elements; here it becomes, per warp:

    ldmatrix.x4        A fragment: lane l gives the address of row r0 + l % 16, column k0 + 8 * (l / 16)
    ldmatrix.x2.trans  B fragment: lane l gives the address of row k0 + l % 16, column c0 (B is k-major in shared)
    mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 on the lane's four accumulators

The addresses are the nest's own index expressions with (lane, eh, el, k) substituted, so they are exactly the
elements the reference reads (tensorize checked the layout). Inline PTX: the pip NVRTC ships no headers.
"""

from __future__ import annotations

from typing import Any

from loopir import nodes as N
from loopir.errors import CudaCodegenError
from loopir.visit import substitute, walk
from schedules.primitives.tensorize import TensorizeError, mma_operands

__all__ = ["render_mma", "render_mma_grid"]

_PTX_TYPE = {"float16": "f16", "bfloat16": "bf16"}


def _parts(r: Any, f: N.For, b_extra: dict[N.Var, N.Expr] | None = None):
    """The checked operands of the tensorized nest `f`, the ldmatrix address of A / B and the four accumulators
    (`b_extra`: further substitutions in B's address, e.g. the column block taken from the lane)."""
    lanes = {lf.var: lf for lf in walk(r.nest) if isinstance(lf, N.For) and lf.thread == "threadIdx.x"}
    try:
        ops = mma_operands(f, lanes, what="CUDA mma")
    except TensorizeError as e:
        raise CudaCodegenError(f"tensorized loop {f.var.name!r} changed shape before rendering: {e}") from e
    if ops.store.buffer.dtype != "float32":
        raise CudaCodegenError(f"mma accumulator {ops.store.buffer.name!r} is {ops.store.buffer.dtype}; "
                               "the widen_accumulators pass should have made it float32")
    lane, i16 = ops.lane, N.const(16)
    zero = N.const(0)
    lm = N.binary("mod", lane, i16)
    a_at = {ops.eh: N.binary("floordiv", lm, N.const(8)),
            lane: N.binary("mul", N.binary("mod", lm, N.const(8)), N.const(4)),
            ops.el: zero, ops.k: N.binary("mul", N.binary("floordiv", lane, i16), N.const(8))}
    b_at = {ops.eh: zero, ops.el: zero, lane: zero, ops.k: lm, **(b_extra or {})}

    def addr(ld: N.Load, at: dict[N.Var, N.Expr]) -> str:
        idx = tuple(substitute(i, at) for i in ld.indices)
        return f"(unsigned)__cvta_generic_to_shared(&{r.buf(ld.buffer)}[{r.expr(r.flat(ld.buffer, idx))}])"

    accs = []
    for e in range(4):
        at = {ops.eh: N.const(e // 2), ops.el: N.const(e % 2), ops.k: zero}
        idx = tuple(substitute(i, at) for i in ops.store.indices)
        accs.append(f"{r.buf(ops.store.buffer)}[{r.expr(r.flat(ops.store.buffer, idx))}]")
    return ops, addr(ops.a, a_at), addr(ops.b, b_at), accs


def _ldmatrix_a(r: Any, regs: list[str], address: str) -> None:
    r.line('asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\\n" '
           f': "=r"({regs[0]}), "=r"({regs[1]}), "=r"({regs[2]}), "=r"({regs[3]}) : "r"({address}));')


def _ldmatrix_b(r: Any, regs: list[str], address: str) -> None:
    r.line('asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\\n" '
           f': "=r"({regs[0]}), "=r"({regs[1]}) : "r"({address}));')


def _ldmatrix_b2(r: Any, regs: list[str], address: str) -> None:
    r.line('asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\\n" '
           f': "=r"({regs[0]}), "=r"({regs[1]}), "=r"({regs[2]}), "=r"({regs[3]}) : "r"({address}));')


def _mma(r: Any, t: str, accs: list[str], a: list[str], b: list[str], shape: str = "m16n8k16") -> None:
    """accs += A B on one mma.sync of `shape` with operands of type `t` (four A and two B registers: m16n8k16 on
    f16 / bf16, m16n8k8 on tf32), float32 accumulators."""
    r.line(f'asm volatile("mma.sync.aligned.{shape}.row.col.f32.{t}.{t}.f32 {{%0, %1, %2, %3}}, '
           '{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\\n" '
           f': "+f"({accs[0]}), "+f"({accs[1]}), "+f"({accs[2]}), "+f"({accs[3]}) '
           f': "r"({a[0]}), "r"({a[1]}), "r"({a[2]}), "r"({a[3]}), "r"({b[0]}), "r"({b[1]}));')


def render_mma(r: Any, f: N.For) -> None:
    """Emit the instruction for the tensorized nest `f` with renderer `r` (codegen.cuda.kernel's)."""
    ops, a_addr, b_addr, accs = _parts(r, f)
    t = _PTX_TYPE[ops.a.buffer.dtype]
    r.line("{  // mma.m16n8k16: " + f"{ops.store.name} (lane {ops.lane.name})")
    r.ind += 1
    r.line("unsigned a0, a1, a2, a3, b0, b1;")
    _ldmatrix_a(r, ["a0", "a1", "a2", "a3"], a_addr)
    _ldmatrix_b(r, ["b0", "b1"], b_addr)
    _mma(r, t, accs, ["a0", "a1", "a2", "a3"], ["b0", "b1"])
    r.ind -= 1
    r.line("}")


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
