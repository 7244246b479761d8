"""Reads of warpgroup-MMA accumulators before their wgmma completes, found in disassembled SASS (nvdisasm -c).

A wgmma writes its accumulator registers asynchronously until a `WARPGROUP.DEPBAR.LE gsb0, N` lets at most N
groups stay in flight; an instruction that touches those registers earlier reads (or clobbers) values the tensor
core is still writing. NVVM and ptxas order such reads only by the PTX wait (which names no register), and ptxas
did schedule a GEMM epilogue's conversions above the wait that followed the k loop (codegen.cuda.wgmma
`_Emit.wait_previous`): a race that returned different, wrong bits from call to call.

`hazards(sass)` walks each kernel linearly: per committed group (the HGMMA run ending in one marked `gsb0`), the
registers its instructions write, then every later non-HGMMA instruction that names one of them before a wait
completes the group (`DEPBAR.LE gsb0, 0x0`, or `0x1` once a later group was committed). Linear order is the layout
order, so a loop's back edge is not followed: a finding is a candidate to read, not a proof.
benchmarks/wgmma_hazards.py runs it over the model blocks' kernels.
"""

from __future__ import annotations

import re

__all__ = ["hazards"]

_HGMMA = re.compile(r"HGMMA\.64x(\d+)x\d+\.F32\S* R(\d+)")
_REG = re.compile(r"\bR(\d+)\b")


def hazards(sass: str) -> dict[str, list[str]]:
    """{kernel: the instructions that touch an in-flight group's accumulators} for every kernel with HGMMA."""
    out: dict[str, list[str]] = {}
    for part in re.split(r"\n\s*\.text\.", sass)[1:]:
        name, _, text = part.partition(":")
        body = [ln.strip() for ln in text.splitlines()]
        groups: list[tuple[int, set[int]]] = []
        regs: set[int] = set()
        for k, ln in enumerate(body):
            m = _HGMMA.search(ln)
            if m:
                base, cols = int(m.group(2)), int(m.group(1))
                regs |= set(range(base, base + cols // 2))  # 64 x cols floats over 128 threads
                if "gsb0" in ln:
                    groups.append((k, regs))
                    regs = set()
        if not groups:
            continue
        found: list[str] = []
        for k, written in groups:
            later = [g for g, _ in groups if g > k]
            for j in range(k + 1, len(body)):
                ln = body[j]
                if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in ln or (
                        "WARPGROUP.DEPBAR.LE gsb0, 0x1" in ln and any(g < j for g in later)):
                    break
                if "HGMMA" in ln or "WARPGROUP" in ln:
                    continue
                if any(int(r) in written for r in _REG.findall(ln)):
                    found.append(ln)
        out[name] = found
    return out
