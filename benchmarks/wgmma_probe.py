"""Probe Hopper's wgmma (issue 12's next step): which shared-memory descriptors give the right product.

    python3 benchmarks/wgmma_probe.py            # on the GPU machine: every variant against float64
    python3 benchmarks/wgmma_probe.py --compile  # anywhere: NVRTC compiles both kernels for sm_90a, nothing runs

One warpgroup (128 threads) computes D (64 x 64, float32) = A (64 x K) @ B (K x 64), float16 inputs, with
`wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16` from shared memory: A K-major (a row of A is contiguous, as
our A[i, k]), B MN-major (a row of B is contiguous, as our B[k, j]: the instruction's transpose-B flag). The data
is stored in one fixed layout per kernel; only the descriptors' byte offsets vary, so the variant that matches the
reference says what the hardware reads:

* `interleave` (no swizzle), K = 16: 8x8 core matrices of 128 bytes; A's at (m/8)*256 + (k/8)*128, B's at
  (k/8)*1024 + (n/8)*128. CUTLASS's reading (K-major: LBO along K, SBO along M; MN-major: SBO along N, LBO along
  K) gives A (LBO 128, SBO 256), B (LBO 1024, SBO 128); the swapped readings are tried too.
* `sw128` (128-byte swizzle), K = 64: rows of 128 bytes whose 16-byte chunks are XOR-ed with (row % 8); A's row is
  m (64 halves of k), B's row is k (64 halves of n); SBO 1024 (eight rows) for both; each k16 step moves A's start
  by 32 bytes and B's by 2048 (16 rows). LBO is ignored there for A; tried at 0 and 8192 for B.

Inline PTX: the pip NVRTC ships no headers. sm_90a (not sm_90) is required for wgmma.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen.cuda.nvrtc import compile_cubin  # noqa: E402

_ACC = ", ".join(f"%{i}" for i in range(32))
_OUTS = ", ".join(f'"+f"(d[{i}])' for i in range(32))

SOURCE = r"""
typedef unsigned short u16;
typedef unsigned long long u64;

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

// a descriptor: start address (bits 0-13, >>4), LBO (16-29, >>4), SBO (32-45, >>4), swizzle mode (62-63)
__device__ __forceinline__ u64 desc(unsigned addr, unsigned lbo, unsigned sbo, unsigned mode) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)((lbo >> 4) & 0x3FFF) << 16) | ((u64)((sbo >> 4) & 0x3FFF) << 32)
         | ((u64)mode << 62);
}

__device__ __forceinline__ void wgmma_step(float* d, u64 da, u64 db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {ACC}, %32, %33, p, 1, 1, 0, 1;\n}\n"
        : OUTS
        : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void store_acc(float* D, const float* d) {
    // the m64nNk16 accumulator layout: warp w owns rows 16w..16w+15; per 8 columns, a lane's 4 values sit at
    // (lane/4, 2*(lane%4) + {0, 1}) and 8 rows below
    int t = threadIdx.x, w = t / 32, lane = t % 32;
    for (int i = 0; i < 8; ++i) {
        int row = 16 * w + lane / 4, col = 8 * i + 2 * (lane % 4);
        D[row * 64 + col] = d[4 * i];
        D[row * 64 + col + 1] = d[4 * i + 1];
        D[(row + 8) * 64 + col] = d[4 * i + 2];
        D[(row + 8) * 64 + col + 1] = d[4 * i + 3];
    }
}

extern "C" __global__ void __launch_bounds__(128) probe_interleave(
        const u16* A, const u16* B, float* D, unsigned a_lbo, unsigned a_sbo, unsigned b_lbo, unsigned b_sbo) {
    // room for every variant's reading: the swapped offsets reach up to 8 KB into a tile (never an illegal address)
    __shared__ __align__(1024) u16 As[4096];
    __shared__ __align__(1024) u16 Bs[4096];
    int t = threadIdx.x;
    for (int e = t; e < 64 * 16; e += 128) {  // A[m][k], m < 64, k < 16
        int m = e / 16, k = e % 16;
        As[((m / 8) * 256 + (k / 8) * 128) / 2 + (m % 8) * 8 + k % 8] = A[e];
    }
    for (int e = t; e < 16 * 64; e += 128) {  // B[k][n], k < 16, n < 64
        int k = e / 64, n = e % 64;
        Bs[((k / 8) * 1024 + (n / 8) * 128) / 2 + (k % 8) * 8 + n % 8] = B[e];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the generic-proxy stores, seen by wgmma
    __syncthreads();
    float d[32];
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    wgmma_step(d, desc(smem_addr(As), a_lbo, a_sbo, 0), desc(smem_addr(Bs), b_lbo, b_sbo, 0), 0);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    store_acc(D, d);
}

extern "C" __global__ void __launch_bounds__(128) probe_sw128(
        const u16* A, const u16* B, float* D, unsigned a_lbo, unsigned a_sbo, unsigned b_lbo, unsigned b_sbo) {
    __shared__ __align__(1024) u16 As[64 * 64];
    __shared__ __align__(1024) u16 Bs[64 * 64];
    int t = threadIdx.x;
    for (int e = t; e < 64 * 64; e += 128) {  // A[m][k] and B[k][n], both 64 x 64: row r, column c
        int r = e / 64, c = e % 64;
        int at = r * 64 + (((c / 8) ^ (r % 8)) * 8) + c % 8;  // 128-byte rows, 16-byte chunks XOR (row % 8)
        As[at] = A[e];
        Bs[at] = B[e];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    float d[32];
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    for (int s = 0; s < 4; ++s)  // k16 steps: A's start moves 32 bytes along its row, B's 16 rows of 128 bytes
        wgmma_step(d, desc(smem_addr(As) + 32 * s, a_lbo, a_sbo, 1), desc(smem_addr(Bs) + 2048 * s, b_lbo, b_sbo, 1),
                   s);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    store_acc(D, d);
}
""".replace("{ACC}", "{" + _ACC + "}").replace("OUTS", _OUTS)

VARIANTS = {  # kernel -> [(a_lbo, a_sbo, b_lbo, b_sbo), ...]; the first is the expected one
    "probe_interleave": [(128, 256, 1024, 128), (256, 128, 1024, 128), (128, 256, 128, 1024), (256, 128, 128, 1024)],
    "probe_sw128": [(16, 1024, 0, 1024), (16, 1024, 8192, 1024), (1024, 16, 0, 1024)],
}
K = {"probe_interleave": 16, "probe_sw128": 64}


def _run(cubin: bytes) -> None:
    from cuda.bindings import driver as cu

    def ok(r):  # noqa: ANN001, ANN202
        err, *rest = r if isinstance(r, tuple) else (r,)
        if int(err) != 0:
            raise RuntimeError(f"CUDA error {err}")
        return rest[0] if len(rest) == 1 else rest

    ok(cu.cuInit(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
    ok(cu.cuCtxSetCurrent(ctx))
    mod = ok(cu.cuModuleLoadData(cubin))
    rng = np.random.default_rng(0)
    for name, variants in VARIANTS.items():
        k = K[name]
        a = rng.standard_normal((64, k)).astype(np.float16)
        b = rng.standard_normal((k, 64)).astype(np.float16)
        want = a.astype(np.float64) @ b.astype(np.float64)
        fn = ok(cu.cuModuleGetFunction(mod, name.encode()))
        da, db, dd = (ok(cu.cuMemAlloc(n)) for n in (a.nbytes, b.nbytes, 64 * 64 * 4))
        ok(cu.cuMemcpyHtoD(da, a.view(np.uint16).ctypes.data, a.nbytes))
        ok(cu.cuMemcpyHtoD(db, b.view(np.uint16).ctypes.data, b.nbytes))
        for v in variants:
            got = np.full((64, 64), np.nan, np.float32)
            ok(cu.cuMemcpyHtoD(dd, got.ctypes.data, got.nbytes))
            vals = [ctypes.c_uint64(int(da)), ctypes.c_uint64(int(db)), ctypes.c_uint64(int(dd)),
                    *(ctypes.c_uint32(x) for x in v)]
            ptrs = (ctypes.c_void_p * len(vals))(*(ctypes.addressof(x) for x in vals))
            ok(cu.cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, 0, ctypes.addressof(ptrs), 0))
            ok(cu.cuCtxSynchronize())
            ok(cu.cuMemcpyDtoH(got.ctypes.data, dd, got.nbytes))
            err = float(np.nanmax(np.abs(got - want)) / np.abs(want).max()) if not np.isnan(got).all() else np.inf
            print(f"{name} (a_lbo, a_sbo, b_lbo, b_sbo) = {v}: rel. error {err:.1e} "
                  f"{'MATCH' if err < 1e-2 and not np.isnan(got).any() else 'wrong'}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true", help="compile only (no GPU needed)")
    a = ap.parse_args()
    cubin = compile_cubin(SOURCE, arch="sm_90a", options=("-std=c++17",), name="wgmma_probe.cu", use_cache=False)
    print(f"sm_90a cubin: {len(cubin)} bytes")
    if not a.compile:
        _run(cubin)


if __name__ == "__main__":
    main()
