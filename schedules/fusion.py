"""The fusion planner: which stages of a tensor-expression graph share one kernel, and why.

    plan = plan_fusion([y], target="cuda")
    print(plan.explain())          # each kernel, what was fused and refused, bytes before/after

Three kinds of fusion, decided on the te stage graph (`Tensor.op.inputs`) and priced by the
roofline model of `schedules.cost`:

* **inline** — an elementwise (reduction-free) stage that is not an output is substituted into
  its readers (`compute_inline`): its values are recomputed where read instead of written and
  read back. Refused when the recomputation costs more time than the bytes it saves (a stage read
  at many points per element, e.g. the probabilities of attention read once per output column).
* **vertical** — a materialized stage and a stage reading it share a kernel when the reader reads
  it only at the *same* values of their common outer loops (`P[i]` read inside the reader's loop
  `i`): fusing those loops (`fuse`) keeps every producer instance before its readers. This puts a
  reduction with its epilogue in one kernel (row softmax: max, sum of exp, normalize, all inside
  one loop over rows). A reader that needs the producer at other points (`s[j]` inside loop `i`)
  would need all of it first — fusing would recompute the reduction per iteration — and is refused.
* **horizontal** — independent kernels over the same iteration space (no path between them)
  merge into one loop, which reads a shared input once and saves launches.

* **GEMM** — a matmul-shaped reduction (`C[i, j] = sum_k X[i, k] * Y[k, j]`) gets a kernel of its own
  with the tiled GEMM recipe (`schedules.gemm`): its elementwise consumer chain (bias add, ReLU) is fused
  as the epilogue, computed on the register tile before the single store (the matmul result is never
  written); its operands' producers and other stages stay in separate kernels (they would give up the
  tiling). Tile sizes are parameters (`gemm=`); tiles that exceed the device's shared memory, threads
  per block or registers are refused with a ValueError.

A reduction is never inlined: recomputing it at each point where it is read multiplies its work
by its extent; the log says so. On `cuda`, a row group's strategy (lanes or a block per row) and the
rows it keeps in shared memory come from `schedules.rows`: a row read by several phases is cached while
everything the kernel keeps in shared memory fits the block's budget (symbolic rows only with `sizes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Collection, Sequence
from typing import Any

from loopir.dtypes import HALVES, np_dtype
from loopir.errors import ArgumentError, ArgumentTypeError
from loopir.affine import multiple_of, simplify
from loopir.nodes import Const, Expr, Load, Var
from loopir.te import ComputeOp, Reduce, Tensor, TupleReduce, tensor_of
from loopir.visit import substitute, walk

from . import cost as C
from . import rows as R
from .fusion_plan import THREADS, Decision, FusionGroup, FusionPlan, RowCache
from .gemm_plan import plan_gemm, split_partials
from .primitives.tensorize import half_load
from .primitives.flash import MAX_DEPTH as FLASH_MAX_DEPTH, TF32_MAX_DEPTH
from .recipes import gemm_params, is_matmul_tensor

ROW_MIN_EXTENT = 1024  # a reduction at least this long gets a block per row (else a thread per row)


# ----------------------------------------------------------------------------- stage graph


@dataclass
class Stage:
    """One compute stage of the graph, with what the planner derives about it."""

    tensor: Tensor
    index: int  # topological position
    is_output: bool
    consumers: list[Tensor] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.tensor.name

    @property
    def op(self) -> ComputeOp:
        assert isinstance(self.tensor.op, ComputeOp)
        return self.tensor.op

    @property
    def is_reduction(self) -> bool:
        return isinstance(self.op.body, Reduce)

    @property
    def kind(self) -> str:
        return "reduction" if self.is_reduction else "elementwise"


def _topo(outputs: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    order: list[Tensor] = []
    inputs: list[Tensor] = []
    seen: set[int] = set()

    def visit(t: Tensor) -> None:
        if id(t) in seen:
            return
        seen.add(id(t))
        if isinstance(t.op, ComputeOp):
            for u in t.op.inputs:
                visit(u)
            order.append(t)
        else:
            inputs.append(t)

    for o in outputs:
        visit(o)
    return order, inputs


def _raw_loads(t: Tensor) -> list[tuple[Tensor, tuple[Expr, ...]]]:
    """(tensor read, index) for every load in the body of `t`, in t's own variables."""
    out = []
    for n in walk(t.op.body):
        if isinstance(n, Load):
            src = tensor_of(n.buffer)
            if src is not None:
                out.append((src, n.indices))
    return out


def _effective_loads(t: Tensor, inlined: set[int]) -> list[tuple[Tensor, tuple[Expr, ...]]]:
    """The loads of `t` once the stages in `inlined` are substituted in: indices composed."""
    out = []
    for src, idx in _raw_loads(t):
        if id(src) in inlined:
            sub = dict(zip(src.op.axis, idx))
            for s2, idx2 in _effective_loads(src, inlined):
                out.append((s2, tuple(substitute(e, sub) for e in idx2)))
        else:
            out.append((src, idx))
    return out


def _domain(t: Tensor) -> tuple[Expr, ...]:
    """Extents of every loop of the stage: its axes, then its reduce axes."""
    op = t.op
    return tuple(t.shape) + tuple(hi - lo for lo, hi in getattr(op, "reduce_dom", ()))


def _flops_per_point(t: Tensor, inlined: set[int]) -> int:
    """Operations in one evaluation of t's body with inlined producers expanded."""
    body = t.op.body.body if isinstance(t.op.body, Reduce) else t.op.body
    total = C.expr_flops(body) + (1 if isinstance(t.op.body, Reduce) else 0)
    for n in walk(body):
        if isinstance(n, Load):
            src = tensor_of(n.buffer)
            if src is not None and id(src) in inlined:
                total += _flops_per_point(src, inlined)
    return total


def _same(a: Expr, b: Expr) -> bool:
    return a is b or a == b


def _shared_prefix(producer: Tensor, consumer: Tensor, accesses: list[tuple[Expr, ...]]) -> int:
    """How many outer loops the consumer can share with the producer: the largest d such that
    every access reads the producer at the consumer's own first d loop variables, in place."""
    d = min(len(producer.shape), len(consumer.shape))
    for idx in accesses:
        k = 0
        while k < d and idx[k] is consumer.op.axis[k] and _same(producer.shape[k], consumer.shape[k]):
            k += 1
        d = min(d, k)
    return d


def _fmt_idx(t: Tensor, idx: tuple[Expr, ...]) -> str:
    return f"{t.name}[{', '.join(str(e) for e in idx)}]"


# ----------------------------------------------------------------------------- plan objects


def _as_list(outputs: Tensor | list[Tensor] | tuple[Tensor, ...]) -> list[Tensor]:
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    if not outs:
        raise ArgumentError("plan_fusion: no outputs given")
    for o in outs:
        if not isinstance(o, Tensor):
            raise ArgumentTypeError(f"plan_fusion: outputs must be te tensors, got {type(o).__name__} {o!r}")
        if not isinstance(o.op, ComputeOp):
            raise ArgumentError(f"plan_fusion: output {o.name!r} is a placeholder; there is nothing to compute")
    return outs


def plan_fusion(
    outputs: Tensor | list[Tensor],
    target: str = "cuda",
    fuse: bool = True,
    sizes: dict[Any, int] | None = None,
    device: C.Device | None = None,
    gemm: dict[str, Any] | bool | None = None,
    rows: R.RowParams | dict | None = None,
    online: Sequence[Collection[str]] = (),
    bounds: dict[Any, int] | None = None,
) -> FusionPlan:
    """Plan the kernels computing `outputs` on `target` ("cuda" or "cpu").

    `sizes` ({size Var or name: int}) are the sizes the cost model evaluates at (others:
    `cost.DEFAULT_SIZE`); `fuse=False` plans one kernel per stage, for comparison. `gemm`: the
    tile parameters of matmul-shaped reductions' GEMM kernels (`schedules.gemm.gemm_params`: on cuda
    block, thread_tile, k_tile; on cpu cpu_tile; None or True: the defaults; False: no GEMM mapping).
    `rows`: the row strategies' thresholds (`schedules.rows.RowParams` or a dict of its fields).
    `online`: the stage names of each online-softmax pass (`schedules.attention.online_stages`): each set is one
    kernel of mapping "online" that nothing else joins, whose stages are neither inlined nor inlined into.
    `bounds` ({size Var or name: int}): upper bounds of symbolic sizes that every call meets (`auto_schedule`
    assumes them): a row whose symbolic length is bounded so may be planned as register rows."""
    outs = _as_list(outputs)
    if target not in ("cuda", "cpu"):
        raise ArgumentError(f"plan_fusion: unknown target {target!r}; expected 'cuda' or 'cpu'")
    dev = device or C.device_info(target)
    gparams = None if gemm is False else gemm_params(target, None if gemm is True else gemm)
    order, inputs = _topo(outs)
    out_ids = {id(t) for t in outs}
    stages = {id(t): Stage(t, k, id(t) in out_ids) for k, t in enumerate(order)}
    for t in order:
        for u in t.op.inputs:
            if id(u) in stages and all(c is not t for c in stages[id(u)].consumers):
                stages[id(u)].consumers.append(t)
    size_map: dict[Any, int] = dict(sizes or {})
    params = _size_vars(order + inputs)
    shown = {v.name: C.size_value(v, size_map) for v in params}
    ev = {v: shown[v.name] for v in params}

    unfused = [_unfused_cost(t, ev) for t in order]
    pl = _Planner(outs, order, stages, dev, ev, target)
    pl.given = {v.name for v in params if v in size_map or v.name in size_map}
    pl.bounded = {v.name for v in params if v in (bounds or {}) or v.name in (bounds or {})}
    pl.gemm = gparams
    pl.row_params = R.RowParams.of(rows)
    pl.online = [set(o) for o in online]
    if fuse:
        pl.decide_inlining()
    pl.make_groups()
    if fuse:
        pl.fuse_vertical()
        pl.fuse_horizontal()
    pl.finish()
    return FusionPlan(
        outputs=outs, target=target, fuse=fuse, device=dev, sizes=shown, groups=pl.groups,
        inlined=[t for t in order if id(t) in pl.inlined], log=pl.log, unfused=unfused,
        stage_order=order, inputs=inputs, row_params=pl.row_params,
    )


def _size_vars(tensors: list[Tensor]) -> list[Var]:
    found: dict[Var, None] = {}
    for t in tensors:
        exprs = list(t.shape)
        if isinstance(t.op, ComputeOp):
            for lo, hi in t.op.reduce_dom:
                exprs += [lo, hi]
        for e in exprs:
            for n in walk(e):
                if isinstance(n, Var):
                    found.setdefault(n, None)
    return list(found)


def _tensor_bytes(t: Tensor, ev: dict) -> int:
    return C.buffer_bytes(t.shape, t.dtype, ev)


def _half_operands(t: Tensor, types: tuple[str, ...] = HALVES) -> tuple[Load, Load, int | None] | None:
    """A matmul-shaped stage's two operand loads when both are float16 (or both bfloat16, or both of `types`;
    plain, or under the float32-accumulation casts), with its reduction's extent when constant; else None."""
    if not is_matmul_tensor(t):
        return None
    op = t.op
    a, b = (half_load(x) for x in (op.body.body.a, op.body.body.b))
    if not (isinstance(a, Load) and isinstance(b, Load) and a.dtype in types and b.dtype == a.dtype):
        return None
    lo, hi = op.reduce_dom[0]
    ext = simplify(hi - lo)
    return a, b, int(ext.value) if isinstance(ext, Const) else None


def _mma_weight(t: Tensor) -> int:
    """The tensor-core cost of a flop of `t` when the CUDA GEMM recipe runs it on tensor cores (the te mirror of
    gemm_mapping._tensor_cores and gemm_mma.mma_applicable), else 0: 1 for half operands (`_half_operands`), 6 for
    float32 ones (mma.m16n8k16.tf32x3: three TF32 products per product, at half the half-precision rate); the
    operands read A[.., i, k] and B[.., k, j], the reduction a known multiple of 8 and at least 32 long; rows and
    columns symbolic or at least 128."""
    half = _half_operands(t)
    ops = half or _half_operands(t, ("float32",))
    if ops is None:
        return 0
    a, b, ext = ops
    i, j, k = t.op.axis[-2], t.op.axis[-1], t.op.reduce_axis[0]
    if tuple(a.indices[-2:]) != (i, k) or tuple(b.indices[-2:]) != (k, j):
        return 0
    if ext is None or ext < 32 or ext % 8:
        return 0
    weight = 1 if half else 6
    return weight if all(not isinstance(d, Const) or int(d.value) >= 128 for d in t.shape[-2:]) else 0


def _tensor_dot(t: Tensor) -> int:
    """The tensor-core cost of a flop of `t` when it is the dot product of an online pass's scores that tensorize
    runs on tensor cores (the te mirror of schedules/primitives/flash.py's condition on them), else 0: 1 for two
    half rows (`_half_operands`) over a constant extent that is a multiple of 16 up to the largest head dimension
    (attention.m16n8k16 / wgmma); 6 for two float32 rows up to TF32_MAX_DEPTH (attention.tf32x3: three TF32 products
    per product, at half the half-precision rate)."""
    for types, most, weight in ((HALVES, FLASH_MAX_DEPTH, 1), (("float32",), TF32_MAX_DEPTH, 6)):
        ops = _half_operands(t, types)
        if ops is not None and ops[2] is not None and 0 < ops[2] <= most and ops[2] % 16 == 0:
            return weight
    return 0


def _unfused_cost(t: Tensor, ev: dict) -> C.KernelCost:
    c = C.KernelCost()
    for u in t.op.inputs:
        c.add_read(u.name, _tensor_bytes(u, ev))
    c.add_write(t.name, _tensor_bytes(t, ev))
    c.flops = _flops_per_point(t, set()) * C.elements(_domain(t), ev)
    return c


class _Planner:
    def __init__(self, outs, order, stages, dev, ev, target) -> None:
        self.outs = outs
        self.order: list[Tensor] = order
        self.stages: dict[int, Stage] = stages
        self.dev: C.Device = dev
        self.ev = ev
        self.target = target
        self.inlined: set[int] = set()
        self.inline_log: dict[int, list[Decision]] = {}  # materialized stage id -> decisions about its producers
        self.groups: list[FusionGroup] = []
        self.group_of: dict[int, FusionGroup] = {}
        self.log: list[Decision] = []
        self.gemm: dict[str, Any] | None = None
        self.given: set[str] = set()  # the size names the plan was given values for
        self.bounded: set[str] = set()  # the size names every call keeps at most their (costed) value
        self.row_params = R.RowParams()
        self.online: list[set[str]] = []  # the stages of each online-softmax pass

    def _in_pass(self, t: Tensor) -> bool:
        return any(t.name in o for o in self.online)

    # ---- GEMM groups
    def _is_gemm(self, t: Tensor) -> bool:
        # batch axes (before the last two) collapse into one grid dimension: all but the first are constants
        return (self.gemm is not None and is_matmul_tensor(t) and R.operands_split(t)
                and all(isinstance(simplify(e), Const) for e in t.shape[1:-2]))

    def _gemm_chain(self, stages: list[Tensor], depth: int) -> bool:
        """A matmul first, then elementwise stages each reading only its predecessor's value at its own
        point (and the predecessor read by nothing else, not an output): the GEMM recipe's epilogue."""
        rank = len(stages[0].shape) if stages else 0
        if not stages or not self._is_gemm(stages[0]) or (len(stages) > 1 and depth != rank):
            return False
        for prev, t in zip(stages, stages[1:]):
            if isinstance(t.op.body, Reduce) or len(t.shape) != rank or self.stages[id(prev)].is_output:
                return False
            readers = [c for c in self.order if id(c) not in self.inlined
                       and any(p is prev for p, _ in _effective_loads(c, self.inlined))]
            if readers != [t] or any(idx != tuple(t.op.axis) for p, idx in _effective_loads(t, self.inlined)
                                     if p is prev):
                return False
        return True

    def _gemm_refusal(self, a: FusionGroup, b: FusionGroup, depth: int) -> str:
        """Why merging a and b would give up a GEMM group's tiled kernel ("" when it would not)."""
        merged = sorted(a.stages + b.stages, key=lambda t: self.order.index(t))
        mms = [t.name for t in merged if self._is_gemm(t)]
        if not mms or self._gemm_chain(merged, depth):
            return ""
        return (f"{', '.join(mms)} is matmul-shaped and keeps its own tiled GEMM kernel (block tiles in fast "
                "memory, a register tile per thread); only an elementwise epilogue chain joins it")

    # ---- inlining
    def decide_inlining(self) -> None:
        # Consumers first: whether a stage is inlined decides what its producers are read by.
        for t in reversed(self.order):
            st = self.stages[id(t)]
            if st.is_output or self._in_pass(t):
                continue
            passes = [c.name for c in st.consumers if self._in_pass(c)]
            if passes:
                for c in st.consumers:
                    self._note(c, Decision("materialize", (t.name,), False,
                                           f"read by {', '.join(passes)} of an online-softmax pass, which reads its "
                                           "operands from memory (K and V tiles staged in shared memory)"))
                continue
            if st.is_reduction:
                for c in st.consumers:
                    pts = C.elements(_domain(c), self.ev)
                    ext = C.elements(_domain(t)[len(t.shape):], self.ev)
                    self._note(c, Decision(
                        "materialize", (t.name,), False,
                        f"a reduction; inlining it into {c.name} would recompute its {ext:,}-term "
                        f"{t.op.body.op} at each of the {pts:,} points where {c.name} reads it — kept in a buffer",
                    ))
                continue
            hosts = self._hosts(t)
            keep = self._gemm_epilogue(t, hosts)
            ok, reason = (False, keep) if keep else self._inline_profit(t)
            d = Decision("inline", (t.name,), ok, reason + f" (into {', '.join(h.name for h in hosts)})")
            for h in hosts:
                self._note(h, d)
            if ok:
                self.inlined.add(id(t))

    def _hosts(self, t: Tensor) -> list[Tensor]:
        """The materialized stages that end up evaluating t's body if t is inlined."""
        out: list[Tensor] = []
        for c in self.stages[id(t)].consumers:
            for h in ([c] if id(c) not in self.inlined else self._hosts(c)):
                if all(h is not x for x in out):
                    out.append(h)
        return out

    def _gemm_epilogue(self, t: Tensor, hosts: list[Tensor]) -> str:
        """Why t stays its GEMM's epilogue rather than being inlined ("" when it need not). t reads a GEMM P at
        its own point, P read by t alone, so P is never written while t is P's epilogue. Inlined into a host that
        cannot be P's epilogue in turn (a reduction, a host that reads t elsewhere than at its own point, or one
        that reads another GEMM, whose epilogue it will be), P is written and read instead of t: kept iff P is the
        wider (a float32 accumulator behind a float16 cast)."""
        ev = self.ev
        gemms = [p for p, idx in _effective_loads(t, self.inlined)
                 if self._is_gemm(p) and tuple(idx) == tuple(t.op.axis)
                 and [c.name for c in self.stages[id(p)].consumers] == [t.name] and not self.stages[id(p)].is_output]
        if len(gemms) != 1 or _tensor_bytes(gemms[0], ev) <= _tensor_bytes(t, ev):
            return ""
        p = gemms[0]
        for h in hosts:
            loads = _effective_loads(h, self.inlined | {id(t)})
            if (self.stages[id(h)].is_reduction or len(h.shape) != len(t.shape)
                    or any(src is p and tuple(idx) != tuple(h.op.axis) for src, idx in loads)
                    or any(src is not p and self._is_gemm(src) for src, _ in loads)):
                return (f"kept as {p.name}'s GEMM epilogue: inlined into {h.name}, which cannot be {p.name}'s "
                        f"epilogue, it would make {p.name} ({p.dtype}, {C.fmt_bytes(_tensor_bytes(p, ev))}) be "
                        f"written and read in place of {t.name} ({t.dtype}, {C.fmt_bytes(_tensor_bytes(t, ev))})")
        return ""

    def _inline_profit(self, t: Tensor) -> tuple[bool, str]:
        # inline iff recomputation time <= time of writing t and reading it back (roofline)
        elems = C.elements(t.shape, self.ev)
        reads = 0  # evaluations of t's body once inlined
        for c in self._hosts(t):
            points = {tuple(idx) for src, idx in _effective_loads(c, self.inlined | {id(t)}) if src is t}
            pts_direct = {tuple(idx) for src, idx in _effective_loads(c, self.inlined) if src is t}
            n = max(len(points), len(pts_direct), 1)
            reads += n * C.elements(_domain(c), self.ev)
        flops = _flops_per_point(t, self.inlined)
        extra = max(0, reads - elems) * flops
        saved = 2 * _tensor_bytes(t, self.ev)
        t_extra, t_saved = extra / self.dev.peak_flops, saved / self.dev.bandwidth
        if extra == 0:
            return True, (f"elementwise, each element read once: saves writing and re-reading "
                          f"{C.fmt_bytes(saved)}")
        factor = reads / max(1, elems)
        if t_extra <= t_saved:
            return True, (f"elementwise; recomputed {factor:.3g}x ({extra:,} extra flops, {C.fmt_time(t_extra)}) "
                          f"costs less than writing and re-reading {C.fmt_bytes(saved)} ({C.fmt_time(t_saved)})")
        return False, (f"each element would be recomputed {factor:.3g}x ({extra:,} extra flops, "
                       f"{C.fmt_time(t_extra)}), more than writing and re-reading it ({C.fmt_bytes(saved)}, "
                       f"{C.fmt_time(t_saved)}) — kept in a buffer")

    def _note(self, host: Tensor, d: Decision) -> None:
        self.inline_log.setdefault(id(host), []).append(d)

    # ---- groups
    def make_groups(self) -> None:
        passes: dict[int, FusionGroup] = {}
        for t in self.order:
            if id(t) in self.inlined:
                continue
            k = next((k for k, o in enumerate(self.online) if t.name in o), None)
            if k is not None and k in passes:  # one kernel per pass
                passes[k].stages.append(t)
                self.group_of[id(t)] = passes[k]
                continue
            g = FusionGroup(name="", stages=[t], depth=len(t.shape))
            if k is not None:
                g.mapping, g.depth = "online", 0
                passes[k] = g
            g.log.extend(self.inline_log.get(id(t), []))
            self.groups.append(g)
            self.group_of[id(t)] = g

    def _edges(self, src: FusionGroup, dst: FusionGroup) -> list[tuple[Tensor, Tensor, tuple[Expr, ...]]]:
        ids = {id(t) for t in src.stages}
        return [(p, c, idx) for c in dst.stages for p, idx in _effective_loads(c, self.inlined) if id(p) in ids]

    def _succ(self, g: FusionGroup) -> list[FusionGroup]:
        return [h for h in self.groups if h is not g and self._edges(g, h)]

    def _reaches(self, a: FusionGroup, b: FusionGroup, skip_direct: bool) -> bool:
        """Is there a path a -> ... -> b (of length >= 2 when skip_direct)?"""
        stack = [h for h in self._succ(a) if not (skip_direct and h is b)]
        seen: set[int] = set()
        while stack:
            h = stack.pop()
            if h is b:
                return True
            if id(h) in seen:
                continue
            seen.add(id(h))
            stack.extend(self._succ(h))
        return False

    def _merge(self, a: FusionGroup, b: FusionGroup, depth: int, d: Decision) -> FusionGroup:
        first, second = (a, b) if self.groups.index(a) < self.groups.index(b) else (b, a)
        pos = {id(t): k for k, t in enumerate(self.order)}
        first.stages = sorted(first.stages + second.stages, key=lambda t: pos[id(t)])
        first.depth = depth
        first.log.extend(second.log)
        first.log.append(d)
        self.groups.remove(second)
        for t in first.stages:
            self.group_of[id(t)] = first
        return first

    def fuse_vertical(self) -> None:
        changed = True
        while changed:
            changed = False
            for t in self.order:
                if id(t) in self.inlined:
                    continue
                gc = self.group_of[id(t)]
                for p, idxs in self._producers(t).items():
                    gp = self.group_of[id(p)]
                    if gp is gc or "online" in (gp.mapping, gc.mapping):
                        continue
                    d_edge = min(_shared_prefix(pp, cc, [idx]) for pp, cc, idx in self._edges(gp, gc))
                    depth = min(gp.depth, gc.depth, d_edge)
                    shown = ", ".join(sorted({_fmt_idx(p, i) for i in idxs}))
                    refusal = self._gemm_refusal(gp, gc, depth) or self._parallelism_refusal(gp, gc, depth)
                    if refusal:
                        d = Decision("vertical", (p.name, t.name), False, refusal)
                        if all(str(d) != str(x) for x in gc.log):
                            gc.log.append(d)
                        continue
                    between = self._between(gp, gc)
                    if depth >= 1 and not self._reaches(gp, gc, skip_direct=True) and between is None:
                        loops = ", ".join(v.name for v in t.op.axis[:depth])
                        why = (f"{t.name} reads {shown} at its own outer loop value{'s' if depth > 1 else ''} "
                               f"({loops}): the loop{'s' if depth > 1 else ''} can be shared and every "
                               f"{p.name} value is produced before it is read"
                               + (f"; saves re-reading {C.fmt_bytes(_tensor_bytes(p, self.ev))} of {p.name}"
                                  if not self.stages[id(p)].is_output else ""))
                        self._merge(gp, gc, depth, Decision("vertical", (p.name, t.name), True, why))
                        changed = True
                        break
                    if depth < 1:
                        red = self.stages[id(p)].is_reduction
                        why = (f"{t.name} reads {shown}, not at its own outer loop values: each iteration "
                               f"needs all of {p.name} first"
                               + (", so sharing a loop would recompute the reduction per iteration" if red else "")
                               + " — separate kernels")
                    elif between is not None:
                        why = (f"{' / '.join(between.stage_names)} lies between them in program order and the later "
                               "one needs it (loop fusion would run it too late) — separate kernels")
                    else:
                        why = "another kernel lies on a path between them (fusing would form a cycle)"
                    d = Decision("vertical", (p.name, t.name), False, why)
                    if all(str(d) != str(x) for x in gc.log):
                        gc.log.append(d)
                if changed:
                    break

    def _parallelism_refusal(self, a: FusionGroup, b: FusionGroup, depth: int) -> str:
        """Why sharing `depth` outer loops would leave the GPU idle ("" when it would not): the shared loops are
        the grid of a row kernel, so fusing at a depth whose iterations are fewer than the SMs, when each kernel
        alone has more, trades all but a few SMs for the bytes it saves (a batch loop shared by the stages of
        attention: 8 blocks for 132 SMs)."""
        if self.target != "cuda" or depth < 1:
            return ""
        merged = C.elements(a.stages[0].shape[:depth], self.ev)
        alone = min(C.elements(g.stages[0].shape[:max(g.depth, 1)], self.ev) for g in (a, b))
        work = max(C.elements(_domain(t), self.ev) for t in a.stages + b.stages)
        # a small program is launch-bound: one kernel beats a full GPU (a wave of blocks' threads, 4 points each)
        if merged >= self.dev.sm_count or merged >= alone or work < self.dev.sm_count * THREADS * 4:
            return ""
        return (f"resource (parallelism): the {depth} loop{'s' if depth > 1 else ''} they share "
                f"({', '.join(v.name for v in a.stages[0].op.axis[:depth])}) give{'' if depth > 1 else 's'} "
                f"{merged:,} blocks for "
                f"{self.dev.sm_count} SMs, while each kernel alone has at least {alone:,} — separate kernels")

    def _between(self, a: FusionGroup, b: FusionGroup) -> FusionGroup | None:
        """A group whose nests lie between those of a and b and that the later of them depends on: loop fusion
        keeps the statements between two fused nests after the fused loop, so it would run too late."""
        i, j = sorted((self.groups.index(a), self.groups.index(b)))
        later = self.groups[j]
        return next((x for x in self.groups[i + 1:j] if self._edges(x, later) or self._reaches(x, later, False)),
                    None)

    def _producers(self, t: Tensor) -> dict[Tensor, list[tuple[Expr, ...]]]:
        out: dict[int, tuple[Tensor, list]] = {}
        for p, idx in _effective_loads(t, self.inlined):
            if isinstance(p.op, ComputeOp):
                out.setdefault(id(p), (p, []))[1].append(idx)
        return {p: idxs for p, idxs in out.values()}

    def _inputs_of(self, g: FusionGroup) -> set[int]:
        ids = {id(t) for t in g.stages}
        return {id(p) for t in g.stages for p, _ in _effective_loads(t, self.inlined) if id(p) not in ids}

    def fuse_horizontal(self) -> None:
        changed = True
        while changed:
            changed = False
            for i, a in enumerate(self.groups):
                for b in self.groups[i + 1:]:
                    ok, depth, why = self._horizontal_ok(a, b)
                    if ok:
                        self._merge(a, b, depth, Decision("horizontal", tuple(a.stage_names + b.stage_names),
                                                          True, why))
                        changed = True
                        break
                    if why:
                        self.log.append(Decision("horizontal", (a.stage_names[-1], b.stage_names[0]), False, why))
                if changed:
                    break
        # keep only the refusals between kernels that stayed apart
        alive = {n for g in self.groups for n in g.stage_names}
        self.log = [d for d in self.log if not (d.action == "horizontal" and
                    any(self.group_of[id(t)] is self.group_of[id(u)] for t in self.order for u in self.order
                        if t.name == d.stages[0] and u.name == d.stages[-1]))
                    and all(n in alive for n in d.stages)]
        uniq: dict[str, Decision] = {}
        for d in self.log:
            uniq.setdefault(str(d), d)
        self.log = list(uniq.values())

    def _horizontal_ok(self, a: FusionGroup, b: FusionGroup) -> tuple[bool, int, str]:
        if self._edges(a, b) or self._edges(b, a) or "online" in (a.mapping, b.mapping):
            return False, 0, ""  # dependent: vertical fusion's business
        if self._reaches(a, b, False) or self._reaches(b, a, False) or self._between(a, b) is not None:
            return False, 0, "a third kernel lies between them (fusing would form a cycle or run it too late)"
        if any(self._is_gemm(t) for t in a.stages + b.stages):
            return False, 0, self._gemm_refusal(a, b, 0)
        ta, tb = a.stages[0], b.stages[0]
        depth = min(a.depth, b.depth)
        while depth > 0 and not all(_same(x, y) for x, y in zip(ta.shape[:depth], tb.shape[:depth])):
            depth -= 1
        flat_a = all(len(t.shape) == a.depth and not isinstance(t.op.body, Reduce) for t in a.stages)
        flat_b = all(len(t.shape) == b.depth and not isinstance(t.op.body, Reduce) for t in b.stages)
        space_a = "×".join(str(s) for s in ta.shape) or "scalar"
        space_b = "×".join(str(s) for s in tb.shape) or "scalar"
        if depth < 1 or flat_a != flat_b or (flat_a and not (depth == a.depth == b.depth)):
            return False, 0, (f"iteration spaces differ ({space_a} for {ta.name}, {space_b} for {tb.name}) "
                              "— one loop cannot cover both")
        shared = self._inputs_of(a) & self._inputs_of(b)
        names = [t.name for t in self.order_all() if id(t) in shared]
        saved = sum(_tensor_bytes(t, self.ev) for t in self.order_all() if id(t) in shared)
        why = (f"independent stages over the same iteration space ({space_a})"
               + (f", sharing {', '.join(names)}: read once (saves {C.fmt_bytes(saved)})" if names else "")
               + f"; one launch instead of two (saves {C.fmt_time(self.dev.launch_overhead)})")
        return True, depth, why

    def order_all(self) -> list[Tensor]:
        seen: dict[int, Tensor] = {}
        for t in self.order:
            for u in t.op.inputs:
                seen.setdefault(id(u), u)
            seen.setdefault(id(t), t)
        return list(seen.values())

    # ---- mapping, caches and costs
    def finish(self) -> None:
        for k, g in enumerate(self.groups):
            g.name = str(k)
            pos = {id(t): j for j, t in enumerate(self.order)}
            g.inlined = [t for t in self.order if id(t) in self.inlined
                         and any(h is s for h in self._hosts(t) for s in g.stages)]
            g.inlined.sort(key=lambda t: pos[id(t)])
            g.mapping = self._mapping(g)
            if g.mapping == "gemm":
                plan_gemm(g, self.gemm, self.target, self.dev, self.ev, self.given)
            if self.target == "cuda" and g.mapping == "row":  # warp rows are re-read from L1
                self._plan_row_cache(g)
            g.cost = self._group_cost(g)

    def _mapping(self, g: FusionGroup) -> str:
        if g.mapping == "online":
            return "online"
        if self._gemm_chain(g.stages, g.depth):
            return "gemm"
        if self.target == "cpu":
            return "cpu"
        if any(isinstance(t.op.body, TupleReduce) for t in g.stages):
            return "thread"  # a user / tuple reducer (argmax): a thread per output, no cross-thread tuple reduction
        flat = all(len(t.shape) == g.depth and not isinstance(t.op.body, Reduce) for t in g.stages)
        if flat:
            return "flat"
        beyond = any(len(t.shape) > g.depth for t in g.stages)
        red_ext = max((C.elements(_domain(t)[len(t.shape):], self.ev) for t in g.stages
                       if isinstance(t.op.body, Reduce)), default=0)
        rows = C.elements(g.stages[0].shape[:g.depth], self.ev)
        if g.depth >= 1 and (beyond or red_ext >= ROW_MIN_EXTENT or rows < self.dev.sm_count * 4):
            inner = [_domain(t)[g.depth:] for t in g.stages]
            row_len = max(C.elements(d, self.ev) for d in inner)
            sym = sorted({n.name for d in inner for e in d for n in walk(e) if isinstance(n, Var)})
            itemsize = np_dtype(g.stages[-1].dtype).itemsize
            # elements of a 16-byte access: the row mapping loads float rows so (auto._load_lanes), others by element
            vl = 16 // itemsize if g.stages[-1].dtype in ("float32", "float16", "bfloat16") else 0
            whole = vl and all(d and multiple_of(simplify(d[-1]), vl) for d in inner)  # rows of whole vectors
            g.strategy = R.choose_row_strategy(row_len, rows, sym, all(v in self.given for v in sym), THREADS,
                                               self.dev, self.row_params, R.splittable(g.stages, g.depth),
                                               itemsize, bounded=bool(sym) and all(v in self.bounded for v in sym),
                                               vector=vl if whole else 0)
            g.log.append(Decision("note", ("row strategy",), None, f"{g.strategy.name}: {g.strategy.why}"))
            return {"warp": "warp", "split": "split"}.get(g.strategy.name, "row")
        return "thread"

    def _plan_row_cache(self, g: FusionGroup) -> None:
        dropped = False
        for p, ok, nbytes, why in R.plan_row_caches(g.stages, g.depth, lambda t: _effective_loads(t, self.inlined),
                                                    self.ev, self.dev, self.given, self.row_params, g.strategy.lanes,
                                                    g.strategy.registers, g.strategy.cluster):
            if ok:
                g.caches.append(RowCache(p, "shared", nbytes))
            dropped = dropped or not ok
            self._cache_note(g, p, ok, why)
        st = g.strategy
        if st.cluster and not g.caches:  # no row to keep in the cluster's registers: a block per row
            st = R.unclustered(st, C.elements(g.stages[0].shape[:g.depth], self.ev), THREADS, self.dev,
                               self.row_params)
        st = R.uncached(st, dropped and not g.caches, self.row_params)
        if st is not g.strategy:  # the row strategy's note says the threads it now has
            g.strategy = st
            g.log = [Decision("note", ("row strategy",), None, f"{st.name}: {st.why}") if d.stages == ("row strategy",)
                     else d for d in g.log]

    def _cache_note(self, g: FusionGroup, p: Tensor, ok: bool, why: str) -> None:
        g.log.append(Decision("cache", (p.name,), ok, why))

    def _group_cost(self, g: FusionGroup) -> C.KernelCost:
        c = C.KernelCost()
        ids = {id(t) for t in g.stages}
        for t in g.stages:
            for p, _ in _effective_loads(t, self.inlined):
                if id(p) not in ids:
                    c.add_read(p.name, _tensor_bytes(p, self.ev))
        kept = {id(t) for t in g.stages[:-1]} if g.mapping == "gemm" else set()  # registers, never written
        if g.mapping == "gemm" and (g.gemm or {}).get("split_k"):  # split-K: partials out and back, a 2nd launch
            part = split_partials(g, self.ev)
            c.add_write(f"{g.stages[0].name}_rf", part)
            c.add_read(f"{g.stages[0].name}_rf", part)
            c.launches += 1
        if g.mapping == "online":  # the pass keeps scores, maxima and probabilities per key in registers
            read_outside = {id(u) for t in self.order if id(t) not in ids for u in t.op.inputs}
            kept = {id(t) for t in g.stages if id(t) not in read_outside and not any(t is o for o in self.outs)}
        # a pass whose scores are a half-precision or float32 matmul runs on tensor cores
        # (schedules/primitives/flash.py); each of its flops costs `weight` half-precision tensor-core flops
        weight = max((_tensor_dot(t) for t in g.stages), default=0) if g.mapping == "online" else 0
        for t in g.stages:
            if id(t) not in kept:
                c.add_write(t.name, _tensor_bytes(t, self.ev))
            fl = _flops_per_point(t, self.inlined) * C.elements(_domain(t), self.ev)
            mma = _mma_weight(t) if g.mapping == "gemm" else weight if is_matmul_tensor(t) else 0
            if self.target == "cuda" and mma:
                c.tensor_flops += fl * mma
            else:
                c.flops += fl
        return c


__all__ = ["plan_fusion", "FusionPlan", "FusionGroup", "Decision", "RowCache", "THREADS"]
