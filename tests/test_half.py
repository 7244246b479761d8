"""Half precision: bfloat16 as a dtype, float16 / bfloat16 workloads on both targets, 16-byte accesses.

Every result is compared with a float64 numpy reference computed from the same (half-rounded) inputs,
relative to the largest reference value. Tolerances per dtype (one rounding of the output to the half
type dominates; reductions accumulate in float32, `codegen.passes.accumulate`):
float16 (11-bit significand, unit roundoff 2^-11 = 4.9e-4): 4e-3; bfloat16 (8 bits, 2^-8 = 3.9e-3): 3e-2.
bfloat16 data on the host is its bits: numpy uint16 arrays (`loopir.dtypes.to_bfloat16` / `from_bfloat16`).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from codegen import build
from loopir import interp, te, workloads
from loopir.dtypes import from_bfloat16, promote, to_bfloat16
from loopir.errors import ArgumentTypeError
from loopir.lower import lower

TOL = {"float16": 4e-3, "bfloat16": 3e-2}
HALVES = ("float16", "bfloat16")


def to_half(a: np.ndarray, dt: str) -> np.ndarray:
    return to_bfloat16(a) if dt == "bfloat16" else a.astype(dt)


def widen(a: np.ndarray, dt: str) -> np.ndarray:
    return from_bfloat16(a).astype(np.float64) if dt == "bfloat16" else a.astype(np.float64)


def poisoned(shape: tuple[int, ...], dt: str) -> np.ndarray:
    """An output full of NaN (bfloat16: a quiet NaN's bits), so an element nobody writes shows."""
    return np.full(shape, 0x7FC0, np.uint16) if dt == "bfloat16" else np.full(shape, np.nan, dt)


def case(name: str, dt: str, sizes: tuple[int, ...], seed: int = 0):
    """(workload in `dt`, its half inputs, the float64 reference of those inputs)."""
    w = getattr(workloads, name)(*sizes, dtype=dt)
    rng = np.random.default_rng(seed)
    ins = [to_half(rng.standard_normal(tuple(int(d.value) for d in x.shape)), dt) for x in w.inputs]
    w64 = getattr(workloads, name)(*sizes, dtype="float64")
    ref = w64.reference(*[widen(a, dt) for a in ins])[0]
    return w, ins, ref


def rel_err(out: np.ndarray, dt: str, ref: np.ndarray) -> float:
    got = widen(out, dt)
    assert not np.isnan(got).any(), "an output element was not written"
    return float(np.abs(got - ref).max() / np.abs(ref).max())


# workload name -> sizes that no tile or vector width divides (and, for the CUDA source checks, sizes that do)
ODD = {"gelu": (1003,), "softmax": (7, 203), "layernorm": (5, 201), "matmul_bias_relu": (37, 29, 67)}
EVEN = {"gelu": (8192,), "softmax": (16, 4096), "layernorm": (16, 4096)}


# ----------------------------------------------------------------------------- the dtype


def test_bfloat16_round_to_nearest_even() -> None:
    # 1 + 2^-8 is half-way between 1 and 1 + 2^-7: ties go to the even significand (1.0)
    vals = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, np.inf, -np.inf, 3.3e38, 1e-40], np.float32)
    bits = to_bfloat16(vals)
    assert bits.dtype == np.uint16
    assert list(bits[:4]) == [0x3F80, 0x3F80, 0x3F82, 0xC020]
    assert list(bits[4:6]) == [0x7F80, 0xFF80]
    back = from_bfloat16(bits)
    assert back.dtype == np.float32
    # every result is the nearest bfloat16: against all representable neighbours
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4096) * 10.0 ** rng.integers(-30, 30, 4096)).astype(np.float32)
    b = to_bfloat16(x)
    near = from_bfloat16(b).astype(np.float64)
    for d in (-1, 1):
        other = from_bfloat16((b.astype(np.int32) + d).astype(np.uint16)).astype(np.float64)
        assert (np.abs(near - x) <= np.abs(other - x)).all()
    nan = to_bfloat16(np.array([np.nan], np.float32))
    assert np.isnan(from_bfloat16(nan)).all()


def test_bfloat16_from_float64_rounds_once() -> None:
    # just above / below the tie 1 + 2^-8: rounding to float32 first would land on the tie and go to even
    t = np.array([1 + 2**-8 + 2**-30, 1 + 2**-8 - 2**-30, 1e39, -1e39, 0.0, -0.0])
    assert list(to_bfloat16(t)) == [0x3F81, 0x3F80, 0x7F80, 0xFF80, 0x0000, 0x8000]


def test_cpu_casts_match_the_interpreter_bit_for_bit() -> None:
    n = 301
    x = te.placeholder((n,), "bfloat16", name="x")
    d = te.placeholder((n,), "float64", name="d")
    k = te.placeholder((n,), "int32", name="k")
    y = te.compute((n,), lambda i: te.cast("bfloat16", d[i]) + te.cast("bfloat16", k[i]) * x[i], name="y")
    h = te.compute((n,), lambda i: te.cast("float16", x[i] * 3.0), name="h")
    rng = np.random.default_rng(11)
    xa = to_bfloat16(rng.standard_normal(n))
    # float64 values a hair off bfloat16 ties, and integers beyond bfloat16's 8-bit significand
    da = (1 + 2**-8 + rng.choice([-1, 1], n) * 2.0**-30) * rng.standard_normal(n)
    ka = rng.integers(-100000, 100000, n).astype(np.int32)
    got = (poisoned((n,), "bfloat16"), poisoned((n,), "float16"))
    want = (poisoned((n,), "bfloat16"), poisoned((n,), "float16"))
    mod = build([y, h], [x, d, k, y, h], target="cpu")
    mod(xa, da, ka, *got)
    interp.run(mod.program, xa, da, ka, *want)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1].view(np.uint16), want[1].view(np.uint16))


def test_from_bfloat16_refuses_floats() -> None:
    with pytest.raises(ArgumentTypeError, match="uint16"):
        from_bfloat16(np.ones(3, np.float32))


@pytest.mark.parametrize("other, want", [("bfloat16", "bfloat16"), ("float16", "float32"), ("float32", "float32"),
                                         ("float64", "float64"), ("bool", "bfloat16"), ("int32", "float64")])
def test_promotion(other: str, want: str) -> None:
    assert promote("bfloat16", other) == want
    assert promote(other, "bfloat16") == want
    x = te.placeholder((4,), "bfloat16", name="x")
    y = te.placeholder((4,), other, name="y")
    assert te.compute((4,), lambda i: x[i] + y[i], name="z").dtype == want
    assert (x[0] * 2.0).dtype == "bfloat16"  # a Python scalar is weak


def test_bad_arguments_are_typed_errors() -> None:
    w = workloads.gelu(16, dtype="bfloat16")
    prog = w.program()
    out = poisoned((16,), "bfloat16")
    for bad in (np.ones(16, np.float32), np.ones(16, np.float16), np.ones(16, np.int16)):
        with pytest.raises(ArgumentTypeError, match="argument 'x' has dtype .* expects bfloat16"):
            interp.run(prog, bad, out)
    mod = build(list(w.outputs), list(w.args), target="cpu")
    with pytest.raises(ArgumentTypeError, match="expects bfloat16"):
        mod(np.ones(16, np.float32), out)
    # a uint16 array is bfloat16 bits only where a bfloat16 buffer takes it
    w16 = workloads.gelu(16, dtype="float16")
    with pytest.raises(TypeError, match="argument 'x' has dtype uint16"):
        interp.run(w16.program(), to_bfloat16(np.ones(16)), poisoned((16,), "float16"))


def test_interpreter_bfloat16_computes_in_float32_and_rounds_on_store() -> None:
    x = te.placeholder((64,), "bfloat16", name="x")
    y = te.compute((64,), lambda i: x[i] * x[i] + te.exp(x[i]), name="y")
    xa = to_bfloat16(np.random.default_rng(5).standard_normal(64))
    out = poisoned((64,), "bfloat16")
    interp.run(lower([y], args=[x, y]), xa, out)
    xf = from_bfloat16(xa)
    expect = to_bfloat16(xf * xf + np.exp(xf))  # float32 arithmetic, one rounding at the store
    assert np.abs(out.astype(np.int32) - expect.astype(np.int32)).max() <= 1  # exp: libm vs numpy, 1 ulp


# ----------------------------------------------------------------------------- numerics on the CPU (LLVM)


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("name", list(ODD))
def test_cpu_against_float64(name: str, dt: str) -> None:
    w, ins, ref = case(name, dt, ODD[name])
    mod = build(list(w.outputs), list(w.args), target="cpu")
    out = poisoned(ref.shape, dt)
    mod(*ins, out)
    assert rel_err(out, dt, ref) < TOL[dt]
    # the interpreter on the built program does what the compiled code does
    again = poisoned(ref.shape, dt)
    interp.run(mod.program, *ins, again)
    assert rel_err(again, dt, ref) < TOL[dt]


def test_cpu_bfloat16_casts_and_matmul_with_float32_accumulation() -> None:
    # the GEMM shape: bfloat16 inputs, cast to float32 in the sum, bias + ReLU, bfloat16 out
    n, m, p = 33, 41, 70
    A = te.placeholder((n, p), "bfloat16", name="A")
    B = te.placeholder((p, m), "bfloat16", name="B")
    bias = te.placeholder((m,), "bfloat16", name="bias")
    k = te.reduce_axis(p, name="k")
    mm = te.compute((n, m), lambda i, j: te.sum(te.cast("float32", A[i, k]) * te.cast("float32", B[k, j]), axis=k),
                    name="matmul")
    C = te.compute((n, m), lambda i, j: te.cast("bfloat16", te.maximum(mm[i, j] + bias[j], 0.0)), name="C")
    rng = np.random.default_rng(9)
    a, b, bb = (to_bfloat16(rng.standard_normal(s)) for s in ((n, p), (p, m), (m,)))
    ref = np.maximum(widen(a, "bfloat16") @ widen(b, "bfloat16") + widen(bb, "bfloat16"), 0.0)
    for target in ("cpu",):
        mod = build([C], [A, B, bias, C], target=target)
        out = poisoned((n, m), "bfloat16")
        mod(a, b, bb, out)
        assert rel_err(out, "bfloat16", ref) < TOL["bfloat16"]


def test_reductions_accumulate_in_float32() -> None:
    # a 4096-term row sum in bfloat16 steps would be off by several percent; float32 accumulation is not
    w, ins, ref = case("softmax", "bfloat16", (3, 4096))
    for target in ("cpu", "cuda"):
        mod = build(list(w.outputs), list(w.args), target=target)
        assert all(t.dtype == "float32" for t in mod.program.temps)  # row_max, row_sum
    mod = build(list(w.outputs), list(w.args), target="cpu")
    out = poisoned(ref.shape, "bfloat16")
    mod(*ins, out)
    assert rel_err(out, "bfloat16", ref) < TOL["bfloat16"]


# ----------------------------------------------------------------------------- CUDA: source (NVRTC) and races


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("name", list(EVEN))
def test_cuda_uses_16_byte_accesses(name: str, dt: str) -> None:
    w, _, _ = case(name, dt, EVEN[name])
    mod = build(list(w.outputs), list(w.args), target="cuda")
    assert mod.cubin  # NVRTC compiled it (the bf16 / f16x2 conversions are PTX)
    src = mod.source
    # (rows kept in registers: each access tests its alignment, loopir_ld16 / loopir_st16)
    assert re.search(r"LOOPIR_LD4\(reinterpret_cast<const uint4\*>|loopir_ld16<uint4>\(", src), "no 16-byte load"
    assert re.search(r"LOOPIR_ST4\(reinterpret_cast<uint4\*>|loopir_st16<uint4>\(", src), "no 16-byte store"
    assert "float4" not in src.split('extern "C"', 1)[1]
    assert ("loopir_f2bf_x2" if dt == "bfloat16" else "loopir_f2h_x2") in src
    # the pointer alignment tests are computed once at the kernel's entry, not at each access
    for kernel in src.split('extern "C"')[1:]:
        for flag in set(re.findall(r"const bool (\w+_aligned16) = ", kernel)):
            assert kernel.count(f"const bool {flag} =") == 1
        assert "& 15) == 0 &&" not in kernel.replace("x_shared", "")  # no per-access global pointer test


def test_cuda_vector_guard_checks_the_last_lane() -> None:
    w, _, _ = case("gelu", "bfloat16", (1003,))
    src = build(list(w.outputs), list(w.args), target="cuda").source
    assert "* 8) + 7) < 1003" in src.replace("LL", "")


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("name, sizes", [("gelu", (203,)), ("softmax", (3, 72)), ("layernorm", (2, 40)),
                                         ("matmul_bias_relu", (17, 13, 19))])
def test_cuda_program_race_free_under_adversarial_order(name: str, sizes: tuple[int, ...], dt: str) -> None:
    w, ins, ref = case(name, dt, sizes)
    mod = build(list(w.outputs), list(w.args), target="cuda")
    for order in ("reversed", 7):
        out = poisoned(ref.shape, dt)
        interp.run(mod.program, *ins, out, gpu_order=order)
        assert rel_err(out, dt, ref) < TOL[dt]


# ----------------------------------------------------------------------------- CUDA on a device


@pytest.mark.gpu
@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("name, sizes", [*ODD.items(), *EVEN.items(), ("gelu", (1000,)), ("softmax", (5, 1000))])
def test_cuda_against_float64(name: str, sizes: tuple[int, ...], dt: str) -> None:
    w, ins, ref = case(name, dt, sizes)
    mod = build(list(w.outputs), list(w.args), target="cuda")
    out = poisoned(ref.shape, dt)
    mod(*ins, out)
    assert rel_err(out, dt, ref) < TOL[dt]


@pytest.mark.gpu
def test_cuda_torch_bfloat16_tensors() -> None:
    torch = pytest.importorskip("torch")
    w, ins, ref = case("gelu", "bfloat16", (4099,))
    mod = build(list(w.outputs), list(w.args), target="cuda")
    x = torch.from_numpy(ins[0].view(np.int16)).view(torch.bfloat16).cuda()
    y = torch.full((4099,), float("nan"), dtype=torch.bfloat16, device="cuda")
    mod(x, y)
    torch.cuda.synchronize()
    out = y.cpu().view(torch.int16).numpy().view(np.uint16)
    assert rel_err(out, "bfloat16", ref) < TOL["bfloat16"]
    with pytest.raises(ArgumentTypeError, match="expects bfloat16"):
        mod(x.float(), y)
    # pointers 2 bytes off a 16-byte boundary: the kernel's entry test sends every thread down the scalar path
    w2, ins2, ref2 = case("gelu", "bfloat16", (4098,))
    mod2 = build(list(w2.outputs), list(w2.args), target="cuda")
    xs = torch.zeros(4099, dtype=torch.int16, device="cuda")
    xs[1:] = torch.from_numpy(ins2[0].view(np.int16)).cuda()
    ys = torch.full((4099,), float("nan"), dtype=torch.bfloat16, device="cuda")
    mod2(xs.view(torch.bfloat16)[1:], ys[1:])
    torch.cuda.synchronize()
    out2 = ys[1:].cpu().view(torch.int16).numpy().view(np.uint16)
    assert rel_err(out2, "bfloat16", ref2) < TOL["bfloat16"]
