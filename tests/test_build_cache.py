"""The whole-build cache (codegen/build_cache.py), the disk store (codegen/diskcache.py, its command line
codegen/cache.py) and the LLVM object
cache (codegen/llvm/runtime.py): hits skip scheduling, lowering and compiling; damaged, foreign or
other-version entries are rebuilt, never returned; an unwritable cache means no caching; concurrent
processes never see a wrong kernel."""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import codegen
from codegen import build, build_cache
from codegen import diskcache as disk
from codegen.cuda import nvrtc
from codegen.llvm import runtime as llrt
from loopir import te
from loopir import workloads as W
from schedules import Schedule

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
cb = sys.modules["codegen.build"]  # the module (codegen.build is also the name of the function)


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPIR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LOOPIR_CACHE_MAX_MB", raising=False)
    codegen.cache_clear()
    yield
    codegen.cache_clear()


def _mbr(n=24, m=20, p=16, dtype="float32"):
    return W.matmul_bias_relu(n, m, p, dtype=dtype)


def _run_cpu(mod, w, sizes, seed=None):
    ins = w.random_inputs(sizes, np.random.default_rng(seed))
    outs = w.empty_outputs(sizes)
    want_all = w.reference(*[a.copy() for a in ins])
    mod(*w.call_args(ins, outs))
    for got, want in zip(ins if w.in_place else outs, want_all):
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=w.tolerance * 10,
                                   atol=w.tolerance * 10)


def _entries(kind=".build"):
    d = disk.cache_dir()
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(kind) and not f.startswith(".tmp"))


def _forbid(monkeypatch):
    """Make scheduling, lowering and both compilers fail: a build must come from the cache."""

    def boom(*a, **k):
        raise AssertionError("a cached build ran the pipeline")

    monkeypatch.setattr(cb, "_schedule", boom)
    monkeypatch.setattr(cb, "lower", boom)
    monkeypatch.setattr(llrt, "_optimised", boom)
    monkeypatch.setattr(nvrtc, "_compile", boom)


def _build_w(w, target="cpu", **kw):
    return build(list(w.outputs), list(w.args), target=target, **kw)


# ----------------------------------------------------------------------------- hits


def test_warm_build_skips_the_pipeline_and_is_right(monkeypatch):
    w = _mbr()
    _run_cpu(_build_w(w), w, {}, 1)
    assert len(_entries()) == 1 and len(_entries(".llo")) == 1
    codegen.cache_clear()  # memory gone: the disk entry serves
    _forbid(monkeypatch)
    w2 = _mbr()  # fresh, structurally equal tensors
    mod = _build_w(w2)
    assert mod.program.args == tuple(t.buffer for t in w2.args)  # the caller's own buffers
    _run_cpu(mod, w2, {}, 2)
    _run_cpu(_build_w(w2), w2, {}, 3)  # the memory cache
    monkeypatch.undo()
    assert "define" in mod.optimized_ir  # loaded from object code: the source is optimised again to show it


def test_cuda_warm_build_is_the_same_kernel_without_nvrtc(monkeypatch):
    w = W.softmax(33, 200)
    cold = _build_w(w, "cuda")
    codegen.cache_clear()
    _forbid(monkeypatch)
    warm = _build_w(W.softmax(33, 200), "cuda")
    assert warm.source == cold.source and warm.cubin == cold.cubin and warm.arch == cold.arch
    assert [k.name for k in warm.gen.kernels] == [k.name for k in cold.gen.kernels]
    assert warm.gen.launch_plan() == cold.gen.launch_plan()


def test_hand_schedule_and_builder_program_are_cached(monkeypatch):
    def sched(w, factor):
        s = Schedule(list(w.outputs))
        i = s.loops(w.outputs[0])[0]
        s.split(i, factor)
        return s

    w = _mbr()
    _run_cpu(build(sched(w, 4), list(w.args)), w, {}, 4)
    pw = W.prefix_sum()
    _run_cpu(build(pw.program()), pw, {"n": 50}, 5)
    n_entries = len(_entries())
    codegen.cache_clear()
    with monkeypatch.context() as mp:
        _forbid(mp)
        wm = _mbr()
        _run_cpu(build(sched(wm, 4), list(wm.args)), wm, {}, 6)
        _run_cpu(build(pw.program()), pw, {"n": 77}, 7)
    assert len(_entries()) == n_entries
    _run_cpu(build(sched(w, 8), list(w.args)), w, {}, 8)  # another trace: another entry
    assert len(_entries()) == n_entries + 1


def test_different_programs_get_different_entries():
    w = _mbr()
    key = build_cache.te_key(list(w.outputs), list(w.args), "cpu", {})
    same = _mbr()
    assert build_cache.te_key(list(same.outputs), list(same.args), "cpu", {}).digest == key.digest
    f64 = _mbr(dtype="float64")
    assert build_cache.te_key(list(f64.outputs), list(f64.args), "cpu", {}).digest != key.digest
    bigger = _mbr(n=25)
    assert build_cache.te_key(list(bigger.outputs), list(bigger.args), "cpu", {}).digest != key.digest
    cuda = {"arch": "sm_90", "options": None}
    assert build_cache.te_key(list(w.outputs), list(w.args), "cuda", cuda).digest != key.digest
    assert (build_cache.te_key(list(w.outputs), list(w.args), "cuda", cuda).digest !=
            build_cache.te_key(list(w.outputs), list(w.args), "cuda", dict(cuda, arch="sm_80")).digest)
    # one size variable shared by both dimensions is another program than two distinct ones
    n = te.var("n")
    a = te.placeholder((n, n), name="x")
    b = te.compute((n, n), lambda i, j: a[i, j] * 2.0, name="y")
    n1, n2 = te.var("n"), te.var("n")
    a2 = te.placeholder((n1, n2), name="x")
    b2 = te.compute((n1, n2), lambda i, j: a2[i, j] * 2.0, name="y")
    assert build_cache.te_key([b], [a, b], "cpu", {}).digest != build_cache.te_key([b2], [a2, b2], "cpu", {}).digest
    # argument order
    assert (build_cache.te_key(list(w.outputs), list(w.args), "cpu", {}).digest !=
            build_cache.te_key(list(w.outputs), list(w.args)[::-1], "cpu", {}).digest)


def test_dtype_change_builds_a_new_right_kernel():
    for dtype in ("float32", "float64"):
        w = _mbr(dtype=dtype)
        _run_cpu(_build_w(w), w, {}, 9)
    assert len(_entries()) == 2


def test_cache_false_and_dump_passes_bypass_the_cache():
    w = _mbr()
    _build_w(w, cache=False)
    assert not os.path.exists(disk.cache_dir()) or not _entries()
    _build_w(w, dump_passes=lambda *a: None)
    assert not os.path.exists(disk.cache_dir()) or not _entries()


# ----------------------------------------------------------------------------- damaged entries


def _one_entry(w):
    _build_w(w)
    (path,) = _entries()
    codegen.cache_clear()
    return path


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "header_only"])
def test_damaged_entry_is_rebuilt_not_returned(damage):
    w = _mbr()
    path = _one_entry(w)
    data = open(path, "rb").read()
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data = data[:-100] + bytes([data[-100] ^ 0x55]) + data[-99:]
    elif damage == "garbage":
        data = os.urandom(500)
    elif damage == "header_only":
        data = data[: disk.HEADER.size]
    else:
        data = b""
    open(path, "wb").write(data)
    _run_cpu(_build_w(_mbr()), w, {}, 10)
    fixed = open(path, "rb").read()
    assert fixed.startswith(build_cache.MAGIC) and len(fixed) > disk.HEADER.size + 100


def _rewrite(path, change):
    """Replace the entry's value by change(value), with a valid checksum (damage the checksum cannot see)."""
    payload = disk.read(os.path.basename(path), build_cache.MAGIC)
    objs = [object()] * 1000  # stand-ins for the references

    class U(pickle.Unpickler):
        def persistent_load(self, pid):
            return ("REF", pid)

    class P(pickle.Pickler):
        def persistent_id(self, obj):
            return obj[1] if isinstance(obj, tuple) and len(obj) == 2 and obj[0] == "REF" else None

    v = U(io.BytesIO(payload)).load()
    v = change(v)
    buf = io.BytesIO()
    P(buf).dump(v)
    assert objs
    disk.write(os.path.basename(path), buf.getvalue(), build_cache.MAGIC)


@pytest.mark.parametrize("change", ["version", "digest", "target", "bad_reference", "wrong_type"])
def test_foreign_or_other_version_entry_is_refused(change, monkeypatch):
    w = _mbr()
    path = _one_entry(w)

    def edit(v):
        if change == "version":
            v["version"] = "0" * 64
        elif change == "digest":
            v["digest"] = "f" * 64
        elif change == "target":
            v["target"] = "cuda"
        elif change == "bad_reference":
            v["program"] = ("REF", 999)
        else:
            return ["not", "a", "build"]
        return v

    _rewrite(path, edit)
    calls = []
    real = cb._schedule
    monkeypatch.setattr(cb, "_schedule", lambda *a, **k: calls.append(1) or real(*a, **k))
    _run_cpu(_build_w(_mbr()), w, {}, 11)
    assert calls == [1]  # refused: rebuilt


def test_entry_of_another_project_version_is_never_found(monkeypatch):
    w = _mbr()
    _build_w(w)
    codegen.cache_clear()
    monkeypatch.setattr(disk, "version", lambda: "another version")
    calls = []
    real = cb._schedule
    monkeypatch.setattr(cb, "_schedule", lambda *a, **k: calls.append(1) or real(*a, **k))
    _run_cpu(_build_w(_mbr()), w, {}, 12)
    assert calls == [1] and len(_entries()) == 2


def test_unwritable_cache_dir_means_no_caching(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a directory")
    monkeypatch.setenv("LOOPIR_CACHE_DIR", str(blocker / "cache"))
    w = _mbr()
    _run_cpu(_build_w(w), w, {}, 13)
    codegen.cache_clear()
    _run_cpu(_build_w(_mbr()), w, {}, 14)
    sm = W.softmax(5, 9)
    assert "__global__" in _build_w(sm, "cuda").source  # the cubin cache is unwritable too: no error
    assert not blocker.is_dir()


def test_read_only_cache_dir_serves_and_never_fails(tmp_path, monkeypatch):
    w = _mbr()
    _build_w(w)
    codegen.cache_clear()
    d = disk.cache_dir()
    real_replace = os.replace

    def refuse(*a, **k):
        raise PermissionError(13, "read-only file system")

    monkeypatch.setattr(os, "replace", refuse)
    monkeypatch.setattr(os, "utime", refuse)
    _run_cpu(_build_w(_mbr()), w, {}, 16)  # a hit from a read-only directory
    w2 = _mbr(n=9)
    _run_cpu(_build_w(w2), w2, {}, 17)  # a miss: built, not stored, no error
    monkeypatch.setattr(os, "replace", real_replace)
    assert not [f for f in os.listdir(d) if f.startswith(".tmp-")]


def test_size_bound_evicts_least_recently_used(monkeypatch):
    for n in (8, 9, 10):
        _build_w(_mbr(n=n))
    es = disk.entries()
    total = sum(s for _, s, _ in es)
    assert disk.evict(total - 1) > 0
    assert sum(s for _, s, _ in disk.entries()) <= (total - 1) * 3 // 4
    monkeypatch.setenv("LOOPIR_CACHE_MAX_MB", "0")  # 0: the disk cache is off
    codegen.cache_clear()
    before = len(_entries())
    w = _mbr(n=11)
    _run_cpu(_build_w(w), w, {}, 18)
    assert len(_entries()) == before
    monkeypatch.setenv("LOOPIR_CACHE_MAX_MB", "not a number")
    assert disk.max_bytes() == disk.DEFAULT_MAX_MB * 2**20


def test_clear_command(tmp_path):
    _build_w(_mbr())
    assert _entries()
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-m", "codegen.cache", "clear"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert not disk.entries()
    out = subprocess.run([sys.executable, "-m", "codegen.cache", "bogus"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2


# ----------------------------------------------------------------------------- specialization variants


def test_specialization_variants_are_sub_entries(monkeypatch):
    w = W.softmax()
    mod = _build_w(w)
    _run_cpu(mod, w, {"m": 6, "n": 64}, 19)
    assert mod.specializations
    n_entries = len(_entries())
    assert n_entries >= 2  # the generic build and the variant
    codegen.cache_clear()
    _forbid(monkeypatch)
    w2 = W.softmax()
    mod2 = _build_w(w2)
    _run_cpu(mod2, w2, {"m": 6, "n": 64}, 20)
    assert mod2.specializations == mod.specializations and not mod2.specializer.failed
    assert len(_entries()) == n_entries


# ----------------------------------------------------------------------------- new processes, concurrency


_CHILD = r"""
import json, sys
import numpy as np
from loopir import workloads as W
from codegen import build
cb = sys.modules["codegen.build"]
from codegen.cuda import nvrtc
from codegen.llvm import runtime as llrt
name, target, forbid, seed = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
calls = []
if forbid:
    def boom(*a, **k):
        calls.append(1)
        raise AssertionError("the pipeline ran in a warm process")
    cb._schedule = cb.lower = llrt._optimised = nvrtc._compile = boom
w = {"mbr": lambda: W.matmul_bias_relu(40, 24, 32), "softmax": lambda: W.softmax(),
     "layernorm": lambda: W.layernorm(17, 40)}[name]()
mod = build(list(w.outputs), list(w.args), target=target)
err = 0.0
if target == "cpu":
    sizes = {"m": 9, "n": 48}
    ins = w.random_inputs(sizes, np.random.default_rng(seed))
    outs = w.empty_outputs(sizes)
    mod(*w.call_args(ins, outs))
    for got, want in zip(outs, w.reference(*ins)):
        err = max(err, float(np.nanmax(np.abs(got.astype(np.float64) - want))) if not np.isnan(got).any() else 1e9)
print(json.dumps({"err": err, "calls": len(calls), "source": len(mod.source)}))
"""


def _spawn(name, target="cpu", forbid=False, seed=0):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-c", _CHILD, name, target, "1" if forbid else "0", str(seed)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(p):
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_new_process_warm_build_runs_no_pipeline():
    cold = _result(_spawn("mbr", "cpu", seed=1))
    warm = _result(_spawn("mbr", "cpu", forbid=True, seed=2))
    assert cold["err"] < 1e-3 and warm["err"] < 1e-3 and warm["calls"] == 0
    assert warm["source"] == cold["source"]
    # a variant compiled at a call in one process is loaded in the next
    _result(_spawn("softmax", "cpu", seed=3))
    warm = _result(_spawn("softmax", "cpu", forbid=True, seed=4))
    assert warm["err"] < 1e-4 and warm["calls"] == 0


def test_concurrent_processes_build_same_and_different_programs():
    names = ["mbr", "softmax", "mbr", "layernorm", "softmax", "mbr"]
    procs = [_spawn(n, "cpu", seed=k) for k, n in enumerate(names)]
    res = [_result(p) for p in procs]
    assert all(r["err"] < 1e-3 for r in res), res
    d = disk.cache_dir()
    assert not [f for f in os.listdir(d) if f.startswith(".tmp-")]
    for path in _entries():  # every entry whole
        assert disk.read(os.path.basename(path), build_cache.MAGIC) is not None
    # and they serve a later process, right
    res = [_result(p) for p in [_spawn(n, "cpu", forbid=True, seed=9 + k) for k, n in enumerate(names[:4])]]
    assert all(r["err"] < 1e-3 and r["calls"] == 0 for r in res), res


def test_concurrent_cuda_builds_agree():
    procs = [_spawn("layernorm", "cuda") for _ in range(3)]
    res = [_result(p) for p in procs]
    assert len({r["source"] for r in res}) == 1
    assert _result(_spawn("layernorm", "cuda", forbid=True))["calls"] == 0


def test_cache_option_must_be_a_bool():
    from loopir.errors import ArgumentTypeError

    w = _mbr()
    for target in ("cpu", "cuda"):
        with pytest.raises(ArgumentTypeError, match="cache must be True or False"):
            _build_w(w, target, cache="no")
