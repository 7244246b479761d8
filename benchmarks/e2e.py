"""Whole model blocks end to end (issue 19): the GPT-2, MLP and LLaMA-style blocks of `loopir.blocks`, each built
as ONE program by `build(outputs, args)` (batch B and sequence T as te.var: the user's path; and at sizes fixed at
build time), against the same block in PyTorch eager and `torch.compile` in the same run.

Every row is checked against the float64 numpy reference (fresh model-like random data, outputs poisoned with
NaN; float32 < 1e-4, float16/bfloat16 < 1e-2 relative to the largest output); a failing row says FAIL, a build
that raises says ERROR with the exception, never dropped. Timing: CUDA events around back-to-back calls after
warm-up, medians (gpu_suite.time_cuda); torch.compile's compile time is excluded (timed after the first call).
Beside each row: the kernels of our plan with their predicted times (the plan's roofline), so the slowest kernels
can be named.

    python3 benchmarks/e2e.py [--blocks gpt2,mlp,llama] [--dtypes float32,float16,bfloat16] [--T 128,1024,4096]
                              [--B 8] [--C 768 --H 12] [--modes sym,fixed] [--out DIR] [--target cuda|cpu]

Modes: `sym` and `fixed` build the block as one program; `ops` is the per-operator path (one `build` per
operator of `blocks.OPERATORS`, the activations passed between the modules). A `sym` module is built once per
block and dtype and called at every T (as a user would; its plan is costed at the first T: `built_at_T` in the
json of the later rows). On the GPU each kernel of the
one-program modes is also timed alone (`CudaModule.kernel_times`), beside the plan's predicted time.

`--target cpu` (default without a GPU) runs the CPU builds at small sizes (B 2, T 64, C 256 unless given); the
CPU rows have no baseline where PyTorch is not installed. Writes e2e_<target>.md / .json / .png (our time over
torch.compile's per row) into --out (default benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from codegen import build, gpu_available  # noqa: E402
from codegen.profile import kernel_stages  # noqa: E402
from loopir import blocks  # noqa: E402
from schedules import auto_schedule  # noqa: E402

# ----------------------------------------------------------------------------- the blocks in PyTorch


def torch_block(name: str, H: int) -> Any:
    """fn(dict of tensors) -> tensor: the block as PyTorch users write it (F.layer_norm, F.scaled_dot_product
    _attention with is_causal, tanh GELU); half-precision matmuls accumulate in float32 as cuBLAS does."""
    import torch
    import torch.nn.functional as F

    def attn(q, k, v):  # noqa: ANN001, ANN202
        Bn, Tn, C = q.shape
        sh = (Bn, Tn, H, C // H)
        q, k, v = (a.view(sh).transpose(1, 2) for a in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(Bn, Tn, C)

    def rot(a, cos, sin):  # noqa: ANN001, ANN202
        Bn, Tn, C = a.shape
        x = a.view(Bn, Tn, H, -1, 2)
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return torch.stack([x[..., 0] * c - x[..., 1] * s, x[..., 1] * c + x[..., 0] * s], -1).view(Bn, Tn, C)

    def gpt2(d):  # noqa: ANN001, ANN202
        C = d["x"].shape[-1]
        h = F.layer_norm(d["x"], (C,), d["g_ln1"], d["beta_ln1"], blocks.LN_EPS)
        lin = lambda a, n: a @ d[f"w_{n}"] + d[f"b_{n}"]  # noqa: E731
        x1 = d["x"] + lin(attn(lin(h, "q"), lin(h, "k"), lin(h, "v")), "proj")
        f = F.gelu(lin(F.layer_norm(x1, (C,), d["g_ln2"], d["beta_ln2"], blocks.LN_EPS), "fc"), approximate="tanh")
        return x1 + lin(f, "fc2")

    def mlp(d):  # noqa: ANN001, ANN202
        C = d["x"].shape[-1]
        h = F.layer_norm(d["x"], (C,), d["g_ln"], d["beta_ln"], blocks.LN_EPS)
        return d["x"] + F.gelu(h @ d["w_fc"] + d["b_fc"], approximate="tanh") @ d["w_fc2"] + d["b_fc2"]

    def llama(d):  # noqa: ANN001, ANN202
        def rms(a, g):  # noqa: ANN001, ANN202
            af = a.float()
            return (af * torch.rsqrt(af.pow(2).mean(-1, keepdim=True) + blocks.RMS_EPS)).to(a.dtype) * g
        h = rms(d["x"], d["g_rms1"])
        q, k = (rot(h @ d[f"w_{n}"], d["cos"], d["sin"]) for n in ("q", "k"))
        x1 = d["x"] + attn(q, k, h @ d["w_v"]) @ d["w_o"]
        h2 = rms(x1, d["g_rms2"])
        return x1 + (F.silu(h2 @ d["w_w1"]) * (h2 @ d["w_w3"])) @ d["w_w2"]

    return {"gpt2": gpt2, "mlp": mlp, "llama": llama}[name]


# ----------------------------------------------------------------------------- one row


def _workload(name: str, dtype: str, C: int, H: int, fixed: dict[str, int] | None) -> Any:
    kw: dict[str, Any] = {"C": C, "dtype": dtype} if name == "mlp" else {"C": C, "H": H, "dtype": dtype}
    if fixed:
        kw.update(fixed)
    return blocks.BLOCKS[name](**kw)


def _rel_err(got: np.ndarray, want: np.ndarray, dtype: str) -> float:
    g, w = blocks.as_float64(got, dtype), blocks.as_float64(want, dtype)
    if np.isnan(g).any():
        return float("inf")
    return float(np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30))


def _flops(name: str, B: int, T: int, C: int) -> float:
    """Multiply-adds x 2 of the block's matmuls and attention (causal: half the scores)."""
    n = B * T
    if name == "mlp":
        return 2.0 * n * C * 4 * C * 2
    ff = 4 * C if name == "gpt2" else -(-(8 * C // 3) // 64) * 64
    mats = 2.0 * n * C * C * 4 + 2.0 * n * C * ff * (2 if name == "gpt2" else 3)
    return mats + 2.0 * B * T * T * C  # q k^T and p v, causal halves of 2 * 2 * B * T^2 * C


def _shape(t: Any, sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(sizes[d.name] if hasattr(d, "name") else int(d.value) for d in t.shape)


class _Operators:
    """The per-operator path: one module per operator (`blocks.operators`), called in order with the activations
    passed between them (the arrays of `alloc`: numpy on the CPU, torch tensors on the GPU)."""

    def __init__(self, w: Any, name: str, target: str) -> None:
        self.steps = [(build([o], [*ins, o], target=target), o, ins) for o, ins in blocks.operators(w, name)]

    def run(self, vals: dict[str, Any], alloc: Any, sizes: dict[str, int]) -> Any:
        for mod, out, ins in self.steps:
            if out.name not in vals:
                vals[out.name] = alloc(_shape(out, sizes))
            mod(*(vals[t.name] for t in ins), vals[out.name])
        return vals["y"]


# the symbolic modules built so far, by (block, dtype, target): (schedule, module, the T its plan was costed at)
_SYM_BUILDS: dict[tuple[str, str, str], tuple[Any, Any, int]] = {}
_OPS_BUILDS: dict[tuple[str, str, str], _Operators] = {}
# the last (block, dtype, B, T, C, H) measured: its inputs and float64 reference; PyTorch's block under torch.compile
# (the sym, fixed and ops rows of one block, dtype and size follow each other and share them)
_REFERENCES: dict[tuple[Any, ...], tuple[list[np.ndarray], np.ndarray]] = {}
_COMPILED: dict[tuple[Any, ...], Any] = {}


def run_row(name: str, dtype: str, B: int, T: int, C: int, H: int, mode: str, target: str, torch: Any,
            compile_torch: bool) -> dict[str, Any]:
    """One row: mode "sym" (the block as one program, B and T symbolic), "fixed" (sizes fixed at build time) or
    "ops" (one build per operator, symbolic sizes)."""
    row: dict[str, Any] = {"block": name, "dtype": dtype, "B": B, "T": T, "C": C, "mode": mode, "target": target}
    sizes = {"B": B, "T": T}
    w = _workload(name, dtype, C, H, sizes if mode == "fixed" else None)
    key = (name, dtype, B, T, C, H)
    if key not in _REFERENCES:  # the same inputs and float64 output for every mode of this block, dtype and size
        t0 = time.perf_counter()
        _REFERENCES.clear()
        ins = blocks.inputs(w, sizes, rng=0)
        _REFERENCES[key] = ins, w.reference(*ins)[0]
        row["reference_s"] = time.perf_counter() - t0
    ins, want = _REFERENCES[key]
    if mode == "ops":
        return _run_operators(row, w, name, ins, want, dtype, sizes, target, torch)
    try:
        hit = _SYM_BUILDS.get((name, dtype, target)) if mode == "sym" else None
        if hit is not None:  # a user builds the symbolic block once and calls it at every T: so do we
            s, mod, row["built_at_T"] = hit
            row["schedule_s"] = row["build_s"] = 0.0
        else:
            t0 = time.perf_counter()
            s = auto_schedule(list(w.outputs), target, sizes=sizes)
            row["schedule_s"] = time.perf_counter() - t0
            mod = build(s, list(w.args), target=target)
            row["build_s"] = time.perf_counter() - t0
            if mode == "sym":
                _SYM_BUILDS[(name, dtype, target)] = (s, mod, T)
    except Exception as e:  # noqa: BLE001 - a row that fails to build is reported, not dropped
        row["status"] = f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        traceback.print_exc(limit=4)
        return row
    groups = getattr(s.plan, "groups", [])
    row["kernels"] = [{"group": g.name, "stages": ", ".join(g.stage_names), "mapping": g.mapping,
                       "predicted_ms": g.cost.time(s.plan.device) * 1e3 if hasattr(g.cost, "time") else None}
                      for g in groups]
    got = blocks.as_dtype(np.full(want.shape, np.nan), dtype)
    mod(*ins, got)
    row["err"] = _rel_err(got, want, dtype)
    row["status"] = "ok" if row["err"] < w.tolerance else f"FAIL (error {row['err']:.2e})"
    names = [t.name for t in w.inputs]
    if target == "cuda":
        _time_cuda_row(row, name, mod, s.plan, ins, names, want, dtype, H, torch, compile_torch)
    else:
        _time_cpu_row(row, name, mod, ins, names, want, dtype, H, torch, compile_torch)
    row["tflops"] = _flops(name, B, T, C) / (row["ms_ours"] * 1e-3) / 1e12 if row.get("ms_ours") else None
    return row


def _run_operators(row: dict[str, Any], w: Any, name: str, ins: list[np.ndarray], want: np.ndarray, dtype: str,
                   sizes: dict[str, int], target: str, torch: Any) -> dict[str, Any]:
    try:
        t0 = time.perf_counter()
        if (name, dtype, target) not in _OPS_BUILDS:  # symbolic sizes: built once, called at every T
            _OPS_BUILDS[(name, dtype, target)] = _Operators(w, name, target)
        ops = _OPS_BUILDS[(name, dtype, target)]
        row["build_s"] = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - a row that fails to build is reported, not dropped
        row["status"] = f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        return row
    row["kernels"] = [{"stages": o.name, "mapping": "operator", "predicted_ms": None} for _, o, _ in ops.steps]
    if target == "cuda":
        from gpu_suite import time_cuda
        vals = {t.name: _on_device(torch, a, dtype) for t, a in zip(w.inputs, ins)}
        alloc = lambda shape: _nan_on_device(torch, shape, dtype)  # noqa: E731
        got = ops.run(vals, alloc, sizes)
        torch.cuda.synchronize()
        row["err"] = _rel_err(got.double().cpu().numpy(), blocks.as_float64(want, dtype), "float64")
        row["ms_ours"] = time_cuda(torch, lambda: ops.run(vals, alloc, sizes), batch=3, repeat=9)
    else:
        vals = {t.name: a for t, a in zip(w.inputs, ins)}
        alloc = lambda shape: blocks.as_dtype(np.full(shape, np.nan), dtype)  # noqa: E731
        row["err"] = _rel_err(ops.run(vals, alloc, sizes), want, dtype)
        row["ms_ours"] = _cpu_ms(lambda: ops.run(vals, alloc, sizes))
    row["status"] = "ok" if row["err"] < w.tolerance else f"FAIL (error {row['err']:.2e})"
    row["tflops"] = None
    return row


def _cpu_ms(fn: Any, repeat: int = 5) -> float:
    """Median milliseconds of fn() by the wall clock."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _on_device(torch: Any, a: np.ndarray, dtype: str) -> Any:
    """Array `a` of `dtype` (bfloat16: its bits) as a CUDA tensor of that dtype."""
    return torch.from_numpy(blocks.as_float64(a, dtype)).to("cuda").to(getattr(torch, dtype))


def _nan_on_device(torch: Any, shape: tuple[int, ...], dtype: str) -> Any:
    return torch.full(shape, float("nan"), dtype=getattr(torch, dtype), device="cuda")


def _time_cpu_row(row: dict[str, Any], name: str, mod: Any, ins: list[np.ndarray], names: list[str],
                  want: np.ndarray, dtype: str, H: int, torch: Any, compile_torch: bool) -> None:
    """Ours, then (where PyTorch imports) the same block in PyTorch on the CPU, eager and torch.compile (whose
    failure to compile, e.g. without a C++ compiler, is recorded as the row's `compile_error`)."""
    out = blocks.as_dtype(np.zeros(want.shape), dtype)
    row["ms_ours"] = _cpu_ms(lambda: mod(*ins, out), repeat=9)
    if torch is None:
        return
    d = {n: torch.from_numpy(blocks.as_float64(a, dtype)).to(getattr(torch, dtype)) for n, a in zip(names, ins)}
    fn = torch_block(name, H)
    with torch.no_grad():
        ref = fn(d)  # also the warm-up
        row["torch_err"] = _rel_err(ref.double().numpy(), blocks.as_float64(want, dtype), "float64")
        row["ms_eager"] = _cpu_ms(lambda: fn(d), repeat=9)
        if compile_torch:
            try:
                torch._dynamo.reset()
                cf = torch.compile(fn, dynamic=False)
                cf(d)
                row["ms_compile"] = _cpu_ms(lambda: cf(d), repeat=9)
            except Exception as e:  # noqa: BLE001 - the baseline is reported missing, with why
                row["compile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def _time_cuda_row(row: dict[str, Any], name: str, mod: Any, plan: Any, ins: list[np.ndarray], names: list[str],
                   want: np.ndarray, dtype: str, H: int, torch: Any, compile_torch: bool) -> None:
    """Ours (the whole call, then each kernel alone), PyTorch eager and torch.compile (compiled before any of
    them is timed, once per block, dtype and size)."""
    from gpu_suite import time_cuda

    d_ins = [_on_device(torch, a, dtype) for a in ins]
    out = _nan_on_device(torch, want.shape, dtype)
    d = dict(zip(names, d_ins))
    fn = torch_block(name, H)
    key = (name, dtype, row["B"], row["T"], row["C"], H)
    if compile_torch and key not in _COMPILED:  # it specializes on the shapes: the rows of one key share it
        t0 = time.perf_counter()
        torch._dynamo.reset()
        _COMPILED.clear()
        _COMPILED[key] = torch.compile(fn, dynamic=False)
        with torch.no_grad():
            _COMPILED[key](d)
        row["torch_compile_s"] = time.perf_counter() - t0
    # the user's call, mod(*arrays): its arguments checked, then the launches recorded at the first call with these
    # arguments replayed (runtime._Plan; about 0.12 ms of host time for the llama block's 13 kernels, where
    # re-deriving every launch, as mod.launch of a prepared call did then, took 0.26-0.35 ms: near the GPU's 0.36)
    row["ms_ours"] = time_cuda(torch, lambda: mod(*d_ins, out), batch=3, repeat=9)
    # measured time per kernel, beside the plan's prediction (a kernel belongs to the group whose stages it runs)
    measured = mod.kernel_times(*d_ins, out)
    with torch.no_grad():
        row["ms_eager"] = time_cuda(torch, lambda: fn(d), batch=3, repeat=9)
        ref = fn(d)
        if compile_torch:
            cf = _COMPILED[key]
            row["ms_compile"] = time_cuda(torch, lambda: cf(d), batch=3, repeat=9)
    row["torch_err"] = _rel_err(ref.float().cpu().numpy().astype(np.float64), blocks.as_float64(want, dtype),
                                "float64")
    by_group = plan.measured_by_group(kernel_stages(mod), {k: t * 1e-3 for k, t in measured.items()})
    for g in row["kernels"]:
        g["measured_ms"] = by_group[g["group"]] * 1e3 if g["group"] in by_group else None


# ----------------------------------------------------------------------------- report


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| block | dtype | B×T | sizes | status | ours ms | eager ms | compile ms | ours / compile | "
             "TFLOP/s | kernels | build s |", "|" + "---|" * 12]
    for r in rows:
        ratio = r["ms_ours"] / r["ms_compile"] if r.get("ms_ours") and r.get("ms_compile") else None
        lines.append(f"| {r['block']} | {r['dtype']} | {r['B']}×{r['T']} | {r['mode']} | {r['status']} | "
                     f"{_fmt(r.get('ms_ours'))} | {_fmt(r.get('ms_eager'))} | {_fmt(r.get('ms_compile'))} | "
                     f"{_fmt(ratio, '.2f')} | {_fmt(r.get('tflops'), '.1f')} | {len(r.get('kernels', []))} | "
                     f"{_fmt(r.get('build_s'), '.1f')} |")
    return "\n".join(lines)


def slowest_kernels(rows: list[dict[str, Any]], n: int = 3) -> str:
    """The kernels with the largest share of each row: measured on the GPU (CUDA events around each kernel
    replayed alone), with the plan's roofline prediction beside it; predicted only on the CPU."""
    out = []
    for r in (r for r in rows if r.get("kernels") and r["mode"] != "ops"):
        key = "measured_ms" if any(k.get("measured_ms") for k in r.get("kernels", [])) else "predicted_ms"
        ks = [k for k in r.get("kernels", []) if k.get(key) is not None]
        ks.sort(key=lambda k: -k[key])
        total = sum(k[key] for k in ks) or 1.0
        out.append(f"- {r['block']} {r['dtype']} {r['B']}×{r['T']} {r['mode']}: " + "; ".join(
            f"{k['stages']} ({k['mapping']}, {k[key]:.3f} ms {key[:-3]}"
            + (f", {k['predicted_ms']:.3f} predicted" if key == "measured_ms" and k.get("predicted_ms") else "")
            + f", {100 * k[key] / total:.0f}%)" for k in ks[:n]))
    return "\n".join(out)


def ratio_png(rows: list[dict[str, Any]]) -> bytes:
    """One bar per row: our time over torch.compile's (eager's when there is none), the axis to 3x, a mark at 1x;
    green at or below 1.2x, amber to 1.5x, red beyond (rows in the markdown table's order)."""
    from _shapes_report import encode_png

    bar, gap, width = 14, 4, 600
    img = np.full((max(1, len(rows)) * (bar + gap) + gap, width, 3), 255, np.uint8)
    for i, r in enumerate(rows):
        base = r.get("ms_compile") or r.get("ms_eager")
        if not (r.get("ms_ours") and base):
            continue
        q = r["ms_ours"] / base
        y = gap + i * (bar + gap)
        color = (60, 170, 60) if q <= 1.2 else (230, 160, 30) if q <= 1.5 else (210, 50, 50)
        img[y:y + bar, : int(min(q, 3.0) / 3.0 * (width - 1))] = color
    img[:, width // 3] = (0, 0, 0)  # 1x
    return encode_png(img)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="cuda" if gpu_available() else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--blocks", default="gpt2,mlp,llama")
    ap.add_argument("--dtypes", default=None)
    ap.add_argument("--T", default=None)
    ap.add_argument("--B", type=int, default=None)
    ap.add_argument("--C", type=int, default=None)
    ap.add_argument("--H", type=int, default=12)
    ap.add_argument("--modes", default="sym,fixed,ops",
                    help="sym, fixed (the block as one program) and ops (one build per operator)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = ap.parse_args(argv)
    cuda = a.target == "cuda"
    dtypes = (a.dtypes or ("float32,float16,bfloat16" if cuda else "float32")).split(",")
    Ts = [int(t) for t in (a.T or ("128,1024,4096" if cuda else "64")).split(",")]
    B = a.B or (8 if cuda else 2)
    C = a.C or (768 if cuda else 256)
    H = a.H if C % a.H == 0 else math.gcd(C, a.H)
    torch = None
    if cuda:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False
    else:
        try:  # the CPU rows' baseline: PyTorch on the CPU where it is installed
            import torch
        except ImportError:
            torch = None
    rows: list[dict[str, Any]] = []
    text = ""
    for name in a.blocks.split(","):
        for dtype in dtypes:
            for T in Ts:
                for mode in a.modes.split(","):
                    r = run_row(name, dtype, B, T, C, H, mode, a.target, torch, not a.no_compile)
                    same = next((x for x in rows if (x["block"], x["dtype"], x["T"]) == (name, dtype, T)
                                 and x.get("ms_eager")), None)
                    for key in ("ms_eager", "ms_compile", "torch_err"):  # PyTorch timed once per block and shape
                        if same is not None and key not in r and key in same:
                            r[key] = same[key]
                    print(json.dumps({k: v for k, v in r.items() if k != "kernels"}), flush=True)
                    rows.append(r)
                    text = write(rows, a.out, a.target)  # after every row: a run cut short keeps what it measured
    print(text)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def write(rows: list[dict[str, Any]], out: str, target: str) -> str:
    """The rows so far as e2e_<target>.json, .md and .png in `out`; the markdown's text."""
    os.makedirs(out, exist_ok=True)
    base = os.path.join(out, f"e2e_{target}")
    with open(base + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    text = (f"# Whole blocks, {target}\n\n{table(rows)}\n\n## Largest kernels per row (measured on the GPU, "
            "predicted on the CPU)\n\n"
            f"{slowest_kernels(rows)}\n")
    with open(base + ".md", "w") as f:
        f.write(text)
    with open(base + ".png", "wb") as f:
        f.write(ratio_png(rows))
    return text


if __name__ == "__main__":
    sys.exit(main())
