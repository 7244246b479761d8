"""ScheduleError: an illegal schedule step, with the witness that proves it illegal."""

from __future__ import annotations

from typing import Any

from loopir.errors import LoopirError
from loopir.nodes import Program, Var
from loopir.printer import program_str

__all__ = ["ScheduleError", "InexactCheckError", "describe_witness", "nest_str"]


class ScheduleError(LoopirError):
    """A schedule step refused because it would change the program's result.

    Attributes: `primitive` (its name), `kind` ("flow", "anti" or "output"), `buffer` (name),
    `source` and `sink` (each `(statement_name, {iteration_variable_name: int})`; the source
    runs first in the original program), `params` (`{size_name: int}`, the sizes at which the
    conflict happens), `element` (the index of `buffer` both touch, or None) and `hint`."""

    def __init__(self, primitive: str, kind: str, buffer: str, source: tuple[str, dict[str, int]],
                 sink: tuple[str, dict[str, int]], params: dict[str, int], message: str | None = None,
                 element: tuple[int, ...] | None = None, hint: str | None = None) -> None:
        self.primitive = primitive
        self.kind = kind
        self.buffer = buffer
        self.source = source
        self.sink = sink
        self.params = params
        self.element = element
        self.hint = hint
        # the program whose statement instances the witness names (set when it is not the schedule's
        # original, e.g. a loop-kind violation found after a step that rebuilt the statements)
        self.analysed: Program | None = None
        if message is None:
            message = f"{primitive} is illegal: " + describe_witness(kind, buffer, source, sink, params, element)
        super().__init__(message)

    @classmethod
    def from_witness(cls, primitive: str, w: Any, program: Program | None = None,
                     marks: dict[Var, str] | None = None, hint: str | None = None,
                     what: str | None = None) -> ScheduleError:
        """Build the error (and its message) from a `loopir.poly.Witness`.

        `program` is printed with `marks` at the loops involved; `what` describes the step
        (e.g. "reorder(j, i)")."""
        step = what or primitive
        lines = [
            f"{step} is illegal: the new schedule would run {_inst(w.sink)} before (or together with) "
            f"{_inst(w.source)}, but",
            "  " + describe_witness(w.kind, w.buffer, w.source, w.sink, w.params, w.element),
        ]
        if program is not None:
            lines.append("the nest before this step" + (" (the loops involved are marked):" if marks else ":"))
            lines += ["    " + ln for ln in nest_str(program, marks).splitlines()]
        if hint:
            lines.append(f"hint: {hint}")
        notes = getattr(w, "notes", ())
        if notes:
            lines.append("note: the analysis of the new nest over-approximated, so this witness may not be real: "
                         + "; ".join(notes))
        return cls(primitive, w.kind, w.buffer, w.source, w.sink, w.params, "\n".join(lines), w.element, hint)


class InexactCheckError(LoopirError, ValueError):
    """A checked step refused because the new nest cannot be analysed exactly (non-affine loop
    bounds, guards or statement coords, e.g. after `collapse` of a loop with a symbolic extent):
    the analysis found a possible conflict that may not be real, so there is no witness to show.

    A ValueError (the step is outside what the checker can decide), not a ScheduleError (whose
    witness is always a real dependence). `possible` is the unconfirmed `poly.Witness`; `notes`
    says what was over-approximated."""

    def __init__(self, primitive: str, message: str, possible: Any = None, notes: tuple[str, ...] = ()) -> None:
        self.primitive = primitive
        self.possible = possible
        self.notes = notes
        super().__init__(message)

    @classmethod
    def from_witness(cls, primitive: str, w: Any, program: Program | None = None,
                     marks: dict[Var, str] | None = None, what: str | None = None) -> InexactCheckError:
        notes = tuple(getattr(w, "notes", ()))
        lines = [
            f"{what or primitive} cannot be checked exactly: the new nest is not affine ("
            + "; ".join(notes) + ")",
            "  the over-approximated analysis finds a possible conflict that may not be real: "
            + describe_witness(w.kind, w.buffer, w.source, w.sink, w.params, w.element),
        ]
        if program is not None:
            lines.append("the nest before this step" + (" (the loops involved are marked):" if marks else ":"))
            lines += ["    " + ln for ln in nest_str(program, marks).splitlines()]
        lines.append("hint: keep the nest affine — split or tile instead of collapsing loops of symbolic extent, "
                     "or apply this step before the one that made the nest non-affine; "
                     "Schedule(..., check=False) skips the check (unsafe)")
        return cls(primitive, "\n".join(lines), w, notes)


def _inst(inst: tuple[str, dict[str, int]]) -> str:
    name, it = inst
    return f"{name}[{', '.join(f'{k}={v}' for k, v in it.items())}]"


def describe_witness(kind: str, buffer: str, source: tuple[str, dict[str, int]], sink: tuple[str, dict[str, int]],
                     params: dict[str, int], element: tuple[int, ...] | None = None) -> str:
    """The dependence in words: "flow dependence on A: S[i=1, j=1] writes A[1, 1], S[i=2, j=0] reads it (at n=3)"."""
    el = f"{buffer}[{', '.join(map(str, element))}]" if element is not None else f"an element of {buffer}"
    first, then = {
        "flow": ("writes", "reads it"),
        "anti": ("reads", "overwrites it afterwards"),
        "output": ("writes", "overwrites it afterwards"),
    }.get(kind, ("touches", "touches it afterwards"))
    at = f" (at {', '.join(f'{k}={v}' for k, v in params.items())})" if params else ""
    return f"{kind} dependence on {buffer}: {_inst(source)} {first} {el}, {_inst(sink)} {then}{at}"


def nest_str(program: Program, marks: dict[Var, str] | None = None) -> str:
    """The printed nest, with `marks` at the loops involved."""
    return program_str(program, marks=marks)
