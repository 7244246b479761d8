"""The wgmma probe (benchmarks/wgmma_probe.py, the groundwork of the Hopper GEMM of issue 12) compiles for sm_90a
with the pip NVRTC (no device needed); on a GPU every descriptor variant runs and the expected one matches."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from codegen.cuda.nvrtc import compile_cubin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from wgmma_probe import SOURCE, VARIANTS  # noqa: E402


def test_the_probe_compiles_for_sm_90a():
    cubin = compile_cubin(SOURCE, arch="sm_90a", options=("-std=c++17",), name="wgmma_probe.cu", use_cache=False)
    assert cubin[:4] == b"\x7fELF" and len(cubin) > 4096
    assert set(VARIANTS) == {"probe_interleave", "probe_sw128"}


@pytest.mark.gpu
def test_the_expected_descriptors_match_on_the_gpu():
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))  # keep the caller's (site wheels)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "wgmma_probe.py")], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, PYTHONPATH=path))
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [x for x in out.stdout.splitlines() if "rel. error" in x]
    assert len(lines) == sum(len(v) for v in VARIANTS.values())
    for name, variants in VARIANTS.items():  # the first variant of each kernel is the expected reading
        first = next(x for x in lines if x.startswith(f"{name} ") and str(variants[0]) in x)
        assert "MATCH" in first, out.stdout
