"""GPU-bound test programs whose threads communicate through memory (issue 10: catch races without a GPU).

Each builder returns a `GpuCase`: a scheduled (not yet lowered) program, random inputs, the numpy
reference of its outputs, and `needs_barriers` — True when the kernel races without the barrier
pass (`codegen.passes.barriers.place_barriers`) today, i.e. some adversarial order of
`interp.run(..., gpu_order=...)` gives a wrong result. `check(case, order)` lowers it for CUDA,
runs it in the GPU mode of the interpreter and compares with the reference.

- `attention(B, n, m, d)`: the issue's repro, fused by auto_schedule into one kernel per (b, i) row
  (scores, row max, probabilities, output, row sum). With d >= 32 the probabilities `p` are kept
  in a buffer written by each thread for 4 columns and read by every thread: a race without a
  barrier. With small d, `p` is inlined and every cross-thread read of `scores` follows a
  cross-thread reduction (whose all-reduce synchronises the block): correct already.
- `reversed_rows`, `shifted_rows`: a row reduction t (kept in a buffer, fused into the consumer's
  row kernel) and a consumer y[i, j] = t[i, m-1-j] (reversed rows) or t[i, j+1] - t[i, j] (shifted,
  4 columns per thread): each reads what other threads wrote.
- `transposed_tiles`: a tile of t written by thread (ty, tx) at (ty, tx), read transposed by the
  same block: y = t^T through global memory (hand-written with the builder, then bound).
- `softmax_matmul`: a row softmax followed by a matmul (auto_schedule: a row kernel whose row is
  staged in shared memory, then the tiled GEMM kernel with cooperative shared-memory copies; or, with
  `gemm=False`, the matmul as another phase of the row kernel).
- `racy_shift(offset, barrier)`: the smallest race: phase 1 writes A[b, tx], phase 2 reads
  A[b, tx + 1] (offset 1; offset -1: thread t reads A[b, t - 1]) in the same block, with or without a
  barrier between.
- `bind_loops(program, {loop name: axis})`: bind loops of a builder program by name (the builder
  makes serial loops only).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loopir import interp, ir, te, workloads
from loopir.nodes import For, Program
from loopir.visit import Transformer

Arrays = dict[str, np.ndarray]


@dataclass
class GpuCase:
    name: str
    program: Program  # scheduled for CUDA, not lowered
    make_inputs: Callable[[np.random.Generator], Arrays]
    reference: Callable[[Arrays], Arrays]  # outputs by name, from the inputs (float64 math)
    needs_barriers: bool = False
    tolerance: float = 1e-4
    notes: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"GpuCase({self.name})"

    def lowered(self) -> Program:
        from codegen.passes import lower

        if "lowered" not in self.meta:
            self.meta["lowered"] = lower(self.program, "cuda")
        return self.meta["lowered"]

    def arrays(self, seed: int = 0, program: Program | None = None) -> tuple[list[np.ndarray], Arrays]:
        """(the arrays in the program's argument order, the inputs by name); outputs NaN-filled."""
        p = program or self.program
        ins = self.make_inputs(np.random.default_rng(seed))
        shapes = {k: v.shape for k, v in self.reference(ins).items()}  # outputs of symbolic shape too
        out = []
        for b in p.args:
            if b.name in ins:
                out.append(ins[b.name].copy())
            else:
                out.append(np.full(shapes[b.name], np.nan, dtype=b.dtype))
        return out, ins

    def run(self, order: Any, seed: int = 0, lower: bool = True) -> tuple[Arrays, Arrays]:
        """(outputs by name, expected by name) after running under `gpu_order=order`."""
        p = self.lowered() if lower else self.program
        arrs, ins = self.arrays(seed, p)
        interp.run(p, *arrs, gpu_order=order)
        expected = self.reference(ins)
        got = {b.name: a for b, a in zip(p.args, arrs) if b.name in expected}
        return got, expected


def close(got: Arrays, expected: Arrays, tolerance: float) -> bool:
    return all(np.allclose(got[k], v, rtol=tolerance, atol=tolerance) for k, v in expected.items())


def check(case: GpuCase, order: Any, seed: int = 0, lower: bool = True) -> None:
    """Assert that `case` computes its reference under `gpu_order=order`."""
    got, expected = case.run(order, seed, lower)
    for k, v in expected.items():
        if not np.allclose(got[k], v, rtol=case.tolerance, atol=case.tolerance):
            err = np.abs(got[k].astype(np.float64) - v)
            worst = float(np.max(err[~np.isnan(err)])) if (~np.isnan(err)).any() else float("nan")
            raise AssertionError(f"{case.name} under gpu_order={order!r}: output {k!r} differs from numpy "
                                 f"({int(np.isnan(got[k]).sum())} NaN of {v.size}, max error {worst})")


def bind_loops(program: Program, axes: dict[str, str]) -> Program:
    """`program` with the loops named in `axes` bound to those GPU axes (kind "thread")."""
    seen: set[str] = set()

    class _Bind(Transformer):
        def visit_For(self, f: For) -> For:
            f = self.generic(f)
            if f.var.name in axes:
                seen.add(f.var.name)
                return dataclasses.replace(f, kind="thread", thread=axes[f.var.name])
            return f

    out = _Bind().visit(program)
    missing = set(axes) - seen
    if missing:
        raise ValueError(f"bind_loops: no loop named {', '.join(sorted(missing))} in {program.name!r}")
    return out


def _rng_inputs(shapes: dict[str, tuple[int, ...]]) -> Callable[[np.random.Generator], Arrays]:
    return lambda rng: {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def _auto(outs: list[Any], **kw: Any) -> Program:
    from schedules import auto_schedule

    kw.setdefault("online", False)  # these cases test the materialized chain; the online form: test_online_softmax
    return auto_schedule(outs, target="cuda", **kw).program


# ----------------------------------------------------------------------------- attention (the repro)

ATTENTION_SIZES = ((2, 5, 37, 8), (1, 4, 32, 4), (2, 3, 130, 8), (2, 5, 37, 32), (1, 3, 20, 40))


def _attention_te(B: Any, n: Any, m: Any, d: Any, dtype: str = "float32") -> tuple[list[Any], Any]:
    """The naive attention of the race-free issue in te: (Q, K, V) and Y; sizes may be te.var."""
    Q = te.placeholder((B, n, d), dtype, name="Q")
    K = te.placeholder((B, m, d), dtype, name="K")
    V = te.placeholder((B, m, d), dtype, name="V")
    r = te.reduce_axis(d, "r")
    S = te.compute((B, n, m), lambda b, i, j: te.sum(Q[b, i, r] * K[b, j, r], axis=r), name="scores")
    r2 = te.reduce_axis(m, "r2")
    mx = te.compute((B, n), lambda b, i: te.max(S[b, i, r2], axis=r2), name="mx")
    P = te.compute((B, n, m), lambda b, i, j: te.exp(S[b, i, j] - mx[b, i]) * 0.125, name="p")
    r3 = te.reduce_axis(m, "r3")
    sm = te.compute((B, n), lambda b, i: te.sum(P[b, i, r3], axis=r3), name="sm")
    r4 = te.reduce_axis(m, "r4")
    O = te.compute((B, n, d), lambda b, i, c: te.sum(P[b, i, r4] * V[b, r4, c], axis=r4), name="O")  # noqa: E741
    Y = te.compute((B, n, d), lambda b, i, c: O[b, i, c] / sm[b, i], name="Y")
    return [Q, K, V], Y


def _attention_ref(a: Arrays) -> Arrays:
    q, k, v = (a[x].astype(np.float64) for x in "QKV")
    s = np.einsum("bir,bjr->bij", q, k)
    p = np.exp(s - s.max(axis=-1, keepdims=True)) * 0.125
    return {"Y": np.einsum("bij,bjc->bic", p, v) / p.sum(axis=-1)[..., None]}


@functools.cache
def attention(B: int, n: int, m: int, d: int) -> GpuCase:
    """S = sum_r Q[b,i,r] K[b,j,r]; mx = max_r2 S; P = exp(S - mx) * 0.125; sm = sum_r3 P;
    O = sum_r4 P[b,i,r4] V[b,r4,c]; Y = O / sm — auto_schedule(target="cuda", gemm=False): one kernel (the
    race-free issue's repro; by default S and O are batched GEMM kernels of their own)."""
    _, Y = _attention_te(B, n, m, d)
    return GpuCase(f"attention_B{B}_n{n}_m{m}_d{d}", _auto([Y], gemm=False),
                   _rng_inputs({"Q": (B, n, d), "K": (B, m, d), "V": (B, m, d)}), _attention_ref,
                   needs_barriers=d >= 32,
                   notes="p materialized (d >= 32): written 4 columns per thread, read by all" if d >= 32 else
                   "p inlined: scores and O are read by other threads only after a cross-thread reduction")


def attention_user(B: int, n: int, m: int, d: int, dtype: str = "float32") -> GpuCase:
    """The user's path: batch, rows and keys as te.var (d fixed), built for the sizes given at call time."""
    _, Y = _attention_te(te.var("B"), te.var("n"), te.var("m"), d, dtype)

    def inputs(rng: np.random.Generator) -> Arrays:
        return {k: rng.standard_normal(s).astype(dtype) for k, s in
                {"Q": (B, n, d), "K": (B, m, d), "V": (B, m, d)}.items()}

    # float16: scores, p and O are stored as halves (11-bit mantissa) between the stages
    return GpuCase(f"attention_var_B{B}_n{n}_m{m}_d{d}_{dtype}", _auto([Y]), inputs, _attention_ref,
                   tolerance=1e-1 if dtype == "float16" else 1e-4)


# ----------------------------------------------------------------------------- producer / consumer pairs


def _row_max(n: int, m: int) -> tuple[Any, Any]:
    x = te.placeholder((n, m, 3), name="x")
    r = te.reduce_axis(3, "r")
    t = te.compute((n, m), lambda i, j: te.max(x[i, j, r] * 2.0, axis=r), name="t")
    return x, t


@functools.cache
def reversed_rows(n: int = 5, m: int = 37) -> GpuCase:
    """t[i, j] = max_r 2 x[i, j, r] (a reduction: kept in a buffer, in the consumer's row kernel);
    y[i, j] = 2 t[i, m-1-j]: thread j reads what thread m-1-j wrote."""
    x, t = _row_max(n, m)
    y = te.compute((n, m), lambda i, j: t[i, m - 1 - j] * 2.0, name="y")
    return GpuCase(f"reversed_rows_{n}x{m}", _auto([y]), _rng_inputs({"x": (n, m, 3)}),
                   lambda a: {"y": (a["x"].astype(np.float64) * 2).max(axis=2)[:, ::-1] * 2},
                   needs_barriers=True)


@functools.cache
def shifted_rows(n: int = 5, m: int = 37) -> GpuCase:
    """t as in `reversed_rows`; y[i, j] = t[i, j+1] - t[i, j] (4 columns per thread): reads of t[i, j+1]
    cross to the next thread at every 4th column."""
    x, t = _row_max(n, m)
    y = te.compute((n, m - 1), lambda i, j: t[i, j + 1] - t[i, j], name="y")

    def ref(a: Arrays) -> Arrays:
        tt = (a["x"].astype(np.float64) * 2).max(axis=2)
        return {"y": tt[:, 1:] - tt[:, :-1]}

    return GpuCase(f"shifted_rows_{n}x{m}", _auto([y]), _rng_inputs({"x": (n, m, 3)}), ref, needs_barriers=True)


@functools.cache
def transposed_tiles(N: int = 13, T: int = 8) -> GpuCase:
    """Blocks (bi, bj) of T x T threads: thread (ty, tx) writes t[bi*T+ty, bj*T+tx] = 2 x + 1, then reads
    t[bi*T+tx, bj*T+ty] (written by thread (tx, ty)) into y[bj*T+ty, bi*T+tx]: y = t^T. N need not be a
    multiple of T (guards)."""
    nb = -(-N // T)
    x = ir.buffer((N, N), name="x")
    y = ir.buffer((N, N), name="y")
    b = ir.Builder("transpose")
    t = b.temp((N, N), name="t")
    with b.loop("bi", 0, nb) as bi, b.loop("bj", 0, nb) as bj:
        with b.loop("ty", 0, T) as ty, b.loop("tx", 0, T) as tx:
            with b.if_((bi * T + ty < N) & (bj * T + tx < N)):
                b.store(t, (bi * T + ty, bj * T + tx), x[bi * T + ty, bj * T + tx] * 2.0 + 1.0, name="P")
        with b.loop("ty2", 0, T) as ty2, b.loop("tx2", 0, T) as tx2:
            with b.if_((bi * T + tx2 < N) & (bj * T + ty2 < N)):
                b.store(y, (bj * T + ty2, bi * T + tx2), t[bi * T + tx2, bj * T + ty2], name="C")
    prog = bind_loops(b.finish([x, y]), {"bi": "blockIdx.y", "bj": "blockIdx.x", "ty": "threadIdx.y",
                                         "tx": "threadIdx.x", "ty2": "threadIdx.y", "tx2": "threadIdx.x"})
    return GpuCase(f"transposed_tiles_{N}_T{T}", prog, _rng_inputs({"x": (N, N)}),
                   lambda a: {"y": (a["x"].astype(np.float64) * 2 + 1).T}, needs_barriers=True)


@functools.cache
def softmax_matmul(n: int = 5, m: int = 37, c: int = 8, gemm: bool = True) -> GpuCase:
    """p = softmax(x) over rows (n, m), o = p @ w with w (m, c); auto_schedule(target="cuda", gemm=gemm)."""
    x = te.placeholder((n, m), name="x")
    w = te.placeholder((m, c), name="w")
    k = te.reduce_axis(m, "k")
    mx = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="mx")
    e = te.compute((n, m), lambda i, j: te.exp(x[i, j] - mx[i]), name="e")
    k2 = te.reduce_axis(m, "k2")
    sm = te.compute((n,), lambda i: te.sum(e[i, k2], axis=k2), name="sm")
    p = te.compute((n, m), lambda i, j: e[i, j] / sm[i], name="p")
    k3 = te.reduce_axis(m, "k3")
    o = te.compute((n, c), lambda i, j: te.sum(p[i, k3] * w[k3, j], axis=k3), name="o")

    def ref(a: Arrays) -> Arrays:
        xx = a["x"].astype(np.float64)
        ee = np.exp(xx - xx.max(axis=1, keepdims=True))
        return {"o": (ee / ee.sum(axis=1, keepdims=True)) @ a["w"].astype(np.float64)}

    return GpuCase(f"softmax_matmul_{n}x{m}x{c}{'' if gemm else '_rows'}", _auto([o], gemm=None if gemm else False),
                   _rng_inputs({"x": (n, m), "w": (m, c)}), ref)


@functools.cache
def workload(name: str, **sizes: int) -> GpuCase:
    """A seed workload of loopir.workloads at constant sizes, auto_schedule(target="cuda")."""
    w = workloads.SEEDS[name](**sizes)
    ins_shapes = {x.name: w.shape_of(x, {}) for x in w.inputs}

    def ref(a: Arrays) -> Arrays:
        outs = w.reference(*(a[x.name] for x in w.inputs))
        return {o.name: np.asarray(v, np.float64) for o, v in zip(w.outputs, outs)}

    tag = "x".join(str(v) for v in sizes.values())
    return GpuCase(f"{name}_{tag}", _auto(list(w.outputs)), _rng_inputs(ins_shapes), ref,
                   tolerance=max(w.tolerance, 1e-5) * 10)


# (builder, args, needs_barriers): tests parametrize over these without building (auto_schedule takes a second)
PAIRS: tuple[tuple[Callable[..., GpuCase], tuple[Any, ...], bool], ...] = (
    (reversed_rows, (5, 37), True), (reversed_rows, (2, 130), True), (shifted_rows, (5, 37), True),
    (shifted_rows, (3, 9), True), (transposed_tiles, (13, 8), True), (transposed_tiles, (16, 8), True),
    (softmax_matmul, (5, 37, 8), False), (softmax_matmul, (3, 20, 5, False), False))
ATTENTION = tuple((attention, size, size[3] >= 32) for size in ATTENTION_SIZES)


def spec_id(spec: tuple[Callable[..., GpuCase], tuple[Any, ...], bool]) -> str:
    return f"{spec[0].__name__}{'_'.join(str(a) for a in ('', *spec[1]))}"


def pairs() -> list[GpuCase]:
    """The producer/consumer pairs (several sizes, tiles that do not divide them)."""
    return [f(*args) for f, args, _ in PAIRS]


# ----------------------------------------------------------------------------- hand-written kernels


def racy_shift(offset: int = 1, barrier: bool = False, blocks: int = 2, threads: int = 32) -> Program:
    """The smallest race: in each block, thread t writes A[b, t], then reads what thread t + offset wrote.

        for b (blockIdx.x):
            for tx in 0..threads+1 (threadIdx.x): A[b, tx] = 2 X[b, tx]
            [barrier]
            offset=+1: for tx2 in 0..threads   (threadIdx.x): Y[b, tx2] = A[b, tx2 + 1] + 1
            offset=-1: for tx2 in 0..threads+1 (threadIdx.x): if tx2 >= 1: Y[b, tx2 - 1] = A[b, tx2 - 1] + 1

    Without the barrier, offset=+1 reads right when higher-numbered threads run first ("reversed") and
    wrong when lower ones do ("forward") or at random (seeds); offset=-1 the other way round."""
    if offset not in (1, -1):
        raise ValueError("racy_shift: offset is 1 or -1")
    W = threads + 1
    X = ir.buffer((blocks, W), name="X")
    Y = ir.buffer((blocks, threads), name="Y")
    b = ir.Builder(f"racy_shift_{'plus' if offset > 0 else 'minus'}{'_sync' if barrier else ''}")
    A = b.temp((blocks, W), name="A")
    with b.loop("blk", 0, blocks) as blk:
        with b.loop("tx", 0, W) as tx:
            b.store(A, (blk, tx), X[blk, tx] * 2.0, name="W")
        if barrier:
            b.barrier()
        if offset > 0:
            with b.loop("tx2", 0, threads) as tx2:
                b.store(Y, (blk, tx2), A[blk, tx2 + 1] + 1.0, name="R")
        else:
            with b.loop("tx2", 0, W) as tx2:
                with b.if_(tx2 >= 1):
                    b.store(Y, (blk, tx2 - 1), A[blk, tx2 - 1] + 1.0, name="R")
    return bind_loops(b.finish([X, Y]), {"blk": "blockIdx.x", "tx": "threadIdx.x", "tx2": "threadIdx.x"})


def racy_shift_reference(X: np.ndarray, offset: int) -> np.ndarray:
    lo = 1 if offset > 0 else 0
    return X[:, lo:lo + X.shape[1] - 1] * np.float32(2) + np.float32(1)


__all__ = ["GpuCase", "ATTENTION_SIZES", "ATTENTION", "PAIRS", "spec_id", "attention", "reversed_rows",
           "shifted_rows", "transposed_tiles", "softmax_matmul", "workload", "pairs", "racy_shift",
           "racy_shift_reference", "bind_loops", "check", "close"]
