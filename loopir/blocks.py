"""Whole model blocks written in te as one program each: what a user hands a fusion compiler.

    w = blocks.gpt2(C=768, H=12)             # batch B and sequence T as te.var
    mod = build(list(w.outputs), list(w.args), target="cuda")
    ins = w.random_inputs({"B": 8, "T": 1024})

* `gpt2`: pre-LayerNorm block: LayerNorm, q/k/v projections with bias, causal multi-head attention
  (softmax over scaled scores, heads packed in the width), output projection + residual, LayerNorm,
  tanh-GELU MLP (4C) + residual;
* `mlp`: LayerNorm, linear + bias + tanh-GELU, linear + bias + residual;
* `llama`: RMSNorm, q/k/v projections, rotary embedding (interleaved pairs, tables `cos`, `sin` of shape
  (T, D/2) given by the caller), causal attention, output projection + residual, RMSNorm, SwiGLU
  (silu(h W1) * (h W3)) W2 + residual.

Activations are (B, T, C). In float16/bfloat16 the weights and activations are stored in that dtype, while
sums (the matmuls and the normalizations' statistics) accumulate in float32, as PyTorch does. The
references compute in float64 (and round to the dtype). Each block is a `loopir.workloads.Workload`;
`inputs(w, sizes)` gives model-like random data (weights scaled by 1/sqrt(fan-in)).
"""

from __future__ import annotations

import math

import numpy as np

from . import te
from .dtypes import from_bfloat16, to_bfloat16
from .errors import ArgumentError
from .subst import cut_at, stages_of
from .te import Tensor
from .workloads import Array, Size, Workload, _acc, _size, _vars, naive_attention_reference

__all__ = ["gpt2", "mlp", "llama", "BLOCKS", "OPERATORS", "operators", "inputs", "as_dtype", "as_float64"]

LN_EPS = 1e-5
RMS_EPS = 1e-6
GELU_C = math.sqrt(2.0 / math.pi)


class _Builder:
    """The te pieces the blocks share, at one (B, T) and dtype."""

    def __init__(self, B: Size, T: Size, dtype: str) -> None:
        self.B, self.T, self.dtype, self.acc = B, T, dtype, _acc(dtype)
        self.inputs: list[Tensor] = []

    def input(self, shape: tuple[Size, ...], name: str) -> Tensor:
        t = te.placeholder(shape, self.dtype, name=name)
        self.inputs.append(t)
        return t

    def f(self, e):  # noqa: ANN001, ANN201 - a value in the accumulation dtype
        return te.cast(self.acc, e)

    def out(self, e):  # noqa: ANN001, ANN201 - a value stored in the activation dtype
        return te.cast(self.dtype, e) if self.acc != self.dtype else e

    def linear(self, a: Tensor, n_out: int, name: str, bias: bool = True) -> Tensor:
        """a @ W (+ b): a float32-accumulated matmul over the last axis, then the bias (its own stage)."""
        n_in = int(a.shape[-1].value)
        w = self.input((n_in, n_out), f"w_{name}")
        r = te.reduce_axis(n_in, f"r_{name}")
        mm = te.compute((self.B, self.T, n_out), lambda i, t, c: te.sum(self.f(a[i, t, r]) * self.f(w[r, c]), axis=r),
                        name=f"mm_{name}")
        if not bias:
            return te.compute(mm.shape, lambda i, t, c: self.out(mm[i, t, c]), name=name)
        b = self.input((n_out,), f"b_{name}")
        return te.compute(mm.shape, lambda i, t, c: self.out(mm[i, t, c] + self.f(b[c])), name=name)

    def layernorm(self, a: Tensor, tag: str) -> Tensor:
        C = int(a.shape[-1].value)
        g, b = self.input((C,), f"g_{tag}"), self.input((C,), f"beta_{tag}")
        k = te.reduce_axis(C, f"k_{tag}")
        mu = te.compute((self.B, self.T), lambda i, t: te.sum(self.f(a[i, t, k]) / float(C), axis=k), name=f"mu_{tag}")
        k2 = te.reduce_axis(C, f"k2_{tag}")
        var = te.compute((self.B, self.T), lambda i, t: te.sum(
            (self.f(a[i, t, k2]) - mu[i, t]) * (self.f(a[i, t, k2]) - mu[i, t]) / float(C), axis=k2), name=f"var_{tag}")
        return te.compute(a.shape, lambda i, t, c: self.out(
            (self.f(a[i, t, c]) - mu[i, t]) * te.rsqrt(var[i, t] + LN_EPS) * self.f(g[c]) + self.f(b[c])), name=tag)

    def rmsnorm(self, a: Tensor, tag: str) -> Tensor:
        C = int(a.shape[-1].value)
        g = self.input((C,), f"g_{tag}")
        k = te.reduce_axis(C, f"k_{tag}")
        ms = te.compute((self.B, self.T), lambda i, t: te.sum(self.f(a[i, t, k]) * self.f(a[i, t, k]) / float(C),
                                                              axis=k), name=f"ms_{tag}")
        return te.compute(a.shape, lambda i, t, c: self.out(
            self.f(a[i, t, c]) * te.rsqrt(ms[i, t] + RMS_EPS) * self.f(g[c])), name=tag)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, H: int, causal: bool) -> Tensor:
        """Multi-head attention over heads packed in the width: scores (B, H, T, T), the row max, the exponentials,
        their sum, P V per head (B, H, T, D), then the heads merged back into (B, T, C) and normalized."""
        B, T = self.B, self.T
        C = int(q.shape[-1].value)
        D = C // H
        scale = 1.0 / math.sqrt(D)
        rd = te.reduce_axis(D, "rd")
        qk = te.compute((B, H, T, T), lambda i, h, t, u: te.sum(
            self.f(q[i, t, h * D + rd]) * self.f(k[i, u, h * D + rd]), axis=rd), name="qk")
        if causal:
            s = te.compute(qk.shape, lambda i, h, t, u: te.where(u <= t, qk[i, h, t, u] * scale, float("-inf")),
                           name="s")
        else:
            s = te.compute(qk.shape, lambda i, h, t, u: qk[i, h, t, u] * scale, name="s")
        rm = te.reduce_axis(T, "rm")
        mx = te.compute((B, H, T), lambda i, h, t: te.max(s[i, h, t, rm], axis=rm), name="mx")
        p = te.compute(qk.shape, lambda i, h, t, u: te.exp(s[i, h, t, u] - mx[i, h, t]), name="p")
        rz = te.reduce_axis(T, "rz")
        z = te.compute((B, H, T), lambda i, h, t: te.sum(p[i, h, t, rz], axis=rz), name="z")
        ro = te.reduce_axis(T, "ro")
        pv = te.compute((B, H, T, D), lambda i, h, t, d: te.sum(p[i, h, t, ro] * self.f(v[i, ro, h * D + d]), axis=ro),
                        name="pv")
        return te.compute((B, T, C), lambda i, t, c: self.out(pv[i, c // D, t, c % D] / z[i, c // D, t]), name="attn")

    def gelu(self, a: Tensor, name: str) -> Tensor:
        def f(i, t, c):  # noqa: ANN001, ANN202
            x = self.f(a[i, t, c])
            return self.out(0.5 * x * (1.0 + te.tanh(GELU_C * (x + 0.044715 * x * x * x))))
        return te.compute(a.shape, f, name=name)

    def add(self, a: Tensor, b: Tensor, name: str) -> Tensor:
        return te.compute(a.shape, lambda i, t, c: self.out(self.f(a[i, t, c]) + self.f(b[i, t, c])), name=name)


# ----------------------------------------------------------------------------- float64 references


def _ln(a: Array, g: Array, b: Array) -> Array:
    mu = a.mean(-1, keepdims=True)
    return (a - mu) / np.sqrt(((a - mu) ** 2).mean(-1, keepdims=True) + LN_EPS) * g + b


def _rms(a: Array, g: Array) -> Array:
    return a / np.sqrt((a * a).mean(-1, keepdims=True) + RMS_EPS) * g


def _gelu(x: Array) -> Array:
    return 0.5 * x * (1 + np.tanh(GELU_C * (x + 0.044715 * x ** 3)))


def _attention(q: Array, k: Array, v: Array, H: int, causal: bool) -> Array:
    # one batch element at a time, its heads the reference's batch: the scores of all B x H heads at once are
    # B * H * T^2 doubles (13 GB at 8 x 12 x 4096^2)
    Bn, Tn, C = q.shape
    D = C // H
    out = np.empty((Bn, Tn, C))
    for b in range(Bn):
        qh, kh, vh = (a[b].reshape(Tn, H, D).transpose(1, 0, 2) for a in (q, k, v))
        out[b] = naive_attention_reference(qh, kh, vh, causal).transpose(1, 0, 2).reshape(Tn, C)
    return out


def _rotary(a: Array, cos: Array, sin: Array, H: int) -> Array:
    Bn, Tn, C = a.shape
    x = a.reshape(Bn, Tn, H, C // H // 2, 2)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = np.stack([x[..., 0] * c - x[..., 1] * s, x[..., 1] * c + x[..., 0] * s], axis=-1)
    return out.reshape(Bn, Tn, C)


def _tol(dtype: str) -> float:
    """The relative error a block's output may have against the float64 reference (issue 19's bounds)."""
    return 1e-4 if dtype in ("float32", "float64") else 1e-2


def as_dtype(a: Array, dtype: str) -> Array:
    """float values as an array of `dtype` (bfloat16: its bits in uint16, as the targets take them)."""
    return to_bfloat16(a) if dtype == "bfloat16" else np.asarray(a).astype(dtype)


def as_float64(a: Array, dtype: str) -> Array:
    """An array of `dtype` (bfloat16 bits included) as float64 values."""
    return (from_bfloat16(a) if dtype == "bfloat16" else np.asarray(a)).astype(np.float64)


def _ref(fn, inputs: tuple[Tensor, ...], dtype: str):  # noqa: ANN001, ANN202
    names = [t.name for t in inputs]

    def ref(*arrays: Array) -> tuple[Array, ...]:
        return (as_dtype(fn({n: as_float64(a, dtype) for n, a in zip(names, arrays)}), dtype),)
    return ref


# ----------------------------------------------------------------------------- the blocks


def gpt2(B: Size | None = None, T: Size | None = None, C: int = 768, H: int = 12, dtype: str = "float32",
         causal: bool = True) -> Workload:
    """A GPT-2 block (pre-LayerNorm, causal multi-head attention, tanh-GELU MLP of width 4C, two residuals)."""
    B, T = _size(B, "B"), _size(T, "T")
    if C % H:
        raise ArgumentError(f"blocks.gpt2: the width C={C} is not a multiple of the heads H={H}")
    m = _Builder(B, T, dtype)
    x = m.input((B, T, C), "x")
    h = m.layernorm(x, "ln1")
    q, k, v = m.linear(h, C, "q"), m.linear(h, C, "k"), m.linear(h, C, "v")
    a = m.linear(m.attention(q, k, v, H, causal), C, "proj")
    x1 = m.add(x, a, "x1")
    f = m.gelu(m.linear(m.layernorm(x1, "ln2"), 4 * C, "fc"), "gelu")
    y = m.add(x1, m.linear(f, C, "fc2"), "y")

    def fn(d: dict[str, Array]) -> Array:
        def lin(a: Array, n: str) -> Array:
            return a @ d[f"w_{n}"] + d[f"b_{n}"]
        h = _ln(d["x"], d["g_ln1"], d["beta_ln1"])
        x1 = d["x"] + lin(_attention(lin(h, "q"), lin(h, "k"), lin(h, "v"), H, causal), "proj")
        return x1 + lin(_gelu(lin(_ln(x1, d["g_ln2"], d["beta_ln2"]), "fc")), "fc2")

    ins = tuple(m.inputs)
    return Workload("gpt2_block", ins, (y,), _ref(fn, ins, dtype), _vars(B, T), tolerance=_tol(dtype))


def mlp(B: Size | None = None, T: Size | None = None, C: int = 768, dtype: str = "float32") -> Workload:
    """An MLP block: LayerNorm, linear + bias + tanh-GELU (4C), linear + bias, residual."""
    B, T = _size(B, "B"), _size(T, "T")
    m = _Builder(B, T, dtype)
    x = m.input((B, T, C), "x")
    f = m.gelu(m.linear(m.layernorm(x, "ln"), 4 * C, "fc"), "gelu")
    y = m.add(x, m.linear(f, C, "fc2"), "y")

    def fn(d: dict[str, Array]) -> Array:
        f = _gelu(_ln(d["x"], d["g_ln"], d["beta_ln"]) @ d["w_fc"] + d["b_fc"])
        return d["x"] + f @ d["w_fc2"] + d["b_fc2"]

    ins = tuple(m.inputs)
    return Workload("mlp_block", ins, (y,), _ref(fn, ins, dtype), _vars(B, T), tolerance=_tol(dtype))


def llama(B: Size | None = None, T: Size | None = None, C: int = 768, H: int = 12, F: int | None = None,
          dtype: str = "float32") -> Workload:
    """A LLaMA-style block: RMSNorm, q/k/v without bias, rotary embedding on q and k (interleaved pairs; inputs
    `cos`, `sin` of shape (T, D/2)), causal attention, output projection + residual, RMSNorm, SwiGLU MLP of
    width F (default 8C/3 rounded up to a multiple of 64) + residual."""
    B, T = _size(B, "B"), _size(T, "T")
    if C % H or (C // H) % 2:
        raise ArgumentError(f"blocks.llama: the width C={C} must be H={H} heads of an even size")
    D = C // H
    F = F or -(-(8 * C // 3) // 64) * 64
    m = _Builder(B, T, dtype)
    x = m.input((B, T, C), "x")
    cos, sin = m.input((T, D // 2), "cos"), m.input((T, D // 2), "sin")
    h = m.rmsnorm(x, "rms1")

    def rotary(a: Tensor, name: str) -> Tensor:
        # out[2j] = a[2j] cos - a[2j+1] sin; out[2j+1] = a[2j+1] cos + a[2j] sin (pairs within each head)
        def f(i, t, c):  # noqa: ANN001, ANN202
            partner = c + 1 - 2 * (c % 2)
            sign = m.f(2 * (c % 2) - 1)
            j = (c % D) // 2
            return m.out(m.f(a[i, t, c]) * m.f(cos[t, j]) + sign * m.f(a[i, t, partner]) * m.f(sin[t, j]))
        return te.compute(a.shape, f, name=name)

    q = rotary(m.linear(h, C, "q", bias=False), "q_rot")
    k = rotary(m.linear(h, C, "k", bias=False), "k_rot")
    v = m.linear(h, C, "v", bias=False)
    x1 = m.add(x, m.linear(m.attention(q, k, v, H, True), C, "o", bias=False), "x1")
    h2 = m.rmsnorm(x1, "rms2")
    g1, g3 = m.linear(h2, F, "w1", bias=False), m.linear(h2, F, "w3", bias=False)
    sw = te.compute(g1.shape, lambda i, t, c: m.out(
        m.f(g1[i, t, c]) / (1.0 + te.exp(-m.f(g1[i, t, c]))) * m.f(g3[i, t, c])), name="swiglu")
    y = m.add(x1, m.linear(sw, C, "w2", bias=False), "y")

    def fn(d: dict[str, Array]) -> Array:
        h = _rms(d["x"], d["g_rms1"])
        q, k = (_rotary(h @ d[f"w_{n}"], d["cos"], d["sin"], H) for n in ("q", "k"))
        x1 = d["x"] + _attention(q, k, h @ d["w_v"], H, True) @ d["w_o"]
        h2 = _rms(x1, d["g_rms2"])
        a = h2 @ d["w_w1"]
        return x1 + (a / (1 + np.exp(-a)) * (h2 @ d["w_w3"])) @ d["w_w2"]

    ins = tuple(m.inputs)
    return Workload("llama_block", ins, (y,), _ref(fn, ins, dtype), _vars(B, T), tolerance=_tol(dtype))


BLOCKS = {"gpt2": gpt2, "mlp": mlp, "llama": llama}


def inputs(w: Workload, sizes: dict[str, int], rng: np.random.Generator | int | None = None) -> list[Array]:
    """Fresh random inputs of block `w` at `sizes` as a model has them: activations standard normal, weights
    scaled by 1/sqrt(fan-in) (so activations stay O(1) through the block, in float16 too), gains near 1, biases
    small, and `cos`/`sin` the rotary tables of positions 0..T-1 (base 10000)."""
    rng = np.random.default_rng(rng)
    out = []
    for t in w.inputs:
        shape = w.shape_of(t, sizes)
        if t.name in ("cos", "sin"):
            half = shape[1]
            ang = np.arange(shape[0])[:, None] * 10000.0 ** (-np.arange(half)[None, :] / half)
            a = np.cos(ang) if t.name == "cos" else np.sin(ang)
        elif t.name.startswith("w_"):
            a = rng.standard_normal(shape) / math.sqrt(shape[0])
        elif t.name.startswith("g_"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif t.name.startswith(("b_", "beta_")):
            a = 0.1 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape)
        out.append(as_dtype(a, t.dtype))
    return out


# the operators a user calls one at a time (PyTorch's modules): the tensor each one ends with
OPERATORS = {
    "gpt2": ("ln1", "q", "k", "v", "attn", "x1", "ln2", "gelu", "y"),
    "mlp": ("ln", "gelu", "y"),
    "llama": ("rms1", "q_rot", "k_rot", "v", "attn", "x1", "rms2", "w1", "w3", "swiglu", "y"),
}


def operators(w: Workload, name: str) -> list[tuple[Tensor, list[Tensor]]]:
    """Block `w` (made by BLOCKS[name]) as its operators, each a graph of its own (`subst.cut_at`): a list of
    (output, inputs) in order, an input being a block input or an earlier operator's output (by name)."""
    byname = {t.name: t for t in stages_of(list(w.outputs))}
    cuts = [byname[n] for n in OPERATORS[name]]
    return [cut_at(c, cuts) for c in cuts]
