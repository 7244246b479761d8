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

__all__ = ["render_mma"]

_PTX_TYPE = {"float16": "f16", "bfloat16": "bf16"}


def render_mma(r: Any, f: N.For) -> None:
    """Emit the instruction for the tensorized nest `f` with renderer `r` (codegen.cuda.kernel's)."""
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
    b_at = {ops.eh: zero, ops.el: zero, lane: zero, ops.k: lm}

    def addr(ld: N.Load, at: dict[N.Var, N.Expr]) -> str:
        idx = tuple(substitute(i, at) for i in ld.indices)
        return f"(unsigned)__cvta_generic_to_shared(&{r.buf(ld.buffer)}[{r.expr(r.flat(ld.buffer, idx))}])"

    accs = []
    for e in range(4):
        at = {ops.eh: N.const(e // 2), ops.el: N.const(e % 2), ops.k: zero}
        idx = tuple(substitute(i, at) for i in ops.store.indices)
        accs.append(f"{r.buf(ops.store.buffer)}[{r.expr(r.flat(ops.store.buffer, idx))}]")
    t = _PTX_TYPE[ops.a.buffer.dtype]
    r.line("{  // mma.m16n8k16: " + f"{ops.store.name} (lane {lane.name})")
    r.ind += 1
    r.line("unsigned a0, a1, a2, a3, b0, b1;")
    r.line('asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\\n" '
           f': "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"({addr(ops.a, a_at)}));')
    r.line('asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\\n" '
           f': "=r"(b0), "=r"(b1) : "r"({addr(ops.b, b_at)}));')
    r.line(f'asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{%0, %1, %2, %3}}, '
           '{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\\n" '
           f': "+f"({accs[0]}), "+f"({accs[1]}), "+f"({accs[2]}), "+f"({accs[3]}) '
           ': "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));')
    r.ind -= 1
    r.line("}")
