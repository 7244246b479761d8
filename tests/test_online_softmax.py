"""The online-softmax rewrite (schedules/primitives/online.py) and the attention schedule built on it
(schedules/attention.py): the printed nest, the refusals with their reasons, numerics against a float64
numpy reference on the interpreter, the LLVM CPU target and the CUDA path (NVRTC here; the lowered CUDA
program in the adversarial GPU interpreter; a device run when there is one), no n x m temporary."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from codegen import build
from codegen.build import lower as lower_for
from loopir import interp, te, workloads
from loopir.errors import ArgumentError, LoopirError, NotFoundError
from loopir.lower import lower
from loopir.nodes import Const, For, Program, Seq, Store, Var
from loopir.visit import map_stmts, walk
from schedules import Schedule, ScheduleError, auto_schedule
from schedules import attention as attention_mod
from schedules.attention import KEY_TILE, ROWS_PER_BLOCK
from schedules.primitives import CheckContext
from schedules.primitives.online import ROW_SAMPLE, _sample_rows, check_online, online_softmax

SCALE = 0.25


@pytest.fixture(autouse=True)
def _simt_pass_for_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check the online rewrite and the SIMT mapping of its pass, which float32 data takes with the
    TF32 tensor-core kernel off (that kernel: tests/test_flash_tf32.py)."""
    monkeypatch.setattr(attention_mod, "TF32_ATTENTION", False)


def attention(B: Any, n: Any, m: Any, d: int, causal: bool = False, dtype: str = "float32") -> tuple[list, Any]:
    """softmax(scale * Q K^T [causal mask]) V, written naively in te (loopir.workloads.naive_attention)."""
    w = workloads.naive_attention(B, n, m, d, causal, dtype, scale=SCALE)
    return list(w.inputs), w.outputs[0]


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    return workloads.naive_attention_reference(q, k, v, causal, SCALE)


def inputs(B: int, n: int, m: int, d: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, x, d)).astype(np.float32) for x in (n, m, m))
    return q, k, v, np.full((B, n, d), np.nan, np.float32)


def temps_nm(program: Program, n: Any, m: Any) -> list[str]:
    """The temporaries whose shape holds both the query and the key length (an n x m matrix)."""
    def has(t: Any, x: Any) -> bool:
        return any(e == x for e in t.shape) if not isinstance(x, int) else any(
            isinstance(e, Const) and e.value == x for e in t.shape)
    return [t.name for t in program.temps if has(t, n) and has(t, m)]


# ----------------------------------------------------------------------------- the primitive


def test_rewrite_prints_the_one_pass_nest_and_drops_the_score_matrix() -> None:
    B, n, m = te.var("B"), te.var("n"), te.var("m")
    _, Y = attention(B, n, m, 16)
    s = Schedule(Y)
    assert temps_nm(s.program, n, m)  # the naive chain holds S, Ss, P as n x m matrices
    s.online_softmax("mx")
    text = str(s)
    assert "mx_online" in text and "mx_rescale" in text and "mx_advance" in text
    assert "O[b, i, c] = O[b, i, c] * mx_scale[b, i] + exp(S_key[b, i] * 0.25 - mx_new[b, i]) * V[b, r2, c]" in text
    assert temps_nm(s.program, n, m) == []
    assert {t.name for t in s.program.temps} == {"mx", "O", "sm", "S_key", "mx_new", "mx_scale"}
    assert "online_softmax('mx')" in s.explain()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("size", [(2, 7, 37, 8), (1, 3, 1, 4), (2, 5, 64, 16)])
def test_rewritten_program_matches_numpy_in_the_interpreter(size: tuple[int, ...], causal: bool) -> None:
    B, n, m, d = size
    _, Y = attention(te.var("B"), te.var("n"), te.var("m"), d, causal)
    s = Schedule(Y)
    s.online_softmax("mx")
    q, k, v, out = inputs(B, n, m, d, seed=sum(size))
    interp.run(s.program, q, k, v, out)
    np.testing.assert_allclose(out, reference(q, k, v, causal), rtol=1e-4, atol=1e-5)


def test_rewrite_with_constant_sizes_matches_the_unscheduled_program() -> None:
    _, Y = attention(2, 6, 19, 8, causal=True)
    old = lower(Y)
    new = Schedule(Y).online_softmax("mx").program
    q, k, v, out = inputs(2, 6, 19, 8, seed=3)
    out2 = out.copy()
    interp.run(old, q, k, v, out)
    interp.run(new, q, k, v, out2)
    np.testing.assert_allclose(out2, out, rtol=1e-5, atol=1e-6)
    assert temps_nm(new, 6, 19) == []


def _leading(s: Any) -> list[For]:
    out = []
    while isinstance(s, For):
        out.append(s)
        s = s.body
    return out


def _never_rescaled(new: Program, dtype: str) -> Program:
    """A wrong rewrite: `new` with its partial sums never rescaled (every rescale factor 1)."""
    broken = map_stmts(new.body, lambda st: Store(st.name, st.buffer, st.indices, Const(1.0, dtype), st.iters,
                                                  st.coords) if isinstance(st, Store) and st.name == "mx_rescale"
                       else None)
    return Program(new.name, new.args, broken, new.temps, new.params)


@pytest.mark.parametrize("sizes", [None, (3, 40, 50)])
def test_the_check_refuses_a_rewrite_that_changes_the_result(sizes: tuple[int, int, int] | None) -> None:
    # symbolic sizes: every size 5; fixed sizes: the check runs the first rows of each row loop only
    _, Y = attention(*(sizes or (te.var("B"), te.var("n"), te.var("m"))), 4)
    old = lower(Y)
    new, _ = online_softmax(old, "mx")

    with pytest.raises(ScheduleError, match=r"online_softmax changed the result: O\["):
        check_online(CheckContext(None, old, _never_rescaled(new, "float32"), ("mx",), {}))  # type: ignore[arg-type]
    assert check_online(CheckContext(None, old, new, ("mx",), {})) is None  # type: ignore[arg-type]
    if sizes is not None:
        sampled = _sample_rows(old, new)
        assert sampled is not None
        for p in sampled:  # the batch and query loops cut to ROW_SAMPLE iterations, the key loops whole
            for top in (p.body.body if isinstance(p.body, Seq) else (p.body,)):
                assert [int(f.hi.value) for f in _leading(top)[:2]] == [ROW_SAMPLE, ROW_SAMPLE]
        # and the rows not run are not allocated: dimensions indexed by the cut loops only shrink to ROW_SAMPLE
        # (the (B, H, T, T) scores of a fixed-size block were 1.6e9 elements), the key dimension stays whole
        shapes = {b.name: tuple(int(d.value) for d in b.shape) for p in sampled for b in (*p.args, *p.temps)}
        B, n, m = sizes
        assert shapes["S"] == shapes["P"] == (ROW_SAMPLE, ROW_SAMPLE, m)
        assert shapes["Q"] == shapes["Y"] == (ROW_SAMPLE, ROW_SAMPLE, 4) and shapes["K"] == (ROW_SAMPLE, m, 4)
        assert shapes["mx"] == (ROW_SAMPLE, ROW_SAMPLE)


# ----------------------------------------------------------------------------- refusals


def _chain(kind: str) -> Any:
    n, m, d = te.var("n"), te.var("m"), 4
    X = te.placeholder((n, m), name="X")
    V = te.placeholder((m, d), name="V")
    r = te.reduce_axis(m, "r")
    mx = te.compute((n,), lambda i: te.max(X[i, r], axis=r), name="mx")
    if kind == "no_exp":  # the max subtracted, but no exponential
        P = te.compute((n, m), lambda i, j: X[i, j] - mx[i], name="P")
    elif kind == "square":
        P = te.compute((n, m), lambda i, j: te.exp(X[i, j] - mx[i]) * te.exp(X[i, j] - mx[i]), name="P")
    else:
        P = te.compute((n, m), lambda i, j: te.exp(X[i, j] - mx[i]), name="P")
    r4 = te.reduce_axis(m, "r4")
    if kind == "max_consumer":
        return te.compute((n, d), lambda i, c: te.max(P[i, r4] * V[r4, c], axis=r4), name="O")
    if kind == "plus":
        return te.compute((n, d), lambda i, c: te.sum(P[i, r4] + V[r4, c], axis=r4), name="O")
    if kind == "max_only":
        return te.compute((n,), lambda i: mx[i] * 2.0, name="O")
    return te.compute((n, d), lambda i, c: te.sum(P[i, r4] * V[r4, c], axis=r4), name="O")


@pytest.mark.parametrize("kind, message", [
    ("no_exp", r"reads 'mx' outside an exponential exp\(x - mx\).*a max without the exponential"),
    ("square", r"the consumer 'O' is not a sum of products with exp\(x - mx\).*does not distribute"),
    ("plus", r"the consumer 'O' is not a sum of products with exp\(x - mx\).*does not distribute"),
    ("max_consumer", r"the softmax 'P' is read by stage 'O', which is not a sum over the keys; its consumer is not "
                     r"rescalable"),
    ("max_only", r"stage 'O' reads 'mx' and is an output"),
])
def test_refusals_name_the_reason(kind: str, message: str) -> None:
    s = Schedule(_chain(kind))
    before = s.program
    with pytest.raises(ArgumentError, match=message):
        s.online_softmax("mx")
    assert s.program is before and s.trace == []


def test_refusals_of_the_argument() -> None:
    s = Schedule(_chain("ok"))
    with pytest.raises(NotFoundError, match=r"no stage named 'nope'; stages: mx, P, O"):
        s.online_softmax("nope")
    with pytest.raises(ArgumentError, match=r"stage 'O' is not a row maximum"):
        s.online_softmax("O")
    s.online_softmax("mx")
    with pytest.raises(ArgumentError, match=r"no longer the unscheduled chain|is not a row maximum"):
        s.online_softmax("mx")


def test_a_sum_that_multiplies_by_another_running_sum_is_refused() -> None:
    n, m = te.var("n"), te.var("m")
    X = te.placeholder((n, m), name="X")
    r, r2, r3 = te.reduce_axis(m, "r"), te.reduce_axis(m, "r2"), te.reduce_axis(m, "r3")
    mx = te.compute((n,), lambda i: te.max(X[i, r], axis=r), name="mx")
    sm = te.compute((n,), lambda i: te.sum(te.exp(X[i, r2] - mx[i]), axis=r2), name="sm")
    P = te.compute((n, m), lambda i, j: te.exp(X[i, j] - mx[i]) * sm[i], name="P")
    ent = te.compute((n,), lambda i: te.sum(P[i, r3] * X[i, r3], axis=r3), name="E")
    with pytest.raises(ArgumentError,
                       match=r"the sum 'E' reads another running sum of the chain.*divide after the sum"):
        Schedule(ent).online_softmax("mx")


def test_probabilities_divided_by_their_row_sum_are_divided_after_the_pass() -> None:
    # loopir.workloads.attention: probs = exp(s * scale - max) / sum, out = sum probs * V
    w = workloads.attention()
    s = Schedule(list(w.outputs))
    s.online_softmax("row_max")
    assert "out[i, c] = out_acc[i, c] / row_sum[i]  # out_divide" in str(s)
    sizes = {"n": 9, "m": 37, "d": 8}
    ins = w.random_inputs(sizes, np.random.default_rng(4))
    ref = w.reference(*ins)[0]
    for target in ("cpu", "cuda"):
        auto = auto_schedule(list(w.outputs), target=target)
        assert "online_softmax(row_max)" in auto.explain()
        outs = [np.full_like(o, np.nan) for o in w.empty_outputs(sizes)]
        if target == "cpu":
            build(auto, list(w.inputs) + list(w.outputs), target="cpu")(*w.call_args(ins, outs))
        else:  # symbolic head size: the register and shared-memory steps are refused and named, the result holds
            assert "note: K tiles in shared memory: not applied" in auto.plan.explain()
            interp.run(lower_for(auto.program, "cuda"), *w.call_args(ins, outs), gpu_order="reversed")
        np.testing.assert_allclose(outs[0], ref, rtol=1e-4, atol=1e-5)


def test_sink_guard_refuses_a_loop_without_a_guard() -> None:
    s = Schedule(_chain("ok"))
    with pytest.raises(ArgumentError, match=r"sink_guard\(i\): no guard"):
        s.sink_guard(s.loops("mx")[0])


# ----------------------------------------------------------------------------- auto_schedule and the targets


def test_auto_schedule_applies_the_rewrite_and_explains_it() -> None:
    _, Y = attention(te.var("B"), te.var("n"), te.var("m"), 16, causal=True)
    s = auto_schedule([Y], target="cuda")
    text = s.explain()
    assert "online_softmax(mx): the running maximum mx rescales the sums O, sm by exp(m_old - m_new)" in text
    assert f"a block per {ROWS_PER_BLOCK} query rows" in text and f"{KEY_TILE} keys at a time" in text
    assert "Sm, P folded into them; S computed one key at a time (no n x m temporary)" in text  # the mask inlined
    assert s.plan.notes == ()  # every mapping step was applied
    assert [t["primitive"] for t in s.trace][:1] == ["online_softmax"]
    assert {"sink_guard", "cache_read", "cache_write"} <= {t["primitive"] for t in s.trace}
    assert "online_softmax" not in auto_schedule([Y], target="cuda", online=False).explain()


CPU_CASES = [(2, 7, 37, 8, False), (2, 7, 37, 8, True), (1, 70, 45, 16, True), (3, 5, 33, 64, False)]


@pytest.mark.parametrize("B, n, m, d, causal", CPU_CASES)
def test_cpu_llvm_matches_numpy(B: int, n: int, m: int, d: int, causal: bool) -> None:
    args, Y = attention(te.var("B"), te.var("n"), te.var("m"), d, causal)
    s = auto_schedule([Y], target="cpu")
    assert "online_softmax" in s.explain()
    mod = build(s, args + [Y], target="cpu")
    q, k, v, out = inputs(B, n, m, d, seed=B * n + m)
    mod(q, k, v, out)
    np.testing.assert_allclose(out, reference(q, k, v, causal), rtol=1e-4, atol=1e-5)


def _cuda(d: int, causal: bool, symbolic: bool = True, sizes: tuple[int, int, int] = (2, 7, 37)) -> tuple[Any, Any]:
    B, n, m = (te.var("B"), te.var("n"), te.var("m")) if symbolic else sizes
    args, Y = attention(B, n, m, d, causal)
    return auto_schedule([Y], target="cuda"), args + [Y]


@pytest.mark.parametrize("B, n, m, d, causal", [(2, 7, 37, 8, False), (2, 7, 37, 8, True), (1, 70, 45, 16, True),
                                                (2, 3, 1, 4, False)])
@pytest.mark.parametrize("order", ["reversed", 11])
def test_cuda_lowering_in_the_adversarial_gpu_interpreter(B: int, n: int, m: int, d: int, causal: bool,
                                                          order: Any) -> None:
    s, _ = _cuda(d, causal)
    low = lower_for(s.program, "cuda")
    q, k, v, out = inputs(B, n, m, d, seed=n + m + d)
    interp.run(low, q, k, v, out, gpu_order=order)
    np.testing.assert_allclose(out, reference(q, k, v, causal), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("symbolic", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_kernel_compiles_one_kernel_with_shared_tiles_and_no_score_matrix(symbolic: bool, causal: bool) -> None:
    s, args = _cuda(64, causal, symbolic, sizes=(4, 300, 300))
    mod = build(s, args, target="cuda")
    src = mod.source
    assert src.count("__global__") == 1
    assert "K_shared" in src and "V_shared" in src and "cooperative copy" in src
    assert "float O_local[64]" in src  # the accumulator row in registers
    assert "__syncthreads()" in src
    low = mod.program
    sizes = {p.name: p for p in low.params}
    assert temps_nm(low, sizes["n"], sizes["m"]) == [] if symbolic else temps_nm(low, 300, 300) == []
    assert low.temps == ()  # the state lives in registers and shared memory: no global temporary at all


@pytest.mark.gpu
@pytest.mark.parametrize("B, n, m, d, causal", [(2, 7, 37, 8, False), (3, 333, 517, 64, True),
                                                (4, 512, 512, 64, False), (1, 1000, 77, 32, True)])
def test_cuda_device_matches_numpy(B: int, n: int, m: int, d: int, causal: bool) -> None:
    s, args = _cuda(d, causal)
    mod = build(s, args, target="cuda")
    q, k, v, out = inputs(B, n, m, d, seed=5)
    mod(q, k, v, out)
    np.testing.assert_allclose(out, reference(q, k, v, causal), rtol=1e-4, atol=1e-5)


def test_module_names_loop_vars_once() -> None:
    # the rewrite reuses the loops of the max and of the sums: every loop variable still names one loop
    _, Y = attention(te.var("B"), te.var("n"), te.var("m"), 4)
    p = Schedule(Y).online_softmax("mx").program
    fors = [x.var for x in walk(p.body) if isinstance(x, For)]
    assert len(fors) == len({id(v) for v in fors}) and all(isinstance(v, Var) for v in fors)


def test_errors_are_typed() -> None:
    assert issubclass(ScheduleError, LoopirError)


@pytest.mark.parametrize("flags", [["--causal"], [], ["--triton-form", "--causal"]])
def test_example_runs_and_shows_the_rewrite(flags: list[str], tmp_path: Any) -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, LOOPIR_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=root)
    proc = subprocess.run([sys.executable, os.path.join(root, "examples", "attention.py"), "--small", "--cpu", *flags],
                          capture_output=True, text=True, timeout=600, env=env, cwd=root)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "online_softmax(mx)" in out and "mx_rescale" in out and "__global__" in out
    output = "O" if "--triton-form" in flags else "Y"
    assert f"check {output} against numpy (float64): ok" in out and "MISMATCH" not in out


# ----------------------------------------------------------------------------- Triton's tutorial form
# softmax(s.float()).half() @ V (loopir.workloads.triton_attention): the probabilities E / sm and their casts are
# elementwise stages between the exponential and the product with V; the rewrite inlines them and divides after
# the pass.

HALF_TOL = 1e-2  # float16 data against float64: relative to the largest output


def _triton(casts: bool, mask: bool | str, dtype: str = "float16", d: int = 64) -> Any:
    return workloads.triton_attention(te.var("B"), te.var("n"), te.var("m"), d, mask, dtype, casts)


def _close(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    """`got` (NaN-poisoned before the run) matches the float64 reference: NaN exactly on the rows that see no key
    (0 / 0), within float16's or float32's tolerance elsewhere."""
    got = got.astype(np.float64)
    seen = ~np.isnan(want)
    assert (np.isnan(got) == ~seen).all(), "rows that see no key are NaN, the others are written"
    if dtype == "float16":
        err = np.abs(got[seen] - want[seen]).max() / np.abs(want[seen]).max()
        assert err < HALF_TOL, err
    else:
        np.testing.assert_allclose(got[seen], want[seen], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("casts", [True, False])
@pytest.mark.parametrize("mask", [False, True])
def test_triton_form_is_rewritten_with_the_division_after_the_pass(casts: bool, mask: bool) -> None:
    w = _triton(casts, mask)
    s = Schedule(list(w.outputs))
    n, m = w.sizes[1:]
    assert temps_nm(s.program, n, m)
    s.online_softmax("mx")
    assert temps_nm(s.program, n, m) == []
    lines = str(s).splitlines()
    if casts:  # O.sum0 (float32) is a temporary: its reader, the cast to O, divides
        update = ("O.sum0[b, i, c] = O.sum0[b, i, c] * mx_scale[b, i] + float32(float16(exp(float32(float16("
                  "S.sum0_key[b, i]) * 0.125) - mx_new[b, i]))) * float32(V[b, r2, c])  # O.sum0")
        division = "O[b, i, c] = float16(O.sum0[b, i, c] / sm[b, i])  # O"
    else:  # O is the output: accumulated in O_acc, written from it after the pass
        update = ("O_acc[b, i, c] = O_acc[b, i, c] * mx_scale[b, i] + exp(S.sum0_key[b, i] * 0.125 - mx_new[b, i]) "
                  "* V[b, r2, c]  # O")
        division = "O[b, i, c] = O_acc[b, i, c] / sm[b, i]  # O_divide"
    at = {key: next(k for k, line in enumerate(lines) if line.strip() == key) for key in (update, division)}
    advance = next(k for k, line in enumerate(lines) if line.strip().endswith("# mx_advance"))
    assert at[update] < advance < at[division]
    # the division comes after the pass, in a nest of its own: nothing in the pass divides by the sum
    assert not any("/ sm[" in line for line in lines[:advance])
    assert (" " * 16 + "if r2 <= i:" in lines) == mask  # the mask seen through the cast to float32
    info = online_softmax(Schedule(list(w.outputs)).program, "mx")[1]
    assert info.rolling == ("sm", "O.sum0" if casts else "O") and info.scores == "S.sum0"
    assert info.inlined == (("E", "Pf", "P") if casts else ("E", "P"))
    assert info.divided == info.rolling[1:] and info.sums == ("sm", "O.sum0" if casts else "O_acc")


TRITON_CASES = [(True, False, "float16"), (True, "causal", "float16"), (False, False, "float16"),
                (False, "causal", "float16"), (True, "late", "float16"), (True, "causal", "float32"),
                (False, False, "float32")]


@pytest.mark.parametrize("casts, mask, dtype", TRITON_CASES)
def test_triton_form_matches_float64_on_the_cpu_and_in_adversarial_gpu_orders(casts: bool, mask: bool | str,
                                                                               dtype: str) -> None:
    """70 rows, 45 keys: neither the tensor-core kernel's 128 rows and 64 keys nor the SIMT mapping's 64 rows and
    32 keys divide them; "late" masks the first keys of every row (its last rows see none: NaN)."""
    w = _triton(casts, mask, dtype)
    sizes = {"B": 2, "n": 70, "m": 45}
    rng = np.random.default_rng([7, int(casts), len(str(mask)), len(dtype)])  # fresh data per case
    ins = w.random_inputs(sizes, rng)
    with np.errstate(invalid="ignore"):
        want = w.reference(*ins)[0]
    cpu = auto_schedule(list(w.outputs), target="cpu")
    assert "online_softmax(mx)" in cpu.explain()
    outs = w.empty_outputs(sizes)
    build(cpu, list(w.args), target="cpu")(*w.call_args(ins, outs))
    _close(outs[0], want, dtype)
    cuda = auto_schedule(list(w.outputs), target="cuda")
    assert "online_softmax(mx)" in cuda.explain()
    low = lower_for(cuda.program, "cuda")
    for order in ("reversed", "forward", 5):
        outs = w.empty_outputs(sizes)
        interp.run(low, *w.call_args(ins, outs), gpu_order=order, sizes=sizes)
        _close(outs[0], want, dtype)


@pytest.mark.parametrize("casts", [True, False])
@pytest.mark.parametrize("mask", [False, True])
def test_triton_form_takes_naive_attentions_tensor_core_path_and_keeps_no_score_matrix(casts: bool,
                                                                                       mask: bool) -> None:
    """auto_schedule and build as a user calls them: the same steps, kernel and epilogue as naive_attention's
    (float16, d = 64, symbolic sizes), one kernel, no n x m temporary in the built module."""
    w = _triton(casts, mask)
    naive = auto_schedule(list(workloads.naive_attention(te.var("B"), te.var("n"), te.var("m"), 64, mask,
                                                         "float16").outputs), target="cuda")
    s = auto_schedule(list(w.outputs), target="cuda")
    assert [t["primitive"] for t in s.trace] == [t["primitive"] for t in naive.trace]
    text, ref = s.plan.explain().splitlines(), naive.plan.explain().splitlines()
    assert text[0].startswith("online_softmax(mx): the running maximum mx rescales the sums sm, O")
    assert text[0].endswith("divided by a sum of the pass once it is over")
    kernel = next(line for line in ref if line.startswith("cuda: a block per 128 query rows"))
    assert "(attention.wgmma: a warpgroup per 64 rows" in kernel and kernel in text
    assert "cuda: O (the division by the sums) is the pass's epilogue" in s.plan.explain()
    assert s.plan.notes == ()
    mod = build(list(w.outputs), list(w.args), target="cuda")
    src = mod.source
    assert src.count("__global__") == 1 and "wgmma.mma_async" in src
    low = mod.program
    params = {p.name: p for p in low.params}
    assert temps_nm(low, params["n"], params["m"]) == []
    assert re.search(r"\bO\[[^\]]*\] = loopir_f2h\(", src)  # the output written once, from the registers


@pytest.mark.parametrize("casts", [True, False])
def test_triton_form_in_float32_keeps_its_state_in_registers_as_naive_attention_does(casts: bool) -> None:
    """The SIMT pass (float32: no tensor cores): the same steps as naive_attention's, every one applied, one kernel
    and no temporary in global memory (the division after the pass is the epilogue of the vector sum)."""
    w = _triton(casts, True, "float32")
    naive = auto_schedule(list(workloads.naive_attention(te.var("B"), te.var("n"), te.var("m"), 64, True,
                                                         "float32").outputs), target="cuda")
    s = auto_schedule(list(w.outputs), target="cuda")
    assert [t["primitive"] for t in s.trace] == [t["primitive"] for t in naive.trace] and s.plan.notes == ()
    assert "a thread per row running the pass with its state in registers" in s.plan.explain()
    mod = build(s, list(w.args), target="cuda")
    assert mod.source.count("__global__") == 1 and mod.program.temps == ()


def test_triton_form_refusals_name_the_stage() -> None:
    """The probabilities divided by the sum of another row; returned as an output; read by a max."""
    B, n, m = te.var("B"), te.var("n"), te.var("m")
    Q, K, V = (te.placeholder((B, x, 16), "float32", name=nm) for x, nm in ((n, "Q"), (m, "K"), (m, "V")))
    r, r2, r3 = (te.reduce_axis(x, nm) for x, nm in ((16, "r"), (m, "r2"), (m, "r3")))
    S = te.compute((B, n, m), lambda b, i, j: te.sum(Q[b, i, r] * K[b, j, r], axis=r), name="S")
    mx = te.compute((B, n), lambda b, i: te.max(S[b, i, r2], axis=r2), name="mx")
    E = te.compute((B, n, m), lambda b, i, j: te.exp(S[b, i, j] - mx[b, i]), name="E")
    sm = te.compute((B, n), lambda b, i: te.sum(E[b, i, r3], axis=r3), name="sm")

    def chain(P: Any, last: str = "sum") -> list[Any]:
        P16 = te.compute((B, n, m), lambda b, i, j: te.cast("float16", P[b, i, j]), name="P16")
        r4 = te.reduce_axis(m, "r4")
        if last == "max":
            return [te.compute((B, n), lambda b, i: te.max(P16[b, i, r4], axis=r4), name="Z")]
        out = te.compute((B, n, 16), lambda b, i, c: te.sum(te.cast("float32", P16[b, i, r4]) * V[b, r4, c],
                                                            axis=r4), name="O")
        return [out, P16] if last == "output" else [out]

    other_row = te.compute((B, n, m), lambda b, i, j: E[b, i, j] / sm[b, n - 1 - i], name="Pf")
    right = te.compute((B, n, m), lambda b, i, j: E[b, i, j] / sm[b, i], name="Pf")
    for outs, message in [
        (chain(other_row), r"online_softmax\(mx\): the sum 'O' reads another running sum of the chain inside its "
                           r"terms other than as a divisor of the whole term"),
        (chain(right, "output"), r"online_softmax\(mx\): stage 'P16' reads 'mx' \(through 'Pf'\) and is an output"),
        (chain(right, "max"), r"online_softmax\(mx\): the softmax 'P16' is read by stage 'Z', which is not a sum "
                              r"over the keys; its consumer is not rescalable"),
    ]:
        s = Schedule(outs)
        before = s.program
        with pytest.raises(ArgumentError, match=message):
            s.online_softmax("mx")
        assert s.program is before and s.trace == []
        assert "online_softmax" not in auto_schedule(outs, target="cpu").explain()
    assert online_softmax(Schedule(chain(right)).program, "mx")[1].divided == ("O",)


def test_probabilities_cast_to_another_half_type_than_v_stay_off_the_tensor_cores() -> None:
    """P rounded to bfloat16 while V is float16: the kernel would round P to float16 instead, so tensorize refuses
    the pass and the plan says why; the online pass runs on the SIMT mapping."""
    B, n, m, d = te.var("B"), te.var("n"), te.var("m"), 64
    Q, K, V = (te.placeholder((B, x, d), "float16", name=nm) for x, nm in ((n, "Q"), (m, "K"), (m, "V")))
    r, r2, r3, r4 = (te.reduce_axis(x, nm) for x, nm in ((d, "r"), (m, "r2"), (m, "r3"), (m, "r4")))
    f32 = lambda x: te.cast("float32", x)  # noqa: E731
    S = te.compute((B, n, m), lambda b, i, j: te.sum(f32(Q[b, i, r]) * f32(K[b, j, r]), axis=r), name="S")
    mx = te.compute((B, n), lambda b, i: te.max(S[b, i, r2], axis=r2), name="mx")
    E = te.compute((B, n, m), lambda b, i, j: te.exp(S[b, i, j] - mx[b, i]), name="E")
    sm = te.compute((B, n), lambda b, i: te.sum(E[b, i, r3], axis=r3), name="sm")
    P = te.compute((B, n, m), lambda b, i, j: te.cast("bfloat16", E[b, i, j] / sm[b, i]), name="P")
    O = te.compute((B, n, d), lambda b, i, c: te.cast("float16", te.sum(f32(P[b, i, r4]) * f32(V[b, r4, c]),  # noqa: E741
                                                                        axis=r4)), name="O")
    s = auto_schedule([O], target="cuda")
    assert "online_softmax(mx)" in s.explain() and "a thread per row" in s.plan.explain()
    assert ("note: tensor cores (attention.m16n8k16): not applied (the vector sum's probabilities are cast to "
            "bfloat16, neither float32 nor V's type float16") in s.plan.explain()


@pytest.mark.gpu
@pytest.mark.parametrize("casts, mask, dtype", [(True, False, "float16"), (True, "causal", "float16"),
                                                (False, False, "float16"), (False, "causal", "float16"),
                                                (True, "causal", "float32")])
def test_triton_form_matches_float64_on_the_gpu(casts: bool, mask: bool | str, dtype: str) -> None:
    """float16 on the tensor-core kernel (float32: the SIMT pass), built from the te tensors as a user does
    (call-time specialization included), against float64, at sizes the tiles divide and do not; a second call on a
    freshly poisoned output gives the same bits."""
    w = _triton(casts, mask, dtype)
    mod = build(list(w.outputs), list(w.args), target="cuda")
    assert ("wgmma.mma_async" in mod.source) == (dtype == "float16")
    rng = np.random.default_rng([11, int(casts), int(bool(mask)), len(dtype)])
    for B, n, m in ((3, 70, 45), (2, 128, 256), (2, 300, 300), (1, 1, 1)):
        sizes = {"B": B, "n": n, "m": m}
        ins = w.random_inputs(sizes, rng)
        with np.errstate(invalid="ignore"):
            want = w.reference(*ins)[0]
        got = w.empty_outputs(sizes)
        mod(*w.call_args(ins, got))
        again = w.empty_outputs(sizes)
        mod(*w.call_args(ins, again))
        assert np.array_equal(got[0].view(np.uint8), again[0].view(np.uint8))
        _close(got[0], want, dtype)


def test_the_check_accepts_a_half_rewrite_over_many_keys_and_refuses_a_wrong_one() -> None:
    # float16 sums over 1024 keys round the two programs apart by a few units of the output's magnitude: the check
    # compares relative to it (an elementwise 1e-2 refused auto_schedule's own rewrite of this attention at d 128)
    w = workloads.naive_attention(2, 2, 1024, 128, False, dtype="float16")
    old = lower(list(w.outputs))
    new, _ = online_softmax(old, "mx")
    assert check_online(CheckContext(None, old, new, ("mx",), {})) is None  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match=r"online_softmax changed the result: O\["):
        check_online(CheckContext(None, old, _never_rescaled(new, "float16"), ("mx",), {}))  # type: ignore[arg-type]
