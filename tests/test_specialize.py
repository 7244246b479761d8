"""Call-time shape specialization (codegen.specialize): keys, variants, dispatch, pinned sizes, errors.

CPU modules run natively; CUDA variants run in the adversarial GPU interpreter (the lowered program of
the variant the real dispatch picks, `gpu_order="reversed"`); the `gpu` test runs them on the device."""

from __future__ import annotations

import math

import numpy as np
import pytest

from codegen import build
from codegen.passes import Assume, lower
from codegen.specialize import ROW_CLASSES, Key, div_class, row_class
from loopir import interp, te, workloads
from loopir.lower import lower as te_lower
from loopir.errors import ArgumentError, ArgumentTypeError, NotFoundError
from loopir.nodes import Kernel
from loopir.subst import substitute_program_sizes, substitute_sizes
from loopir.visit import walk
from schedules import auto_schedule
from loopir.affine import multiple_of

# a sequence that visits every divisibility key and comes back to the first: a call with a new
# shape must never run a variant built for another key
SEQ = (32, 20, 7, 1, 12, 48, 33)


def _call_cpu(mod, w, sizes):
    ins = w.random_inputs(sizes, rng=np.random.default_rng(sum(sizes.values())))
    outs = w.empty_outputs(sizes)
    mod(*w.call_args(ins, outs))
    for got, want in zip(outs, w.reference(*ins)):
        np.testing.assert_allclose(got, want, rtol=w.tolerance, atol=w.tolerance)


def _call_cuda_interp(mod, w, sizes):
    """What a CUDA call does up to the launch (checks, key, variant), then the variant's lowered program
    in the adversarial GPU interpreter."""
    ins = w.random_inputs(sizes, rng=np.random.default_rng(sum(sizes.values())))
    outs = w.empty_outputs(sizes)
    arrays = tuple(w.call_args(ins, outs))
    var = mod._select(mod.check(arrays))
    interp.run(var.program, *arrays, gpu_order="reversed")
    for got, want in zip(outs, w.reference(*ins)):
        np.testing.assert_allclose(got, want, rtol=w.tolerance, atol=w.tolerance)
    return var


def _index_dtypes(mod) -> set[str]:
    return {n.index_dtype for n in walk(mod.program.body) if isinstance(n, Kernel)}


# ----------------------------------------------------------------------------- keys


def test_div_and_row_classes():
    assert [div_class(v) for v in (1, 16, 4096, 20, 12, 24, 3000, 7, 0, 2)] == \
        ["1", "%16", "%16", "%4", "%4", "%8", "%8", "*", "*", "*"]
    assert row_class(1) == row_class(16) == ROW_CLASSES[0] and row_class(65) == 96 and row_class(127) == 127
    assert row_class(128) == 128 and row_class(129) == 192 and row_class(700) == row_class(768) == 768
    assert row_class(769) == 2**10
    assert row_class(2500) == row_class(3072) == 3072 and row_class(3073) == 2**12 and row_class(4097) == 6144
    assert row_class(12289) == row_class(16384) == 2**14
    assert row_class(50257) == 2**16 and row_class(2**16 + 1) == 0
    # a row is planned at most 1.5x its length from 64 to 16384 elements (to the register rows' end)
    assert all(row_class(n) <= 1.5 * n for n in range(64, 2**14 + 1))


def test_key_int32_and_rows_without_allocating():
    w = workloads.softmax()
    mod = build(list(w.outputs), list(w.args), target="cuda")
    spec = mod.specializer
    m, n = spec.vars
    assert [v.name for v in spec.vars] == ["m", "n"] and [v.name for v in spec.rows] == ["n"]
    small = spec.key({m: 16384, n: 4096})
    assert small == Key(("m", "n"), ("%16", "%16"), True, (("n", 2**12),))
    assert str(small) == "m%16 n%16 int32 n<=4096"
    huge = spec.key({m: 2**16, n: 2**16 + 16})  # 2^32 elements: 64-bit indices, and rows past every class
    assert not huge.int32 and huge.rows == (("n", 0),)
    # padded reach of an (m, n) buffer, each index 2048 past its end: (m + 2048) * n + (n + 2048), just below / at
    # 2**31 (the old bound, (m + 2048) * (n + 2048), refused n from 2**16 - 2048 on at this m)
    edge = (2**31 - 1 - 2048) // (2**15 + 1)
    assert (2**15 + 1) * edge + 2048 < 2**31 <= (2**15 + 1) * (edge + 1) + 2048
    assert spec.key({m: 2**15 - 2048, n: edge}).int32
    assert not spec.key({m: 2**15 - 2048, n: edge + 1}).int32
    assert spec.key({m: 3, n: 7}).div == ("*", "*")
    assert mod.specializations == []  # asking for keys compiles nothing


def test_cpu_keys_have_no_index_width():
    w = workloads.gelu()
    mod = build(list(w.outputs), list(w.args), target="cpu")
    (n,) = mod.specializer.vars
    assert not mod.specializer.key({n: 64}).int32
    assert mod.specializer.key({n: 7}).generic  # nothing to specialize: the generic module runs it


# ----------------------------------------------------------------------------- dispatch, CPU


@pytest.mark.parametrize("name", ["gelu", "softmax", "layernorm"])
def test_cpu_dispatch_sequence(name):
    w = getattr(workloads, name)()
    mod = build(list(w.outputs), list(w.args), target="cpu")
    two = len(w.sizes) == 2
    for n in SEQ:
        sizes = {"m": 3, "n": n} if two else {"n": n}
        _call_cpu(mod, w, sizes)
        assert mod.explain().splitlines()[-1]  # every call explains itself
    keys = set(mod.specializations)
    assert any("n%16" in k for k in keys) and any("n%4" in k for k in keys) and any("n=1" in k for k in keys)


def test_cpu_explain_names_key_and_reason():
    w = workloads.gelu()
    mod = build(list(w.outputs), list(w.args), target="cpu")
    _call_cpu(mod, w, {"n": 4096})
    text = mod.explain()
    assert "specialization n%16" in text and "n=4096: divisible by 16" in text
    _call_cpu(mod, w, {"n": 7})
    assert "n=7: not divisible" in mod.explain() and "generic" in mod.explain()
    assert mod.specializations == ["n%16"]


def test_last_ran_is_the_variant_of_the_last_call():
    w = workloads.gelu()
    mod = build(list(w.outputs), list(w.args), target="cpu")
    assert mod.last_ran is mod  # no call yet
    _call_cpu(mod, w, {"n": 4096})
    v16 = mod.last_ran
    assert v16 is not mod and v16 in mod.specializer.variants.values()
    assert [v.name for v in v16.size_vars] == ["n16"]
    _call_cpu(mod, w, {"n": 7})  # a generic call
    assert mod.last_ran is mod


def test_cpu_tiny_and_wide_rows():
    w = workloads.softmax()
    mod = build(list(w.outputs), list(w.args), target="cpu")
    for sizes in ({"m": 1, "n": 1}, {"m": 5, "n": 2}, {"m": 2, "n": 3000}, {"m": 2, "n": 5000}, {"m": 1, "n": 70001}):
        _call_cpu(mod, w, sizes)
    assert any("n<=3072" in k for k in mod.specializations) and any("n<=6144" in k for k in mod.specializations)


def test_variant_program_is_specialized():
    w = workloads.gelu()
    mod = build(list(w.outputs), list(w.args), target="cpu")
    (n,) = mod.specializer.vars
    v16, k16 = mod.specializer.select({n: 64})
    v1, _ = mod.specializer.select({n: 1})
    assert k16.div == ("%16",) and v16 is not mod
    assert [v.name for v in v16.size_vars] == ["n16"]
    assert not v1.size_vars and all(d.value == 1 for d in v1.program.args[0].shape)
    assert mod.specializer.select({n: 64})[0] is v16  # cached
    assert mod.specializer.select({n: 7})[0] is mod


def test_failed_variant_falls_back_to_generic():
    w = workloads.gelu()
    mod = build(list(w.outputs), list(w.args), target="cpu")

    def boom(key):
        raise ArgumentError("cannot build this variant")

    mod.specializer.make = boom
    _call_cpu(mod, w, {"n": 64})
    assert mod.specializations == [] and "could not be built" in mod.explain()
    _call_cpu(mod, w, {"n": 64})  # the failure is remembered: no second attempt, still right


# ----------------------------------------------------------------------------- dispatch, CUDA (interpreter)


@pytest.mark.parametrize("name", ["gelu", "softmax"])
def test_cuda_dispatch_sequence_interp(name):
    w = getattr(workloads, name)()
    mod = build(list(w.outputs), list(w.args), target="cuda")
    two = len(w.sizes) == 2
    seen = {}
    for n in (32, 7, 1, 12, 32):
        sizes = {"m": 2, "n": n} if two else {"n": n}
        var = _call_cuda_interp(mod, w, sizes)
        seen.setdefault(n, var)
        assert seen[n] is var  # the same key, the same variant
    assert seen[32] is not seen[7] and seen[1] is not seen[32]
    assert _index_dtypes(seen[32]) == {"int32"}
    # the generic kernel assumes 32-bit indices: it is the variant of sizes of no divisibility (gelu's n = 7; a
    # softmax row of 7 is a row class of its own)
    assert _index_dtypes(mod) == {"int32"} and (seen[7] is mod) == (name == "gelu")


@pytest.mark.parametrize("how", ["te", "schedule"])
def test_sizes_past_32_bits_get_a_64_bit_variant_never_the_generic(how):
    w = workloads.gelu()
    outs = list(w.outputs)
    mod = build(outs if how == "te" else auto_schedule(outs, target="cuda"), list(w.args), target="cuda")
    spec = mod.specializer
    (n,) = spec.vars
    assert spec.generic_int32 and spec.runs_generic(spec.key({n: 7}))
    huge = spec.key({n: 2**31 + 3})
    assert not huge.int32 and not spec.runs_generic(huge)
    var, key = spec.select({n: 2**31 + 3})  # compiled here (nothing runs): 64-bit indices
    assert key == huge and var is not mod and _index_dtypes(var) == {"int64"}
    assert "64-bit" in "\n".join(spec.explain(huge, {n: 2**31 + 3}))

    def boom(key):
        raise ArgumentError("cannot build this variant")

    spec.make = boom
    spec.variants.clear()
    with pytest.raises(ArgumentError, match="cannot build this variant"):  # the 32-bit generic is no fallback
        spec.select({n: 2**31 + 5})
    assert spec.select({n: 9})[0] is mod  # sizes that fit still run the generic module


def test_without_specialization_the_generic_kernel_keeps_64_bit_indices():
    w = workloads.gelu()
    mod = build(list(w.outputs), list(w.args), target="cuda", specialize=False)
    assert mod.specializer is None and _index_dtypes(mod) == {"int64"}


def test_cuda_layernorm_variant_interp():
    w = workloads.layernorm()
    mod = build(list(w.outputs), list(w.args), target="cuda")
    for sizes in ({"m": 2, "n": 48}, {"m": 3, "n": 5}, {"m": 1, "n": 1}):
        _call_cuda_interp(mod, w, sizes)
    assert len(mod.specializations) == 3


def test_cpu_rows_at_each_side_of_every_class_bound():
    # one symbolic module called at each class's bound and one past it (the next class's smallest row): every
    # variant, planned at its bound and assuming it, matches numpy on fresh data in NaN-poisoned outputs
    for w in (workloads.softmax(), workloads.layernorm()):
        mod = build(list(w.outputs), list(w.args), target="cpu")
        for b in ROW_CLASSES:
            for n in (b, b + 1):
                _call_cpu(mod, w, {"m": 3, "n": n})
        bounds = {int(k.split("n<=")[1]) for k in mod.specializations if "n<=" in k}
        assert bounds == set(ROW_CLASSES), sorted(bounds)


def test_cuda_rows_at_each_side_of_a_class_bound_interp():
    # a row at a class's bound and one past it take two variants (warp rows at 64 / 65 and 768 / 769 float16, block
    # register rows at 3072 / 3073 float32), each right in reversed thread order
    for w, pairs in ((workloads.rmsnorm(dtype="float16"), ((64, 65), (768, 769))),
                     (workloads.softmax(), ((3072, 3073),))):
        mod = build(list(w.outputs), list(w.args), target="cuda")
        for lo, hi in pairs:
            a = _call_cuda_interp(mod, w, {"m": 2, "n": lo})
            b = _call_cuda_interp(mod, w, {"m": 2, "n": hi})
            assert a is not b
        bounds = sorted(int(k.split("n<=")[1]) for k in mod.specializations)
        assert bounds == sorted({row_class(n) for pair in pairs for n in pair}), bounds


def test_cuda_row_classes_around_4096_plan_their_own_blocks_interp():
    # rows of 2049..3072 are planned at 3072 (128 threads), 3073..4096 at 4096 (128), 4097..6144 at 6144 (256
    # threads): register rows of at most 24, 32 and 24 elements per thread, the class's bound assumed; each variant's
    # lowered program matches numpy in the adversarial interpreter at a length inside its class
    w = workloads.layernorm()
    mod = build(list(w.outputs), list(w.args), target="cuda")
    small = _call_cuda_interp(mod, w, {"m": 2, "n": 3008})
    mid = _call_cuda_interp(mod, w, {"m": 2, "n": 3088})
    big = _call_cuda_interp(mod, w, {"m": 2, "n": 4112})
    assert sorted(mod.specializations) == ["m* n%16 int32 n<=3072", "m* n%16 int32 n<=4096",
                                           "m* n%16 int32 n<=6144"]
    threads = {v: math.prod(int(str(e)) for e in v.gen.kernels[0].launch.block) for v in (small, mid, big)}
    assert threads == {small: 128, mid: 128, big: 256}
    assert [v.source.count(f"float x_shared_reg[{k}];") for v, k in ((small, 24), (mid, 32), (big, 24))] == [1, 1, 1]
    assert all("__shared__ float x_shared" not in v.source for v in (small, mid, big))


def test_cuda_divisible_variant_drops_vector_size_check():
    w = workloads.softmax()
    mod = build(list(w.outputs), list(w.args), target="cuda")
    m, n = mod.specializer.vars
    var, key = mod.specializer.select({m: 64, n: 4096})
    assert key.int32 and "float4" in var.source and "const int i" in var.source
    assert "n16" in var.source and "long long i =" not in var.source


def test_hand_schedule_specializes_without_rescheduling():
    w = workloads.gelu()
    s = auto_schedule(list(w.outputs), target="cuda")
    mod = build(s, list(w.args), target="cuda")
    spec = mod.specializer
    (n,) = spec.vars
    assert spec.key({n: 4096}) == Key(("n",), ("%16",), True, ())
    assert not spec.key({n: 2**31}).int32
    for size in (36, 7, 1, 36):
        _call_cuda_interp(mod, w, {"n": size})
    assert sorted(mod.specializations) == ["n%4 int32", "n=1 int32"]  # n = 7: the (32-bit) generic module
    var, _ = spec.select({n: 36})
    assert "n4" in var.source and _index_dtypes(var) == {"int32"}
    cpu = build(auto_schedule(list(w.outputs), target="cpu"), list(w.args), target="cpu")
    for size in (64, 1, 7, 12):
        _call_cpu(cpu, w, {"n": size})
    assert sorted(cpu.specializations) == ["n%16", "n%4", "n=1"]


def test_substitute_program_sizes():
    w = workloads.softmax()
    m, n = w.sizes
    prog = auto_schedule(list(w.outputs), target="cpu").program
    n4 = te.var("n4")
    new = substitute_program_sizes(prog, {n: 4 * n4, m: 3})
    assert [str(d) for d in new.args[0].shape] == ["3", str(4 * n4)]
    assert [str(d) for d in prog.args[0].shape] == ["m", "n"]  # the original is untouched
    xa = np.random.default_rng(2).standard_normal((3, 8)).astype("float32")
    ya = np.full((3, 8), np.nan, "float32")
    interp.run(new, xa, ya)
    np.testing.assert_allclose(ya, w.reference(xa)[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ArgumentTypeError):
        substitute_program_sizes(prog, {"n": 3})


# ----------------------------------------------------------------------------- sizes= and specialize=False


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_pinned_sizes(target):
    w = workloads.softmax()
    m, n = w.sizes
    mod = build(list(w.outputs), list(w.args), target=target, sizes={m: 6, "n": 64})
    assert mod.specializer is None and all(not b.shape or all(d.value for d in b.shape) for b in mod.program.args)
    if target == "cuda":
        assert _index_dtypes(mod) == {"int32"}
        _call_cuda_interp(mod, w, {"m": 6, "n": 64})
    else:
        _call_cpu(mod, w, {"m": 6, "n": 64})
    part = build(list(w.outputs), list(w.args), target="cpu", sizes={"n": 16})  # m stays symbolic
    _call_cpu(part, w, {"m": 5, "n": 16})
    assert [v.name for v in part.specializer.vars] == ["m"]


def test_specialize_false_is_generic():
    w = workloads.gelu()
    mod = build(list(w.outputs), list(w.args), target="cpu", specialize=False)
    assert mod.specializer is None
    _call_cpu(mod, w, {"n": 64})
    assert mod.specializations == [] and "specialization" not in mod.explain()


def test_bad_sizes_and_options():
    w = workloads.softmax()
    outs, args = list(w.outputs), list(w.args)
    with pytest.raises(NotFoundError, match="'q'"):
        build(outs, args, target="cpu", sizes={"q": 3})
    with pytest.raises(NotFoundError, match="'n'"):
        build(outs, args, target="cpu", sizes={te.var("n"): 3})  # another variable of the same name
    with pytest.raises(ArgumentTypeError, match="'n' must be an int"):
        build(outs, args, target="cpu", sizes={"n": 2.0})
    with pytest.raises(ArgumentTypeError, match="'n' must be an int"):
        build(outs, args, target="cpu", sizes={"n": True})
    with pytest.raises(ArgumentError, match="'m' must be >= 0"):
        build(outs, args, target="cpu", sizes={"m": -1})
    with pytest.raises(ArgumentTypeError, match="sizes must be a dict"):
        build(outs, args, target="cpu", sizes=[("n", 3)])
    with pytest.raises(ArgumentTypeError, match="specialize must be True or False"):
        build(outs, args, target="cpu", specialize="no")
    with pytest.raises(ArgumentError, match="needs te tensors"):
        build(w.program(), args, target="cpu", sizes={"n": 3})


def test_bad_call_is_refused_before_any_variant():
    w = workloads.gelu()
    mod = build(list(w.outputs), list(w.args), target="cpu")
    x = np.random.default_rng(0).standard_normal(64).astype("float64")  # wrong dtype
    with pytest.raises(TypeError, match="dtype float64"):
        mod(x, np.full(64, np.nan, "float32"))
    assert mod.specializations == []


# ----------------------------------------------------------------------------- te substitution, pieces


def test_substitute_sizes_leaves_original():
    n, n16 = te.var("n"), te.var("n16")
    x = te.placeholder((n,), name="x")
    k = te.reduce_axis(n, name="k")
    s = te.compute((), lambda: te.sum(x[k], axis=k), name="s")
    y = te.compute((n,), lambda i: x[i] - s[()], name="y")
    new = substitute_sizes([y], {n: 16 * n16})
    y2 = new[y]
    assert y.shape == (n,) and str(y2.shape[0]) == str(16 * n16)
    assert new[x].buffer is not x.buffer and str(new[s].op.reduce_dom[0][1]) == str(16 * n16)
    prog = te_lower([y2], args=[new[x], y2])
    xa = np.random.default_rng(1).standard_normal(32).astype("float32")
    ya = np.full(32, np.nan, "float32")
    interp.run(prog, xa, ya)
    np.testing.assert_allclose(ya, xa - xa.astype(np.float64).sum(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ArgumentTypeError):
        substitute_sizes([y], {"n": 3})
    with pytest.raises(ArgumentTypeError):
        substitute_sizes([y], {n: 2.5})
    with pytest.raises(ArgumentError):
        substitute_sizes([y], {n: -2})


def test_multiple_of_affine():
    n = te.var("n")
    assert multiple_of(16 * n, 4) and multiple_of(16 * n + 8, 4) and multiple_of(te.const(4096), 16)
    assert not multiple_of(n, 4) and not multiple_of(16 * n + 2, 4) and not multiple_of(n // 4, 4)


def test_lower_assume_int32():
    w = workloads.gelu()
    prog = auto_schedule(list(w.outputs), target="cuda").program
    kinds = {k.index_dtype for k in walk(lower(prog, "cuda").body) if isinstance(k, Kernel)}
    assumed = {k.index_dtype for k in walk(lower(prog, "cuda", assume=Assume(index_int32=True)).body)
               if isinstance(k, Kernel)}
    assert kinds == {"int64"} and assumed == {"int32"}


# ----------------------------------------------------------------------------- on the device


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gelu", "softmax", "layernorm"])
def test_gpu_variants_run(name):
    w = getattr(workloads, name)()
    mod = build(list(w.outputs), list(w.args), target="cuda")
    two = len(w.sizes) == 2
    for n in (4096, 1000, 7, 1, 12, 50257, 4096):
        sizes = {"m": 33, "n": n} if two else {"n": n}
        _call_cpu(mod, w, sizes)  # numpy arrays in and out, the real launch
    assert len(mod.specializations) >= 3
    # prepare / launch / finish (the benchmarks' path) run the variant of the call's key too
    sizes = {"m": 17, "n": 2048} if two else {"n": 2048}
    ins, outs = w.random_inputs(sizes, rng=5), w.empty_outputs(sizes)
    p = mod.prepare(tuple(w.call_args(ins, outs)))
    assert p.module is not mod and "n%16" in str(mod._last_call[0])
    mod.launch(p)
    mod.finish(p)
    for got, want in zip(outs, w.reference(*ins)):
        np.testing.assert_allclose(got, want, rtol=w.tolerance, atol=w.tolerance)
    assert mod.benchmark(*w.call_args(ins, outs), warmup=1, repeat=2) > 0
