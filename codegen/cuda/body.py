"""The small printing vocabulary of a renderer that prints a whole kernel body for one marked nest (a block pass:
codegen/cuda/flash.py, codegen/cuda/wgmma.py): lines at the renderer's indentation, scopes, loop variables bound
to C expressions, unrolled loops."""

from __future__ import annotations

from typing import Any

from loopir import nodes as N

__all__ = ["BodyEmitter"]


class BodyEmitter:
    """Prints through renderer `r` (codegen.cuda.kernel's); `ix` is the C type of index arithmetic."""

    def __init__(self, r: Any) -> None:
        self.r = r
        self.ix = r.ix

    def line(self, text: str) -> None:
        self.r.line(text)

    def open(self, text: str) -> None:
        self.line(text)
        self.r.ind += 1

    def close(self, text: str = "}") -> None:
        self.r.ind -= 1
        self.line(text)

    def let(self, v: N.Var, value: str) -> None:
        """Bind the loop variable `v` to a C expression in the current scope (an inner scope shadows it)."""
        self.line(f"const {self.ix} {self.r.var(v)} = {value};")

    def unrolled(self, var: str, extent: int) -> None:
        self.line("#pragma unroll")
        self.open(f"for (int {var} = 0; {var} < {extent}; ++{var}) {{")
