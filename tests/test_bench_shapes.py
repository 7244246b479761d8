"""benchmarks/shapes.py's machinery on a tiny CPU grid: rows for every (workload, shape, dtype, sizes mode), a
wrong result reported FAIL and a build that raises reported ERROR (never dropped), the markdown table, the PNG
(a valid PNG: signature, chunk CRCs, image data of the declared size), merging parts and the worst rows.
Also the two workloads added for it (rmsnorm, bias_gelu) against their numpy references on the CPU target."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import struct
import sys
import time
import types
import zlib

import numpy as np
import pytest

from codegen import build
from loopir import workloads as W
from loopir.errors import ArgumentError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import _shapes_report as R  # noqa: E402
import shapes as S  # noqa: E402


def _broken_reference(shape, dtype):
    """gelu whose reference is off by one: every row of it must come out FAIL."""
    w = S._mn(W.gelu)(shape, dtype)
    good = w.reference
    return dataclasses.replace(w, reference=lambda *xs: tuple(r + 1.0 for r in good(*xs)))


def _no_symbolic(shape, dtype):
    """sincos that cannot be made at symbolic sizes: the sym row must be ERROR with the exception's class."""
    if shape is None:
        raise ArgumentError("no symbolic version of this test workload\nsecond line not shown")
    return W.sincos(shape[0] * shape[1], dtype=dtype)


BROKEN = S.Spec("broken", "ew", _broken_reference, S._t_gelu, S._n_gelu)
NOSYM = S.Spec("nosym", "ew", _no_symbolic, lambda x: x, lambda x: np.sin(x) ** 2 + np.cos(x) ** 2)


@pytest.fixture(scope="module")
def data():
    groups = [(S.SPECS["gelu"], (3, 37)), (S.SPECS["softmax"], (5, 70)), (S.SPECS["rmsnorm"], (2, 33)),
              (BROKEN, (2, 9)), (NOSYM, (1, 17))]
    return S.run_part("cpu", backend=S.CpuBackend(1, copy_bytes=1 << 20), groups=groups)


def test_every_row_reported(data):
    rows = data["rows"]
    assert len(rows) == 5 * 2  # five groups x (fixed, sym), float32
    got = {(r["workload"], r["shape"], r["dtype"], r["mode"]): r for r in rows}
    for name, shape in (("gelu", "3x37"), ("softmax", "5x70"), ("rmsnorm", "2x33")):
        for mode in ("fixed", "sym"):
            r = got[(name, shape, "float32", mode)]
            assert r["status"] == "ok", r
            assert r["max_err"] < 1e-5 and r["ms_ours"] > 0 and r["ms_other"] > 0
            assert r["ours_other"] == pytest.approx(r["ms_ours"] / r["ms_other"])
            assert r["numpy_err"] < 1e-5 and "baseline_error" not in r
        assert got[(name, shape, "float32", "sym")]["sym_fixed"] is not None
    for mode in ("fixed", "sym"):
        bad = got[("broken", "2x9", "float32", mode)]
        assert bad["status"] == "FAIL" and "max rel. error" in bad["error"]
    assert got[("nosym", "1x17", "float32", "fixed")]["status"] == "ok"
    err = got[("nosym", "1x17", "float32", "sym")]
    assert err["status"] == "ERROR" and "ArgumentError: no symbolic version" in err["error"]
    assert "second line" not in err["error"]


def test_table_lists_every_row(data):
    md = R.markdown(data)
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")]
    for r in data["rows"]:
        prefix = f"| {r['workload']} | {r['shape']} | {r['dtype']} | {r['mode']} |"
        assert sum(ln.startswith(prefix) for ln in lines) >= 1, prefix
    assert "## The worst 5 rows" in md and "## Failing rows" in md
    assert md.count("**FAIL**") == 2 and md.count("**ERROR**") == 1


def test_worst_rows_have_a_reason(data):
    w = R.worst(data["rows"])
    assert 0 < len(w) <= 5 and all(r["status"] == "ok" for r in w)
    ratios = [R.headline(r) for r in w]
    assert ratios == sorted(ratios, reverse=True)
    assert all(isinstance(R.why(r), str) and R.why(r) for r in w)
    assert R.why({"status": "FAIL", "workload": "gelu", "shape": "2x9", "mode": "sym"}) == "wrong result (see error)"


def _chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    out, pos = [], 8
    while pos < len(png):
        (n,) = struct.unpack(">I", png[pos:pos + 4])
        kind, body = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", png[pos + 8 + n:pos + 12 + n])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        out.append((kind, body))
        pos += 12 + n
    return out


def test_png_is_valid(data, tmp_path):
    paths = R.write_all(data, str(tmp_path), "t", use_matplotlib=False)
    png = open(paths["png"], "rb").read()
    chunks = _chunks(png)
    assert [k for k, _ in chunks][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    w, h, depth, ctype, _, _, _ = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, ctype) == (8, 2)
    raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    assert len(raw) == h * (1 + 3 * w)
    img = np.frombuffer(raw, np.uint8).reshape(h, 1 + 3 * w)
    assert (img[:, 0] == 0).all()  # filter byte "none" on every row
    pix = img[:, 1:].reshape(h, w, 3)
    assert (pix == 40).all(axis=2).any()  # a failing cell is drawn (dark)
    assert len(R.heat_rows(data["rows"])) == 10  # one strip per workload x dtype x sizes mode
    saved = json.load(open(paths["json"]))
    assert len(saved["rows"]) == len(data["rows"])


def test_encode_png_refuses_a_bad_image():
    with pytest.raises(ArgumentError, match="uint8"):
        R.encode_png(np.zeros((4, 4, 3), np.float32))


def test_merge_combines_parts(data, tmp_path):
    rows = data["rows"]
    a = {"title": "a", "meta": [{"part": "cpu"}], "rows": rows[:6]}
    b = {"title": "b", "meta": [{"part": "cpu"}], "rows": rows[4:]}  # rows 4, 5 overlap: counted once
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    assert S.main(["--merge", str(pa), str(pb), "--out", str(tmp_path), "--no-matplotlib"]) == 0
    merged = json.load(open(tmp_path / "shapes_merged.json"))
    assert len(merged["rows"]) == len(rows) and len(merged["meta"]) == 2
    md = (tmp_path / "shapes_merged.md").read_text()
    assert all(f"| {r['workload']} | {r['shape']} |" in md for r in rows)
    assert _chunks((tmp_path / "shapes_merged.png").read_bytes())


def test_max_rel_err_sees_nan_and_shape():
    ref = (np.arange(1.0, 5.0),)
    assert S.max_rel_err((np.arange(1.0, 5.0),), ref) == 0.0
    assert S.max_rel_err((np.array([1.0, np.nan, 3.0, 4.0]),), ref) == float("inf")
    assert S.max_rel_err((np.arange(1.0, 4.0),), ref) == float("inf")


def test_grid_covers_the_parts():
    for part in ("gpu-mem", "gpu-gemm", "cpu"):
        for quick in (False, True):
            g = S.grid(part, quick, None)
            assert g and {s.kind for s, _ in g} <= set(S.KINDS[part])
    names = {s.name for s, _ in S.grid("gpu-mem", False, None)}
    assert names == {"sincos", "gelu", "horizontal", "bias_gelu", "softmax", "layernorm", "rmsnorm"}
    assert {s.name for s, _ in S.grid("gpu-mem", True, {"softmax"})} == {"softmax"}
    assert (1024, 1024, 1024) in [sh for _, sh in S.grid("cpu", True, None)]
    assert "float16" in S.default_dtypes("gpu-mem") and S.default_dtypes("cpu") == ["float32"]
    picked = S.grid("gpu-mem", False, {"softmax", "gelu"}, {"4096x3000", "7x9", "16x4096x4096"})
    assert sorted((s.name, sh) for s, sh in picked) == [("gelu", (7, 9)), ("gelu", (4096, 3000)),
                                                        ("softmax", (7, 9)), ("softmax", (4096, 3000))]
    assert [sh for _, sh in S.grid("gpu-gemm", False, None, {"16x4096x4096", "7x9"})] == [(16, 4096, 4096)]


@pytest.mark.parametrize("make", [W.rmsnorm, W.bias_gelu, W.softmax_mixed, W.layernorm_mixed])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_new_workloads_match_numpy(make, dtype):
    w = make(dtype=dtype)
    sizes = {"m": 3, "n": 4100}  # a wide row: a float16 accumulator would be off by percents
    ins = w.random_inputs(sizes, np.random.default_rng())
    outs = w.empty_outputs(sizes)
    build(list(w.outputs), list(w.args), target="cpu")(*w.call_args(ins, outs))
    ref = w.reference(*ins)[0].astype(np.float64)
    err = np.abs(outs[0].astype(np.float64) - ref).max() / np.abs(ref).max()
    assert err < (1e-5 if dtype == "float32" else 5e-3)


def _row(part, workload, shape, mode, ms, **kw):
    kind = {"softmax": "row", "gelu": "ew", "matmul_bias_relu": "gemm"}[workload]
    return dict(part=part, workload=workload, kind=kind, shape=shape, dtype="float32", mode=mode, status="ok",
                ms_ours=ms, **kw)


def test_goals_and_reasons_on_gpu_rows(tmp_path):
    """Rows as the GPU parts write them (numbers made up here): the ratios, the goal counts, the reasons."""
    rows = R.derive([
        _row("gpu-mem", "softmax", "1024x50257", "fixed", 1.0, ms_compile=0.5, ms_eager=0.8, floor_ms=0.4),
        _row("gpu-mem", "softmax", "1024x50257", "sym", 1.5, ms_compile=0.5, ms_eager=0.8, floor_ms=0.4),
        _row("gpu-mem", "gelu", "8192x8192", "fixed", 0.5, ms_compile=0.5, floor_ms=0.48),
        _row("gpu-mem", "gelu", "8192x8192", "sym", 0.51, ms_compile=0.5, floor_ms=0.48),
        _row("gpu-gemm", "matmul_bias_relu", "1000x1000x1000", "fixed", 2.0, ms_compile=1.0, ms_other=1.0),
        _row("gpu-gemm", "matmul_bias_relu", "16x4096x4096", "fixed", 0.1, ms_compile=0.05, ms_other=0.05,
             floor_ms=0.09),
        dict(_row("gpu-mem", "softmax", "1x1000", "sym", None), status="FAIL", error="max rel. error 1e+00"),
    ])
    r0 = rows[1]
    assert r0["sym_fixed"] == pytest.approx(1.5) and r0["ours_compile"] == pytest.approx(3.0)
    assert r0["pct_floor"] == pytest.approx(100 * 0.4 / 1.5)
    goals = {ln.split(" | ")[0][2:]: ln.split(" | ")[1:5] for ln in R.goals_section(rows) if ln.startswith("| GPU")}
    assert goals["GPU memory-bound: ours <= 1.05x torch.compile"] == ["5", "2", "3", "0"]
    assert goals["GPU symbolic sizes within 5% of fixed (sym/fixed <= 1.05)"] == ["3", "1", "2", "0"]
    assert goals["GPU skinny GEMM (M <= 64): >= 80% of its bandwidth floor"] == ["1", "1", "0", "0"]
    assert R.why(rows[4]).startswith("GEMM size not a multiple")
    assert R.why(rows[5]).startswith("skinny M")
    assert R.why(rows[0]).startswith("very wide rows")
    assert [(r["shape"], r["mode"]) for r in R.worst(rows, 1)] == [("1024x50257", "sym")]  # 3.0x compile
    assert len(R.worst(rows)) == 5 and R.failures(rows) == [rows[-1]]
    paths = R.write_all({"title": "gpu", "meta": [], "rows": rows}, str(tmp_path), "g", use_matplotlib=False)
    assert _chunks(open(paths["png"], "rb").read())


class _FakeTensor(np.ndarray):
    """A numpy array with the few torch.Tensor methods the GPU backend calls (a stand-in: no torch here)."""

    def detach(self):
        return self

    def double(self):
        return self.astype(np.float64)

    def cpu(self):
        return self

    def numpy(self):
        return np.asarray(self)

    def fill_(self, v):
        self.fill(v)
        return self

    def tanh(self):
        return np.tanh(self)

    def relu(self):
        return np.maximum(self, 0)


class _FakeEvent:
    def __init__(self, enable_timing=False):
        self.t = 0.0

    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def _fake_torch():
    """Just enough of torch's surface for GpuBackend, run on the host (the module under test is built for "cpu")."""
    rng = np.random.default_rng()
    ns = types.SimpleNamespace
    calls = {"compile": 0, "reset": 0, "matmul": 0}

    def compile_(fn, dynamic=None):
        assert dynamic is False
        calls["compile"] += 1
        return fn

    def reset():
        calls["reset"] += 1

    def matmul(a, b):
        calls["matmul"] += 1
        return np.asarray(a) @ np.asarray(b)

    return ns(
        float32="float32", float16="float16", __version__="fake", calls=calls,
        randn=lambda shape, device=None, dtype="float32": rng.standard_normal(shape).astype(dtype).view(_FakeTensor),
        full=lambda shape, v, device=None, dtype="float32": np.full(shape, v, dtype).view(_FakeTensor),
        manual_seed=lambda s: None, compile=compile_, matmul=matmul, no_grad=contextlib.nullcontext,
        _dynamo=ns(reset=reset),
        backends=ns(cuda=ns(matmul=ns(allow_tf32=True)), cudnn=ns(allow_tf32=True)),
        cuda=ns(synchronize=lambda: None, Event=_FakeEvent, empty_cache=lambda: None,
                get_device_name=lambda i: "fake device",
                get_device_properties=lambda i: ns(L2_cache_size=1 << 16)),
    )


def test_gpu_backend_flow_with_a_stand_in_torch(monkeypatch):
    """GpuBackend's path (inputs, L2 rotation, eager / torch.compile / cuBLAS baselines, timing through
    gpu_suite.time_cuda, ratios) with a host stand-in for torch; the modules are CPU builds of the same programs."""
    fake = _fake_torch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(S, "copy_bandwidth", lambda torch, n: 1e10)
    monkeypatch.setattr(S, "TIME_BUDGET_S", 0.01)

    class HostGpu(S.GpuBackend):
        target = "cpu"  # build for the host: the stand-in tensors are numpy arrays

    b = HostGpu(quick=True)
    assert fake.backends.cuda.matmul.allow_tf32 is False and b.l2 == 1 << 16
    assert b.copies(1 << 10) == (64, "L2") and b.copies(1 << 20) == (1, "cold")
    groups = [(S.SPECS["gelu"], (4, 50)), (S.SPECS["matmul_bias_relu"], (8, 24, 16))]
    data = S.run_part("gpu-mem", dtypes=["float32"], backend=b, groups=groups)
    rows = data["rows"]
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows), rows
    assert fake.calls["compile"] == fake.calls["reset"] == 2 and fake.calls["matmul"] > 0
    for r in rows:
        assert r["ms_ours"] > 0 and r["ms_compile"] > 0 and r["ours_compile"] is not None and r["max_err"] < 1e-5
    gemm = [r for r in rows if r["workload"] == "matmul_bias_relu"]
    assert all(r["other_name"] == "cuBLAS" and r["ms_other"] > 0 and r["floor_ms"] for r in gemm)  # M = 8: skinny
    assert data["meta"][0]["device"] == "fake device"
    assert all(r["eager_err"] < 1e-5 and r["compile_err"] < 1e-5 and "baseline_error" not in r for r in rows)
