"""The seed workloads: small, well-known programs every part of loopir is tested on.

Each function takes its sizes (size variables from `te.var`, or plain ints) and a dtype,
and returns a `Workload`:

    w = workloads.softmax()                  # symbolic sizes m, n
    prog = w.program()                       # the lowered (or built) loop-IR program
    ins = w.random_inputs({"m": 7, "n": 13}) # fresh random numpy inputs
    outs = w.empty_outputs({"m": 7, "n": 13})  # outputs poisoned with NaN
    interp.run(prog, *w.call_args(ins, outs))
    expected = w.reference(*ins)             # tuple of numpy outputs (float64 math, then cast)

`args` is the program's call order: inputs, then outputs; an in-place workload
(`prefix_sum`) has the same buffer as input and output and appears once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from . import ir, te
from .args import eval_expr
from .lower import lower
from .nodes import Buffer, Expr, Program, Var
from .te import Tensor

Size = int | Var
Array = np.ndarray


@dataclass(frozen=True)
class Workload:
    """A seed program with its numpy reference.

    `inputs` / `outputs` are te tensors (or loop-IR buffers for builder programs);
    `reference(*input_arrays)` returns the expected outputs as a tuple, computed in
    float64 and cast to each output's dtype; `sizes` are the size variables used."""

    name: str
    inputs: tuple[Tensor | Buffer, ...]
    outputs: tuple[Tensor | Buffer, ...]
    reference: Callable[..., tuple[Array, ...]]
    sizes: tuple[Var, ...]
    built: Program | None = field(default=None, repr=False)  # set for programs written with loopir.ir
    in_place: bool = False  # outputs are the inputs, updated in place
    tolerance: float = 1e-5  # relative tolerance of the float32 result against the reference

    @property
    def args(self) -> tuple[Tensor | Buffer, ...]:
        """Call order: inputs, then the outputs not already among them."""
        ids = {id(x) for x in self.inputs}
        return self.inputs + tuple(o for o in self.outputs if id(o) not in ids)

    def program(self) -> Program:
        """The loop-IR program (lowered from te, or the builder's program)."""
        if self.built is not None:
            return self.built
        return lower(list(self.outputs), args=list(self.args), name=self.name)

    def shape_of(self, x: Tensor | Buffer, sizes: dict[str, int]) -> tuple[int, ...]:
        """The concrete shape of an input or output at the given sizes (by variable name)."""
        env = {v: sizes[v.name] for v in self.sizes}
        return tuple(int(eval_expr(e, env)) for e in x.shape)

    def random_inputs(self, sizes: dict[str, int], rng: np.random.Generator | int | None = None) -> list[Array]:
        """Fresh random inputs (standard normal, never zeros) at the given sizes."""
        rng = np.random.default_rng(rng)
        return [rng.standard_normal(self.shape_of(x, sizes)).astype(x.dtype) for x in self.inputs]

    def empty_outputs(self, sizes: dict[str, int]) -> list[Array]:
        """Outputs filled with NaN, so an element the program forgets to write shows."""
        return [np.full(self.shape_of(o, sizes), np.nan, dtype=o.dtype) for o in self.outputs]

    def call_args(self, inputs: Sequence[Array], outputs: Sequence[Array]) -> list[Array]:
        """The arrays in the program's argument order (an in-place workload takes its inputs only)."""
        return list(inputs) if self.in_place else list(inputs) + list(outputs)


def _size(x: Size | None, name: str) -> Size:
    return te.var(name) if x is None else x


def _vars(*xs: Size) -> tuple[Var, ...]:
    return tuple(x for x in xs if isinstance(x, Var))


def _f(x: Size, dtype: str) -> Expr:
    """A size as a float of `dtype` (sizes are int64; dividing a float32 by one would give float64)."""
    return te.cast(dtype, x)


# ----------------------------------------------------------------------------- elementwise


def sincos(n: Size | None = None, dtype: str = "float32") -> Workload:
    """y = sin(x)^2 + cos(x)^2 as the chain a user writes: s = sin(x)^2, c = cos(x)^2, y = s + c
    (three stages; fused, one kernel reads x once and writes y once)."""
    n = _size(n, "n")
    x = te.placeholder((n,), dtype, name="x")
    s = te.compute((n,), lambda i: te.sin(x[i]) ** 2, name="s")
    c = te.compute((n,), lambda i: te.cos(x[i]) ** 2, name="c")
    y = te.compute((n,), lambda i: s[i] + c[i], name="y")

    def ref(xa: Array) -> tuple[Array, ...]:
        x64 = xa.astype(np.float64)
        return ((np.sin(x64) ** 2 + np.cos(x64) ** 2).astype(dtype),)

    return Workload("sincos", (x,), (y,), ref, _vars(n))


GELU_C = math.sqrt(2.0 / math.pi)


def _shape(n: Size | None, m: Size | None) -> tuple[tuple[Size, ...], tuple[Var, ...]]:
    """(n,) when m is None, else (m, n): the elementwise seeds are 1-D by default, 2-D on request."""
    n = _size(n, "n")
    if m is None:
        return (n,), _vars(n)
    return (m, n), _vars(m, n)


def _ew(shape: tuple[Size, ...], f: Callable[[tuple[Expr, ...]], Expr], name: str) -> Tensor:
    """An elementwise stage over `shape` (loop variables named i, or i and j)."""
    if len(shape) == 1:
        return te.compute(shape, lambda i: f((i,)), name=name)
    return te.compute(shape, lambda i, j: f((i, j)), name=name)


def gelu(n: Size | None = None, dtype: str = "float32", m: Size | None = None) -> Workload:
    """The tanh GELU, y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as a chain of four
    elementwise stages: cube = x^3, inner = sqrt(2/pi) (x + 0.044715 cube), th = tanh(inner),
    y = 0.5 x (1 + th). Shape (n,), or (m, n) when `m` is given."""
    shape, sizes = _shape(n, m)
    x = te.placeholder(shape, dtype, name="x")
    cube = _ew(shape, lambda i: x[i] * x[i] * x[i], "cube")
    inner = _ew(shape, lambda i: GELU_C * (x[i] + 0.044715 * cube[i]), "inner")
    th = _ew(shape, lambda i: te.tanh(inner[i]), "th")
    y = _ew(shape, lambda i: 0.5 * x[i] * (1.0 + th[i]), "y")

    def ref(xa: Array) -> tuple[Array, ...]:
        x64 = xa.astype(np.float64)
        return ((0.5 * x64 * (1.0 + np.tanh(GELU_C * (x64 + 0.044715 * x64**3)))).astype(dtype),)

    return Workload("gelu", (x,), (y,), ref, sizes)


def horizontal(n: Size | None = None, dtype: str = "float32", m: Size | None = None) -> Workload:
    """Three outputs of one input: relu(x), sigmoid(x), tanh(x) (three independent stages).
    Shape (n,), or (m, n) when `m` is given."""
    shape, sizes = _shape(n, m)
    x = te.placeholder(shape, dtype, name="x")
    r = _ew(shape, lambda i: te.maximum(x[i], 0.0), "y_relu")
    s = _ew(shape, lambda i: te.sigmoid(x[i]), "y_sigmoid")
    t = _ew(shape, lambda i: te.tanh(x[i]), "y_tanh")

    def ref(xa: Array) -> tuple[Array, ...]:
        x64 = xa.astype(np.float64)
        return (
            np.maximum(x64, 0.0).astype(dtype),
            (1.0 / (1.0 + np.exp(-x64))).astype(dtype),
            np.tanh(x64).astype(dtype),
        )

    return Workload("horizontal", (x,), (r, s, t), ref, sizes)


# ----------------------------------------------------------------------------- reductions


def _softmax_ref(x64: Array) -> Array:
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax(m: Size | None = None, n: Size | None = None, dtype: str = "float32") -> Workload:
    """Row softmax of x (m, n), three stages: row max, sum of exp(x - max), normalize."""
    m, n = _size(m, "m"), _size(n, "n")
    x = te.placeholder((m, n), dtype, name="x")
    k1 = te.reduce_axis(n, name="k")
    mx = te.compute((m,), lambda i: te.max(x[i, k1], axis=k1), name="row_max")
    k2 = te.reduce_axis(n, name="k")
    sm = te.compute((m,), lambda i: te.sum(te.exp(x[i, k2] - mx[i]), axis=k2), name="row_sum")
    y = te.compute((m, n), lambda i, j: te.exp(x[i, j] - mx[i]) / sm[i], name="y")

    def ref(xa: Array) -> tuple[Array, ...]:
        return (_softmax_ref(xa.astype(np.float64)).astype(dtype),)

    return Workload("softmax", (x,), (y,), ref, _vars(m, n))


LAYERNORM_EPS = 1e-5


def layernorm(m: Size | None = None, n: Size | None = None, dtype: str = "float32") -> Workload:
    """Layer norm over the rows of x (m, n) with weight and bias (n,): mean, variance, normalize."""
    m, n = _size(m, "m"), _size(n, "n")
    x = te.placeholder((m, n), dtype, name="x")
    w = te.placeholder((n,), dtype, name="weight")
    b = te.placeholder((n,), dtype, name="bias")
    k1 = te.reduce_axis(n, name="k")
    mean = te.compute((m,), lambda i: te.sum(x[i, k1] / _f(n, dtype), axis=k1), name="mean")
    k2 = te.reduce_axis(n, name="k")
    var = te.compute((m,), lambda i: te.sum((x[i, k2] - mean[i]) ** 2 / _f(n, dtype), axis=k2), name="var")
    y = te.compute(
        (m, n),
        lambda i, j: (x[i, j] - mean[i]) * te.rsqrt(var[i] + LAYERNORM_EPS) * w[j] + b[j],
        name="y",
    )

    def ref(xa: Array, wa: Array, ba: Array) -> tuple[Array, ...]:
        x64 = xa.astype(np.float64)
        mu = x64.mean(axis=1, keepdims=True)
        v = ((x64 - mu) ** 2).mean(axis=1, keepdims=True)
        out = (x64 - mu) / np.sqrt(v + LAYERNORM_EPS) * wa.astype(np.float64) + ba.astype(np.float64)
        return (out.astype(dtype),)

    return Workload("layernorm", (x, w, b), (y,), ref, _vars(m, n), tolerance=1e-4)


def matmul_bias_relu(
    n: Size | None = None, m: Size | None = None, p: Size | None = None, dtype: str = "float32"
) -> Workload:
    """C = relu(A @ B + bias) with A (n, p), B (p, m), bias (m,): a matmul stage, then bias + relu."""
    n, m, p = _size(n, "n"), _size(m, "m"), _size(p, "p")
    a = te.placeholder((n, p), dtype, name="A")
    b = te.placeholder((p, m), dtype, name="B")
    bias = te.placeholder((m,), dtype, name="bias")
    k = te.reduce_axis(p, name="k")
    mm = te.compute((n, m), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="matmul")
    c = te.compute((n, m), lambda i, j: te.maximum(mm[i, j] + bias[j], 0.0), name="C")

    def ref(aa: Array, ba: Array, bias_a: Array) -> tuple[Array, ...]:
        out = aa.astype(np.float64) @ ba.astype(np.float64) + bias_a.astype(np.float64)
        return (np.maximum(out, 0.0).astype(dtype),)

    return Workload("matmul_bias_relu", (a, b, bias), (c,), ref, _vars(n, m, p), tolerance=1e-4)


def attention(
    n: Size | None = None, m: Size | None = None, d: Size | None = None, dtype: str = "float32"
) -> Workload:
    """softmax(Q K^T / sqrt(d)) V with Q (n, d), K (m, d), V (m, d).

    Stages: scores = Q K^T, row max of the scaled scores, sum of exp, probabilities, out = P V."""
    n, m, d = _size(n, "n"), _size(m, "m"), _size(d, "d")
    q = te.placeholder((n, d), dtype, name="Q")
    k = te.placeholder((m, d), dtype, name="K")
    v = te.placeholder((m, d), dtype, name="V")
    scale = te.rsqrt(_f(d, dtype))
    r1 = te.reduce_axis(d, name="r")
    s = te.compute((n, m), lambda i, j: te.sum(q[i, r1] * k[j, r1], axis=r1), name="scores")
    r2 = te.reduce_axis(m, name="r")
    mx = te.compute((n,), lambda i: te.max(s[i, r2] * scale, axis=r2), name="row_max")
    r3 = te.reduce_axis(m, name="r")
    sm = te.compute((n,), lambda i: te.sum(te.exp(s[i, r3] * scale - mx[i]), axis=r3), name="row_sum")
    p = te.compute((n, m), lambda i, j: te.exp(s[i, j] * scale - mx[i]) / sm[i], name="probs")
    r4 = te.reduce_axis(m, name="r")
    o = te.compute((n, d), lambda i, c: te.sum(p[i, r4] * v[r4, c], axis=r4), name="out")

    def ref(qa: Array, ka: Array, va: Array) -> tuple[Array, ...]:
        q64, k64, v64 = (x.astype(np.float64) for x in (qa, ka, va))
        probs = _softmax_ref(q64 @ k64.T / math.sqrt(q64.shape[1]))
        return ((probs @ v64).astype(dtype),)

    return Workload("attention", (q, k, v), (o,), ref, _vars(n, m, d), tolerance=1e-4)


# the masks naive_attention takes (`causal=`): key j visible from row i iff mask(i, j); on te and numpy values alike
MASKS = {"causal": lambda i, j: j <= i, "late": lambda i, j: j >= i}  # late: a row's first keys are masked


def naive_attention(B: Size | None = None, n: Size | None = None, m: Size | None = None, d: int = 64,
                    causal: bool | str = False, dtype: str = "float32", scale: float | None = None) -> Workload:
    """softmax(scale * Q K^T [causal mask]) V over (batch x heads, rows, d), written as a user would: scores S,
    the scaled (masked: `Sm`) copy `Ss`, the row max `mx`, `P = exp(.)`, the row sum `sm`, `O = P V` and
    `Y = O / sm`: the chain that `online_softmax` rewrites. `scale` defaults to 1/sqrt(d). Not a seed: the
    attention examples and tests share it."""
    B, n, m = _size(B, "B"), _size(n, "n"), _size(m, "m")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    Q = te.placeholder((B, n, d), dtype, name="Q")
    K = te.placeholder((B, m, d), dtype, name="K")
    V = te.placeholder((B, m, d), dtype, name="V")
    r = te.reduce_axis(d, "r")
    S = te.compute((B, n, m), lambda b, i, j: te.sum(Q[b, i, r] * K[b, j, r], axis=r), name="S")
    if causal:
        vis = MASKS["causal" if causal is True else causal]
        S = te.compute((B, n, m), lambda b, i, j: te.where(vis(i, j), S[b, i, j] * scale, float("-inf")), name="Sm")
    else:
        S = te.compute((B, n, m), lambda b, i, j: S[b, i, j] * scale, name="Ss")
    r2 = te.reduce_axis(m, "r2")
    mx = te.compute((B, n), lambda b, i: te.max(S[b, i, r2], axis=r2), name="mx")
    P = te.compute((B, n, m), lambda b, i, j: te.exp(S[b, i, j] - mx[b, i]), name="P")
    r3 = te.reduce_axis(m, "r3")
    sm = te.compute((B, n), lambda b, i: te.sum(P[b, i, r3], axis=r3), name="sm")
    r4 = te.reduce_axis(m, "r4")
    O = te.compute((B, n, d), lambda b, i, c: te.sum(P[b, i, r4] * V[b, r4, c], axis=r4), name="O")  # noqa: E741
    Y = te.compute((B, n, d), lambda b, i, c: O[b, i, c] / sm[b, i], name="Y")

    def ref(q: Array, k: Array, v: Array) -> tuple[Array, ...]:
        return (naive_attention_reference(q, k, v, causal, scale),)

    return Workload("naive_attention", (Q, K, V), (Y,), ref, _vars(B, n, m), tolerance=1e-4)


def triton_attention(B: Size | None = None, n: Size | None = None, m: Size | None = None, d: int = 64,
                     causal: bool | str = False, dtype: str = "float16", casts: bool = True,
                     scale: float | None = None) -> Workload:
    """The torch reference of Triton's fused-attention tutorial, ported to te:

        p = q @ k^T * sm_scale;  p[~mask] = -inf;  p = softmax(p.float()).half();  out = p @ v

    S = Q K^T * scale (the product accumulated in float32 and rounded to `dtype`, as a half matmul does), the
    masked copy Sm (`causal`: a mask of MASKS, as naive_attention's), Sf = float32(Sm), the row max mx,
    E = exp(Sf - mx), the row sum sm, the probabilities Pf = E / sm, P = Pf cast back to `dtype`, and the output
    O = P V (accumulated in float32, rounded to `dtype`). Unlike naive_attention, the probabilities are divided
    before the product with V. `casts=False`: no conversion anywhere, every stage in `dtype` (Sf and P absent).
    `scale` defaults to 1/sqrt(d); the reference is naive_attention_reference's (the same function)."""
    B, n, m = _size(B, "B"), _size(n, "n"), _size(m, "m")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    acc = "float32" if casts else dtype

    def f(x: Expr) -> Expr:
        return te.cast(acc, x)

    Q = te.placeholder((B, n, d), dtype, name="Q")
    K = te.placeholder((B, m, d), dtype, name="K")
    V = te.placeholder((B, m, d), dtype, name="V")
    r = te.reduce_axis(d, "r")
    S = te.compute((B, n, m), lambda b, i, j: te.cast(dtype, te.sum(f(Q[b, i, r]) * f(K[b, j, r]), axis=r)) * scale,
                   name="S")
    if causal:
        vis = MASKS["causal" if causal is True else causal]
        S = te.compute((B, n, m), lambda b, i, j: te.where(vis(i, j), S[b, i, j], float("-inf")), name="Sm")
    if casts:
        S = te.compute((B, n, m), lambda b, i, j: te.cast("float32", S[b, i, j]), name="Sf")
    r2 = te.reduce_axis(m, "r2")
    mx = te.compute((B, n), lambda b, i: te.max(S[b, i, r2], axis=r2), name="mx")
    E = te.compute((B, n, m), lambda b, i, j: te.exp(S[b, i, j] - mx[b, i]), name="E")
    r3 = te.reduce_axis(m, "r3")
    sm = te.compute((B, n), lambda b, i: te.sum(E[b, i, r3], axis=r3), name="sm")
    P = te.compute((B, n, m), lambda b, i, j: E[b, i, j] / sm[b, i], name="Pf" if casts else "P")
    if casts:
        P = te.compute((B, n, m), lambda b, i, j: te.cast(dtype, P[b, i, j]), name="P")
    r4 = te.reduce_axis(m, "r4")
    O = te.compute((B, n, d), lambda b, i, c: te.cast(dtype, te.sum(f(P[b, i, r4]) * f(V[b, r4, c]), axis=r4)),  # noqa: E741
                   name="O")

    def ref(q: Array, k: Array, v: Array) -> tuple[Array, ...]:
        return (naive_attention_reference(q, k, v, causal, scale),)

    half = dtype in ("float16", "bfloat16")
    return Workload("triton_attention", (Q, K, V), (O,), ref, _vars(B, n, m), tolerance=1e-2 if half else 1e-4)


def naive_attention_reference(q: Array, k: Array, v: Array, causal: bool | str = False,
                              scale: float | None = None) -> Array:
    """`naive_attention`'s output in float64 (scale defaults to 1/sqrt(d); a row that sees no key is NaN)."""
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    s = (q64 @ k64.transpose(0, 2, 1)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        rows, keys = s.shape[1:]
        vis = MASKS["causal" if causal is True else causal]
        s = np.where(vis(np.arange(rows)[None, :, None], np.arange(keys)[None, None, :]), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return p @ v64 / p.sum(axis=-1)[..., None]  # matmuls: BLAS, where einsum's loops take minutes at 4096 keys


# ----------------------------------------------------------------------------- stencil and scan

STENCIL_CENTER, STENCIL_SIDE = 0.5, 0.125


def stencil5(n: Size | None = None, m: Size | None = None, dtype: str = "float32") -> Workload:
    """2-D 5-point stencil over the interior of x (n, m).

    out has shape (n - 2, m - 2): out[i, j] is the stencil at x[i + 1, j + 1] (the interior
    point (i + 1, j + 1) of x), 0.5 * centre + 0.125 * each of the four neighbours."""
    n, m = _size(n, "n"), _size(m, "m")
    x = te.placeholder((n, m), dtype, name="x")
    out = te.compute(
        (n - 2, m - 2),
        lambda i, j: STENCIL_CENTER * x[i + 1, j + 1]
        + STENCIL_SIDE * (x[i, j + 1] + x[i + 2, j + 1] + x[i + 1, j] + x[i + 1, j + 2]),
        name="out",
    )

    def ref(xa: Array) -> tuple[Array, ...]:
        x64 = xa.astype(np.float64)
        c = x64[1:-1, 1:-1]
        nb = x64[:-2, 1:-1] + x64[2:, 1:-1] + x64[1:-1, :-2] + x64[1:-1, 2:]
        return ((STENCIL_CENTER * c + STENCIL_SIDE * nb).astype(dtype),)

    return Workload("stencil5", (x,), (out,), ref, _vars(n, m))


def prefix_sum(n: Size | None = None, dtype: str = "float32") -> Workload:
    """In-place prefix sum written with the builder (a loop-carried dependence):

        for i in range(1, n):
            A[i] = A[i - 1] + A[i]      # S
    """
    n = _size(n, "n")
    a = ir.buffer((n,), dtype=dtype, name="A")
    b = ir.Builder("prefix_sum")
    with b.loop("i", 1, n) as i:
        b.store(a, (i,), a[i - 1] + a[i], name="S")
    prog = b.finish([a])

    def ref(aa: Array) -> tuple[Array, ...]:
        return (np.cumsum(aa.astype(np.float64)).astype(dtype),)

    return Workload("prefix_sum", (a,), (a,), ref, _vars(n), built=prog, in_place=True, tolerance=1e-4)


SEEDS: dict[str, Callable[..., Workload]] = {
    "sincos": sincos,
    "gelu": gelu,
    "horizontal": horizontal,
    "softmax": softmax,
    "layernorm": layernorm,
    "matmul_bias_relu": matmul_bias_relu,
    "attention": attention,
    "stencil5": stencil5,
    "prefix_sum": prefix_sum,
}

__all__ = [
    "SEEDS",
    "Workload",
    "attention",
    "gelu",
    "horizontal",
    "layernorm",
    "matmul_bias_relu",
    "naive_attention",
    "naive_attention_reference",
    "prefix_sum",
    "sincos",
    "softmax",
    "stencil5",
    "triton_attention",
]


# ----------------------------------------------------------------------------- more memory-bound rows
# (benchmarks/shapes.py runs these beside the seeds; they are not seeds, so not in SEEDS)

RMSNORM_EPS = 1e-6


def _acc(dtype: str) -> str:
    """The accumulation dtype of a row statistic: float32 for 16-bit inputs (as PyTorch does; a float16 sum
    of 65,536 squares, or the size itself as a float16, overflows), else the dtype itself."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def rmsnorm(m: Size | None = None, n: Size | None = None, dtype: str = "float32") -> Workload:
    """RMSNorm over the rows of x (m, n) with weight (n,): ms = mean(x^2) (accumulated in float32 for
    16-bit inputs), y = x * rsqrt(ms + eps) * weight. Two stages: the row statistic, then the scaling."""
    m, n = _size(m, "m"), _size(n, "n")
    acc = _acc(dtype)
    x = te.placeholder((m, n), dtype, name="x")
    w = te.placeholder((n,), dtype, name="weight")
    k = te.reduce_axis(n, name="k")
    ms = te.compute((m,), lambda i: te.sum(te.cast(acc, x[i, k]) * te.cast(acc, x[i, k]) / _f(n, acc), axis=k),
                    name="mean_sq")
    y = te.compute(
        (m, n),
        lambda i, j: te.cast(dtype, te.cast(acc, x[i, j]) * te.rsqrt(ms[i] + RMSNORM_EPS) * te.cast(acc, w[j])),
        name="y",
    )

    def ref(xa: Array, wa: Array) -> tuple[Array, ...]:
        x64 = xa.astype(np.float64)
        r = 1.0 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + RMSNORM_EPS)
        return ((x64 * r * wa.astype(np.float64)).astype(dtype),)

    return Workload("rmsnorm", (x, w), (y,), ref, _vars(m, n), tolerance=1e-4)


def bias_gelu(m: Size | None = None, n: Size | None = None, dtype: str = "float32") -> Workload:
    """GELU of a biased activation, as after a linear layer: h = x + bias (bias (n,) broadcast over the m
    rows of x (m, n)), y = 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3))). Two stages."""
    m, n = _size(m, "m"), _size(n, "n")
    x = te.placeholder((m, n), dtype, name="x")
    b = te.placeholder((n,), dtype, name="bias")
    h = te.compute((m, n), lambda i, j: x[i, j] + b[j], name="h")
    y = te.compute(
        (m, n),
        lambda i, j: 0.5 * h[i, j] * (1.0 + te.tanh(GELU_C * (h[i, j] + 0.044715 * h[i, j] * h[i, j] * h[i, j]))),
        name="y",
    )

    def ref(xa: Array, ba: Array) -> tuple[Array, ...]:
        h64 = xa.astype(np.float64) + ba.astype(np.float64)
        return ((0.5 * h64 * (1.0 + np.tanh(GELU_C * (h64 + 0.044715 * h64**3)))).astype(dtype),)

    return Workload("bias_gelu", (x, b), (y,), ref, _vars(m, n))


def softmax_mixed(m: Size | None = None, n: Size | None = None, dtype: str = "float16") -> Workload:
    """The row softmax of `softmax` for 16-bit inputs as PyTorch computes it: the exponentials and their sum in
    float32 (a float16 sum of 50,257 terms is off by percents), the result cast back to `dtype`."""
    m, n = _size(m, "m"), _size(n, "n")
    acc = _acc(dtype)
    x = te.placeholder((m, n), dtype, name="x")
    k1 = te.reduce_axis(n, name="k")
    mx = te.compute((m,), lambda i: te.max(te.cast(acc, x[i, k1]), axis=k1), name="row_max")
    k2 = te.reduce_axis(n, name="k")
    sm = te.compute((m,), lambda i: te.sum(te.exp(te.cast(acc, x[i, k2]) - mx[i]), axis=k2), name="row_sum")
    y = te.compute((m, n), lambda i, j: te.cast(dtype, te.exp(te.cast(acc, x[i, j]) - mx[i]) / sm[i]), name="y")

    def ref(xa: Array) -> tuple[Array, ...]:
        return (_softmax_ref(xa.astype(np.float64)).astype(dtype),)

    return Workload("softmax", (x,), (y,), ref, _vars(m, n))


def layernorm_mixed(m: Size | None = None, n: Size | None = None, dtype: str = "float16") -> Workload:
    """The layer norm of `layernorm` for 16-bit inputs as PyTorch computes it: mean and variance in float32 (the
    seed divides by n cast to `dtype`, inf in float16 at n = 65,536), the result cast back to `dtype`."""
    m, n = _size(m, "m"), _size(n, "n")
    acc = _acc(dtype)
    x = te.placeholder((m, n), dtype, name="x")
    w = te.placeholder((n,), dtype, name="weight")
    b = te.placeholder((n,), dtype, name="bias")
    k1 = te.reduce_axis(n, name="k")
    mean = te.compute((m,), lambda i: te.sum(te.cast(acc, x[i, k1]) / _f(n, acc), axis=k1), name="mean")
    k2 = te.reduce_axis(n, name="k")
    var = te.compute((m,), lambda i: te.sum((te.cast(acc, x[i, k2]) - mean[i]) ** 2 / _f(n, acc), axis=k2),
                     name="var")
    y = te.compute(
        (m, n),
        lambda i, j: te.cast(dtype, (te.cast(acc, x[i, j]) - mean[i]) * te.rsqrt(var[i] + LAYERNORM_EPS)
                             * te.cast(acc, w[j]) + te.cast(acc, b[j])),
        name="y",
    )
    seed_ref = layernorm(m, n, dtype).reference

    return Workload("layernorm", (x, w, b), (y,), seed_ref, _vars(m, n), tolerance=1e-4)
