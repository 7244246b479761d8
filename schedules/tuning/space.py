"""The search space of a workload: the decisions `auto_schedule`'s rules make, as knobs.

    space = space_for([y], "cuda", sizes={"m": 4096, "n": 1024})
    space.default                       # what the untuned rules pick: measured first, the baseline
    schedule_opts, build_opts = options(cfg)   # build(outs, args, schedule=schedule_opts, **build_opts)

A candidate is a configuration of these knobs; applied, it is `auto_schedule(outs, **schedule_opts)`, so every
candidate is a checked schedule (each step verified against the dependences, recorded in a replayable trace).
Which knobs exist depends on the fusion plan the rules make at the tuned sizes:

| kernel (plan mapping)    | knobs                                                                  |
|--------------------------|------------------------------------------------------------------------|
| cuda flat (elementwise)  | threads, per_thread                                                    |
| cuda row / warp / split  | threads, rows.wide_threads, rows.warp_lanes, rows.split_threads,       |
|                          | rows.register_row_max (register rows, or the row in shared memory),    |
|                          | rows.cluster_row_max (a cluster per row), rows.uncached_threads         |
| cuda GEMM, half inputs   | gemm.mma.block, gemm.mma.warp, gemm.mma.k_tile (tensor cores, mma.sync: |
|                          | chosen when not at their defaults), gemm.wgmma.block (2-d matmuls);    |
|                          | gemm.split_k for a skinny plan split into chunks (0: no split)         |
| cuda GEMM, float32       | gemm.block, gemm.thread_tile, gemm.k_tile (the SIMT recipe's tiles; the |
|                          | default, measured first, runs tensor cores: mma.m16n8k16.tf32x3);     |
|                          | gemm.split_k for a skinny plan split into chunks (0: no split)         |
| cpu GEMM                 | gemm.cpu_tile                                                          |
| cpu (every workload)     | build.threads (the module's worker threads)                            |
| several stages, no GEMM  | fuse (one kernel per stage when False)                                 |

`check(cfg)` prunes what cannot run before anything is built: threads per block over 1024 or not a whole
warp, shared memory over the device's per-block limit, more accumulators per thread than registers hold.
"""

from __future__ import annotations

import math
from typing import Any

from loopir.dtypes import np_dtype
from loopir.lower import lower
from loopir.target import MMA_STAGES, cpu_count, padded_row
from loopir.te import Tensor
from loopir.nodes import Load
from loopir.visit import walk

from ..attention import online_rewrites, online_stages
from ..cost import H200, Device
from ..fusion import THREADS, plan_fusion
from ..recipes import MMA_TILES, WGMMA_TILES, gemm_params, gemm_resources
from ..recipes.gemm_mma import mma_applicable
from ..rows import CLUSTER_ROW_MAX, REGISTER_ROW_MAX, RowParams
from .record import Config, Knob, Space

__all__ = ["space_for", "options", "check"]

MAX_ACC = 128  # accumulators per thread beyond which the register file spills

_POW2_THREADS = (64, 128, 256, 512, 1024)
# the knobs of one recipe (the SIMT tiles, the tensor-core tiles), each with split-K
GEMM_KNOBS = (("gemm.block", "gemm.thread_tile", "gemm.k_tile", "gemm.split_k"),
              ("gemm.mma.block", "gemm.mma.warp", "gemm.mma.k_tile", "gemm.split_k"))


def _item(t: Tensor) -> int:
    loads = [n for n in walk(t.op.body) if isinstance(n, Load)]
    return max((np_dtype(n.buffer.dtype).itemsize for n in loads), default=4)


def space_for(outputs: Tensor | list[Tensor], target: str = "cuda", sizes: dict[Any, int] | None = None) -> Space:
    """The knobs of `outputs` on `target` at `sizes` (size Vars or names; the plan's mappings are decided at
    these sizes), the untuned rules' choices as `default`, and the validity check."""
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    found, alone = online_rewrites(outs)
    if alone:  # the attention chain alone: its online pass is mapped by fixed rules, nothing here to vary
        return Space((), {})
    # the plan auto_schedule makes: a softmax(.) V chain among other stages is one online kernel of it
    online = [online_stages([r]) for r in found]
    plan = plan_fusion(outs, target=target, sizes=sizes, online=online)
    knobs: dict[str, Knob] = {}
    default: Config = {}
    itemsize = 4

    def add(name: str, choices: tuple[Any, ...], value: Any) -> None:
        if name not in knobs:
            knobs[name] = Knob(name, choices if value in choices else tuple(sorted({*choices, value},
                                                                                   key=_order)))
            default[name] = value

    rows = RowParams()
    stages = sum(len(g.stages) for g in plan.groups) + len(plan.inlined)
    for g in plan.groups:
        if g.mapping == "gemm":
            itemsize = _item(g.stages[0])
            if target == "cpu":
                tile = gemm_params("cpu")["cpu_tile"]
                t0, t1 = tile
                add("gemm.cpu_tile", tuple(sorted({(r, c) for r in (2, 4, 6, 8) for c in (t1 // 2, t1, 2 * t1)},
                                                 key=_order)), tile)
            elif itemsize == 2 and mma_applicable(lower(outs), g.stages[0].name) is None:
                gm = g.gemm or {}
                # a skinny plan on tensor cores (16 to 64 rows): its own tiles, blocks no taller than the rows
                skinny = bool(gm.get("tensor_cores")) and gm.get("mma") not in (None, MMA_TILES)
                tiles = gm["mma"] if skinny else MMA_TILES
                add("gemm.mma.block", (((16, 64), (32, 64), (16, 128), (32, 128)) if skinny else ())
                    + ((64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128)), tiles["block"])
                add("gemm.mma.warp", (((16, 32), (16, 64)) if skinny else ())
                    + ((32, 32), (32, 64), (64, 32), (64, 64), (32, 128), (128, 32)), tiles["warp"])
                add("gemm.mma.k_tile", (16, 32, 64), tiles["k_tile"])
                if len(g.stages[0].shape) == 2 and not skinny:  # a plain matmul: Hopper's warpgroup recipe, its tile
                    add("gemm.wgmma.block", ((128, 128), (128, 192), (128, 256), (64, 256)), WGMMA_TILES["block"])
                if gm.get("split_k"):
                    add("gemm.split_k", (0, 256, 512, 1024, 2048), int(gm["split_k"]))
            else:
                p = gemm_params("cuda", g.gemm and {k: v for k, v in g.gemm.items() if k in ("block", "thread_tile",
                                                                                             "k_tile")})
                add("gemm.block", ((32, 64), (64, 64), (64, 128), (128, 64), (128, 128), (64, 256), (16, 32),
                                   (16, 64)), p["block"])
                add("gemm.thread_tile", ((2, 1), (4, 1), (4, 2), (4, 4), (4, 8), (8, 4), (8, 8)), p["thread_tile"])
                add("gemm.k_tile", (8, 16, 32, 64, 128), p["k_tile"])
                if (g.gemm or {}).get("split_k"):  # a skinny plan in chunks: the chunk length too (0: no split)
                    add("gemm.split_k", (0, 256, 512, 1024, 2048), int(g.gemm["split_k"]))  # type: ignore[index]
        elif target == "cuda" and g.mapping == "flat":
            add("threads", _POW2_THREADS, THREADS)
            add("per_thread", (1, 2, 4, 8), 2)
        elif target == "cuda" and g.mapping in ("row", "warp", "split"):
            add("threads", _POW2_THREADS, THREADS)
            probe = 256 if rows.wide_threads != 256 else 1024
            if g.mapping == "row" and _changes(outs, sizes, plan, {"wide_threads": probe}, online):
                add("rows.wide_threads", (256, 512, 1024), rows.wide_threads)
            if g.mapping == "row" and g.strategy is not None and g.strategy.registers:
                # register rows (measured faster on the H200's 4096- and 8192-element half rows) or the shared row
                add("rows.register_row_max", (REGISTER_ROW_MAX, 0), rows.register_row_max)
            if g.mapping == "row" and _changes(outs, sizes, plan,
                                               {"cluster_row_max": 0 if rows.cluster_row_max else CLUSTER_ROW_MAX},
                                               online):
                # a row beyond one block's register rows: a cluster of register rows (read once) or a block per row
                add("rows.cluster_row_max", (0, CLUSTER_ROW_MAX), rows.cluster_row_max)
            if g.mapping == "row" and g.strategy is not None and not g.strategy.cluster and _changes(
                    outs, sizes, plan, {"uncached_threads": 512 if rows.uncached_threads != 512 else 1024}, online):
                # a wide row every phase re-reads: its threads per row (half the rows in flight at 1024)
                add("rows.uncached_threads", (512, 1024), rows.uncached_threads)
            if g.mapping == "split":
                add("rows.split_threads", (128, 256, 512, 1024), rows.split_threads)
            # rows a block each today that would take warp rows below a higher threshold: the threshold and the
            # lanes per row are decisions too (short rows: several rows a block, shuffle reductions)
            if g.mapping == "warp" or _changes(outs, sizes, plan, {"warp_row_max": 4096}, online):
                add("rows.warp_row_max", (0, 1024, 2048, 4096), rows.warp_row_max)
                add("rows.warp_lanes", (4, 8, 16, 32), rows.warp_lanes)
    if stages > 1 and not any(g.mapping in ("gemm", "online") for g in plan.groups):
        add("fuse", (True, False), True)
    if target == "cpu":
        n = cpu_count()
        add("build.threads", tuple(sorted({1, *(2**k for k in range(1, n.bit_length()) if 2**k <= n), n})), n)
    ks = tuple(knobs.values())
    return Space(ks, default, lambda c: check(c, itemsize, plan.device))


def _changes(outs: list[Tensor], sizes: Any, plan: Any, rows: dict[str, Any], online: list[set[str]]) -> bool:
    """Whether these row parameters change any kernel's mapping or row strategy at `sizes` (a knob that never
    changes the plan would only re-measure the same kernels)."""
    other = plan_fusion(outs, target="cuda", sizes=sizes, rows=rows, online=online)
    return [(g.mapping, g.strategy) for g in other.groups] != [(g.mapping, g.strategy) for g in plan.groups]


def _order(v: Any) -> tuple[Any, ...]:
    """Choices ordered by size (tiles by their area, then shape): neighbours are close values."""
    if isinstance(v, tuple):
        return (math.prod(v), v)
    return (0, v) if not isinstance(v, bool) else (0, int(v))


def options(config: Config, default: Config | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(auto_schedule keyword options, build options) of a configuration; knobs at their `default` value are
    left out (the rules decide them), so the default configuration is exactly the untuned build."""
    sched: dict[str, Any] = {}
    build: dict[str, Any] = {}
    # a recipe's knobs go together once one differs: given alone, a tile would replace the planner's choice of all
    # of them (a skinny plan's tiles and split-K) by the recipe's defaults for the others
    together = {k for group in GEMM_KNOBS if default is not None
                and any(g in config and config[g] != default.get(g) for g in group) for k in group}
    for name, v in config.items():
        if default is not None and default.get(name) == v and name not in together:
            continue
        head, _, rest = name.partition(".")
        if head == "build":
            build[rest] = v
        elif head == "rows":
            sched.setdefault("rows", {})[rest] = v
        elif head == "gemm":
            gemm = sched.setdefault("gemm", {})
            if rest.startswith(("mma.", "wgmma.")):
                kind, _, key = rest.partition(".")
                gemm.setdefault(kind, {})[key] = v
                gemm["tensor_cores"] = True
            else:
                gemm[rest] = v
        else:
            sched[name] = v
    return sched, build


def check(config: Config, itemsize: int = 4, device: Device = H200) -> str | None:
    """None when `config` may be built on `device` (the cost model's: the fusion plan's own); else why not
    (arithmetic only: nothing is scheduled)."""
    most = device.max_threads_per_block
    if "gemm.mma.block" in config:
        (b0, b1), (w0, w1), kt = config["gemm.mma.block"], config["gemm.mma.warp"], config["gemm.mma.k_tile"]
        if b0 % w0 or b1 % w1:
            return f"block {(b0, b1)} is not a multiple of the warp tile {(w0, w1)}"
        warps = (b0 // w0) * (b1 // w1)
        if warps * 32 > most:
            return f"{warps} warps: more than {most} threads per block"
        if w0 * w1 // 32 > MAX_ACC:
            return f"warp tile {(w0, w1)}: {w0 * w1 // 32} accumulators per lane (registers hold {MAX_ACC})"
        smem = MMA_STAGES * (b0 * padded_row(kt, 2) + kt * padded_row(b1, 2)) * 2
        if smem > device.smem_per_block_optin:
            return (f"{MMA_STAGES} stages of shared tiles need {smem} bytes (a block has "
                    f"{device.smem_per_block_optin})")
    if "gemm.block" in config:
        b, t, kt = config["gemm.block"], config["gemm.thread_tile"], config["gemm.k_tile"]
        if b[0] % t[0] or b[1] % t[1]:
            return f"block {b} is not a multiple of the thread tile {t}"
        threads, smem, acc = gemm_resources({"block": b, "thread_tile": t, "k_tile": kt}, itemsize)
        if threads > most or threads % 32:
            return f"{threads} threads per block (a whole number of warps, at most {most})"
        if acc > MAX_ACC:
            return f"thread tile {t}: {acc} accumulators per thread (registers hold {MAX_ACC})"
        if 2 * smem > device.smem_per_block:
            return (f"two stages of shared tiles need {2 * smem} bytes (the SIMT recipe's static limit: "
                    f"{device.smem_per_block // 1024} KiB)")
    chunk, kt = config.get("gemm.split_k"), config.get("gemm.k_tile", config.get("gemm.mma.k_tile"))
    if chunk and kt and chunk % kt:
        return f"split_k {chunk} is not a multiple of k_tile {kt}"
    if "gemm.cpu_tile" in config:
        t0, t1 = config["gemm.cpu_tile"]
        if t0 * t1 > 512:
            return f"cpu tile {(t0, t1)}: {t0 * t1} accumulators"
    return None
