"""The generality suite (issue 11 part 6): loopir across shapes, dtypes and symbolic / fixed sizes, against PyTorch
eager, torch.compile (dynamic=False), cuBLAS and the DRAM floor, all timed in one process.

Workloads: the memory-bound seeds of loopir/workloads.py (sincos, gelu, horizontal, softmax, layernorm) plus
rmsnorm and bias_gelu (for float16 / bfloat16, softmax and layernorm are the seeds' float32-accumulating twins
`softmax_mixed` / `layernorm_mixed`, as PyTorch computes them: the seeds accumulate in their own dtype and fail the
float64 check on wide rows); the GEMM relu(A @ B + bias) (workloads.matmul_bias_relu) on squares and skinny M. Each
(workload, shape, dtype) is built twice: at symbolic sizes (`te.var`, the user's path
`build(outs, ins + outs, target=...)`, one module per workload and dtype reused for every shape) and at sizes fixed
at build time. Every row is checked against the float64 numpy reference (fresh random inputs, outputs poisoned
with NaN); a failing row is reported FAIL with its error, a build that raises ERROR with the exception's class and
first line, never dropped.

Timing (GPU): CUDA events around back-to-back calls after warm-up, medians (benchmarks/gpu_suite.py's
`time_cuda`, batch and repeats scaled so one timing takes ~0.3 s). Inputs and outputs rotate over enough copies that
the working set exceeds twice the L2 (the `L2` column says `cold`); rows too small for that (more than 64 copies)
run L2-resident and say `L2`. torch.compile recompiles per shape (`torch._dynamo.reset()` before each, so the
recompile limit never falls back to eager); its compile time is excluded (timed after the first call). The DRAM
floor is (bytes in + out) / the device-to-device copy bandwidth measured at the start of the run. GEMM: cuBLAS is
`torch.matmul` with TF32 off; skinny M's floor is its bytes over the copy bandwidth.

The CPU twin (`--part cpu`): the same workloads on the CPU target (`build(..., threads=2)`) against numpy and
PyTorch CPU (if importable, 2 threads; "n/a" otherwise), with the CPU GEMM 1024^3; timing by perf_counter medians.

    python3 benchmarks/shapes.py --part gpu-mem [--quick] [--only softmax,rmsnorm] [--dtypes float32]
    python3 benchmarks/shapes.py --part gpu-gemm --max-seconds 500
    python3 benchmarks/shapes.py --part cpu --quick
    python3 benchmarks/shapes.py --merge results/shapes_gpu-mem.json results/shapes_gpu-gemm.json --record
    python3 benchmarks/shapes.py --worst results/shapes_merged.json    # the worst five, with a "why" each

The full grid in 10-minute device calls (each writes its own JSON; then --merge):
    --part gpu-mem --only sincos,gelu,horizontal,bias_gelu --max-seconds 520
    --part gpu-mem --only softmax,layernorm,rmsnorm --max-seconds 520
    --part gpu-gemm --max-seconds 520
(and --dtypes float32 / float16 per call when one call does not fit; the file names carry --only and --dtypes).

Writes shapes_<part>[_quick][_only].json / .md / .png into --out (default benchmarks/results/); with --record
also benchmarks/RESULTS_shapes.md and RESULTS_shapes.png.
"""

from __future__ import annotations

import sys

if any("cpu" in a for a in sys.argv):  # the CPU twin runs on 2 threads; the BLAS pools read these before numpy loads
    import os as _os

    for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        _os.environ.setdefault(_v, "2")

import argparse  # noqa: E402
import datetime  # noqa: E402
import itertools  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path[:0] = [ROOT, BENCH]

import _shapes_report as R  # noqa: E402
from gpu_suite import copy_bandwidth, time_cuda  # noqa: E402

from codegen import build  # noqa: E402
from loopir import dtypes as D  # noqa: E402
from loopir import workloads as W  # noqa: E402
from loopir.workloads import Workload  # noqa: E402

try:  # a module global, so the functions torch.compile traces hold no import statement
    import torch as _torch
except ImportError:  # the report side and --part cpu run without PyTorch
    _torch = None

Shape = tuple[int, ...]
Row = dict[str, Any]
GELU_C = math.sqrt(2.0 / math.pi)
TIME_BUDGET_S = 0.3  # seconds one GPU timing may take (batch and repeats are scaled to it)
MAX_COPIES = 64  # rotated copies of a row's arrays at most (more: the row runs L2-resident)
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
TOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}  # max |ours - ref| / max |ref|


# ----------------------------------------------------------------------------- workloads and baselines


def _t_gelu(x: Any) -> Any:
    return 0.5 * x * (1.0 + (GELU_C * (x + 0.044715 * x * x * x)).tanh())


def _t_softmax(x: Any) -> Any:
    return x.softmax(dim=-1)


def _t_layernorm(x: Any, w: Any, b: Any) -> Any:
    return _torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps=W.LAYERNORM_EPS)


def _t_rmsnorm(x: Any, w: Any) -> Any:
    xf = x.float()
    return (xf * ((xf * xf).mean(dim=-1, keepdim=True) + W.RMSNORM_EPS).rsqrt() * w.float()).to(x.dtype)


def _t_gemm(a: Any, b: Any, bias: Any) -> Any:
    return (a @ b + bias).relu()


def _n_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(GELU_C * (x + 0.044715 * (x * x * x))))


def _n_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _n_layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(axis=1, keepdims=True)
    v = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(v + W.LAYERNORM_EPS) * w + b


def _n_rmsnorm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + W.RMSNORM_EPS) * w


@dataclass(frozen=True)
class Spec:
    """One workload of the grid. `make(shape, dtype)` gives the Workload at fixed sizes, `make(None, dtype)` at
    symbolic ones; `torch_fn` / `np_fn` compute the same outputs from the inputs (the baselines)."""

    name: str
    kind: str  # "ew" (elementwise, shape (m, n)), "row" (row reductions, (rows, row length)), "gemm" ((M, N, K))
    make: Callable[[Shape | None, str], Workload]
    torch_fn: Callable[..., Any]
    np_fn: Callable[..., Any]


def _mn(f: Callable[..., Workload]) -> Callable[[Shape | None, str], Workload]:
    """A 2-D seed taking (m, n) keywords; None -> both symbolic (the seeds' own te.var)."""
    def make(shape: Shape | None, dtype: str) -> Workload:
        if shape is None:
            return f(m=W.te.var("m"), n=W.te.var("n"), dtype=dtype)
        return f(m=shape[0], n=shape[1], dtype=dtype)
    return make


def _mixed(seed: Callable[..., Workload], mixed: Callable[..., Workload]) -> Callable[[Shape | None, str], Workload]:
    """The seed for float32 / float64; for 16-bit dtypes its float32-accumulating twin (what PyTorch computes; the
    seeds as written accumulate in their own dtype and fail the float64 check on wide rows)."""
    s, m = _mn(seed), _mn(mixed)

    def make(shape: Shape | None, dtype: str) -> Workload:
        return m(shape, dtype) if dtype in ("float16", "bfloat16") else s(shape, dtype)
    return make


def _sincos(shape: Shape | None, dtype: str) -> Workload:
    return W.sincos(None if shape is None else shape[0] * shape[1], dtype=dtype)  # 1-D: the shape flattened


def _gemm(shape: Shape | None, dtype: str) -> Workload:
    if shape is None:
        return W.matmul_bias_relu(dtype=dtype)
    mm, nn, kk = shape
    return W.matmul_bias_relu(n=mm, m=nn, p=kk, dtype=dtype)  # A (M, K), B (K, N), C (M, N)


SPECS: dict[str, Spec] = {s.name: s for s in [
    Spec("sincos", "ew", _sincos, lambda x: x.sin() ** 2 + x.cos() ** 2, lambda x: np.sin(x) ** 2 + np.cos(x) ** 2),
    Spec("gelu", "ew", _mn(W.gelu), _t_gelu, _n_gelu),
    Spec("horizontal", "ew", _mn(W.horizontal), lambda x: (x.relu(), x.sigmoid(), x.tanh()),
         lambda x: (np.maximum(x, 0), 1 / (1 + np.exp(-x)), np.tanh(x))),
    Spec("bias_gelu", "ew", _mn(W.bias_gelu), lambda x, b: _t_gelu(x + b), lambda x, b: _n_gelu(x + b)),
    Spec("softmax", "row", _mixed(W.softmax, W.softmax_mixed), _t_softmax, _n_softmax),
    Spec("layernorm", "row", _mixed(W.layernorm, W.layernorm_mixed), _t_layernorm, _n_layernorm),
    Spec("rmsnorm", "row", _mn(W.rmsnorm), _t_rmsnorm, _n_rmsnorm),
    Spec("matmul_bias_relu", "gemm", _gemm, _t_gemm, lambda a, b, bias: np.maximum(a @ b + bias, 0)),
]}

# the grid: well-spread shapes rather than a dense one (torch.compile recompiles per shape); non-powers of two,
# rows from 1 to 65,536 and row lengths from 64 to 65,536
GRID: dict[str, dict[str, list[Shape]]] = {
    "gpu-mem": {
        "row": [(1, 1000), (64, 4096), (65536, 64), (65536, 768), (16384, 1000), (4096, 3000), (16384, 4096),
                (1024, 50257), (32, 65536), (1024, 65536)],
        "ew": [(1, 1000), (128, 3000), (1000, 1000), (4096, 4096), (8192, 8192), (1024, 50257)],
    },
    "gpu-gemm": {"gemm": [(256, 256, 256), (1000, 1000, 1000), (1024, 1024, 1024), (1536, 1536, 1536),
                          (2048, 2048, 2048), (3000, 3000, 3000), (4096, 4096, 4096), (8192, 8192, 8192),
                          (1, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096)]},
    "cpu": {
        "row": [(1, 1000), (64, 4096), (4096, 64), (1024, 3000), (4096, 4096), (128, 50257)],
        "ew": [(1, 1000), (1000, 1000), (4096, 4096), (128, 50257)],
        "gemm": [(1024, 1024, 1024)],
    },
}
QUICK: dict[str, dict[str, list[Shape]]] = {
    "gpu-mem": {"row": [(64, 1000), (4096, 3000), (1024, 50257)], "ew": [(1000, 1000), (4096, 4096)]},
    "gpu-gemm": {"gemm": [(1000, 1000, 1000), (4096, 4096, 4096), (16, 4096, 4096)]},
    "cpu": {"row": [(64, 1000), (256, 3000)], "ew": [(1000, 1000)], "gemm": [(1024, 1024, 1024)]},
}
KINDS = {"gpu-mem": ("ew", "row"), "gpu-gemm": ("gemm",), "cpu": ("ew", "row", "gemm")}


def default_dtypes(part: str) -> list[str]:
    """float32 and float16 on the GPU, bfloat16 too when loopir.dtypes has it; float32 on the CPU."""
    if part == "cpu":
        return ["float32"]
    return ["float32", "float16"] + (["bfloat16"] if "bfloat16" in D.DTYPES else [])


def shape_label(shape: Shape) -> str:
    return "x".join(str(d) for d in shape)


# ----------------------------------------------------------------------------- one row


def _err_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:300]


def _tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def max_rel_err(got: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> float:
    """max over outputs of max |got - ref| / max |ref| in float64 (inf when anything is NaN or the shapes differ)."""
    worst = 0.0
    for g, r in zip(got, ref, strict=True):
        g64, r64 = np.asarray(g, dtype=np.float64), np.asarray(r, dtype=np.float64)
        if g64.shape != r64.shape:
            return math.inf
        d = np.abs(g64 - r64)
        if np.isnan(d).any():
            return math.inf
        worst = max(worst, float(d.max(initial=0.0) / max(float(np.abs(r64).max(initial=0.0)), 1e-30)))
    return worst


def dims(w: Workload, x: Any) -> Shape:
    return w.shape_of(x, {})


class Backend:
    """What differs between the GPU and the CPU runs: arrays, the baselines, timing."""

    target = "cpu"

    def inputs(self, w: Workload, rng: np.random.Generator, copies: int) -> list[list[Any]]: ...
    def outputs(self, w: Workload, copies: int) -> list[list[Any]]: ...
    def host64(self, a: Any) -> np.ndarray: ...
    def poison(self, outs: list[Any]) -> None: ...
    def sync(self) -> None: ...
    def time(self, fn: Callable[[], Any]) -> float: ...
    def baselines(self, spec: Spec, ins: list[list[Any]], row: Row, ref: tuple[np.ndarray, ...]) -> None: ...

    def check(self, name: str, got: Any, ref: tuple[np.ndarray, ...], row: Row) -> None:
        """Record a baseline's own error against the reference (`<name>_err`): a baseline that computes
        something else would make its timing meaningless."""
        err = max_rel_err([self.host64(g) for g in _tuple(got)], ref)
        row[f"{name}_err"] = err
        if not err <= TOL.get(row.get("dtype", ""), 1e-2) * 10:
            row["baseline_error"] = f"{name} result differs from the reference (max rel. error {err:.1e})"

    def copies(self, nbytes: int) -> tuple[int, str]: ...
    def build_opts(self) -> dict[str, Any]: ...


class CpuBackend(Backend):
    target = "cpu"

    def __init__(self, threads: int = 2, copy_bytes: int = 1 << 27) -> None:
        self.threads = threads
        try:
            import torch

            torch.set_num_threads(threads)
            self.torch: Any = torch
        except ImportError:
            self.torch = None
        a = np.ones(copy_bytes // 4, np.float32)  # 128 MiB by default: beyond any L3 here
        b = np.empty_like(a)
        ms = self.time(lambda: np.copyto(b, a))
        self.bandwidth = 2 * a.nbytes / (ms * 1e-3)

    @staticmethod
    def _host(a: np.ndarray, dtype: str) -> np.ndarray:
        """float64 values as a host array of `dtype` (bfloat16: its uint16 bits, loopir.dtypes.to_bfloat16)."""
        return D.to_bfloat16(a) if dtype == "bfloat16" else a.astype(dtype)  # type: ignore[attr-defined]

    def inputs(self, w: Workload, rng: np.random.Generator, copies: int) -> list[list[Any]]:
        return [[self._host(rng.standard_normal(dims(w, x)), x.dtype) for x in w.inputs] for _ in range(copies)]

    def outputs(self, w: Workload, copies: int) -> list[list[Any]]:
        return [[self._host(np.full(dims(w, o), np.nan), o.dtype) for o in w.outputs] for _ in range(copies)]

    def host64(self, a: Any) -> np.ndarray:
        if a.dtype == np.uint16:  # bfloat16 bits (no workload here has 16-bit integers)
            return D.from_bfloat16(a).astype(np.float64)  # type: ignore[attr-defined]
        return np.asarray(a, dtype=np.float64)

    def poison(self, outs: list[Any]) -> None:
        for o in outs:
            o[...] = self._host(np.full(o.shape, np.nan), "bfloat16" if o.dtype == np.uint16 else str(o.dtype))

    def sync(self) -> None:
        pass

    def time(self, fn: Callable[[], Any]) -> float:
        time.sleep(0.1)  # let the previous timing's BLAS / OpenMP threads stop spinning (they would take a core)
        fn()
        t = time.perf_counter()
        fn()
        probe = time.perf_counter() - t
        reps = max(3, min(21, int(2 * TIME_BUDGET_S / max(probe, 1e-6))))  # the host is noisier than CUDA events
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e3

    def copies(self, nbytes: int) -> tuple[int, str]:
        return 1, ""

    def build_opts(self) -> dict[str, Any]:
        return {"threads": self.threads}

    def baselines(self, spec: Spec, ins: list[list[Any]], row: Row, ref: tuple[np.ndarray, ...]) -> None:
        # numpy has no bfloat16: its baseline (and PyTorch's input) is the float32 widening of the bits
        wide = [self.host64(a).astype(np.float32) if a.dtype == np.uint16 else a for a in ins[0]]
        row["other_name"] = "numpy" if all(a.dtype != np.uint16 for a in ins[0]) else "numpy float32"
        try:
            self.check("numpy", spec.np_fn(*wide), ref, row)
            row["ms_other"] = self.time(lambda: spec.np_fn(*wide))
        except Exception as exc:  # noqa: BLE001 - a baseline failing must not drop the row
            row["baseline_error"] = _err_line(exc)
        if self.torch is not None:
            try:
                torch = self.torch
                targs = [torch.from_numpy(w).to(torch.bfloat16) if a.dtype == np.uint16 else torch.from_numpy(a)
                         for a, w in zip(ins[0], wide)]
                with torch.no_grad():
                    self.check("eager", [o.double().numpy() for o in _tuple(spec.torch_fn(*targs))], ref, row)
                    row["ms_eager"] = self.time(lambda: spec.torch_fn(*targs))
            except Exception as exc:  # noqa: BLE001
                row["baseline_error"] = _err_line(exc)


class GpuBackend(Backend):
    target = "cuda"

    def __init__(self, quick: bool) -> None:
        import torch

        self.torch = torch
        torch.backends.cuda.matmul.allow_tf32 = False  # cuBLAS in true fp32 (the GEMM goal is against this)
        torch.backends.cudnn.allow_tf32 = False
        torch.manual_seed(0)
        self.bandwidth = copy_bandwidth(torch, (1 << 28) if quick else (1 << 30))
        self.l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20))
        self.device = torch.cuda.get_device_name(0)

    def _dt(self, dtype: str) -> Any:
        return getattr(self.torch, dtype)

    def inputs(self, w: Workload, rng: np.random.Generator, copies: int) -> list[list[Any]]:
        t = self.torch
        return [[t.randn(dims(w, x), device="cuda", dtype=self._dt(x.dtype)) for x in w.inputs] for _ in range(copies)]

    def outputs(self, w: Workload, copies: int) -> list[list[Any]]:
        t = self.torch
        return [[t.full(dims(w, o), float("nan"), device="cuda", dtype=self._dt(o.dtype)) for o in w.outputs]
                for _ in range(copies)]

    def host64(self, a: Any) -> np.ndarray:
        return a.detach().double().cpu().numpy()

    def poison(self, outs: list[Any]) -> None:
        for o in outs:
            o.fill_(float("nan"))

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def time(self, fn: Callable[[], Any]) -> float:
        t = self.torch
        fn()
        t.cuda.synchronize()
        s = time.perf_counter()
        fn()
        t.cuda.synchronize()
        probe = time.perf_counter() - s
        batch = max(1, min(10, int(2e-3 / max(probe, 1e-7))))
        repeat = max(3, min(15, int(TIME_BUDGET_S / max(probe * batch, 1e-7))))
        return time_cuda(t, fn, batch=batch, repeat=repeat, warmup=2)

    def copies(self, nbytes: int) -> tuple[int, str]:
        k = math.ceil(2 * self.l2 / max(nbytes, 1))
        return (min(k, MAX_COPIES), "cold" if k <= MAX_COPIES else "L2")

    def build_opts(self) -> dict[str, Any]:
        return {}

    def baselines(self, spec: Spec, ins: list[list[Any]], row: Row, ref: tuple[np.ndarray, ...]) -> None:
        torch = self.torch
        cyc = itertools.cycle(ins)
        with torch.no_grad():
            try:
                self.check("eager", spec.torch_fn(*ins[0]), ref, row)
                row["ms_eager"] = self.time(lambda: spec.torch_fn(*next(cyc)))
            except Exception as exc:  # noqa: BLE001
                row["baseline_error"] = "eager " + _err_line(exc)
            try:
                torch._dynamo.reset()  # a fresh cache per shape: the recompile limit never falls back to eager
                compiled = torch.compile(spec.torch_fn, dynamic=False)
                s = time.perf_counter()
                got = compiled(*ins[0])
                torch.cuda.synchronize()
                row["compile_s"] = round(time.perf_counter() - s, 2)
                self.check("compile", got, ref, row)
                row["ms_compile"] = self.time(lambda: compiled(*next(cyc)))
            except Exception as exc:  # noqa: BLE001
                row["baseline_error"] = "compile " + _err_line(exc)
            if spec.kind == "gemm":
                row["other_name"] = "cuBLAS"
                try:
                    row["ms_other"] = self.time(lambda: torch.matmul(*next(cyc)[:2]))
                except Exception as exc:  # noqa: BLE001
                    row["baseline_error"] = "cuBLAS " + _err_line(exc)


def _floor_ms(spec: Spec, w: Workload, nbytes: int, bandwidth: float, part: str) -> float | None:
    """The DRAM floor: every byte in and out once over the copy bandwidth. For GEMM only where it binds
    (skinny M on the GPU, M <= 64); square GEMMs are judged against cuBLAS instead."""
    if spec.kind == "gemm" and (part == "cpu" or dims(w, w.outputs[0])[0] > 64):
        return None
    return nbytes / bandwidth * 1e3


class Runner:
    """Runs (spec, shape, dtype) groups: a fixed and a symbolic row each, the baselines shared."""

    def __init__(self, backend: Backend, modes: Sequence[str] = ("fixed", "sym"), deadline: float | None = None,
                 rng: int = 20261123) -> None:
        self.b = backend
        self.modes = tuple(modes)
        self.deadline = deadline
        self.rng = np.random.default_rng(rng)
        self.sym: dict[tuple[str, str], Any] = {}  # (workload, dtype) -> module built at symbolic sizes, or the error
        self.rows: list[Row] = []
        self.skipped: list[str] = []

    def _module(self, spec: Spec, shape: Shape, dtype: str, mode: str, fixed: Workload) -> tuple[Any, float]:
        if mode == "fixed":
            s = time.perf_counter()
            mod = build(list(fixed.outputs), list(fixed.args), target=self.b.target, **self.b.build_opts())
            return mod, time.perf_counter() - s
        key = (spec.name, dtype)
        if key not in self.sym:
            s = time.perf_counter()
            try:
                w = spec.make(None, dtype)
                self.sym[key] = (build(list(w.outputs), list(w.args), target=self.b.target, **self.b.build_opts()),
                                 time.perf_counter() - s)
            except Exception as exc:  # noqa: BLE001 - remembered, so each shape reports the same error
                self.sym[key] = exc
        got = self.sym[key]
        if isinstance(got, Exception):
            raise got
        return got

    def run_group(self, spec: Spec, shape: Shape, dtype: str, part: str) -> list[Row]:
        if self.deadline is not None and time.time() > self.deadline:
            self.skipped.append(f"{spec.name} {shape_label(shape)} {dtype}")
            return []
        base: Row = {"part": part, "workload": spec.name, "kind": spec.kind, "shape": shape_label(shape),
                     "dtype": dtype, "status": "ok"}
        rows = [dict(base, mode=m) for m in self.modes]
        t0 = time.perf_counter()
        try:
            fixed = spec.make(shape, dtype)
            nbytes = sum(math.prod(dims(fixed, x)) * ITEMSIZE[x.dtype] for x in (*fixed.inputs, *fixed.outputs))
            ncopies, l2 = self.b.copies(nbytes)
            ins = self.b.inputs(fixed, self.rng, ncopies)
            outs = self.b.outputs(fixed, ncopies)
            ref = spec.make(shape, "float64").reference(*[self.b.host64(a) for a in ins[0]])
            shared: Row = {"dtype": dtype, "bytes": nbytes, "l2": l2, "copies": ncopies,
                           "floor_ms": _floor_ms(spec, fixed, nbytes, self.b.bandwidth, part)}
            self.b.baselines(spec, ins, shared, ref)
        except Exception as exc:  # noqa: BLE001 - the whole group fails alike
            for r in rows:
                r.update(status="ERROR", error="setup " + _err_line(exc), trace=traceback.format_exc(limit=3))
            self.rows += rows
            self.free()
            return rows
        for r in rows:
            r.update(shared)
            self._ours(spec, shape, dtype, r, fixed, ins, outs, ref)
            self._print(r)
        rows[0]["group_s"] = round(time.perf_counter() - t0, 2)
        self.rows += rows
        del ins, outs, ref
        self.free()
        return rows

    def _ours(self, spec: Spec, shape: Shape, dtype: str, r: Row, fixed: Workload, ins: list[list[Any]],
              outs: list[list[Any]], ref: tuple[np.ndarray, ...]) -> None:
        try:
            mod, r["build_s"] = self._module(spec, shape, dtype, r["mode"], fixed)
            r["build_s"] = round(r["build_s"], 3)
        except Exception as exc:  # noqa: BLE001
            r.update(status="ERROR", error="build " + _err_line(exc))
            return
        try:
            self.b.poison(outs[0])
            mod(*ins[0], *outs[0])
            self.b.sync()
            r["max_err"] = err = max_rel_err([self.b.host64(o) for o in outs[0]], ref)
            if callable(getattr(mod, "explain", None)):  # the build's notes and the specialization this call took
                r["explain"] = str(mod.explain())[:600]
            r["tol"] = tol = max(TOL.get(dtype, 1e-2), fixed.tolerance)
            if not err <= tol:
                r.update(status="FAIL", error=f"max rel. error {err:.2e} > tolerance {tol:.0e}")
            sets = [(*i, *o) for i, o in zip(ins, outs)]
            cyc = itertools.cycle(sets)
            r["ms_ours"] = self.b.time(lambda: mod(*next(cyc)))
            r["kernels"] = len(getattr(mod, "kernels", ()) or ())
            if hasattr(mod, "prepare") and hasattr(mod, "launch"):
                try:
                    preps = itertools.cycle([mod.prepare(s) for s in sets])
                    r["ms_ours_launch"] = self.b.time(lambda: mod.launch(next(preps)))
                except Exception as exc:  # noqa: BLE001 - the launch-only timing is extra; keep the row
                    r["launch_error"] = _err_line(exc)
            spec_list = getattr(mod, "specializations", None)
            if spec_list is not None:
                r["specializations"] = len(spec_list)
        except Exception as exc:  # noqa: BLE001
            r.update(status="ERROR", error="run " + _err_line(exc))

    def free(self) -> None:
        torch = getattr(self.b, "torch", None)
        if self.b.target == "cuda" and torch is not None:
            torch.cuda.empty_cache()

    def _print(self, r: Row) -> None:
        ms = r.get("ms_ours")
        shown = f"{ms:.4f} ms" if ms else "-"
        extra = "" if r["status"] == "ok" else f" {r['status']}: {r.get('error', '')[:100]}"
        if r.get("baseline_error"):
            extra += f" (baseline: {r['baseline_error'][:100]})"
        print(f"  {r['workload']:16s} {r['shape']:16s} {r['dtype']:8s} {r['mode']:5s} ours {shown:12s} "
              f"eager {r.get('ms_eager') or 0:.4f} compile {r.get('ms_compile') or 0:.4f} "
              f"other {r.get('ms_other') or 0:.4f} err {r.get('max_err', float('nan')):.1e}{extra}", flush=True)


# ----------------------------------------------------------------------------- parts


def grid(part: str, quick: bool, only: set[str] | None, shapes: set[str] | None = None) -> list[tuple[Spec, Shape]]:
    """The (workload, shape) pairs of a part; `only` keeps those workloads, `shapes` those shape labels
    ("4096x3000"; a label not in the grid is run as given, for every workload of its rank)."""
    g = (QUICK if quick else GRID)[part]
    out = []
    for spec in SPECS.values():
        if spec.kind not in KINDS[part] or (only and spec.name not in only):
            continue
        todo = g.get(spec.kind, [])
        if shapes:
            rank = len(todo[0]) if todo else (3 if spec.kind == "gemm" else 2)
            todo = [tuple(int(d) for d in lb.split("x")) for lb in sorted(shapes)]
            todo = [t for t in todo if len(t) == rank]
        out += [(spec, s) for s in todo]
    return out


def run_part(part: str, quick: bool = False, only: set[str] | None = None, dtypes: Sequence[str] | None = None,
             max_seconds: float | None = None, modes: Sequence[str] = ("fixed", "sym"),
             backend: Backend | None = None, groups: Sequence[tuple[Spec, Shape]] | None = None,
             shapes: set[str] | None = None) -> dict[str, Any]:
    """Run one part; returns {"title", "meta", "rows"} (rows in run order, ratios filled)."""
    start = time.time()
    if backend is None:
        backend = CpuBackend(2) if part == "cpu" else GpuBackend(quick)
    dts = list(dtypes or default_dtypes(part))
    runner = Runner(backend, modes, None if max_seconds is None else start + max_seconds)
    todo = list(groups) if groups is not None else grid(part, quick, only, shapes)
    print(f"{part}: {len(todo)} shape(s) x {len(dts)} dtype(s) x {len(modes)} size mode(s); copy bandwidth "
          f"{backend.bandwidth / 1e9:.1f} GB/s", flush=True)
    for spec, shape in todo:
        for dt in dts:
            runner.run_group(spec, shape, dt, part)
    meta = {"part": part, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "device": getattr(backend, "device", platform.processor() or platform.machine()),
            "copy bandwidth GB/s": round(backend.bandwidth / 1e9, 1), "seconds": round(time.time() - start, 1),
            "command": " ".join(["python3", "benchmarks/shapes.py", *sys.argv[1:]])}
    groups = [r for r in runner.rows if r.get("group_s")]
    meta["torch.compile s (sum)"] = round(sum(r.get("compile_s") or 0 for r in groups), 1)
    meta["our builds s (sum)"] = round(sum(r.get("build_s") or 0 for r in runner.rows if r.get("mode") == "fixed")
                                       + sum(v[1] for v in runner.sym.values() if isinstance(v, tuple)), 1)
    torch = getattr(backend, "torch", None)
    meta["torch"] = getattr(torch, "__version__", "n/a (not importable)")
    if part == "cpu":
        meta["threads"] = getattr(backend, "threads", 2)
        meta["floor"] = "bytes over a numpy copyto's bandwidth (one thread)"
    if getattr(backend, "l2", None):
        meta["L2 MiB"] = round(backend.l2 / 2**20, 1)
    if runner.skipped:
        meta["not run (--max-seconds)"] = f"{len(runner.skipped)} group(s): " + ", ".join(runner.skipped[:20])
    return {"title": f"{part}{' (quick)' if quick else ''}", "meta": [meta], "rows": R.derive(runner.rows)}


def _tag(part: str, quick: bool, only: set[str] | None, dtypes: Sequence[str] | None = None) -> str:
    """The output files' name: the part, then what narrowed it, so the calls of one grid do not overwrite."""
    return (part + ("_quick" if quick else "") + ("_" + "-".join(sorted(only)) if only else "")
            + ("_" + "-".join(dtypes) if dtypes else ""))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--part", choices=sorted(KINDS), help="which part of the grid to run")
    ap.add_argument("--quick", action="store_true", help="a few shapes per workload")
    ap.add_argument("--only", default="", help="comma-separated workload names (" + ", ".join(SPECS) + ")")
    ap.add_argument("--shapes", default="", help="comma-separated shapes to run instead of the grid's, e.g. "
                                                 "4096x3000,1024x50257 (GEMM: MxNxK)")
    ap.add_argument("--dtypes", default="", help="comma-separated dtypes (default: float32,float16[,bfloat16] "
                                                 "on the GPU, float32 on the CPU)")
    ap.add_argument("--modes", default="fixed,sym", help="fixed, sym or both")
    ap.add_argument("--max-seconds", type=float, default=None, help="start no new shape after this many seconds")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="combine parts' JSON files into one table")
    ap.add_argument("--worst", nargs="+", metavar="JSON", help="print the worst rows (and failures) of JSON files")
    ap.add_argument("--out", default=os.path.join(BENCH, "results"), help="output directory")
    ap.add_argument("--record", action="store_true", help="also write benchmarks/RESULTS_shapes.md and .png")
    ap.add_argument("--no-matplotlib", action="store_true", help="write the PNG with the built-in encoder")
    a = ap.parse_args(argv)
    only = set(filter(None, a.only.split(","))) or None
    if only and only - set(SPECS):
        ap.error(f"unknown workload(s) {sorted(only - set(SPECS))}; known: {', '.join(SPECS)}")
    mpl = not a.no_matplotlib
    if a.worst:
        print("\n".join(R.worst_section(R.merge(R.load(a.worst))["rows"])))
        return 0
    if a.merge:
        data = R.merge(R.load(a.merge))
        tag = "merged"
    elif a.part:
        dts = [d for d in a.dtypes.split(",") if d] or None
        modes = [m for m in a.modes.split(",") if m]
        if set(modes) - {"fixed", "sym"}:
            ap.error(f"--modes takes fixed and/or sym, got {a.modes}")
        shapes = set(filter(None, a.shapes.split(","))) or None
        if shapes and not all(re.fullmatch(r"\d+(x\d+)+", x) for x in shapes):
            ap.error(f"--shapes takes labels like 4096x3000, got {a.shapes}")
        data = run_part(a.part, a.quick, only, dts, a.max_seconds, modes, shapes=shapes)
        tag = _tag(a.part, a.quick, only, dts) + ("_" + "-".join(sorted(shapes)) if shapes else "")
    else:
        ap.error("give --part or --merge")
    paths = R.write_all(data, a.out, tag, mpl)
    if a.record:
        paths.update({"rec_" + k: v for k, v in R.record(data, BENCH, mpl).items()})
    print()
    print(R.markdown(data))
    print("wrote " + ", ".join(paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
