"""loopir in one screen: write tensor expressions, schedule them by hand (every step checked exactly against
the dependences), see an illegal step refused with its witness, let auto_schedule decide and explain itself,
compile the CUDA kernel with NVRTC (and run it when a GPU is present), check everything against numpy.

    python examples/quickstart.py            # runs on the GPU when one is usable, else on this CPU
    python examples/quickstart.py --cpu      # run on the CPU even with a GPU (the CUDA C is still compiled)
    python examples/quickstart.py --small    # small sizes (what the test runs)
    python examples/quickstart.py --verbose  # also the whole error message, explain() logs and generated sources

Two programs: the GELU chain (tanh form, three elementwise stages) and a row softmax (two reductions and a
normalization).
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import statistics
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a plain checkout

from codegen import Module, build, gpu_available  # noqa: E402
from codegen.cuda.cubin_info import cubin_resources  # noqa: E402
from loopir import te  # noqa: E402
from loopir.nodes import Var  # noqa: E402
from loopir.te import Tensor  # noqa: E402
from schedules import LoopHandle, Schedule, ScheduleError, auto_schedule  # noqa: E402

Size = Var | int  # a symbolic size (te.var) or a known one

SMALL, VERBOSE = "--small" in sys.argv, "--verbose" in sys.argv
WIDTH = 118  # summary lines are cut here (--verbose prints them whole)


# ----------------------------------------------------------------------------- 1. the programs, in te


def gelu_chain(n: Size) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) as three stages; n: a te.var or an int."""
    x = te.placeholder((n,), "float32", name="x")
    cube = te.compute((n,), lambda i: x[i] * x[i] * x[i], name="cube")
    inner = te.compute((n,), lambda i: math.sqrt(2 / math.pi) * (x[i] + 0.044715 * cube[i]), name="inner")
    gelu = te.compute((n,), lambda i: 0.5 * x[i] * (1.0 + te.tanh(inner[i])), name="gelu")
    return x, cube, inner, gelu


def softmax(m: Size, n: Size) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Row softmax of x (m, n): the row max, the sum of exp(x - max), the normalization."""
    x = te.placeholder((m, n), "float32", name="x")
    k = te.reduce_axis(n, name="k")
    row_max = te.compute((m,), lambda i: te.max(x[i, k], axis=k), name="row_max")
    k = te.reduce_axis(n, name="k")
    row_sum = te.compute((m,), lambda i: te.sum(te.exp(x[i, k] - row_max[i]), axis=k), name="row_sum")
    y = te.compute((m, n), lambda i, j: te.exp(x[i, j] - row_max[i]) / row_sum[i], name="softmax")
    return x, row_max, row_sum, y


def gelu_ref(x: np.ndarray) -> np.ndarray:  # float64: the reference every result is checked against
    x = x.astype(np.float64)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def softmax_ref(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def numpy_gelu(x: np.ndarray) -> np.ndarray:  # the numpy baseline timed on the CPU, in the inputs' float32
    return 0.5 * x * (1 + np.tanh(np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x * x * x)))


def numpy_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# ----------------------------------------------------------------------------- 2. and 3. schedules by hand


def schedule_gelu(n: Size) -> tuple[Schedule, Tensor, Tensor]:
    """Blocks of 1024 elements in parallel, each computing the cube and inner values it needs (compute_at)."""
    x, cube, inner, gelu = gelu_chain(n)
    g = Schedule(gelu, name="gelu")
    io, ii = g.split(g.loops(gelu)[0], 1024)
    g.compute_at(inner, io)
    g.compute_at(cube, io)
    g.parallel(io)
    return g, x, gelu


def fuse_rows(s: Schedule, row_max: Tensor, row_sum: Tensor, y: Tensor) -> LoopHandle:
    """Sibling fusion: the three stages' row loops become one, so a row is finished before the next starts."""
    row = s.fuse(s.loops(row_max)[0], s.loops(row_sum)[0])
    return s.fuse(row, s.loops(y)[0])


def schedule_softmax(m: Size, n: Size) -> tuple[Schedule, Tensor, Tensor, ScheduleError | None]:
    x, row_max, row_sum, y = softmax(m, n)
    s = Schedule(y, name="softmax")
    row = fuse_rows(s, row_max, row_sum, y)
    refusal = None
    try:  # one pass over the row for both reductions? The sum needs the finished max: refused, with a witness
        s.fuse(s.loop("k"), s.loop("k#1"))
    except ScheduleError as err:
        refusal = err
    jo, ji = s.split(s.loops(y)[1], 8)
    s.parallel(row).vectorize(ji)
    return s, x, y, refusal


def short_error(err: ScheduleError) -> str:
    """The error's message with its printed nest cut to the marked loops (the nest is printed above)."""
    out: list[str] = []
    for line in str(err).splitlines():
        if line.startswith("    ") and "<--" not in line:  # an unmarked line of the nest
            if out and "<--" in out[-1]:
                out.append("    ...")
            continue
        out.append(line)
    if out[-2] == "    ..." and out[-1].startswith("hint"):  # nothing marked after it
        del out[-2]
    return "\n".join(out)


# ----------------------------------------------------------------------------- small helpers


def nest(schedule: Schedule) -> str:
    """The schedule's current loop nest, indented under its heading."""
    return textwrap.indent(str(schedule), "   ")


def cut(line: str) -> str:
    return line if VERBOSE or len(line) <= WIDTH else line[:WIDTH - 3] + "..."


def check(got: np.ndarray, want: np.ndarray, rtol: float = 1e-4) -> tuple[bool, str]:
    """Whether `got` matches the float64 reference `want`, and a few words saying so."""
    err = float(np.max(np.abs(got - want)))
    ok = bool(np.allclose(got, want, rtol=rtol, atol=1e-5))
    return ok, f"max |err| vs numpy {err:.1e} {'OK' if ok else 'MISMATCH'}"


def median_ms(f: Callable[..., Any], *args: Any, reps: int = 5) -> float:
    """Median wall time of `f(*args)` after a warm-up call."""
    f(*args)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f(*args)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def torch_ms(f: Callable[[], Any], reps: int = 20) -> float:
    """Median of CUDA-event times of `f`, a PyTorch call on the GPU."""
    import torch

    f()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        f()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def timings(title: str, mod: Module, base: Callable[[np.ndarray], np.ndarray], xa: np.ndarray,
            ya: np.ndarray) -> tuple[float, str, float]:
    """(loopir ms, the baseline's name, its ms): on the GPU the kernels by CUDA events against PyTorch (when
    installed, else numpy on the CPU); on the CPU the whole call against numpy."""
    if mod.target == "cpu":
        return median_ms(mod, xa, ya), "numpy", median_ms(base, xa)
    ours = mod.benchmark(xa, ya)  # CUDA events around the kernels, median of 20 after a warm-up
    if importlib.util.find_spec("torch") is None:
        return ours, "numpy on the CPU (no PyTorch)", median_ms(base, xa)
    import torch  # only here: importing it takes seconds

    xt = torch.from_numpy(xa).cuda()
    if title == "gelu":
        return ours, "PyTorch", torch_ms(lambda: torch.nn.functional.gelu(xt, approximate="tanh"))
    return ours, "PyTorch", torch_ms(lambda: torch.softmax(xt, dim=1))


# ----------------------------------------------------------------------------- the story


def by_hand(rng: np.random.Generator) -> bool:
    """Parts 1 to 3: the programs, the hand schedules (run and checked on the CPU), the refused step."""
    n, m = te.var("n"), te.var("m")  # symbolic sizes: the schedules are checked for every n and m
    print("\n1. Write the GELU chain and a row softmax in te (this file), e.g. the GELU chain's stages:")
    print("\n".join(ln for ln in inspect.getsource(gelu_chain).splitlines() if "= te." in ln))
    print("   lowered to loop IR (a nest per stage; n is symbolic):")
    print(nest(Schedule(gelu_chain(n)[3], name="gelu")))

    print("\n2. Schedule by hand; each step is checked exactly against the program's dependences (isl):")
    g, gx, gy = schedule_gelu(n)
    s, sx, sy, refusal = schedule_softmax(m, n)
    for title, sched in (("gelu", g), ("softmax", s)):
        print(f"   {title + ':':9}" + ", ".join(line.split(". ", 1)[1] for line in sched.explain().splitlines()))
    if VERBOSE:
        print(nest(g))
    print(nest(s))
    ok, said = True, []
    for title, sched, x, y, shape, ref in (("gelu", g, gx, gy, (10_007,), gelu_ref),
                                           ("softmax", s, sx, sy, (100, 1000), softmax_ref)):
        xa = (rng.standard_normal(shape) * 3).astype(np.float32)
        ya = np.full_like(xa, np.nan)  # poisoned: an element the kernel does not write shows
        build(sched, [x, y], target="cpu")(xa, ya)
        good, words = check(ya, ref(xa))
        ok &= good
        said.append(f"{title} at {' x '.join(map(str, shape))}: {words}")
    print("   run on the CPU: " + "; ".join(said))

    print("\n3. An illegal step is refused: fuse the two k loops (the max and the sum in one pass over a row):")
    if refusal is None:
        print("   NOT REFUSED: the schedule checker let an illegal step through")
        return False
    print("ScheduleError: " + (str(refusal) if VERBOSE else short_error(refusal)))
    return ok


def automatic(target: str, rng: np.random.Generator) -> bool:
    """Parts 4 and 5: auto_schedule and its explanation, the CUDA kernels, a run checked and timed."""
    gn = 1 << (14 if SMALL else 24 if target == "cuda" else 22)
    sm, sn = (256, 1000) if SMALL else (8192, 4096) if target == "cuda" else (2048, 2048)
    print(f"\n4. Or let auto_schedule decide (here for {target}, sizes known), and explain itself:")
    programs = []
    for title, (x, *_, y), shape, ref, base in (("gelu", gelu_chain(gn), (gn,), gelu_ref, numpy_gelu),
                                                ("softmax", softmax(sm, sn), (sm, sn), softmax_ref, numpy_softmax)):
        auto = auto_schedule([y], target=target)
        steps = [line.split(". ", 1)[1] for line in auto.explain().splitlines() if line[:1].isdigit()]
        print(cut(f"   {title}: {len(steps)} steps: " + ", ".join(steps)))
        plan = auto.plan.explain().splitlines()
        keep = plan if VERBOSE else [ln for ln in plan if ln.startswith(("kernel", "bytes moved", "  +", "  ·"))]
        for line in keep:
            print(cut("     " + line.strip()))
        programs.append((title, x, y, auto, shape, ref, base))

    print("\n5. The CUDA kernels, compiled by NVRTC to a cubin (no GPU needed to compile), then a run on "
          f"{'the GPU' if target == 'cuda' else 'the CPU'}:")
    ok = True
    for title, x, y, auto, shape, ref, base in programs:
        cu = build(auto if target == "cuda" else auto_schedule([y], target="cuda"), [x, y], target="cuda")
        resources = cubin_resources(cu.cubin)
        for line in cu.gen.launch_plan().splitlines():
            if not line.lstrip().startswith("launch"):  # a host loop or guard around launches
                print(f"   {title}: {line}")
                continue
            regs, shared = resources[line.split()[1]]
            print(f"   {title}: {line.strip()}, {regs} registers, {shared} B shared memory ({cu.arch})")
        mod = cu if target == "cuda" else build(auto, [x, y], target="cpu")
        xa = (rng.standard_normal(shape) * 3).astype(np.float32)
        ya = np.full_like(xa, np.nan)
        mod(xa, ya)
        good, words = check(ya, ref(xa))
        ok &= good
        ours, base_name, theirs = timings(title, mod, base, xa, ya)
        print(f"     at {' x '.join(map(str, shape))}: {words}; median loopir {ours:.3f} ms, {base_name} "
              f"{theirs:.3f} ms -> {theirs / ours:.2f}x")
        if mod.explain():
            print(cut("     mod.explain(): " + " / ".join(mod.explain().splitlines())))
        if VERBOSE:
            print(cu.source if target == "cuda" else cu.source + "\n" + mod.source)
    return ok


def main() -> int:
    target = "cuda" if "--cpu" not in sys.argv and gpu_available() else "cpu"
    rng = np.random.default_rng()  # fresh data on every run
    print(f"loopir quickstart: runs on {'the GPU (CUDA)' if target == 'cuda' else 'this CPU (LLVM JIT)'}"
          f"{'' if target == 'cuda' else '; the CUDA kernels are compiled (NVRTC), not run'}")
    ok = by_hand(rng)
    ok &= automatic(target, rng)
    print("\nall results match numpy" if ok else "\nSOME RESULTS DO NOT MATCH NUMPY")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
