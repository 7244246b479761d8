"""The CUDA flat mapping of elementwise groups (schedules/auto.py `_map_cuda`) across row lengths and symbolic
sizes: an odd constant row length is collapsed and vectorized (the renderer folds `(f // n) * n + f % n` to `f`,
`loopir.affine.row_major`); symbolic inner extents collapse too where every access reads or writes the point it
computes (the bounds and barrier passes place a collapsed instance by its loop values and an access by its
flat offset), so each call-time key (row length odd, a multiple of 4, 8 or 16, 1; one row) runs 16-byte vectors
over a flat index; 3-D and mixed-dtype elementwise programs at symbolic sizes build. Each kernel is run through
the GPU interpreter with its threads in reversed order, on fresh random data, outputs poisoned with NaN."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from loopir import interp, te
from loopir import nodes as N
from loopir import workloads as W
from loopir.affine import row_major


def _kernel_body(src: str) -> str:
    return src[src.index("__global__"):]


def _run(mod, ins, outs) -> None:
    interp.run(mod.program, *ins, *outs, gpu_order="reversed")


def test_row_major_folds_a_collapsed_index_only_when_the_divisor_is_the_row_length() -> None:
    f, n, m = N.Var("f", "int64"), N.Var("n", "int64"), N.Var("m", "int64")
    assert row_major((m, n), (N.binary("floordiv", f, n), N.binary("mod", f, n))) is f
    folded = row_major((N.const(3), N.const(5), N.const(7)),
                       (N.binary("floordiv", N.binary("floordiv", f, N.const(7)), N.const(5)),
                        N.binary("mod", N.binary("floordiv", f, N.const(7)), N.const(5)),
                        N.binary("mod", f, N.const(7))))
    assert folded is f
    # a divisor that is not the row length: no fold, the plain row-major offset (value checked at a point)
    other = row_major((m, n), (N.binary("floordiv", f, m), N.binary("mod", f, m)))
    assert other is not f
    from loopir.affine import eval_index
    env = {f: 23, m: 4, n: 9}
    assert eval_index(other, env) == (23 // 4) * 9 + 23 % 4


def test_mixed_radix_digits_and_wrapped_digits() -> None:
    from loopir.affine import mixed_radix, wrapped_digits

    f, m, n, p = (N.Var(c, "int64") for c in "fmnp")
    div, mod = (lambda a, b: N.binary("floordiv", a, b)), (lambda a, b: N.binary("mod", a, b))
    assert mixed_radix((m, n), (div(f, n), mod(f, n))) is f  # in bounds iff 0 <= f < m * n
    g = div(f, p)
    assert mixed_radix((m, n, p), (div(g, n), mod(g, n), mod(f, p))) is f
    assert mixed_radix((m, n), (div(f, m), mod(f, n))) is None  # another divisor
    assert mixed_radix((m, n), (div(f, n), mod(f + 1, n))) is None  # digits of two different numbers
    assert wrapped_digits((n,), (mod(f, n),)) and wrapped_digits((n, p), (mod(g, n), mod(f, p)))
    assert not wrapped_digits((n,), (mod(f, m),)) and not wrapped_digits((n, p), (div(g, n), mod(f, p)))
    one, zero = N.const(1), N.const(0)  # a size specialized to 1: its loop gone, its index 0
    assert mixed_radix((m, n, one), (div(f, n), mod(f, n), zero)) is f
    assert wrapped_digits((n, one), (mod(f, n), zero))
    assert mixed_radix((m, n, one), (div(f, n), mod(f, n), N.const(1))) is None  # index 1 of extent 1: no


@pytest.mark.parametrize("seed", [W.gelu, W.horizontal, W.bias_gelu])
@pytest.mark.parametrize("shape", [(37, 101), (5, 3), (16, 64)])
def test_odd_and_even_constant_widths_vectorize_and_match(seed, shape) -> None:
    w = seed(m=shape[0], n=shape[1])
    mod = build(list(w.outputs), list(w.args), target="cuda")
    body = _kernel_body(mod.source)
    assert mod.source.count("__global__") == 1
    assert "LOOPIR_LD4" in body or "LOOPIR_ST4" in body  # 16-byte accesses whatever the width (bias_gelu:
    # at an odd width the bias is read lane by lane, x and y stay 16-byte)
    rng = np.random.default_rng(sum(shape))
    ins = [rng.standard_normal([int(d.value) for d in a.shape]).astype("float32") for a in w.inputs]
    outs = [np.full([int(d.value) for d in o.shape], np.nan, "float32") for o in w.outputs]
    _run(mod, ins, outs)
    for got, ref in zip(outs, w.reference(*ins)):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_odd_width_pointwise_kernel_has_a_flat_vector_index() -> None:
    w = W.gelu(m=64, n=1001)
    src = build(list(w.outputs), list(w.args), target="cuda").source
    vec = _kernel_body(src).split("} else {")[0]  # the float4 branch
    assert "LOOPIR_LD4" in vec and "loopir_floordiv" not in vec and "loopir_mod" not in vec


SYM_SHAPES = [(33, 1001), (4, 4), (3, 8), (5, 64), (1, 1000), (7, 1), (1, 1), (2, 3)]


def _sym_inputs(w, sizes: dict, rng: np.random.Generator, dtype: str) -> list[np.ndarray]:
    return [rng.standard_normal([sizes[d] for d in a.shape]).astype(dtype) for a in w.inputs]


@pytest.mark.parametrize("seed", [W.gelu, W.horizontal, W.bias_gelu])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_symbolic_row_lengths_collapse_and_vectorize_at_every_key(seed, dtype) -> None:
    m, n = te.var("m"), te.var("n")
    w = seed(m=m, n=n, dtype=dtype)
    mod = build(list(w.outputs), list(w.args), target="cuda")
    rng = np.random.default_rng(5)
    keys = set()
    for shape in SYM_SHAPES:
        v, key = mod.specializer.select({m: shape[0], n: shape[1]})
        keys.add(str(key))
        body = _kernel_body(v.source)
        assert body.count("__global__") == 1 and v.notes == []  # every access proven in bounds: no guard
        if shape[1] > 1:  # a row of one element is a 1-d loop over the rows
            vec = [ln for ln in body.splitlines() if "LOOPIR_LD4" in ln or "LOOPIR_ST4" in ln]
            # 16-byte accesses of x and y at a flat index (no row / column division), whatever the key; a bias
            # is read lane by lane at f % n where the key does not make the row whole vectors
            assert vec and not any("loopir_floordiv" in ln for ln in vec), key
            assert all("loopir_mod" not in ln.split("= LOOPIR_LD4")[-1].split("]")[0] for ln in vec), key
            if len(w.inputs) > 1 and "loopir_mod" in body:  # a bias read at f % n: one division per vector, the
                vec_branch = body.split("} else {")[0]  # next lanes' columns by increments
                assert vec_branch.count("loopir_mod(") == 1 and "// the column of lane 0" in vec_branch, key
        ins = _sym_inputs(w, {m: shape[0], n: shape[1]}, rng, dtype)
        outs = [np.full(shape, np.nan, dtype) for _ in w.outputs]
        _run(v, ins, outs)
        tol = 1e-5 if dtype == "float32" else 2e-3
        for got, ref in zip(outs, w.reference(*ins)):
            np.testing.assert_allclose(got.astype("float64"), ref.astype("float64"), rtol=tol, atol=tol,
                                       err_msg=f"{shape} {key}")
    assert len(keys) == len(SYM_SHAPES) - 1  # (33, 1001) and (2, 3) share "m* n*"


def test_three_d_elementwise_at_symbolic_sizes_builds_and_matches() -> None:
    b, t, d = te.var("b"), te.var("t"), te.var("d")
    x = te.placeholder((b, t, d), name="x")
    y = te.compute((b, t, d), lambda i, j, k: x[i, j, k] * 2.0 - 1.0, name="y")
    rng = np.random.default_rng(7)
    for sizes in ({"d": 64}, {}):
        mod = build([y], [x, y], target="cuda", sizes=sizes, specialize=False)
        a = rng.standard_normal((3, 5, 64)).astype("float32")
        o = np.full_like(a, np.nan)
        _run(mod, [a], [o])
        np.testing.assert_allclose(o, 2 * a - 1, rtol=1e-6)


def test_mixed_dtype_siblings_at_symbolic_sizes_build_and_match() -> None:
    m, n = te.var("m"), te.var("n")
    x = te.placeholder((m, n), name="x")
    y = te.compute((m, n), lambda i, j: te.cast("float16", x[i, j] * 2.0), name="y")
    z = te.compute((m, n), lambda i, j: x[i, j] + 1.0, name="z")
    mod = build([y, z], [x, y, z], target="cuda", specialize=False)
    a = np.random.default_rng(3).standard_normal((7, 9)).astype("float32")
    o1, o2 = np.full((7, 9), np.nan, "float16"), np.full((7, 9), np.nan, "float32")
    _run(mod, [a], [o1, o2])
    np.testing.assert_allclose(o1, (2 * a).astype("float16"), rtol=1e-3)
    np.testing.assert_allclose(o2, a + 1, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_device_odd_width_and_symbolic_3d(dtype: str) -> None:
    rng = np.random.default_rng(11)
    for seed in (W.gelu, W.horizontal):
        w = seed(m=33, n=1001, dtype=dtype)
        mod = build(list(w.outputs), list(w.args), target="cuda")
        a = rng.standard_normal((33, 1001)).astype(dtype)
        outs = [np.full((33, 1001), np.nan, dtype) for _ in w.outputs]
        mod(a, *outs)
        for got, ref in zip(outs, w.reference(a)):
            np.testing.assert_allclose(got.astype("float64"), ref.astype("float64"), rtol=2e-3, atol=2e-3)
    m, n = te.var("m"), te.var("n")
    for seed in (W.gelu, W.horizontal, W.bias_gelu):  # symbolic sizes: one module, every key
        w = seed(m=m, n=n, dtype=dtype)
        mod = build(list(w.outputs), list(w.args), target="cuda")
        for shape in SYM_SHAPES:
            ins = _sym_inputs(w, {m: shape[0], n: shape[1]}, rng, dtype)
            outs = [np.full(shape, np.nan, dtype) for _ in w.outputs]
            mod(*ins, *outs)
            for got, ref in zip(outs, w.reference(*ins)):
                np.testing.assert_allclose(got.astype("float64"), ref.astype("float64"), rtol=2e-3, atol=2e-3)
    b, t, d = te.var("b"), te.var("t"), te.var("d")
    x = te.placeholder((b, t, d), dtype=dtype, name="x")
    y = te.compute((b, t, d), lambda i, j, k: x[i, j, k] * 2.0 - 1.0, name="y")
    mod = build([y], [x, y], target="cuda")
    for shape in ((3, 5, 64), (2, 7, 33), (4, 9, 1)):  # d = 1: a key without the loop over d
        a = rng.standard_normal(shape).astype(dtype)
        o = np.full(shape, np.nan, dtype)
        mod(a, o)
        np.testing.assert_allclose(o.astype("float64"), (2 * a.astype("float64") - 1), rtol=2e-3, atol=2e-3)



def _brighter(h, w, c):  # noqa: ANN001, ANN202 - sizes: ints or te.var
    """Halide's lesson 2 (float): out(x, y, c) = min(in(x, y, c) * 1.5, 255)."""
    img = te.placeholder((h, w, c), name="input")
    return img, te.compute((h, w, c), lambda y, x, ch: te.minimum(img[y, x, ch] * 1.5, 255.0), name="brighter")


def _image(shape: tuple[int, int, int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A random image of `shape` in [0, 255) and the brightened float64 reference."""
    a = (np.random.default_rng(seed).random(shape) * 255).astype(np.float32)
    return a, np.minimum(a.astype(np.float64) * 1.5, 255)


def test_halide_lesson_2_brighter_image_of_odd_width() -> None:
    # Halide's tutorial lesson 2 (float): out(x, y, c) = min(in(x, y, c) * 1.5, 255) over a 3-channel image of an
    # odd width; all three loops collapse into one vectorized flat loop
    img, out = _brighter(37, 641, 3)
    a, ref = _image((37, 641, 3), 0)
    cu = build([out], [img, out], target="cuda")
    vec = _kernel_body(cu.source).split("} else {")[0]
    assert "LOOPIR_LD4" in vec and "loopir_floordiv" not in vec
    got = np.full_like(a, np.nan)
    _run(cu, [a], [got])
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    got_cpu = np.full_like(a, np.nan)
    build([out], [img, out], target="cpu")(a, got_cpu)
    np.testing.assert_allclose(got_cpu, ref, rtol=1e-6)


@pytest.mark.parametrize("shape", [(37, 641, 3), (5, 7, 1), (2, 1024, 4)])
def test_halide_lesson_2_at_symbolic_sizes(shape) -> None:
    # the same brightening with the image's sizes known only at run time: one module; every call-time key (an odd
    # width, a channel count of 1 whose loop the key removes, whole vectors) runs 16-byte accesses at a flat index
    # with every access proven in bounds (no guard, no note), on both targets
    h, w, c = te.var("h"), te.var("w"), te.var("c")
    img, out = _brighter(h, w, c)
    a, ref = _image(shape, sum(shape))
    cu = build([out], [img, out], target="cuda")
    v, key = cu.specializer.select({h: shape[0], w: shape[1], c: shape[2]})
    assert v.notes == [], key
    vec = [ln for ln in _kernel_body(v.source).splitlines() if "LOOPIR_LD4" in ln]
    assert vec and not any("loopir_floordiv" in ln or "loopir_mod" in ln for ln in vec), key
    got = np.full_like(a, np.nan)
    _run(v, [a], [got])
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    got_cpu = np.full_like(a, np.nan)
    build([out], [img, out], target="cpu")(a, got_cpu)
    np.testing.assert_allclose(got_cpu, ref, rtol=1e-6)
