"""Attention recognized in plain te and scheduled in the online form (FlashAttention's rewrite).

`auto_schedule` asks `schedule_attention(outputs, target)` first: when the program holds a row
maximum whose readers satisfy the precondition of `online_softmax` (an exponential of the difference,
consumed by sums of products with it, e.g. softmax(Q K^T) V), the rewrite is applied, as a checked
step, and the single pass is mapped:
  * cuda: the rows (batch x query) collapsed, a block per tile of `threads` rows, one thread per row
    running the pass over the keys with its running maximum, sum and output accumulator; the final
    division one thread per element;
  * cpu: the rows collapsed into one parallel loop.
The plan's `explain()` names the rewrite. Otherwise None, and auto_schedule goes on as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loopir.lower import lower
from loopir.nodes import For, Program, Seq
from loopir.te import Tensor
from loopir.visit import deep_recursion

from .primitives.online import OnlineRewrite, find_softmax_max, online_softmax
from .schedule import Schedule

__all__ = ["AttentionPlan", "schedule_attention", "ROWS_PER_BLOCK"]

ROWS_PER_BLOCK = 64  # query rows per block (one per thread)


@dataclass(frozen=True)
class AttentionPlan:
    """What `schedule_attention` did, for `schedule.plan.explain()`."""

    rewrites: tuple[OnlineRewrite, ...]
    target: str
    rows_per_block: int

    @property
    def groups(self) -> tuple[()]:
        return ()

    @property
    def inlined(self) -> tuple[()]:
        return ()

    def explain(self) -> str:
        lines = []
        for r in self.rewrites:
            lines.append(
                f"online_softmax({r.max_stage}): the running maximum {r.max_stage} rescales the sums "
                f"{', '.join(r.rolling)} by exp(m_old - m_new) in one pass over the keys; "
                + (f"{', '.join(r.inlined)} folded into them; " if r.inlined else "")
                + (f"{r.scores} computed one key at a time (no n x m temporary)" if r.scores else
                   "the maximized values stay materialized"))
        if self.target == "cuda":
            lines.append(f"cuda: a block per {self.rows_per_block} rows (batch x query), a thread per row "
                         "running the pass; the final division a thread per element")
        else:
            lines.append("cpu: the rows in one parallel loop")
        return "\n".join(lines)


def schedule_attention(outputs: list[Tensor], target: str, threads: int = ROWS_PER_BLOCK,
                       check: bool = True) -> Schedule | None:
    """The online-softmax schedule of `outputs`, or None when no row maximum fits the rewrite."""
    with deep_recursion():
        program = lower(outputs)
    names = find_softmax_max(program)
    if not names:
        return None
    s = Schedule(outputs, check=check)
    rewrites = []
    for name in names:
        _, info = online_softmax(s.program, name)  # what the step will do, for the plan
        s.online_softmax(name)
        rewrites.append(info)
    _map(s, target, threads)
    s.plan = AttentionPlan(tuple(rewrites), target, threads)  # type: ignore[attr-defined]
    return s


def _top(program: Program) -> tuple[Any, ...]:
    return program.body.body if isinstance(program.body, Seq) else (program.body,)


def _rows(s: Schedule, nest: For) -> list[Any]:
    """The handles of the perfectly nested loops at the top of `nest`."""
    out = []
    f: Any = nest
    while isinstance(f, For):
        out.append(s.loop(s._ref(f.var)))
        f = f.body
    return out


def _map(s: Schedule, target: str, threads: int) -> None:
    # the rows are (batch..., query); with symbolic sizes collapse would make the coordinates non-affine,
    # so the batch loops go to blockIdx.y/z and the query loop is split into blockIdx.x and threadIdx.x
    for k in range(len(_top(s.program))):
        loops = _rows(s, _top(s.program)[k])
        if not loops:
            continue
        if target != "cuda":
            s.parallel(loops[0])
            continue
        rows = loops[:2] if len(loops) <= 2 or k == 0 else loops[:-1]
        rows = rows[-3:]
        *batch, q = rows
        bo, ti = s.split(q, threads)
        s.bind(bo, "blockIdx.x").bind(ti, "threadIdx.x")
        for axis, b in zip(("blockIdx.y", "blockIdx.z"), reversed(batch)):
            s.bind(b, axis)
