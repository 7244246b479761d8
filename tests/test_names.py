"""One name for a size, a tensor and a loop variable (issue 15): accepted, and kept apart everywhere a name
becomes text — the printer (`loopir.printer.display_names`), C and LLVM identifiers (`codegen.names`), the
arguments' binding by name (`loopir.args`), the specialization keys (`codegen.specialize`).

Each clash (size/tensor, size/loop, tensor/loop, all three; C words and prelude names; a dotted internal
stage) runs three ways against numpy (float64 reference): the reference interpreter on the lowered program,
the CPU target (LLVM), and the CUDA target — compiled by NVRTC, its lowered program run by the adversarial
GPU interpreter (`gpu_order="reversed"`)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from codegen import build
from codegen.names import C_RESERVED, C_RESERVED_PREFIXES, Namer, mangle
from codegen.specialize import Key, substitution
from loopir import interp, te
from loopir.args import bind_args
from loopir.errors import ArgumentError, NotFoundError
from loopir.lower import lower
from loopir.nodes import Buffer, Const, For, Program, Store, Var
from loopir.printer import display_names, program_str
from loopir.visit import seq
from schedules import Schedule

RNG = np.random.default_rng(15)


# ----------------------------------------------------------------------------- the programs


def size_and_tensor():
    """te.var("b") beside a placeholder named "b"."""
    b = te.var("b")
    x = te.placeholder((b,), name="b")
    y = te.compute((b,), lambda i: x[i] * 2.0 + 1.0, name="y")
    return [y], [x, y], lambda xa: [xa * 2 + 1], lambda s: [(s,)], b


def size_and_loop():
    """A loop variable named like the size it runs to: i = te.var("i"); lambda i: ..."""
    i = te.var("i")
    x = te.placeholder((i,), name="x")
    w = te.compute((i,), lambda i: x[i] + 1.0, name="w")
    return [w], [x, w], lambda xa: [xa + 1], lambda s: [(s,)], i


def tensor_and_loop():
    """Loop variables (an axis, a reduce axis) named like the tensor they read: a row sum and the rows
    minus it."""
    n, c = te.var("n"), te.var("c")
    xt = te.placeholder((n, c), name="x")
    k = te.reduce_axis(c, "x")
    y = te.compute((n,), lambda i: te.sum(xt[i, k], axis=k), name="y")
    z = te.compute((n, c), lambda x, j: xt[x, j] - y[x], name="z")

    def ref(xa):
        s = xa.sum(axis=1)
        return [s, xa - s[:, None]]

    return [y, z], [xt, y, z], ref, lambda s: [(s, s + 3)], n


def all_three():
    """A size, a tensor and loop variables (an axis, a reduce axis) all named "b": RMS-normalized rows."""
    b = te.var("b")
    bt = te.placeholder((b, 8), name="b")
    k = te.reduce_axis(8, "b")
    s = te.compute((b,), lambda i: te.sum(bt[i, k] * bt[i, k], axis=k), name="s")
    o = te.compute((b, 8), lambda b, j: bt[b, j] / te.sqrt(s[b] + 1.0), name="o")

    def ref(xa):
        ss = (xa * xa).sum(axis=1)
        return [xa / np.sqrt(ss + 1.0)[:, None]]

    return [o], [bt, o], ref, lambda s: [(s, 8)], b


def c_words():
    """Names that are C/C++ words, CUDA built-ins and prelude helpers: a size `max`, tensors `int`, `float`,
    `for`, loop variables `threadIdx`, `min`, `float4`, a reduce axis `loopir_mod`."""
    mx = te.var("max")
    it = te.placeholder((mx, 4), name="int")
    k = te.reduce_axis(4, "loopir_mod")
    fl = te.compute((mx,), lambda threadIdx: te.max(it[threadIdx, k], axis=k), name="float")
    fo = te.compute((mx, 4), lambda min, float4: te.exp(it[min, float4] - fl[min]), name="for")

    def ref(xa):
        m = xa.max(axis=1)
        return [np.exp(xa - m[:, None])]

    return [fo], [it, fo], ref, lambda s: [(s, 4)], mx


CASES = [size_and_tensor, size_and_loop, tensor_and_loop, all_three, c_words]


def _inputs(shapes):
    return [RNG.standard_normal(s).astype(np.float32) for s in shapes]


def _outputs(args, n_in, sizes):
    """NaN-poisoned outputs for the args after the inputs, shaped at `sizes`."""
    out = []
    for t in args[n_in:]:
        shape = tuple(int(d.value) if isinstance(d, Const) else sizes[d] for d in t.shape)
        out.append(np.full(shape, np.nan, np.float32))
    return out


def _sizes_of(args, n_in, arrays):
    env: dict[Var, int] = {}
    for t, a in zip(args[:n_in], arrays):
        for d, x in zip(t.shape, a.shape):
            if isinstance(d, Var):
                env[d] = x
    return env


def _check(outs, want):
    for got, w in zip(outs, want):
        np.testing.assert_allclose(got, w.astype(np.float64), rtol=2e-5, atol=2e-5)


def _run_three_ways(case, size):
    outs_t, args, ref, shapes, _ = case()
    n_in = len(shapes(size))
    ins = _inputs(shapes(size))
    want = ref(*[a.astype(np.float64) for a in ins])
    sizes = _sizes_of(args, n_in, ins)
    # the reference interpreter on the lowered te program
    prog = lower(outs_t, args)
    outs = _outputs(args, n_in, sizes)
    interp.run(prog, *ins, *outs)
    _check(outs, want)
    # CPU (LLVM)
    mod = build(outs_t, args, target="cpu")
    outs = _outputs(args, n_in, sizes)
    mod(*ins, *outs)
    _check(outs, want)
    # CUDA: NVRTC compiles at build; the lowered program of the variant a call picks runs in the adversarial
    # GPU interpreter
    cmod = build(outs_t, args, target="cuda")
    assert cmod.kernels and "__global__" in cmod.source
    outs = _outputs(args, n_in, sizes)
    arrays = (*ins, *outs)
    var = cmod._select(cmod.check(arrays))
    interp.run(var.program, *arrays, gpu_order="reversed")
    _check(outs, want)
    return prog, mod, cmod


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_clashing_names_build_and_match_numpy(case):
    prog, mod, cmod = _run_three_ways(case, 37)
    _assert_unambiguous(prog)
    _assert_kernel_names_safe(cmod.source)
    assert re.search(r"define i32 @\w+_s0\(", mod.source)


def test_size_by_the_users_name_beside_a_tensor_of_that_name():
    outs_t, args, ref, shapes, b = all_three()
    # pinned before scheduling by the user's name, and by the Var
    for key in ("b", b):
        mod = build(outs_t, args, target="cpu", sizes={key: 12})
        (xa,) = _inputs(shapes(12))
        (oa,) = _outputs(args, 1, {b: 12})
        mod(xa, oa)
        _check([oa], ref(xa.astype(np.float64)))
        with pytest.raises(ArgumentError):
            mod(*_inputs(shapes(13)), np.full((13, 8), np.nan, np.float32))
    with pytest.raises(NotFoundError, match="'o', which is not a size variable"):
        build(outs_t, args, target="cpu", sizes={"o": 12})  # a tensor's name is no size
    # passed by name at call time: the size `b`, not the tensor `b` nor the loop `b`
    prog = lower(outs_t, args)
    (xa,) = _inputs(shapes(5))
    (oa,) = _outputs(args, 1, {b: 5})
    assert bind_args(prog, [xa, oa], known={"b": 5}) == {b: 5}
    with pytest.raises(ArgumentError, match="size variable 'b' is 5"):
        bind_args(prog, [xa, np.zeros((6, 8), np.float32)], known={"b": 5})
    interp.run(prog, xa, oa, sizes={"b": 5})
    _check([oa], ref(xa.astype(np.float64)))


def test_two_size_variables_of_one_name_are_refused_by_name():
    # lowering refuses them (test_lower); a hand-built program may have them, and binding by that name
    # cannot choose
    n1, n2 = Var("n"), Var("n")
    x, y = Buffer("x", (n1,), "float32"), Buffer("y", (n2,), "float32")
    i = Var("i")
    prog = Program("p", (x, y), For(i, Const(0, "int64"), n1, Store("S", x, (i,), x[i] + 1.0, (i,), (i,))),
                   (), (n1, n2))
    with pytest.raises(ArgumentError, match="2 size variables named 'n'"):
        bind_args(prog, [np.zeros(3, np.float32), np.zeros(4, np.float32)], known={"n": 3})
    with pytest.raises(NotFoundError, match="size 'm' is not a size variable"):
        bind_args(prog, [np.zeros(3, np.float32), np.zeros(4, np.float32)], known={"m": 3})
    assert "def p(x: float32[n], y: float32[n_size]):  # sizes: n, n_size (passed as 'n')" in str(prog)


@pytest.mark.parametrize("case", [all_three, size_and_loop], ids=lambda c: c.__name__)
def test_symbolic_size_specialization_with_clashing_names(case):
    outs_t, args, ref, shapes, size = case()
    n_in = len(shapes(1))
    mod = build(outs_t, args, target="cpu")
    cmod = build(outs_t, args, target="cuda")
    for s in (32, 12, 7, 1):
        ins = _inputs(shapes(s))
        sizes = _sizes_of(args, n_in, ins)
        want = ref(*[a.astype(np.float64) for a in ins])
        outs = _outputs(args, n_in, sizes)
        mod(*ins, *outs)
        _check(outs, want)
        outs = _outputs(args, n_in, sizes)
        arrays = (*ins, *outs)
        var = cmod._select(cmod.check(arrays))
        interp.run(var.program, *arrays, gpu_order="reversed")
        _check(outs, want)
        # the key and explain() speak of the size by the user's name
        assert f"{size.name}={s}:" in mod.explain() and f"{size.name}={s}:" in cmod.explain()
    assert not mod.specializer.failed and not cmod.specializer.failed  # variants built, no generic fallback
    assert any(k.startswith(f"{size.name}%16") for k in mod.specializations)
    assert any(k.startswith(f"{size.name}=1") for k in cmod.specializations)


def test_specialization_fresh_size_avoids_another_sizes_name():
    # n divisible by 16 becomes 16 * a fresh size; the user has a size named n16 already
    n, n16 = Var("n"), Var("n16")
    sub, _ = substitution(Key(("n", "n16"), ("%16", "*"), False, ()), [n, n16])
    fresh_var = sub[n].b
    assert isinstance(fresh_var, Var) and fresh_var.name == "n16_1"


# ----------------------------------------------------------------------------- C words, a dotted stage


def dotted_program():
    """A program named "x.y" whose temporary and statement are named "x.y" (as an internal stage lifted
    from an inline reduction is: `mean.sum0`), its loops "i" and "x.y", next to a tensor "x_y"."""
    n = te.var("n")
    x = Buffer("x", (n,), "float32")
    t = Buffer("x.y", (n,), "float32")
    y = Buffer("x_y", (n,), "float32")
    i, j = Var("i"), Var("x.y")
    zero = Const(0, "int64")
    body = seq(For(i, zero, n, Store("x.y", t, (i,), x[i] * 3.0, (i,), (i,))),
               For(j, zero, n, Store("x_y", y, (j,), t[j] - x[j], (j,), (j,))))
    return Program("x.y", (x, y), body, (t,), (n,))


def test_dotted_internal_stage_compiles_and_runs():
    prog = dotted_program()
    xa = RNG.standard_normal(50).astype(np.float32)
    want = xa.astype(np.float64) * 2
    ya = np.full_like(xa, np.nan)
    interp.run(prog, xa, ya)
    _check([ya], [want])
    mod = build(prog, target="cpu")
    ya[:] = np.nan
    mod(xa, ya)
    _check([ya], [want])
    assert "@x_y_s0(" in mod.source
    s = Schedule(prog)
    for stage in ("x.y", "x_y"):
        (lp,) = s.loops(stage)
        o, i = s.split(lp, 32)
        s.bind(o, "blockIdx.x").bind(i, "threadIdx.x")
    cmod = build(s, target="cuda")
    _assert_kernel_names_safe(cmod.source)
    assert "x_y_1" in cmod.source  # the tensor x_y and the mangled x.y stay apart
    ya[:] = np.nan
    interp.run(cmod.program, xa, ya, gpu_order="reversed")
    _check([ya], [want])


def test_c_words_become_safe_identifiers():
    outs_t, args, *_ = c_words()
    src = build(outs_t, args, target="cuda", specialize=False).source
    kernels = "".join(src.split('extern "C" __global__')[1:])
    params = {p.split()[-1] for head in re.findall(r"\w+\(([^)]*)\) \{", kernels) for p in head.split(",")}
    assert {"int_", "for_", "max_"} <= params, params
    assert not params & {"int", "float", "for", "max", "min", "threadIdx", "float4", "loopir_mod"}
    _assert_kernel_names_safe(src)


# ----------------------------------------------------------------------------- printing


def test_printed_program_is_unambiguous():
    outs_t, args, *_ = all_three()
    p = lower(outs_t, args)
    assert str(p) == "\n".join([
        "def o(b: float32[b_size, 8], o: float32[b_size, 8]):  # sizes: b_size (passed as 'b')",
        "    s: float32[b_size]  # temporary",
        "    for i in range(0, b_size):",
        "        s[i] = 0.0  # s_init",
        "        for b_1 in range(0, 8):",
        "            s[i] = s[i] + b[i, b_1] * b[i, b_1]  # s",
        "    for b_1 in range(0, b_size):",
        "        for j in range(0, 8):",
        "            o[b_1, j] = b[b_1, j] / sqrt(s[b_1] + 1.0)  # o",
    ])
    _assert_unambiguous(p)
    # a schedule prints the same names, and a split loop's binding too
    s = Schedule(outs_t)
    io, ii = s.split(s.loops("o")[0], 4)
    assert io is not None and ii is not None
    text = program_str(s.program)
    assert str(s) == text
    assert "for b_o in range(0, (b_size + 3) // 4):" in text and "if b_o * 4 + b_i < b_size:" in text
    assert "o[b_1, j] = b[b_1, j] / sqrt(s[b_1] + 1.0)  # o (b_1 = b_o * 4 + b_i)" in text


def test_loop_nested_in_a_loop_of_its_name_prints_apart():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    i = Var("i")
    inner, outer = Var("i"), i
    a = Buffer("a", (n, n), "float32")
    zero = Const(0, "int64")
    body = For(outer, zero, n, For(inner, zero, n, Store("S", a, (outer, inner), x.buffer[inner] + 1.0,
                                                         (outer, inner), (outer, inner))))
    p = Program("p", (x.buffer, a), body, (), (n,))
    text = str(p)
    assert "for i in range(0, n):" in text and "for i_1 in range(0, n):" in text
    assert "a[i, i_1] = x[i_1] + 1.0  # S" in text


def _assert_unambiguous(p: Program) -> None:
    names = display_names(p.body, p.args + p.temps, p.params)
    glob = [names[b] for b in p.args + p.temps] + [names[v] for v in p.params]
    assert len(set(glob)) == len(glob), glob
    loops = [names[v] for v, nm in names.items() if isinstance(v, Var) and v not in p.params]
    assert not set(loops) & set(glob), (loops, glob)


# ----------------------------------------------------------------------------- the mangling


def test_mangle():
    assert mangle("mean.sum0") == "mean_sum0"
    assert mangle("résultat") == "r_xe9_sultat"
    assert [mangle(w) for w in ("int", "float", "min", "max", "threadIdx", "float4", "for", "expf")] == \
        ["int_", "float_", "min_", "max_", "threadIdx_", "float4_", "for_", "expf_"]
    assert mangle("loopir_mod") == "v_loopir_mod" and mangle("LOOPIR_LD4") == "v_LOOPIR_LD4"
    assert mangle("__syncthreads") == "v___syncthreads" and mangle("_Bool") == "v_Bool"
    assert mangle("2d") == "v2d" and mangle("") == "v" and mangle("a b") == "a_x20_b"
    for name in ("int", "x.y", "loopir_min", "", "9", "__x", "make_float4"):
        m = mangle(name)
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", m) and m not in C_RESERVED
        assert not m.startswith(C_RESERVED_PREFIXES)


def test_namer_keeps_objects_of_one_name_apart():
    names = Namer()
    size, tensor, loop = Var("b"), Buffer("b", (4,), "float32"), Var("b")
    got = [names.get(size, size.name), names.get(tensor, tensor.name), names.get(loop, loop.name)]
    assert got == ["b", "b_1", "b_2"] and names.get(size, "b") == "b"
    dotted, under = Buffer("x.y", (4,), "float32"), Buffer("x_y", (4,), "float32")
    assert names.get(dotted, dotted.name) != names.get(under, under.name)
    assert names.fresh("b") == "b_3" and names.fresh("int") == "int_"


def _assert_kernel_names_safe(src: str) -> None:
    """Every function a kernel body calls is reserved (a user's name can never shadow it): every identifier
    before `(` in the kernels, but the kernels' own names, is a reserved word or in a reserved namespace."""
    kernels = src.split('extern "C" __global__')[1:]
    assert kernels
    own = {re.search(r"(\w+)\(", k).group(1) for k in kernels}
    for k in kernels:
        body = re.sub(r'"[^"\n]*"', '""', re.sub(r"//[^\n]*", "", k))  # comments and PTX strings are not C
        for name in set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", body)) - own:
            assert name in C_RESERVED or name.startswith(C_RESERVED_PREFIXES), name


def test_an_object_named_and_dropped_does_not_pass_its_name_on():
    """Namer keys objects by id: a temporary a renderer names and drops frees its id, and the next object often
    gets the same one. It must still get a name of its own (the attention kernel's epilogue once declared its row
    sum under the name of a dropped variable of the softmax)."""
    n = Namer()
    first = n.get(Var("x", "float32"), "x")
    names = [n.get(Var(f"y{k}", "float32"), "y") for k in range(50)]
    assert len({first, *names}) == 51
    kept = Var("z", "float32")
    assert n.get(kept, "z") == n.get(kept, "z")  # one object, one name
