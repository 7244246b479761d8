"""codegen.cuda.sass_hazards finds reads of warpgroup-MMA accumulators before their wgmma completes: on SASS text
cut from the kernel that raced (the llama block's w2 GEMM before the fix: F2FP conversions of the accumulators above
WARPGROUP.DEPBAR.LE gsb0, 0x0), on the same kernel after the fix, and on two groups in flight (a wait for all but
one completes the first); with nvdisasm at hand, on the model blocks' kernels (benchmarks/wgmma_hazards.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from codegen.cuda.sass_hazards import hazards

RACED = """
.text.y_mm_w2_init:
        /*0dd0*/                   HGMMA.64x128x16.F32 R24, gdesc[UR12].tnspB, R24 ;
        /*0e20*/                   HGMMA.64x128x16.F32 R24, gdesc[UR12].tnspB, R24, gsb0 ;
        /*0e30*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0f10*/                   LDG.E.CONSTANT R14, desc[UR8][R4.64] ;
        /*1170*/                   F2FP.F16.F32.PACK_AB R17, R81, R80 ;
        /*1190*/                   F2FP.F16.F32.PACK_AB R18, R79, R78 ;
        /*1400*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*1410*/                   F2FP.F16.F32.PACK_AB R165, R25, R24 ;
"""

FIXED = """
.text.y_mm_w2_init:
        /*0e20*/                   HGMMA.64x128x16.F32 R24, gdesc[UR12].tnspB, R24, gsb0 ;
        /*0e30*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*1170*/                   F2FP.F16.F32.PACK_AB R17, R81, R80 ;
.text.y_rows:
        /*0000*/                   FADD R1, R2, R3 ;
"""

# S = Q K^T (R24..R55) committed, then O += P V (R88..R119): waiting for all but one completes S only
TWO = """
.text.y_flash:
        /*0100*/                   HGMMA.64x64x16.F32 R24, gdesc[UR4], RZ, gsb0 ;
        /*0200*/                   HGMMA.64x64x16.F32 R88, R4, gdesc[UR8], R88, gsb0 ;
        /*0300*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0310*/                   FMNMX R2, R24, R25, !PT ;
        /*0320*/                   FMUL R88, R88, R3 ;
        /*0400*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0410*/                   FMUL R89, R89, R3 ;
"""


def test_the_read_above_the_last_wait_is_found_and_the_fixed_kernel_is_clean():
    found = hazards(RACED)
    assert [ln.split()[1] for ln in found["y_mm_w2_init"]] == ["F2FP.F16.F32.PACK_AB"] * 2
    assert "R81, R80" in found["y_mm_w2_init"][0]
    assert hazards(FIXED) == {"y_mm_w2_init": []}  # a kernel without wgmma is not listed


def test_a_wait_for_all_but_one_completes_the_earlier_group_only():
    (found,) = hazards(TWO).values()
    assert len(found) == 1 and "FMUL R88, R88, R3" in found[0]


def _nvdisasm() -> str | None:
    return os.environ.get("LOOPIR_NVDISASM") or shutil.which("nvdisasm")


@pytest.mark.skipif(_nvdisasm() is None, reason="nvdisasm not found (LOOPIR_NVDISASM or PATH)")
def test_the_model_blocks_kernels_read_no_accumulator_in_flight():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "wgmma_hazards.py"), "--nvdisasm",
                        _nvdisasm()], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
