"""Every example runs (CPU target, small sizes) and compiles its CUDA kernels with NVRTC.

The examples check their own results against numpy and exit non-zero on a mismatch; on a
machine without a GPU they also build the CUDA version (NVRTC needs no device) and print it,
which is how CI compiles the CUDA C of every example. The quickstart has its own tests: it
must tell its story (the five parts) in one screen, and the witness it prints for the refused
step must be a real dependence that the step breaks.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import types

import pytest

from codegen import build
from loopir import te
from schedules import Schedule, ScheduleError, auto_schedule
from tests.witness_check import verify_witness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = ["sincos", "gelu", "horizontal", "softmax", "layernorm", "matmul_bias_relu"]


def _run(name: str, tmp_path, *flags: str) -> str:
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)  # keep the caller's packages
    env = dict(os.environ, LOOPIR_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=path)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", f"{name}.py"), *flags],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"examples/{name}.py failed:\n{out[-4000:]}"
    assert "MISMATCH" not in out
    return out


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_and_compiles_cuda(name, tmp_path):
    out = _run(name, tmp_path, "--small", "--cpu")
    assert '__global__' in out, f"examples/{name}.py did not show a compiled CUDA kernel:\n{out[-2000:]}"


# ----------------------------------------------------------------------------- the quickstart

WITNESS = re.compile(r"(flow|anti|output) dependence on (\w+): (\w+)\[([^\]]*)\] (?:writes|reads) \w+\[([^\]]*)\], "
                     r"(\w+)\[([^\]]*)\] (?:reads|overwrites) it[^(]*\(at ([^)]*)\)")
LAUNCH = re.compile(r"^   (gelu|softmax): launch (\w+) grid \(([^)]*)\) block \(([^)]*)\), (\d+) registers, "
                    r"(\d+) B shared memory \(sm_\d+\)$", re.M)


def _quickstart_module() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("quickstart_example", os.path.join(ROOT, "examples", "quickstart.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _instance(text: str) -> dict[str, int]:
    """'i=0, k=1' -> {'i': 0, 'k': 1}"""
    return {k.strip(): int(v) for k, v in (part.split("=") for part in text.split(","))}


@pytest.fixture(scope="module")
def quickstart_output(tmp_path_factory) -> str:
    return _run("quickstart", tmp_path_factory.mktemp("quickstart"), "--small", "--cpu")


def test_quickstart_tells_the_story_in_one_screen(quickstart_output):
    out = quickstart_output
    lines = out.splitlines()
    assert len(lines) <= 70, f"the quickstart printed {len(lines)} lines; it must fit a screen:\n{out}"
    starts = [next((k for k, ln in enumerate(lines) if ln.startswith(f"{part}. ")), -1) for part in range(1, 6)]
    assert all(k >= 0 for k in starts) and starts == sorted(starts), f"parts 1-5 missing or out of order:\n{out}"
    part = {p + 1: "\n".join(lines[starts[p]:starts[p + 1] if p < 4 else len(lines)]) for p in range(5)}
    # 1: the te program lowered; 2: the hand schedules, their nest, both run and checked
    assert "def gelu(x: float32[n], gelu: float32[n])" in part[1]
    for step in ("split(", "compute_at('inner'", "compute_at('cube'", "fuse(", "parallel(", "vectorize("):
        assert step in part[2], f"the hand schedule does not show {step}:\n{part[2]}"
    assert "for i in parallel(0, m):" in part[2] and "vectorize(0, 8)" in part[2]
    assert re.search(r"run on the CPU: gelu at \d+: max \|err\| vs numpy \S+ OK; softmax at \d+ x \d+: "
                     r"max \|err\| vs numpy \S+ OK$", part[2], re.M), part[2]
    assert "gelu = te.compute((n,), lambda i:" in part[1]
    # 3: the refusal with its witness, the marked loops and the hint
    assert "ScheduleError: fuse(k, k) is illegal" in part[3]
    assert WITNESS.search(part[3]), part[3]
    assert part[3].count("<-- fuse") == 2 and "\nhint: " in part[3]
    # 4: auto_schedule and its explanation
    assert "compute_inline('cube')" in part[4] and "bytes moved: before" in part[4]
    assert "+ fuse row_max, row_sum" in part[4]
    # 5: both CUDA kernels compiled, both runs checked against numpy
    launches = LAUNCH.findall(part[5])
    assert [t for t, *_ in launches] == ["gelu", "softmax"], part[5]
    assert all(int(regs) > 0 for *_, regs, _ in launches)
    assert int(launches[1][5]) > 0, "the softmax kernel caches its row in shared memory at a known row length"
    assert len(re.findall(r"max \|err\| vs numpy \S+ OK; median loopir [\d.]+ ms, numpy [\d.]+ ms", part[5])) == 2
    assert lines[-1] == "all results match numpy"


def test_quickstart_witness_is_a_real_broken_dependence(quickstart_output):
    """The printed witness, checked independently of loopir.poly: the access functions meet at it, the
    original runs the source first, and the refused step (applied without the check) runs the sink first."""
    match = WITNESS.search(quickstart_output)
    assert match is not None, quickstart_output
    kind, buffer, src, src_it, element, snk, snk_it, params = match.groups()
    printed = types.SimpleNamespace(kind=kind, buffer=buffer, source=(src, _instance(src_it)),
                                    sink=(snk, _instance(snk_it)), params=_instance(params),
                                    element=tuple(int(e) for e in element.split(",")))
    qs = _quickstart_module()
    m, n = te.var("m"), te.var("n")
    _, _, _, refusal = qs.schedule_softmax(m, n)
    assert isinstance(refusal, ScheduleError) and refusal.primitive == "fuse"
    assert (refusal.kind, refusal.buffer, refusal.source, refusal.sink, refusal.params, refusal.element) == \
        (printed.kind, printed.buffer, printed.source, printed.sink, printed.params, printed.element)

    x, row_max, row_sum, y = qs.softmax(m, n)
    forced = Schedule(y, name="softmax", check=False)  # the same steps, the refused one applied anyway
    qs.fuse_rows(forced, row_max, row_sum, y)
    forced.fuse(forced.loop("k"), forced.loop("k#1"))
    verify_witness(forced.original, forced.program, printed)


def test_quickstart_short_error_keeps_marks_and_hint():
    qs = _quickstart_module()
    _, _, _, refusal = qs.schedule_softmax(te.var("m"), te.var("n"))
    short = qs.short_error(refusal).splitlines()
    full = str(refusal).splitlines()
    assert short[0] == full[0] and short[-1] == full[-1] and short[-1].startswith("hint: ")
    assert [ln for ln in short if "<--" in ln] == [ln for ln in full if "<--" in ln]
    assert len(short) < len(full)


def test_cubin_resources_matches_the_launch_plan():
    """The register and shared-memory counts come from the cubin of each kernel the module launches."""
    qs = _quickstart_module()
    x, *_, y = qs.softmax(64, 1000)
    cu = build(auto_schedule([y], target="cuda"), [x, y], target="cuda")
    res = qs.cubin_resources(cu.cubin)
    assert set(cu.kernels) <= set(res)
    regs, shared = res[cu.kernels[0]]
    assert 0 < regs <= 255
    # the row of 1000 float32 is cached in its threads' registers (8 each), not shared memory (the reduction scratch)
    assert shared < 1000 * 4 and "float x_shared_reg[8];" in cu.source


@pytest.mark.gpu
def test_quickstart_runs_on_the_gpu(tmp_path):
    out = _run("quickstart", tmp_path, "--small")
    assert "runs on the GPU (CUDA)" in out
    assert len(re.findall(r"max \|err\| vs numpy \S+ OK; median loopir", out)) == 2
    assert out.splitlines()[-1] == "all results match numpy"
