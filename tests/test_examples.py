"""Every example runs (CPU target, small sizes) and compiles its CUDA kernels with NVRTC.

The examples check their own results against numpy and exit non-zero on a mismatch; on a
machine without a GPU they also build the CUDA version (NVRTC needs no device) and print it,
which is how CI compiles the CUDA C of every example.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = ["quickstart", "sincos", "gelu", "horizontal", "softmax", "layernorm", "matmul_bias_relu"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_and_compiles_cuda(name, tmp_path):
    env = dict(os.environ, LOOPIR_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", f"{name}.py"), "--small", "--cpu"],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"examples/{name}.py failed:\n{out[-4000:]}"
    assert "MISMATCH" not in out
    assert '__global__' in out, f"examples/{name}.py did not show a compiled CUDA kernel:\n{out[-2000:]}"
