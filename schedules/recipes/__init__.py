"""The GEMM recipes: the classic tiled GEMM as a sequence of checked Schedule steps, one recipe per target.

    schedule_gemm(s, "matmul", epilogue=["C"], target="cuda", block=(64, 128), thread_tile=(8, 8), k_tile=16)
    schedule_gemm(s, "matmul", epilogue=["C"], target="cpu", cpu_tile=(6, 64))

`gemm` holds what the targets share (finding the matmul-shaped reduction and its epilogue, `GemmPlan`),
`gemm_cpu` and `gemm_cuda` the recipes (their docstrings show the nest each produces); this module
dispatches on the target (`schedule_gemm`) and resolves the tile parameters `auto_schedule` and the
fusion planner pass (`gemm_params`). `auto_schedule` schedules every matmul-shaped reduction
(`matmul_stage`) with these recipes.
"""

from __future__ import annotations

import inspect
from typing import Any

from loopir.errors import ArgumentError
from .gemm import (
    GemmPlan,
    check_tiles,
    elementwise_consumers,
    is_matmul_tensor,
    matmul_operands,
    matmul_stage,
    pos_int,
    resolve_stage,
    shared_weight_rows,
)
from .gemm_cpu import default_cpu_tile, schedule_gemm_cpu
from .gemm_cuda import SKINNY_ROWS, gemm_resources, schedule_gemm_cuda, skinny_params
from .gemm_mma import MMA_TILES, check_mma_tiles
from .gemm_wgmma import WGMMA_TILES, check_wgmma_tiles

__all__ = [
    "GEMM_KEYS", "GemmPlan", "check_tiles", "default_cpu_tile", "elementwise_consumers", "gemm_params",
    "gemm_resources", "is_matmul_tensor", "matmul_operands", "matmul_stage", "resolve_stage", "schedule_gemm",
    "schedule_gemm_cpu", "schedule_gemm_cuda", "SKINNY_ROWS", "shared_weight_rows", "skinny_params", "SIMT_KEYS",
    "simt_default",
    "MMA_TILES", "WGMMA_TILES",
]


def schedule_gemm(s: Any, stage: str | Any = None, epilogue: Any = "auto", target: str = "cuda",
                  block: tuple[int, int] | None = None, thread_tile: tuple[int, int] | None = None,
                  k_tile: int | None = None, shared: bool = True, cpu_tile: tuple[int, int] | None = None,
                  **cuda_opts: Any) -> GemmPlan:
    """Apply the tiled-GEMM recipe to the matmul-shaped reduction `stage` of Schedule `s`.

    `stage`: the update statement's name (or tensor); None picks the only matmul-shaped one.
    `epilogue`: elementwise consumers fused into the single store ("auto": every elementwise
    consumer chain found by `elementwise_consumers`; [] for none). Tile sizes are parameters:
    on "cuda" `block`, `thread_tile`, `k_tile`, `shared` and `cuda_opts` (`strided`, `unroll_k`) go to
    `schedule_gemm_cuda` (None: its defaults); on "cpu" `cpu_tile` (None: `default_cpu_tile()`).
    Returns a GemmPlan (`.explain()`); the schedule `s` is modified in place.
    """
    if target not in ("cuda", "cpu"):
        raise ArgumentError(f"schedule_gemm: target must be 'cuda' or 'cpu', got {target!r}")
    if target == "cuda":
        tiles = {k: v for k, v in (("block", block), ("thread_tile", thread_tile), ("k_tile", k_tile))
                 if v is not None}
        return schedule_gemm_cuda(s, stage, epilogue, shared=shared, **tiles, **cuda_opts)
    if cuda_opts:
        raise ArgumentError(f"schedule_gemm: {', '.join(sorted(cuda_opts))} only apply to target 'cuda'")
    return schedule_gemm_cpu(s, stage, epilogue, cpu_tile, who="schedule_gemm")


GEMM_KEYS = {"cuda": ("block", "thread_tile", "k_tile", "shared", "strided", "unroll_k", "split_k", "tensor_cores",
                      "mma", "wgmma"),
             "cpu": ("cpu_tile",)}
SIMT_KEYS = GEMM_KEYS["cuda"][:7]  # the SIMT recipe's own parameters (schedule_gemm_cuda's keywords)


def gemm_params(target: str, gemm: dict[str, Any] | None = None) -> dict[str, Any]:
    """The tile parameters of the GEMM recipe for `target`: the recipe's defaults, overridden by `gemm`.
    cuda: block, thread_tile, k_tile (and shared, strided, unroll_k) of `schedule_gemm_cuda`;
    cpu: cpu_tile (default `default_cpu_tile()`). ValueError naming an unknown key or a bad size."""
    if target not in GEMM_KEYS:
        raise ArgumentError(f"gemm_params: target must be 'cuda' or 'cpu', got {target!r}")
    given = dict(gemm or {})
    bad = [k for k in given if k not in GEMM_KEYS[target]]
    if bad:
        raise ArgumentError(f"auto_schedule: unknown gemm parameter {', '.join(map(repr, bad))} for target {target!r}; "
                            f"expected some of {', '.join(GEMM_KEYS[target])}")
    for k in ("block", "thread_tile", "cpu_tile"):
        if isinstance(given.get(k), list):
            given[k] = tuple(given[k])
    if target == "cpu":
        tile = given.get("cpu_tile") or default_cpu_tile()
        if not (isinstance(tile, tuple) and len(tile) == 2 and all(pos_int(x) for x in tile)):
            raise ArgumentError(f"auto_schedule: gemm cpu_tile must be two positive ints, got {tile!r}")
        return {"cpu_tile": tile}
    sig = inspect.signature(schedule_gemm_cuda).parameters
    out = {k: given.get(k, sig[k].default) for k in SIMT_KEYS}
    check_tiles(out["block"], out["thread_tile"], out["k_tile"])
    sk = out["split_k"]
    if sk is not None and (isinstance(sk, bool) or not isinstance(sk, int) or sk < 0):
        raise ArgumentError(f"auto_schedule: gemm split_k must be None (the planner decides: skinny GEMMs split), "
                            f"0 (no split) or a chunk length (a positive multiple of k_tile), got {sk!r}")
    # tensor_cores: None lets auto_schedule decide (half inputs, shapes the recipe suits), True asks for the
    # tensor-core recipe wherever it applies, False keeps the SIMT recipe; mma: that recipe's tiles
    tc = given.get("tensor_cores")
    if tc not in (None, True, False):
        raise ArgumentError(f"auto_schedule: gemm tensor_cores must be None, True or False, got {tc!r}")
    mma = given.get("mma") or {}
    if not isinstance(mma, dict) or set(mma) - set(MMA_TILES):
        raise ArgumentError(f"auto_schedule: gemm mma must be a dict with some of {', '.join(MMA_TILES)}, got {mma!r}")
    mma = {k: tuple(v) if isinstance(v, list) else v for k, v in {**MMA_TILES, **mma}.items()}
    check_mma_tiles(mma["block"], mma["warp"], mma["k_tile"])
    out["tensor_cores"], out["mma"] = tc, mma
    # wgmma: None lets auto_schedule take Hopper's warpgroup recipe where it applies (a plain 2-d matmul, rows of
    # A and B 16-byte aligned), False keeps mma.sync, or {"block": (rows, cols)} takes it with that tile
    wg = given.get("wgmma")
    if wg not in (None, False) and not isinstance(wg, dict):
        raise ArgumentError(f"auto_schedule: gemm wgmma must be None, False or a dict with 'block', got {wg!r}")
    if isinstance(wg, dict):
        if set(wg) - set(WGMMA_TILES):
            raise ArgumentError(f"auto_schedule: gemm wgmma must be a dict with some of {', '.join(WGMMA_TILES)}, "
                                f"got {wg!r}")
        wg = {k: tuple(v) if isinstance(v, list) else v for k, v in {**WGMMA_TILES, **wg}.items()}
        check_wgmma_tiles(wg["block"])
    out["wgmma"] = wg
    return out


def simt_default(params: dict[str, Any]) -> bool:
    """The SIMT recipe's tile parameters in `params` (from gemm_params) are its defaults: nobody chose tiles (a
    chosen split_k is no tile: the planner still picks the tiles of a skinny GEMM, and keeps that split_k)."""
    default = gemm_params("cuda")
    return all(params.get(k) == default[k] for k in SIMT_KEYS if k != "split_k")
