"""What a compiled kernel uses, read from the cubin NVRTC made (an ELF file), so no GPU is needed: registers per
thread and static shared memory per block. The build checks every kernel against the device's register file
(`check_registers`): a kernel whose block could not be launched is refused with its numbers, never left to
fail at launch."""

from __future__ import annotations

import struct

from loopir.errors import ResourceLimitError

__all__ = ["cubin_resources", "check_registers", "REGISTERS_PER_BLOCK"]

REGISTERS_PER_BLOCK = 65536  # every architecture loopir targets (sm_70 .. sm_90): the register file a block may use


def cubin_resources(cubin: bytes) -> dict[str, tuple[int, int]]:
    """{kernel: (registers per thread, shared bytes per block)} read from the cubin (an ELF file), so no GPU is
    needed: the register count is the EIATTR_REGCOUNT attribute of .nv.info (what `ptxas -v` reports), the
    shared bytes the size of the kernel's .nv.shared section: its static shared memory, with the 1 KB the
    system reserves per block on sm_80 and later (`ptxas -v` reports 1 KB less)."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    size, count, names = struct.unpack_from("<HHH", cubin, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + k * size) for k in range(count)]

    def name(table: int, off: int) -> str:
        start = secs[table][4] + off
        return cubin[start:cubin.index(b"\0", start)].decode()

    by_name = {name(names, s[0]): s for s in secs}
    symtab = by_name[".symtab"]
    symbols = [struct.unpack_from("<I", cubin, symtab[4] + 24 * k)[0] for k in range(symtab[5] // 24)]
    out: dict[str, tuple[int, int]] = {}
    info = by_name[".nv.info"]
    p, end = info[4], info[4] + info[5]
    while p < end:
        fmt, attr, length = cubin[p], cubin[p + 1], struct.unpack_from("<H", cubin, p + 2)[0]
        if fmt == 4 and attr == 0x2F:  # EIFMT_SVAL, EIATTR_REGCOUNT: (symbol index, registers)
            sym, regs = struct.unpack_from("<II", cubin, p + 4)
            kernel = name(symtab[6], symbols[sym])  # sh_link: the string table of the symbols
            shared = by_name.get(f".nv.shared.{kernel}")
            out[kernel] = (regs, shared[5] if shared else 0)
        p += 4 + (length if fmt == 4 else 0)
    return out


def check_registers(resources: dict[str, tuple[int, int]], threads: dict[str, int]) -> None:
    """ResourceLimitError naming the kernel when registers per thread x threads per block exceed the register file
    (the kernels loopir renders carry __launch_bounds__ above 256 threads, so NVRTC keeps within it)."""
    for name, n in threads.items():
        regs = resources.get(name, (0, 0))[0]
        # launchable iff registers per thread x threads per block <= the register file
        if regs * n > REGISTERS_PER_BLOCK:
            raise ResourceLimitError(f"kernel {name!r} uses {regs} registers per thread; a block of {n} threads needs "
                                     f"{regs * n:,} of the {REGISTERS_PER_BLOCK:,} a block may have: schedule it with "
                                     "fewer threads per block")
