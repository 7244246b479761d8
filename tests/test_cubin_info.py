"""What a compiled kernel uses, read from NVRTC's cubin without a GPU (codegen/cuda/cubin_info.py), and the build's
check that every kernel's block fits the register file (refused with the numbers, never a failed launch)."""

from __future__ import annotations

import pytest

from codegen import build
from codegen.cuda.cubin_info import REGISTERS_PER_BLOCK, check_registers, cubin_resources
from loopir import te, workloads
from loopir.errors import ResourceLimitError


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPIR_CACHE_DIR", str(tmp_path / "cache"))


def test_every_kernel_has_its_registers_and_shared_memory():
    w = workloads.layernorm(dtype="float32")
    mod = build(list(w.outputs), list(w.args), target="cuda")
    res = cubin_resources(mod.cubin)
    assert set(res) == {k.name for k in mod.gen.kernels}
    assert all(1 <= regs <= 255 and shared >= 0 for regs, shared in res.values())


def test_wide_blocks_carry_a_launch_bound_so_their_registers_fit():
    # 512 threads per row (rows of 8192 and more, longer than register rows, as block rows: clusters turned off):
    # __launch_bounds__(512) keeps NVRTC at <= 128 registers
    x = te.placeholder((1024, 32768), name="x")
    k = te.reduce_axis(32768, "k")
    s = te.compute((1024,), lambda i: te.sum(x[i, k] * x[i, k], axis=k), name="s")
    y = te.compute((1024, 32768), lambda i, j: x[i, j] / s[i], name="y")
    mod = build([y], [x, y], target="cuda", schedule={"rows": {"cluster_row_max": 0}})
    threads = {k.name: int(k.launch.block[0].value) * int(k.launch.block[1].value) * int(k.launch.block[2].value)
               for k in mod.gen.kernels}
    wide = [n for n, t in threads.items() if t > 256]
    assert wide and all(f"__launch_bounds__({threads[n]}) {n}(" in mod.source for n in wide)
    regs = cubin_resources(mod.cubin)
    assert all(regs[n][0] * threads[n] <= REGISTERS_PER_BLOCK for n in threads)


def test_a_kernel_over_the_register_file_is_refused_with_its_numbers():
    check_registers({"k": (64, 0)}, {"k": 1024})  # 65,536: fits exactly
    with pytest.raises(ResourceLimitError, match=r"kernel 'k' uses 65 registers per thread; a block of 1024 threads "
                                                 r"needs 66,560 of the 65,536"):
        check_registers({"k": (65, 0)}, {"k": 1024})
