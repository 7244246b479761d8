"""Running the GPU mode of the reference interpreter: blocks in adversarial order, each block's threads
interleaved statement by statement between barriers (the kernels are compiled by `loopir.interp_gpu`).

    compiled(program)                    the program's kernels compiled to thread generators (cached)
    run(program, bufs, env, gpu_order)   called by `loopir.interp.run(..., gpu_order=...)`
    plan(program, sizes)                 what the model decided per kernel (tests compare it with the renderer)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .errors import ArgumentError, ResourceLimitError
from .args import eval_expr
from .dtypes import is_float
from . import interp_gpu
from .interp_gpu import _MAX_THREADS, ORDERS, BarrierDivergenceError, _identity, _Kernel, _KernelCompiler
from .nodes import For, If, Kernel, Program, Stmt, Store, Var
from .visit import body_list, walk


def _combine_fn(op: str, dtype: str) -> Callable[[Any, Any], Any]:
    if op == "add":
        return lambda a, b: a + b
    if op == "mul":
        return lambda a, b: a * b
    if is_float(dtype):
        return np.maximum if op == "max" else np.minimum  # NaN propagates, as the interpreter's max/min
    return max if op == "max" else min


def _warp_reduce(v: list[Any], fn: Callable[[Any, Any], Any]) -> Any:
    """Lane 0's value after `for o in 16, 8, 4, 2, 1: v = op(v, __shfl_down_sync(v, o))`."""
    v = list(v)
    for o in (16, 8, 4, 2, 1):
        for lane in range(o):
            v[lane] = fn(v[lane], v[lane + o])
    return v[0]


def _block_allreduce(vals: list[Any], fn: Callable[[Any, Any], Any], ident: Any) -> Any:
    """The total of one row of the block, combined as `loopir_block_allreduce` does (warp shuffles, then
    the warps' totals in warp 0); a row narrower than a warp (the sub-warp all-reduce) is padded with the
    identity."""
    warps = [_warp_reduce(list(vals[w:w + 32]) + [ident] * (32 - len(vals[w:w + 32])), fn)
             for w in range(0, len(vals), 32)]
    return _warp_reduce([warps[k] if k < len(warps) else ident for k in range(32)], fn)




# ----------------------------------------------------------------------------- the program: host plan of launches


class _Compiled:
    __slots__ = ("items", "kernels")

    def __init__(self, items: list[tuple], kernels: list[_Kernel]) -> None:
        self.items = items  # ("kernel", _Kernel) | ("host", For, items)
        self.kernels = kernels


def _compile(program: Program, traced: bool) -> _Compiled:
    kernels: list[_Kernel] = []
    taken: set[str] = set()

    def items_of(s: Stmt) -> list[tuple]:
        out: list[tuple] = []
        for nest in body_list(s):
            if isinstance(nest, For) and nest.kind == "host":
                out.append(("host", nest, items_of(nest.body)))
                continue
            if isinstance(nest, If) and any(isinstance(n, Kernel) for n in walk(nest)):
                out.append(("if", nest, items_of(nest.then), items_of(nest.orelse) if nest.orelse else []))
                continue
            first = next((n.name for n in walk(nest) if isinstance(n, Store)), f"nest{len(kernels)}")
            name, j = f"{program.name}_{first}", 1
            while name in taken:
                name, j = f"{program.name}_{first}_{j}", j + 1
            taken.add(name)
            plan_ = nest if isinstance(nest, Kernel) else None
            kern = _KernelCompiler(program, nest, name, traced, plan_).compile_kernel()
            kernels.append(kern)
            out.append(("kernel", kern))
        return out

    return _Compiled(items_of(program.body), kernels)


_CACHE: dict[tuple[int, bool, bool], tuple[Program, _Compiled]] = {}
_CACHE_MAX = 256


def compiled(program: Program, traced: bool = False) -> _Compiled:
    """The kernels of `program` compiled for the GPU mode (cached per program object)."""
    key = (id(program), traced, interp_gpu.RENDERER_IMPLICIT_SYNCS)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is program:
        return hit[1]
    c = _compile(program, traced)
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (program, c)
    return c


def source(program: Program) -> str:
    """The Python source of every kernel's thread function (for debugging)."""
    return "\n".join(k.source for k in compiled(program).kernels)




def launch_dims(k: _Kernel, env: Mapping[Var, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The grid and block of kernel `k` at the sizes (and host loop values) of `env`."""
    grid = tuple(int(eval_expr(e, env)) for e in k.grid)
    block = tuple(int(eval_expr(e, env)) for e in k.block)
    return grid, block  # type: ignore[return-value]


def _threads_text(ts: list[int], bdim: tuple[int, int, int]) -> str:
    def one(t: int) -> str:
        x, y, z = t % bdim[0], (t // bdim[0]) % bdim[1], t // (bdim[0] * bdim[1])
        return f"({x}, {y}, {z})"

    shown = ", ".join(one(t) for t in ts[:4])
    return shown + (f" and {len(ts) - 4} more" if len(ts) > 4 else "")


class _Block:
    """The threads of one block and the scheduler that interleaves them."""

    def __init__(self, k: _Kernel, bufs: list, sizes: list, trace: list | None, bid: tuple[int, int, int],
                 bdim: tuple[int, int, int]) -> None:
        self.k, self.bid, self.bdim = k, bid, bdim
        blk: dict[int, np.ndarray] = {}
        bx, by, bz = bid
        T = bdim[0] * bdim[1] * bdim[2]
        self.gens = []
        for t in range(T):
            tx, ty, tz = t % bdim[0], (t // bdim[0]) % bdim[1], t // (bdim[0] * bdim[1])
            self.gens.append(k.fn(bufs, sizes, trace, blk, bx, by, bz, tx, ty, tz, t, T))
        self.T = T
        self.finished: list[int] = []

    def where(self, t: int) -> str:
        return f"kernel {self.k.name!r}, block {self.bid}, thread {_threads_text([t], self.bdim)}"

    def run(self, order: str | random.Random) -> None:
        T = self.T
        pending: list[Any] = [None] * T
        runnable = list(range(T))
        while True:
            waiting: dict[int, Any] = {}
            finished: list[int] = []
            if isinstance(order, random.Random):
                rnd = order.randrange
                while runnable:
                    i = rnd(len(runnable))
                    t = runnable[i]
                    try:
                        tok = self.gens[t].send(pending[t])
                    except StopIteration:
                        tok = StopIteration
                    except Exception as e:
                        e.add_note(f"(GPU mode: in {self.where(t)})")
                        raise
                    pending[t] = None
                    if tok is None:
                        continue
                    runnable[i] = runnable[-1]
                    runnable.pop()
                    if tok is StopIteration:
                        finished.append(t)
                    else:
                        waiting[t] = tok
            else:  # "reversed" ("forward"): the highest- (lowest-) numbered runnable thread runs until it blocks
                for t in sorted(runnable, reverse=order == "reversed"):
                    send = self.gens[t].send
                    try:
                        tok = send(pending[t])
                        while tok is None:
                            tok = send(None)
                    except StopIteration:
                        finished.append(t)
                        continue
                    except Exception as e:
                        e.add_note(f"(GPU mode: in {self.where(t)})")
                        raise
                    waiting[t] = tok
                runnable = []
            if not waiting:
                return
            self.finished += finished
            self.release(waiting, pending)
            runnable = sorted(waiting)

    def release(self, waiting: dict[int, Any], pending: list[Any]) -> None:
        sites: dict[int, list[int]] = {}
        for t, tok in waiting.items():
            sites.setdefault(tok if isinstance(tok, int) else tok[0], []).append(t)
        done = self.finished
        if len(sites) > 1 or done:
            parts = [f"threads {_threads_text(sorted(ts), self.bdim)} wait at {self.k.sites[s][1]}"
                     for s, ts in sorted(sites.items())]
            if done:
                parts.append(f"threads {_threads_text(sorted(done), self.bdim)} finished the kernel")
            raise BarrierDivergenceError(
                f"barrier divergence: in kernel {self.k.name!r} (statements {', '.join(self.k.stmts)}), block "
                f"{self.bid}: " + "; ".join(parts) + " (every thread of a block must reach the same barriers)")
        (s,) = sites
        kind, _, extra = self.k.sites[s]
        if kind == "barrier":
            return
        op, dtype = extra
        fn = _combine_fn(op, dtype)
        ident = np.dtype("float32" if dtype == "bfloat16" else dtype).type(_identity(op, dtype))  # bf16: float32
        bx = self.bdim[0]
        for row in range(0, self.T, bx):
            vals = [waiting[t][1] for t in range(row, row + bx)]
            if self.k.cluster:  # each block of the cluster, then the blocks' totals in rank order
                per = bx // self.k.cluster
                parts = [_block_allreduce(vals[r:r + per], fn, ident) for r in range(0, bx, per)]
                total = parts[0]
                for p in parts[1:]:
                    total = fn(total, p)
            else:
                total = _block_allreduce(vals, fn, ident)
            for t in range(row, row + bx):
                pending[t] = total


def run(program: Program, bufs: list[np.ndarray], env: Mapping[Var, int], gpu_order: Any,
        trace: list | None = None) -> None:
    """Run `program` on `bufs` (arguments, then temps) in the GPU mode (see the module docstring);
    called by `loopir.interp.run(..., gpu_order=...)`, which checks the arguments and infers `env`."""
    if isinstance(gpu_order, bool) or not (gpu_order in ORDERS or isinstance(gpu_order, int)):
        raise ArgumentError(f"gpu_order must be None, 'reversed', 'forward' or an int seed, got {gpu_order!r}")
    order: str | random.Random = gpu_order if isinstance(gpu_order, str) else random.Random(gpu_order)
    c = compiled(program, trace is not None)
    env = dict(env)

    def launch(k: _Kernel) -> None:
        missing = [v.name for v in k.size_vars if v not in env]
        if missing:
            raise ArgumentError(
                f"program {program.name!r} uses variable(s) {', '.join(repr(m) for m in missing)} that are neither "
                "loop variables around their use nor sizes of its arguments (pass sizes={...} for free sizes)")
        sizes = [env[v] for v in k.size_vars]
        grid, bdim = launch_dims(k, env)
        if min(grid) <= 0 or min(bdim) <= 0:
            return  # an empty launch: the runtime skips it
        most = _MAX_THREADS * max(1, k.cluster)  # a cluster kernel's block is its cluster's threads
        if bdim[0] * bdim[1] * bdim[2] > most:
            raise ResourceLimitError(
                f"kernel {k.name!r} needs block {bdim}, more than {most} threads: CUDA cannot "
                "launch it; split the bound loops differently")
        nb = grid[0] * grid[1] * grid[2]
        blocks = list(range(nb))
        if isinstance(order, random.Random):
            order.shuffle(blocks)
        elif order == "reversed":
            blocks.reverse()
        for b in blocks:
            bid = (b % grid[0], (b // grid[0]) % grid[1], b // (grid[0] * grid[1]))
            _Block(k, bufs, sizes, trace, bid, bdim).run(order)

    def go(items: list[tuple]) -> None:
        for it in items:
            if it[0] == "kernel":
                launch(it[1])
                continue
            if it[0] == "if":
                go(it[2] if eval_expr(it[1].cond, env) else it[3])
                continue
            _, f, inner = it
            lo, hi = int(eval_expr(f.lo, env)), int(eval_expr(f.hi, env))
            for v in range(lo, hi):
                env[f.var] = v
                go(inner)
            env.pop(f.var, None)

    with np.errstate(all="ignore"):
        go(c.items)


def plan(program: Program, sizes: Mapping[Var | str, int]) -> list[dict[str, Any]]:
    """What the model decided for each kernel (top-level launches, host loops unrolled are not listed):
    name, statements, grid and block at `sizes`, and the statements run as cross-thread reductions (and
    those of them that start from their init constant), cooperative copies and by thread 0 only. Tests
    compare it with the CUDA renderer's output."""
    env: dict[Var, int] = {}
    byname = {v.name: v for v in program.params}
    for key, val in sizes.items():
        env[byname[key] if isinstance(key, str) else key] = int(val)
    out = []
    for k in compiled(program).kernels:
        grid, block = launch_dims(k, env)
        out.append({"name": k.name, "statements": k.stmts, "grid": grid, "block": block,
                    "collectives": tuple(k.collectives), "cooperative": tuple(dict.fromkeys(k.cooperative)),
                    "thread0": tuple(k.thread0), "from_init": tuple(k.from_init)})
    return out



__all__ = ["run", "plan", "launch_dims", "compiled", "source"]
