"""A pre-LayerNorm transformer block written in te as ONE program (batch and sequence as te.var, width 64,
2 heads, causal attention, tanh-GELU MLP, two residuals), built with `build(outputs, args)` on the CPU and
CUDA (without a GPU the CUDA build is compiled by NVRTC, not run); compared with a float64 numpy reference on
random data.

    python3 benchmarks/block_check.py [B T]
"""

from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen import build, gpu_available  # noqa: E402
from loopir import te  # noqa: E402

C, H = 64, 2
D = C // H


def block():
    B, T = te.var("B"), te.var("T")
    x = te.placeholder((B, T, C), name="x")
    g1, b1, g2, b2 = (te.placeholder((C,), name=n) for n in ("g1", "b1", "g2", "b2"))
    wq, wk, wv, wo = (te.placeholder((C, C), name=n) for n in ("wq", "wk", "wv", "wo"))
    w1 = te.placeholder((C, 4 * C), name="w1")
    w2 = te.placeholder((4 * C, C), name="w2")

    def layernorm(a, g, b, tag):
        # a reduction is the whole body of its stage (issue 15 lifts that): sums, then their consumers
        k = te.reduce_axis(C, f"k{tag}")
        su = te.compute((B, T), lambda i, t: te.sum(a[i, t, k], axis=k), name=f"sum{tag}")
        k2 = te.reduce_axis(C, f"q{tag}")
        sq = te.compute((B, T), lambda i, t: te.sum((a[i, t, k2] - su[i, t] / float(C))
                                                    * (a[i, t, k2] - su[i, t] / float(C)), axis=k2), name=f"sq{tag}")
        return te.compute((B, T, C), lambda i, t, c: (a[i, t, c] - su[i, t] / float(C))
                          * te.rsqrt(sq[i, t] / float(C) + 1e-5) * g[c] + b[c], name=f"ln{tag}")

    def linear(a, w, n_in, n_out, name):
        r = te.reduce_axis(n_in, f"r_{name}")
        return te.compute((B, T, n_out), lambda i, t, c: te.sum(a[i, t, r] * w[r, c], axis=r), name=name)

    h = layernorm(x, g1, b1, "1")
    q, k, v = linear(h, wq, C, C, "q"), linear(h, wk, C, C, "k"), linear(h, wv, C, C, "v")
    rs = te.reduce_axis(D, "rs")
    qk = te.compute((B, H, T, T), lambda i, hh, t, u: te.sum(q[i, t, hh * D + rs] * k[i, u, hh * D + rs], axis=rs),
                    name="qk")
    s = te.compute((B, H, T, T), lambda i, hh, t, u: te.where(u <= t, qk[i, hh, t, u] * (1.0 / math.sqrt(D)), -1e30),
                   name="s")
    rm = te.reduce_axis(T, "rm")
    mx = te.compute((B, H, T), lambda i, hh, t: te.max(s[i, hh, t, rm], axis=rm), name="mx")
    p = te.compute((B, H, T, T), lambda i, hh, t, u: te.exp(s[i, hh, t, u] - mx[i, hh, t]), name="p")
    rz = te.reduce_axis(T, "rz")
    z = te.compute((B, H, T), lambda i, hh, t: te.sum(p[i, hh, t, rz], axis=rz), name="z")
    ro = te.reduce_axis(T, "ro")
    pv = te.compute((B, T, C), lambda i, t, c: te.sum(p[i, c // D, t, ro] * v[i, ro, c], axis=ro), name="pv")
    o = te.compute((B, T, C), lambda i, t, c: pv[i, t, c] / z[i, c // D, t], name="o")
    a = linear(o, wo, C, C, "a")
    x1 = te.compute((B, T, C), lambda i, t, c: x[i, t, c] + a[i, t, c], name="x1")
    h2 = layernorm(x1, g2, b2, "2")
    f = linear(h2, w1, C, 4 * C, "f")
    gl = te.compute((B, T, 4 * C), lambda i, t, c: 0.5 * f[i, t, c] * (1.0 + te.tanh(
        0.7978845608 * (f[i, t, c] + 0.044715 * f[i, t, c] * f[i, t, c] * f[i, t, c]))), name="gelu")
    m = linear(gl, w2, 4 * C, C, "m")
    y = te.compute((B, T, C), lambda i, t, c: x1[i, t, c] + m[i, t, c], name="y")
    return [x, g1, b1, g2, b2, wq, wk, wv, wo, w1, w2], y


def reference(x, g1, b1, g2, b2, wq, wk, wv, wo, w1, w2):
    x, g1, b1, g2, b2, wq, wk, wv, wo, w1, w2 = (a.astype(np.float64) for a in (x, g1, b1, g2, b2, wq, wk, wv, wo,
                                                                               w1, w2))

    def ln(a, g, b):
        mu = a.mean(-1, keepdims=True)
        return (a - mu) / np.sqrt(((a - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b

    Bn, Tn, _ = x.shape
    h = ln(x, g1, b1)
    q, k, v = h @ wq, h @ wk, h @ wv
    o = np.empty_like(q)
    mask = np.tril(np.ones((Tn, Tn), bool))
    for hh in range(H):
        sl = slice(hh * D, (hh + 1) * D)
        s = np.einsum("btd,bud->btu", q[..., sl], k[..., sl]) / math.sqrt(D)
        s = np.where(mask, s, -1e30)
        p = np.exp(s - s.max(-1, keepdims=True))
        o[..., sl] = np.einsum("btu,bud->btd", p, v[..., sl]) / p.sum(-1, keepdims=True)
    x1 = x + o @ wo
    f = ln(x1, g2, b2) @ w1
    gl = 0.5 * f * (1 + np.tanh(0.7978845608 * (f + 0.044715 * f ** 3)))
    return x1 + gl @ w2


def main() -> int:
    Bn, Tn = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (2, 37)
    rng = np.random.default_rng(5)
    ins, y = block()
    sizes = {"B": Bn, "T": Tn}
    shape = lambda t: tuple(sizes[d.name] if hasattr(d, "name") else int(d.value) for d in t.buffer.shape)  # noqa: E731
    arrays = [rng.standard_normal(shape(t)).astype(np.float32) * (0.2 if t.name.startswith("w") else 1) for t in ins]
    want = reference(*arrays)
    bad = 0
    for target in ("cpu", "cuda"):
        t0 = time.perf_counter()
        try:
            mod = build([y], [*ins, y], target=target)
        except Exception as e:  # noqa: BLE001 - report what fails to build, on each target
            print(f"{target}: build FAILED after {time.perf_counter() - t0:.1f} s: {type(e).__name__}: {str(e)[:300]}")
            bad += 1
            continue
        if target == "cuda" and not gpu_available():  # NVRTC compiled it; there is no device to run it on
            print(f"cuda: built (NVRTC compiled) in {time.perf_counter() - t0:.1f} s, {len(mod.kernels)} kernel(s); "
                  "no GPU here to run it")
            continue
        got = np.full(want.shape, np.nan, np.float32)
        mod(*arrays, got)
        err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        print(f"{target}: built in {time.perf_counter() - t0:.1f} s, {len(mod.kernels)} kernel(s), "
              f"max rel. error vs float64 {err:.2e} at B={Bn}, T={Tn}")
        bad += not err < 1e-3
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
