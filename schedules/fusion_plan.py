"""The fusion plan as data: the kernels (`FusionGroup`), the log of decisions (`Decision`) and the plan
(`FusionPlan`, whose `explain()` is the readable report). `schedules.fusion` makes them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loopir.te import Reduce, Tensor

from . import cost as C
from . import rows as R

THREADS = 128  # threads per block of the CUDA mappings (gpu_suite.py --sweep: best or tied on the H200)


@dataclass
class Decision:
    """One line of the log: `accepted` fusions start with '+', refusals with '-', notes with '·'."""

    action: str  # "inline" | "vertical" | "horizontal" | "materialize" | "cache" | "note"
    stages: tuple[str, ...]
    accepted: bool | None
    reason: str

    def __str__(self) -> str:
        mark = {True: "+", False: "-", None: "·"}[self.accepted]
        verb = {
            True: {"inline": "inline", "vertical": "fuse", "horizontal": "fuse horizontally", "cache": "cache"},
            False: {"inline": "do not inline", "vertical": "do not fuse", "horizontal": "do not fuse horizontally",
                    "cache": "do not cache", "materialize": "do not inline"},
        }
        head = verb.get(self.accepted, {}).get(self.action, self.action) if self.accepted is not None else ""
        names = ", ".join(self.stages)
        return f"{mark} {head} {names}: {self.reason}".replace("  ", " ") if head else f"{mark} {names}: {self.reason}"


@dataclass
class RowCache:
    """A planned copy of one input's row into fast memory at the group's row loop."""

    tensor: Tensor
    scope: str
    nbytes: int


@dataclass
class FusionGroup:
    """One kernel: the materialized stages it computes (topological order), the stages inlined
    into them, how many outer loops they share, and the default mapping it gets."""

    name: str
    stages: list[Tensor]
    inlined: list[Tensor] = field(default_factory=list)
    depth: int = 0
    mapping: str = "flat"  # cuda: "flat" | "row" | "warp" | "split" | "thread"; cpu: "cpu"; both: "gemm", "online"
    log: list[Decision] = field(default_factory=list)
    caches: list[RowCache] = field(default_factory=list)
    cost: C.KernelCost = field(default_factory=C.KernelCost)
    gemm: dict[str, Any] | None = None  # "gemm" mapping: the recipe's tile parameters
    gemm_plan: Any = None  # the GemmPlan auto_schedule applied (its steps are part of explain())
    # a skinny linear layer planned over all its batches' rows (X[b, t, k] @ W[k, j], B x T <= SKINNY_ROWS): the
    # mapping collapses the batch loops into the row loop first (one 2-d GEMM: split-K, W streamed once)
    collapse_rows: bool = False
    gemm_batched: dict[str, Any] | None = None  # collapse_rows: the parameters of a GEMM per batch (the fallback)
    strategy: R.RowStrategy | None = None  # cuda row groups: warp or block per row (schedules.rows)

    @property
    def kind(self) -> str:
        red = any(isinstance(t.op.body, Reduce) for t in self.stages)
        return "reduction" if red else "elementwise"

    @property
    def stage_names(self) -> list[str]:
        return [t.name for t in self.stages]


@dataclass
class FusionPlan:
    outputs: list[Tensor]
    target: str
    fuse: bool
    device: C.Device
    sizes: dict[str, int]
    groups: list[FusionGroup]
    inlined: list[Tensor]
    log: list[Decision]  # decisions not tied to one group (horizontal refusals, the summary)
    unfused: list[C.KernelCost]  # one kernel per stage
    stage_order: list[Tensor] = field(default_factory=list)
    inputs: list[Tensor] = field(default_factory=list)
    row_params: Any = None  # the row strategies' parameters it was planned with (schedules.rows.RowParams)

    # ---- predictions
    @property
    def bytes_before(self) -> int:
        return sum(c.bytes for c in self.unfused)

    @property
    def bytes_after(self) -> int:
        return sum(g.cost.bytes for g in self.groups)

    @property
    def time_before(self) -> float:
        return sum(c.time(self.device) for c in self.unfused)

    @property
    def time_after(self) -> float:
        return sum(g.cost.time(self.device) for g in self.groups)

    @property
    def kernels(self) -> int:
        return len(self.groups)

    def group_of(self, tensor_or_name: Tensor | str) -> FusionGroup | None:
        name = tensor_or_name if isinstance(tensor_or_name, str) else tensor_or_name.name
        for g in self.groups:
            if name in g.stage_names or name in [t.name for t in g.inlined]:
                return g
        return None

    def measured_by_group(self, kernel_stages: Mapping[str, Iterable[str]],
                          times: Mapping[str, float]) -> dict[str, float]:
        """Measured seconds per kernel of the plan (by group name), from `times` (seconds per compiled kernel, e.g.
        a CUDA module's `kernel_times` / 1e3) and `kernel_stages` (the statements each compiled kernel runs): a
        group's time is that of the compiled kernels running any of its stages (its GEMM's init and epilogue
        kernels too). A group none runs is absent."""
        out: dict[str, float] = {}
        for g in self.groups:
            stages = set(g.stage_names)
            hit = [t for k, t in times.items() if stages & set(kernel_stages.get(k, ()))]
            if hit:
                out[g.name] = sum(hit)
        return out

    def explain(self, measured: Mapping[str, float] | None = None) -> str:
        """A readable log: each kernel, what it fused and why, what it refused and why, and the
        predicted bytes moved before (one kernel per stage) and after. `measured` (seconds per kernel, by group
        name: `measured_by_group`, or `codegen.profile`) puts each kernel's measured time beside its prediction."""
        dev = self.device
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items()) or "none"
        lines = [
            f"fusion plan for {', '.join(t.name for t in self.outputs)} on {self.target}"
            f"{'' if self.fuse else ' (fuse=False: one kernel per stage)'}",
            f"  device: {dev.describe()}",
            f"  sizes: {sizes} (symbolic sizes not given are costed at {C.DEFAULT_SIZE})",
            "  stages: " + ", ".join(
                [f"{t.name} (input)" for t in self.inputs]
                + [f"{t.name} ({'reduction' if isinstance(t.op.body, Reduce) else 'elementwise'})"
                   for t in self.stage_order]
            ),
        ]
        for g in self.groups:
            shared = f"{g.depth} shared outer loop{'s' if g.depth != 1 else ''}"
            lines.append(f"kernel {g.name}: {', '.join(g.stage_names)} — {g.kind}, {shared}, "
                         f"mapping {_MAPPINGS[g.mapping]}")
            if g.inlined:
                lines.append(f"  inlined: {', '.join(t.name for t in g.inlined)}")
            for d in g.log:
                lines.append(f"  {d}")
            if g.gemm_plan is not None:
                lines.append(f"  recipe applied to {g.gemm_plan.stage} (epilogue: "
                             f"{', '.join(g.gemm_plan.epilogue) or 'none'}):")
                lines += [f"    {k + 1}. {st}" for k, st in enumerate(g.gemm_plan.steps)]
                lines += [f"    skipped: {st}" for st in g.gemm_plan.skipped]
            c = g.cost
            reads = ", ".join(f"{k} {C.fmt_bytes(v)}" for k, v in c.reads.items()) or "nothing"
            writes = ", ".join(f"{k} {C.fmt_bytes(v)}" for k, v in c.writes.items()) or "nothing"
            lines.append(
                f"  predicted: reads {reads}; writes {writes}; {C.fmt_bytes(c.bytes)} moved, {c.flops:,} flops"
                + (f" + {c.tensor_flops:,} mma flops" if c.tensor_flops else "") + ", "
                f"{C.fmt_time(c.time(dev))} ({c.bound(dev)}-bound)"
            )
            if measured is not None:
                lines.append(_measured_line(measured.get(g.name), c.time(dev)))
        for d in self.log:
            lines.append(f"{d}")
        nb = len(self.unfused)
        lines.append(
            f"bytes moved: before {C.fmt_bytes(self.bytes_before)} ({self.bytes_before:,} B, {nb} kernel"
            f"{'s' if nb != 1 else ''}, one per stage) -> after {C.fmt_bytes(self.bytes_after)} "
            f"({self.bytes_after:,} B, {self.kernels} kernel{'s' if self.kernels != 1 else ''})"
        )
        lines.append(
            f"predicted time: before {C.fmt_time(self.time_before)} -> after {C.fmt_time(self.time_after)}"
            + (f" ({self.time_before / self.time_after:.2f}x)" if self.time_after > 0 else "")
        )
        if measured:
            total, after = sum(measured.values()), self.time_after
            lines.append(f"measured time: {C.fmt_time(total)}, each kernel alone (predicted {C.fmt_time(after)}"
                         f"{f'; {total / after:.2f}x the prediction' if after > 0 else ''})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.explain()


def _measured_line(t: float | None, predicted: float) -> str:
    if t is None:
        return "  measured: no compiled kernel ran its stages"
    ratio = f"; {t / predicted:.2f}x the prediction" if predicted > 0 else ""
    return f"  measured: {C.fmt_time(t)} (predicted {C.fmt_time(predicted)}{ratio})"


_MAPPINGS = {
    "online": ("the online-softmax pass (schedules.attention: the running maximum rescales the sums while the keys "
               "stream; a block per tile of query rows: FlashAttention's tensor-core kernel for half data, else a "
               "thread per row)"),
    "flat": f"flat grid (loops collapsed, {THREADS} threads per block, 16-byte chunks per thread)",
    "row": "one block per row, threads across each phase's inner loop",
    "warp": "up to 16 lanes of a warp per row, several rows per block on threadIdx.y",
    "thread": "one thread per output point",
    "split": "rows split over blocks: per-chunk partials (rfactor), a combine per row, flat elementwise kernels",
    "cpu": "parallel outer loop, vectorized inner loop",
    "gemm": "tiled GEMM (schedules.gemm: block / register tiles, epilogue on the register tile)",
    "serial": "serial",
}


# ----------------------------------------------------------------------------- the planner
