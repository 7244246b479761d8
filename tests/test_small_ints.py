"""Small integers (int8, uint8, int16, uint16) on both targets and the interpreter: promotion as numpy, arithmetic
that wraps per operation as numpy's does (computed in 32-bit registers, narrowed), `te.cast` wrapping like
`astype`, `te.saturate_cast` clamping (NaN -> 0), reductions, lookup tables indexed by a small integer, and the
vectorized paths (CPU LLVM vectors, CUDA lane loops, which fall back to scalar accesses for 1- and 2-byte types).
uint16 means real numbers now; bfloat16 keeps its uint16 bits on the host.

CPU numerics run here; CUDA is built to a cubin through NVRTC and run in the adversarial GPU interpreter
(`gpu_order="reversed"`); the `gpu` tests run the same kernels on a device. Fresh random data, outputs poisoned."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from loopir import interp, te
from loopir.dtypes import promote, to_bfloat16
from loopir.errors import ArgumentTypeError
from loopir.nodes import Cast, Const
from schedules import Schedule

SMALL = ("int8", "uint8", "int16", "uint16")
EDGES = [-129.0, -128.0, 128.0, 255.0, 256.0, -1.0, 65535.0, 65536.0, -32769.0, 32767.0, 255.7, -0.7, -128.5,
         3.3, np.nan, np.inf, -np.inf]


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _ints(rng: np.random.Generator, dt: str, shape) -> np.ndarray:
    info = np.iinfo(dt)
    return rng.integers(int(info.min), int(info.max) + 1, shape).astype(dt)


def _poison(shape, dt: str) -> np.ndarray:
    return np.full(shape, np.nan if np.dtype(dt).kind == "f" else np.iinfo(dt).max // 3 + 7, dt)


def _run(mod, how: str, *arrays) -> None:
    """Run on the CPU module itself, or the CUDA module's program in the adversarial GPU interpreter."""
    if how == "cuda-interp":
        interp.run(mod.program, *arrays, gpu_order="reversed")
    else:
        mod(*arrays)


TARGETS = [("cpu", "cpu"), ("cuda", "cuda-interp")]


# ----------------------------------------------------------------------------- the language


@pytest.mark.parametrize("a", [*SMALL, "int32", "int64", "float16", "float32", "float64", "bool"])
@pytest.mark.parametrize("b", SMALL)
def test_promotion_is_numpys(a: str, b: str) -> None:
    assert promote(a, b) == np.promote_types(a, b).name


def test_bfloat16_promotion_with_small_ints() -> None:
    assert promote("bfloat16", "uint8") == "bfloat16"  # as float16 would: numpy keeps float16 there
    assert promote("bfloat16", "int16") == "float32"


def test_weak_scalars_and_constant_casts_wrap() -> None:
    x = te.placeholder((4,), "uint8", name="x")
    assert (x[0] + 3).dtype == "uint8"  # a Python int is weak
    assert (x[0] * 1.5).dtype == "float64"  # a Python float next to an integer: float64, as numpy
    c = te.cast("uint8", 300)
    assert isinstance(c, Const) and c.value == 44 and c.dtype == "uint8"
    assert te.cast("int8", 200).value == -56
    assert te.cast("uint8", -1.5).value == 255  # truncated toward zero, then wrapped (astype)
    assert isinstance(te.cast("uint8", float("nan")), Cast)  # unspecified: left to run time


def test_printed_nest_names_the_small_dtypes() -> None:
    n = te.var("n")
    a = te.placeholder((n,), "uint8", name="a")
    b = te.compute((n,), lambda i: te.saturate_cast("int16", a[i] * 2), name="b")
    text = str(Schedule(b).program)
    assert "a: uint8[n]" in text and "b: int16[n]" in text


def test_unknown_dtype_is_a_typed_error() -> None:
    with pytest.raises(ArgumentTypeError, match="uint9"):
        te.placeholder((3,), "uint9", name="x")
    with pytest.raises(ArgumentTypeError, match="uint9"):
        te.saturate_cast("uint9", 1)


def test_argument_dtypes_are_checked() -> None:
    n = te.var("n")
    a = te.placeholder((n,), "uint16", name="a")
    b = te.compute((n,), lambda i: a[i] + 1, name="b")
    mod = build(b, [a, b])
    with pytest.raises(ArgumentTypeError, match="argument 'a' has dtype int16, but program 'b' expects uint16"):
        mod(np.zeros(3, np.int16), np.zeros(3, np.uint16))
    with pytest.raises(ArgumentTypeError, match="argument 'b' has dtype float32"):
        mod(np.zeros(3, np.uint16), np.zeros(3, np.float32))


# ----------------------------------------------------------------------------- Halide's lesson 2, int8 GEMM


@pytest.mark.parametrize("target,how", TARGETS)
def test_brighten_uint8_image(target: str, how: str) -> None:
    """Halide lesson 2: `cast<uint8_t>(min(input * 1.5f, 255))`, 3 channels, an odd width."""
    h, w = 23, 45
    img = te.placeholder((h, w, 3), "uint8", name="img")
    out = te.compute((h, w, 3), lambda y, x, c: te.cast("uint8", te.minimum(img[y, x, c] * 1.5, 255)),
                     name="brighter")
    mod = build(out, [img, out], target=target)
    if target == "cuda":  # flat, 16 lanes of bytes per 128-bit access (guarded: 16 does not divide 23 * 45 * 3)
        assert "const uint4 img_v = LOOPIR_LD4(" in mod.source
    x = _ints(_rng(1), "uint8", (h, w, 3))
    got = _poison((h, w, 3), "uint8")
    _run(mod, how, x, got)
    np.testing.assert_array_equal(got, np.minimum(x * 1.5, 255).astype(np.uint8))


@pytest.mark.parametrize("target,how", TARGETS)
@pytest.mark.parametrize("shape", [(37, 29, 53), (16, 16, 16)])
def test_int8_matmul_accumulates_in_int32(target: str, how: str, shape) -> None:
    m, n, k = shape
    a = te.placeholder((m, k), "int8", name="A")
    b = te.placeholder((k, n), "int8", name="B")
    r = te.reduce_axis(k, name="k")
    c = te.compute((m, n), lambda i, j: te.sum(te.cast("int32", a[i, r]) * te.cast("int32", b[r, j]), axis=r),
                   name="C")
    mod = build(c, [a, b, c], target=target)
    rng = _rng(sum(shape))
    x, y = _ints(rng, "int8", (m, k)), _ints(rng, "int8", (k, n))
    got = _poison((m, n), "int32")
    _run(mod, how, x, y, got)
    np.testing.assert_array_equal(got, x.astype(np.int64) @ y.astype(np.int64))


# ----------------------------------------------------------------------------- arithmetic, wrap and saturation


def _arith(dt: str):
    n = te.var("n")
    a = te.placeholder((n,), dt, name="a")
    b = te.placeholder((n,), dt, name="b")
    fns = {
        "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
        "floordiv": lambda x, y: x // y, "mod": lambda x, y: x % y, "max": te.maximum, "min": te.minimum,
        "neg": lambda x, y: -x, "abs": lambda x, y: te.abs(x), "shift": lambda x, y: x * 3 + 7,
        "lt": lambda x, y: te.where(x < y, x, y), "to_f": lambda x, y: te.cast("float32", x) * 0.5,
        "to_i64": lambda x, y: te.cast("int64", x) * 1000,
    }
    outs = [te.compute((n,), lambda i, f=f: f(a[i], b[i]), name=name) for name, f in fns.items()]
    return a, b, outs, fns


def _np_arith(name: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return {
            "add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y,
            "floordiv": lambda: x // y, "mod": lambda: x % y, "max": lambda: np.maximum(x, y),
            "min": lambda: np.minimum(x, y), "neg": lambda: -x, "abs": lambda: np.abs(x),
            "shift": lambda: x * x.dtype.type(3) + x.dtype.type(7), "lt": lambda: np.where(x < y, x, y),
            "to_f": lambda: x.astype(np.float32) * np.float32(0.5), "to_i64": lambda: x.astype(np.int64) * 1000,
        }[name]()


@pytest.mark.parametrize("target,how", TARGETS)
@pytest.mark.parametrize("dt", SMALL)
def test_arithmetic_wraps_as_numpy(target: str, how: str, dt: str) -> None:
    a, b, outs, fns = _arith(dt)
    mod = build(outs, [a, b, *outs], target=target)
    rng = _rng(len(dt))
    size = 203
    x, y = _ints(rng, dt, size), _ints(rng, dt, size)
    info = np.iinfo(dt)
    x[:6] = [info.min, info.max, info.min, 0, info.max, -1 if info.min < 0 else 1]  # the edges
    y[:6] = [-1 if info.min < 0 else 1, 1, info.max, 0, info.max, 0]  # x // 0 and x % 0 give 0 (numpy)
    got = [_poison(size, o.dtype) for o in outs]
    _run(mod, how, x, y, *got)
    for name, g in zip(fns, got):
        np.testing.assert_array_equal(g, _np_arith(name, x, y), err_msg=f"{dt} {name} on {target}")


def test_uint16_arithmetic_uses_the_full_range_in_the_plain_interpreter() -> None:
    a, b, outs, fns = _arith("uint16")
    prog = Schedule(outs).program
    rng = _rng(16)
    x = rng.integers(32768, 65536, 57).astype(np.uint16)  # above int16: they must read as large positives
    y = _ints(rng, "uint16", 57)
    got = [_poison(57, o.dtype) for o in outs]
    interp.run(prog, x, y, *got)
    for name, g in zip(fns, got):
        np.testing.assert_array_equal(g, _np_arith(name, x, y), err_msg=name)


def _casts(src: str):
    n = te.var("n")
    x = te.placeholder((n,), src, name="x")
    outs = []
    for dt in SMALL:
        outs.append(te.compute((n,), lambda i, dt=dt: te.saturate_cast(dt, x[i]), name=f"sat_{dt}"))
        outs.append(te.compute((n,), lambda i, dt=dt: te.cast(dt, x[i]), name=f"wrap_{dt}"))
    return x, outs


def _np_saturate(v: np.ndarray, dt: str) -> np.ndarray:
    info = np.iinfo(dt)
    w = v.astype(np.float64)
    w = np.where(np.isnan(w), 0, w)
    return np.trunc(np.clip(w, info.min, info.max)).astype(dt)


@pytest.mark.parametrize("how", ["cpu", "interp", "cuda-interp"])
@pytest.mark.parametrize("src", ["float32", "float64", "int32", "int64", "uint16", "int8"])
def test_wraparound_and_saturation_at_the_edges(how: str, src: str) -> None:
    x, outs = _casts(src)
    if np.dtype(src).kind == "f":
        vals = np.array(EDGES, src)
    else:
        info = np.iinfo(src)
        vals = np.array([v for v in EDGES if np.isfinite(v) and info.min <= v <= info.max], np.float64).astype(src)
        vals = np.concatenate([vals, np.array([info.min, info.max], src), _ints(_rng(3), src, 40)])
    got = [_poison(len(vals), o.dtype) for o in outs]
    if how == "interp":
        interp.run(Schedule(outs).program, vals, *got)
    else:
        mod = build(outs, [x, *outs], target="cpu" if how == "cpu" else "cuda")
        _run(mod, how, vals, *got)
    finite = np.isfinite(vals) if vals.dtype.kind == "f" else np.ones(len(vals), bool)
    for o, g in zip(outs, got):
        kind, dt = o.name.split("_")
        if kind == "sat":
            np.testing.assert_array_equal(g, _np_saturate(vals, dt), err_msg=f"{o.name} of {src} ({how})")
        else:  # wraps: a float truncated toward zero to 64 bits first (inf and NaN: unspecified, not compared)
            want = vals[finite].astype(np.int64).astype(dt)
            np.testing.assert_array_equal(g[finite], want, err_msg=f"{o.name} of {src} ({how})")


def test_saturation_edges_are_the_documented_ones() -> None:
    x = te.placeholder((6,), "float32", name="x")
    y = te.compute((6,), lambda i: te.saturating_cast("uint8", x[i]), name="y")  # Halide's name, the alias
    got = _poison(6, "uint8")
    build(y, [x, y])(np.array([-129, 256, np.nan, np.inf, -np.inf, 255.7], np.float32), got)
    np.testing.assert_array_equal(got, [0, 255, 0, 255, 0, 255])


@pytest.mark.parametrize("target,how", TARGETS)
def test_saturate_cast_to_floats_clamps_to_the_finite_range(target: str, how: str) -> None:
    n = te.var("n")
    x = te.placeholder((n,), "float64", name="x")
    k = te.placeholder((n,), "int32", name="k")
    h = te.compute((n,), lambda i: te.saturate_cast("float16", x[i]), name="h")
    f = te.compute((n,), lambda i: te.saturate_cast("float32", x[i] * 1e300), name="f")
    hk = te.compute((n,), lambda i: te.saturate_cast("float16", k[i]), name="hk")
    mod = build([h, f, hk], [x, k, h, f, hk], target=target)
    xs = np.array([1e6, -1e6, 1.5, np.nan, np.inf, -65504.0, 70000.0], np.float64)
    ks = np.array([100000, -100000, 7, 0, 65504, -3, 2**31 - 1], np.int32)
    got = [_poison(7, "float16"), _poison(7, "float32"), _poison(7, "float16")]
    _run(mod, how, xs, ks, *got)
    f16, f32 = np.finfo(np.float16).max, np.finfo(np.float32).max
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got[0], np.clip(xs, -f16, f16).astype(np.float16))  # NaN stays NaN
        np.testing.assert_array_equal(got[1], np.clip(xs * 1e300, -f32, f32).astype(np.float32))
    np.testing.assert_array_equal(got[2], np.clip(ks, -65504, 65504).astype(np.float16))


# ----------------------------------------------------------------------------- reductions and lookups


@pytest.mark.parametrize("target,how", TARGETS)
@pytest.mark.parametrize("dt", ["uint8", "int16"])
def test_reductions_over_small_ints(target: str, how: str, dt: str) -> None:
    n = te.var("n")
    x = te.placeholder((n, 19), dt, name="x")
    r1, r2, r3 = (te.reduce_axis(19, name=f"r{k}") for k in range(3))
    s = te.compute((n,), lambda i: te.sum(x[i, r1], axis=r1), name="s")  # wraps in the dtype (numpy's dtype=)
    mx = te.compute((n,), lambda i: te.max(x[i, r2], axis=r2), name="mx")
    mn = te.compute((n,), lambda i: te.min(x[i, r3], axis=r3), name="mn")
    mod = build([s, mx, mn], [x, s, mx, mn], target=target)
    a = _ints(_rng(5), dt, (11, 19))
    got = [_poison(11, dt) for _ in range(3)]
    _run(mod, how, a, *got)
    np.testing.assert_array_equal(got[0], a.sum(1, dtype=dt))
    np.testing.assert_array_equal(got[1], a.max(1))
    np.testing.assert_array_equal(got[2], a.min(1))


@pytest.mark.parametrize("target,how", TARGETS)
def test_lookup_table_indexed_by_uint8(target: str, how: str) -> None:
    n = te.var("n")
    img = te.placeholder((n,), "uint8", name="img")
    lut = te.placeholder((256,), "int16", name="lut")
    out = te.compute((n,), lambda i: lut[img[i]], name="out")
    mod = build(out, [img, lut, out], target=target)
    rng = _rng(9)
    a, table = _ints(rng, "uint8", 300), _ints(rng, "int16", 256)
    a[:2] = [0, 255]
    got = _poison(300, "int16")
    _run(mod, how, a, table, got)
    np.testing.assert_array_equal(got, table[a])


# ----------------------------------------------------------------------------- vectorized paths


@pytest.mark.parametrize("dt", SMALL)
@pytest.mark.parametrize("factor", [16, 7])
def test_cpu_vectorized_small_int_loops_at_odd_sizes(dt: str, factor: int) -> None:
    n = te.var("n")
    a, b = te.placeholder((n,), dt, name="a"), te.placeholder((n,), dt, name="b")
    c = te.compute((n,), lambda i: a[i] * b[i] + a[i] // 3 - b[i], name="c")
    s = Schedule(c)
    (i,) = s.loops("c")
    _, ii = s.split(i, factor)
    s.vectorize(ii)
    mod = build(s, [a, b, c])
    assert f" x {'i8' if '8' in dt else 'i16'}>" in mod.optimized_ir  # LLVM vectors of the narrow type
    rng = _rng(factor)
    for size in (1, 31, 257):
        x, y = _ints(rng, dt, size), _ints(rng, dt, size)
        got = _poison(size, dt)
        mod(x, y, got)
        np.testing.assert_array_equal(got, _np_arith("add", _np_arith("mul", x, y), x // x.dtype.type(3)) - y)


@pytest.mark.parametrize("dt", SMALL)
@pytest.mark.parametrize("lanes", ["128-bit", 4])
def test_cuda_vectorized_small_int_lane_loops(dt: str, lanes) -> None:
    """16 lanes of a byte type (8 of a 2-byte one) become 128-bit accesses of packed lanes; another lane count
    is the scalar unrolled loop. Sizes the lanes do not divide run guarded (the scalar fallback)."""
    n = te.var("n")
    a, b = te.placeholder((n,), dt, name="a"), te.placeholder((n,), dt, name="b")
    c = te.compute((n,), lambda i: a[i] * b[i] - b[i], name="c")
    s = Schedule(c)
    (i,) = s.loops("c")
    width = 16 // np.dtype(dt).itemsize if lanes == "128-bit" else lanes
    o, ii = s.split(i, width)
    bo, bi = s.split(o, 32)
    s.bind(bo, "blockIdx.x").bind(bi, "threadIdx.x")
    s.vectorize(ii)
    mod = build(s, [a, b, c], target="cuda")
    assert len(mod.cubin) > 0
    body = mod.source[mod.source.index("__global__"):]
    assert ("const uint4 a_v = LOOPIR_LD4(" in body) == (lanes == "128-bit")
    if lanes == "128-bit":
        size = np.dtype(dt).itemsize
        ctype = {"int8": "signed char", "uint8": "unsigned char", "int16": "short", "uint16": "unsigned short"}[dt]
        top = 32 - 8 * size  # the last lane of a word: little-endian, lane k at bit 8 * size * k
        assert f"((int)({ctype})(a_v.w >> {top}))" in body
        mask = "0xFFu" if size == 1 else "0xFFFFu"
        assert f"(((unsigned)(c_{width - 1}) & {mask}) << {top})" in body and "LOOPIR_ST4(" in body
    rng = _rng(4)
    for size in (1, 31, 257):
        x, y = _ints(rng, dt, size), _ints(rng, dt, size)
        got = _poison(size, dt)
        interp.run(mod.program, x, y, got, gpu_order="reversed")
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(got, x * y - y)


# ----------------------------------------------------------------------------- uint16 is not bfloat16


def test_uint16_numbers_and_bfloat16_bits_stay_apart() -> None:
    n = te.var("n")
    u = te.placeholder((n,), "uint16", name="u")
    bf = te.placeholder((n,), "bfloat16", name="bf")
    out_u = te.compute((n,), lambda i: u[i] // 2 + 40000, name="out_u")
    out_f = te.compute((n,), lambda i: te.cast("float32", bf[i]) * 2.0, name="out_f")
    mod = build([out_u, out_f], [u, bf, out_u, out_f])
    rng = _rng(11)
    x = _ints(rng, "uint16", 50)
    vals = rng.standard_normal(50).astype(np.float32)
    bits = to_bfloat16(vals)
    got_u, got_f = _poison(50, "uint16"), _poison(50, "float32")
    mod(x, bits, got_u, got_f)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got_u, x // np.uint16(2) + np.uint16(40000))
    from loopir.dtypes import from_bfloat16
    np.testing.assert_array_equal(got_f, from_bfloat16(bits) * 2)
    with pytest.raises(ArgumentTypeError, match="expects bfloat16"):
        mod(x, vals, got_u, got_f)


# ----------------------------------------------------------------------------- on a device


@pytest.mark.gpu
@pytest.mark.parametrize("dt", SMALL)
def test_cuda_device_arithmetic_and_saturation(dt: str) -> None:
    a, b, outs, fns = _arith(dt)
    mod = build(outs, [a, b, *outs], target="cuda")
    rng = _rng(21)
    x, y = _ints(rng, dt, 1001), _ints(rng, dt, 1001)
    got = [_poison(1001, o.dtype) for o in outs]
    mod(x, y, *got)
    for name, g in zip(fns, got):
        np.testing.assert_array_equal(g, _np_arith(name, x, y), err_msg=name)
    xs, couts = _casts("float32")
    vals = np.array(EDGES, np.float32)
    got = [_poison(len(vals), o.dtype) for o in couts]
    build(couts, [xs, *couts], target="cuda")(vals, *got)
    for o, g in zip(couts, got):
        if o.name.startswith("sat"):
            np.testing.assert_array_equal(g, _np_saturate(vals, o.name.split("_")[1]), err_msg=o.name)


@pytest.mark.gpu
def test_cuda_device_brighten_and_int8_matmul() -> None:
    h, w = 480, 641
    img = te.placeholder((h, w, 3), "uint8", name="img")
    out = te.compute((h, w, 3), lambda y, x, c: te.cast("uint8", te.minimum(img[y, x, c] * 1.5, 255)), name="o")
    x = _ints(_rng(2), "uint8", (h, w, 3))
    got = _poison((h, w, 3), "uint8")
    build(out, [img, out], target="cuda")(x, got)
    np.testing.assert_array_equal(got, np.minimum(x * 1.5, 255).astype(np.uint8))
    m, n, k = 130, 70, 257
    a = te.placeholder((m, k), "int8", name="A")
    b = te.placeholder((k, n), "int8", name="B")
    r = te.reduce_axis(k, name="k")
    c = te.compute((m, n), lambda i, j: te.sum(te.cast("int32", a[i, r]) * te.cast("int32", b[r, j]), axis=r),
                   name="C")
    xa, xb = _ints(_rng(3), "int8", (m, k)), _ints(_rng(4), "int8", (k, n))
    gc = _poison((m, n), "int32")
    build(c, [a, b, c], target="cuda")(xa, xb, gc)
    np.testing.assert_array_equal(gc, xa.astype(np.int64) @ xb.astype(np.int64))


def test_cuda_source_narrows_every_small_int_result() -> None:
    """The GPU interpreter runs the IR, not the C: the C's own narrowing is checked here in the text (and run
    by the gpu tests): loads widen to int, + and // narrow back, a zero divisor is guarded."""
    n = te.var("n")
    a, b = te.placeholder((n,), "uint8", name="a"), te.placeholder((n,), "int16", name="b")
    c = te.compute((n,), lambda i: a[i] + a[i] // a[i], name="c")
    d = te.compute((n,), lambda i: -b[i] % 7 + te.cast("int16", te.cast("float32", b[i]) * 0.5), name="d")
    src = build([c, d], [a, b, c, d], target="cuda").source
    body = src[src.index("__global__"):]
    assert "const unsigned char* __restrict__ a" in body and "short* __restrict__ d" in body
    assert "((int)(unsigned char)((((int)a[" in body  # the sum, narrowed
    assert "loopir_floordiv0(" in body  # a // a: a divisor that may be 0
    assert "((int)(short)((-" in body  # the negation, narrowed
    assert "loopir_mod(" in body and "loopir_mod0(" not in body  # % 7: no guard needed
    assert "((int)(short)((long long)(" in body  # float -> int16 truncates through 64 bits, then wraps
