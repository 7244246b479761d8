"""Speculative NVRTC (codegen/build.py `_speculate`, codegen/cuda/nvrtc.py `prefetch_cubin`): a te build for CUDA
starts NVRTC on the unchecked schedule's source while the checked schedule is computed. The module must be the
checked program's, whatever the speculation did: used only when the checked program is the same program."""

from __future__ import annotations

import importlib

import pytest

from codegen import build
from codegen.cuda import nvrtc
from loopir import te
from loopir import workloads as W
from schedules import auto_schedule

from tests.test_bounds import never_written

B = importlib.import_module("codegen.build")  # the module (codegen.build the name is the function)


def _gemm(n, m, p):
    wl = W.matmul_bias_relu(n=n, m=m, p=p)
    return list(wl.outputs), list(wl.inputs) + list(wl.outputs)


def _plain(outs, args, monkeypatch):
    with monkeypatch.context() as mp:
        mp.setattr(B, "_speculate", lambda *a, **k: None)
        return build(outs, args, target="cuda", cache=False)


@pytest.mark.parametrize("sizes", [(70, 50, 37), None])
def test_confirmed_speculation_gives_the_checked_build(sizes, monkeypatch):
    n, m, p = sizes or (te.var("n"), te.var("m"), te.var("p"))
    outs, args = _gemm(n, m, p)
    used = []
    real = B._module
    monkeypatch.setattr(B, "_module", lambda spec, opts: used.append(spec) or real(spec, opts))
    mod = build(outs, args, target="cuda", cache=False)
    assert used, "the speculation was not confirmed for an auto-scheduled GEMM"
    ref = _plain(outs, args, monkeypatch)
    assert mod.source == ref.source and mod.notes == ref.notes and mod.preconditions == ref.preconditions
    assert [b.name for b in mod.program.args] == [b.name for b in ref.program.args]


def test_a_different_unchecked_schedule_is_dropped(monkeypatch):
    # the unchecked schedule takes other decisions (here: no fusion): the checked program differs, so the
    # speculation must not be used and the module is the checked program's
    outs, args = _gemm(64, 48, 40)
    real_auto = B.auto_schedule

    def auto(o, target="cuda", check=True, **kw):
        return real_auto(o, target=target, check=check, **({"fuse": False} if not check else {}), **kw)

    monkeypatch.setattr(B, "auto_schedule", auto)
    used = []
    real = B._module
    monkeypatch.setattr(B, "_module", lambda spec, opts: used.append(spec) or real(spec, opts))
    mod = build(outs, args, target="cuda", cache=False)
    assert not used
    monkeypatch.setattr(B, "auto_schedule", real_auto)
    assert mod.source == _plain(outs, args, monkeypatch).source
    assert auto_schedule(outs, target="cuda", fuse=False).program.name  # the speculated plan existed


def test_same_refuses_another_argument_order():
    outs, args = _gemm(32, 32, 32)
    prog = B.with_args(auto_schedule(outs, target="cuda").program, args)
    spec = B._Speculation(B.build_cache.program_key(prog, "cuda", {}), prog, None, [], [])
    assert B._same(spec, prog)
    other = B.with_args(auto_schedule(outs, target="cuda").program, [args[1], args[0], *args[2:]])
    assert not B._same(spec, other)


def test_speculation_errors_are_left_to_the_checked_build(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("speculation failed")

    outs, args = _gemm(16, 16, 16)
    monkeypatch.setattr(B, "cuda_source", boom)  # only the speculation renders through this name
    mod = build(outs, args, target="cuda", cache=False)
    assert "__global__" in mod.source


def test_prefetched_cubin_is_taken_and_equals_a_direct_compile():
    src = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 2.0f * x[threadIdx.x] + 1.0f; }\n// spec-1'
    nvrtc.prefetch_cubin(src, "sm_90")
    key = nvrtc.cache_key(src, "sm_90", nvrtc.DEFAULT_OPTIONS)
    assert key in nvrtc._INFLIGHT
    got = nvrtc.compile_cubin(src, "sm_90", use_cache=False)
    assert key not in nvrtc._INFLIGHT  # claimed once
    assert got[:4] == b"\x7fELF" and len(got) == len(nvrtc._compile(src, "sm_90", nvrtc.DEFAULT_OPTIONS, "k.cu"))


def test_prefetched_failure_is_raised_where_the_cubin_is_asked_for():
    src = 'extern "C" __global__ void k(float* x) { x[0] = undefined_name; }\n// spec-2'
    nvrtc.prefetch_cubin(src, "sm_90")  # never raises here
    with pytest.raises(nvrtc.NvrtcError, match="undefined_name"):
        nvrtc.compile_cubin(src, "sm_90", use_cache=False)


def test_unclaimed_speculations_are_bounded_and_forgotten_after_fork():
    for i in range(12):
        nvrtc.prefetch_cubin(f'extern "C" __global__ void k{i}(int* x) {{ x[0] = {i}; }}', "sm_90")
    assert len(nvrtc._INFLIGHT) <= 8
    nvrtc._forget_after_fork()
    assert not nvrtc._INFLIGHT


def test_the_deferred_initialisation_check_runs_on_a_confirmed_speculation(monkeypatch):
    # the speculation lowers without the initialisation check (it only refuses); the build runs it on the checked
    # program before returning the speculated module, and its refusal is the build's
    from loopir.bounds import BoundsError, check_initialized

    outs, args = _gemm(70, 50, 37)
    seen = []
    real = B.refuse_uninitialized
    monkeypatch.setattr(B, "refuse_uninitialized", lambda p: seen.append(p) or real(p))
    used = []
    real_module = B._module
    monkeypatch.setattr(B, "_module", lambda spec, opts: used.append(spec) or real_module(spec, opts))
    build(outs, args, target="cuda", cache=False)
    assert used and len(seen) == 1 and check_initialized(seen[0]) is None

    def refuse(p):
        w = check_initialized(never_written())
        raise BoundsError(w)

    monkeypatch.setattr(B, "refuse_uninitialized", refuse)
    with pytest.raises(BoundsError, match="reads temporary 'T' before anything writes it"):
        build(outs, args, target="cuda", cache=False)


def test_refuse_uninitialized_names_the_read_with_its_witness():
    from codegen.passes.bounds import refuse_uninitialized
    from loopir.bounds import BoundsError

    with pytest.raises(BoundsError) as ei:
        refuse_uninitialized(never_written())
    w = ei.value.witness
    assert (w.statement, w.buffer, w.kind) == ("S", "T", "uninitialized") and 0 <= w.index[0] < w.params["n"]
