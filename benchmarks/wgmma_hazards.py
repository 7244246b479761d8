"""Reads of warpgroup-MMA accumulators before their wgmma completes, in the SASS of the model blocks' kernels
(codegen.cuda.sass_hazards): the GPT-2, MLP and LLaMA blocks in float16 at symbolic and at fixed sizes, and the
attention pass alone, compiled by NVRTC for sm_90a and disassembled by nvdisasm. No GPU is needed.

    python3 benchmarks/wgmma_hazards.py [--nvdisasm PATH]

nvdisasm: on PATH, or from `pip download nvidia-cuda-nvdisasm` (the wheel's nvidia/cu13/bin/nvdisasm). Exit status 1
when any kernel has a finding (each printed with its instructions).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen.cuda.build import cuda_source  # noqa: E402
from codegen.cuda.nvrtc import compile_cubin  # noqa: E402
from codegen.cuda.sass_hazards import hazards  # noqa: E402
from codegen.passes import lower as lower_passes  # noqa: E402
from loopir import blocks, te, workloads  # noqa: E402
from schedules import auto_schedule  # noqa: E402


def _programs():
    for name in ("gpt2", "mlp", "llama"):
        for mode in ("sym", "fixed"):
            B, T = (te.var("B"), te.var("T")) if mode == "sym" else (8, 1024)
            kw = dict(C=768, H=12) if name != "mlp" else dict(C=768)
            yield f"{name} float16 {mode}", getattr(blocks, name)(B, T, dtype="float16", **kw).outputs
    for d in (64, 128):
        w = workloads.naive_attention(te.var("B"), te.var("n"), te.var("m"), d, "causal", dtype="float16")
        yield f"attention float16 d{d}", w.outputs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvdisasm", default=shutil.which("nvdisasm"))
    a = ap.parse_args()
    if not a.nvdisasm:
        print("nvdisasm not found: give --nvdisasm (pip download nvidia-cuda-nvdisasm)")
        return 2
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        for what, outputs in _programs():
            src = cuda_source(lower_passes(auto_schedule(list(outputs), "cuda").program, "cuda")).source
            with open(cubin, "wb") as f:
                f.write(compile_cubin(src, "sm_90a", use_cache=False))
            sass = subprocess.run([a.nvdisasm, "-c", cubin], capture_output=True, text=True, check=True).stdout
            found = hazards(sass)
            bad += sum(bool(v) for v in found.values())
            print(f"{what}: {len(found)} kernels with wgmma, findings: "
                  + (", ".join(f"{k} {len(v)}" for k, v in found.items() if v) or "none"))
            for k, v in found.items():
                for ln in v[:4]:
                    print(f"    {k}: {ln}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
