"""Identifiers for the names a user gave (loops, buffers, statements, sizes) in generated text.

One sanitiser and one unique-name rule for every consumer: isl formulas (`loopir.isl_conv`, with isl's
keywords) and the C/CUDA source (`codegen.cuda.expr`, with C's). Each keeps its own reserved words.
"""

from __future__ import annotations

import re
from collections.abc import Collection

__all__ = ["fresh", "sanitize"]


def sanitize(name: str, reserved: Collection[str] = (), reserved_prefixes: tuple[str, ...] = ()) -> str:
    """`name` as an identifier `[A-Za-z_][A-Za-z0-9_]*`: another character c becomes `_x<hex of c>_`, a
    leading digit gets a `v` before it, a reserved word or a name with a reserved prefix gets a `_` after it.
    The escape keeps distinct names apart where the text is all there is to tell them by (isl's statement
    names: a stage `x.y`, lifted from an inline reduction, beside a tensor `x_y`)."""
    s = re.sub(r"[^A-Za-z0-9_]", lambda m: f"_x{ord(m.group()):x}_", name) or "v"
    if s[0].isdigit():
        s = "v" + s
    if s in reserved or s.startswith(reserved_prefixes):
        s += "_"
    return s


def fresh(base: str, taken: set[str]) -> str:
    """`base`, else `base_1`, `base_2`, ...: the first not in `taken`, which is added to it."""
    name, k = base, 1
    while name in taken:
        name = f"{base}_{k}"
        k += 1
    taken.add(name)
    return name
