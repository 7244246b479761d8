"""The report side of benchmarks/shapes.py: the markdown table, the worst rows with their reasons, the PNG heat
map (a tiny numpy + zlib PNG encoder with a 3x5 pixel font, so no matplotlib is needed), JSON, and merging the
JSON of several parts into one table. Nothing here needs a GPU or PyTorch.

A row is a dict (see `shapes.py`): part, workload, shape (label), dtype, mode ("sym" | "fixed"), status
("ok" | "FAIL" | "ERROR"), error, and the measured ms_* fields; `derive` fills the ratios.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from loopir.errors import ArgumentError

Row = dict[str, Any]

# ----------------------------------------------------------------------------- ratios


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def headline(r: Row) -> float | None:
    """The ratio each row is judged by: ours / torch.compile, else ours / the other baseline (cuBLAS has no
    compile column; on the CPU, PyTorch CPU eager, else numpy)."""
    for k in ("ours_compile", "ours_eager" if r.get("part") == "cpu" else "", "ours_other"):
        if k and r.get(k):
            return float(r[k])
    return None


def derive(rows: list[Row]) -> list[Row]:
    """Fill the ratios: % of floor, ours / compile, ours / eager, ours / other, sym / fixed (same shape and dtype)."""
    fixed = {_key(r, mode=False): r.get("ms_ours") for r in rows
             if r.get("mode") == "fixed" and r.get("status") == "ok"}
    for r in rows:
        ours = r.get("ms_ours") if r.get("status") == "ok" else None
        r["pct_floor"] = 100.0 * r["floor_ms"] / ours if ours and r.get("floor_ms") else None
        r["ours_compile"] = _div(ours, r.get("ms_compile"))
        r["ours_eager"] = _div(ours, r.get("ms_eager"))
        r["ours_other"] = _div(ours, r.get("ms_other"))
        r["sym_fixed"] = _div(ours, fixed.get(_key(r, mode=False))) if r.get("mode") == "sym" else None
    return rows


def _key(r: Row, mode: bool = True) -> tuple[str, ...]:
    k = (r.get("part", ""), r["workload"], r["shape"], r["dtype"])
    return k + (r["mode"],) if mode else k


# ----------------------------------------------------------------------------- reasons for the worst rows

# (predicate on a row, reason): the first that matches names the row's "why"; edit as causes are understood.
# The predicates read the row's own numbers; a row no entry explains gets "?" for a human to fill in.
def _gpu(r: Row) -> bool:
    return r.get("part") != "cpu"


KNOWN_REASONS: list[tuple[Callable[[Row], bool], str]] = [
    (lambda r: r["status"] == "ERROR", "the build or call raised (see error)"),
    (lambda r: not _gpu(r) and r["workload"] == "matmul_bias_relu",
     "CPU GEMM through the default auto_schedule path (a 6x16 register tile), not the hand recipe (issue 11 item 5)"),
    (lambda r: not _gpu(r) and (r.get("floor_ms") or 1) < 0.1,
     "tiny problem on the CPU: the ctypes call and argument checks dominate"),
    (lambda r: r["status"] == "FAIL", "wrong result (see error)"),
    (lambda r: r["workload"] == "matmul_bias_relu" and r["mode"] == "sym" and (r.get("sym_fixed") or 0) > 2,
     "GEMM at symbolic sizes: bound guards in the inner tile, no vector or staged loads (issue 11 item 1/5)"),
    (lambda r: _gpu(r) and r["workload"] == "matmul_bias_relu" and _dims(r)[0] <= 64,
     "skinny M: the square tiles waste the M dimension; no split-K / GEMV mapping (issue 11 item 5)"),
    (lambda r: _gpu(r) and r["workload"] == "matmul_bias_relu" and any(d % 128 for d in _dims(r)),
     "GEMM size not a multiple of the tile: guarded remainder tiles (issue 11 item 5)"),
    (lambda r: r["mode"] == "sym" and (r.get("sym_fixed") or 0) > 1.05,
     "symbolic sizes: bound guards in the innermost loops, no 16-byte accesses (issue 11 items 1-2)"),
    (lambda r: _gpu(r) and r.get("kind") == "row" and _dims(r)[-1] >= 16384,
     "very wide rows: a row does not fit on chip, so each stage re-reads it from DRAM; no several-blocks-per-row "
     "or online combine (issue 11 item 4)"),
    (lambda r: _gpu(r) and r.get("kind") == "row" and len(_dims(r)) == 2 and _dims(r)[0] < 264,
     "few rows: fewer blocks than 2 per SM (issue 11 item 4)"),
    (lambda r: (r.get("floor_ms") or 1) < 0.01, "tiny problem: launch latency and host overhead dominate"),
    (lambda r: _gpu(r) and r.get("kind") == "row" and len(_dims(r)) == 2 and _dims(r)[1] <= 1024,
     "short rows: a block per row leaves threads idle; a warp per row would fit (issue 11 item 4)"),
]


def _dims(r: Row) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", r["shape"]))


def why(r: Row) -> str:
    return next((reason for pred, reason in KNOWN_REASONS if _safe(pred, r)), "?")


def worst(rows: list[Row], k: int = 5) -> list[Row]:
    """The k rows with the largest headline ratio (slowest against the baseline)."""
    ok = [r for r in rows if r.get("status") == "ok" and headline(r)]
    return sorted(ok, key=lambda r: -(headline(r) or 0))[:k]


def failures(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.get("status") != "ok"]


# ----------------------------------------------------------------------------- markdown


def _ms(x: float | None) -> str:
    return "n/a" if x is None else (f"{x:.4f}" if x < 1 else f"{x:.3f}")


def _x(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}x"


COLUMNS = ("workload", "shape", "dtype", "sizes", "ms ours", "ms ours launch", "ms eager", "ms compile", "ms other",
           "% of floor", "ours/compile", "ours/other", "sym/fixed", "max err", "L2", "status")


def table_row(r: Row) -> str:
    status = r["status"] if r["status"] == "ok" else f"**{r['status']}** {r.get('error', '')[:120]}"
    if r.get("baseline_error"):
        status += f" (baseline: {r['baseline_error'][:100]})"
    status = status.replace("|", "/").replace("\n", " ")
    pct = "" if r.get("pct_floor") is None else f"{r['pct_floor']:.0f}%"
    err = "" if r.get("max_err") is None else f"{r['max_err']:.1e}"
    other = "" if r.get("ms_other") is None else f"{_ms(r['ms_other'])} ({r.get('other_name', '')})"
    cells = (r["workload"], r["shape"], r["dtype"], r["mode"], _ms(r.get("ms_ours")), _ms(r.get("ms_ours_launch")),
             _ms(r.get("ms_eager")), _ms(r.get("ms_compile")), other, pct, _x(r.get("ours_compile")),
             _x(r.get("ours_other")), _x(r.get("sym_fixed")), err, r.get("l2", ""), status)
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown(data: dict[str, Any]) -> str:
    rows = data["rows"]
    out = [f"# loopir across shapes: {data.get('title', '')}".rstrip(": "), ""]
    for m in data.get("meta", []):
        out.append("- " + "; ".join(f"{k} {v}" for k, v in m.items()))
    out += ["", "Columns: `ms ours` is the user's call `mod(*arrays)` (dispatch included); `ms ours launch` the "
            "kernels alone (arguments bound once); `ms eager` PyTorch eager (CPU part: PyTorch CPU); `ms compile` "
            "`torch.compile(dynamic=False)`, compile time excluded (timed after its first call); `ms other` "
            "cuBLAS `torch.matmul` (TF32 off) for GEMM, numpy on the CPU; `% of floor` the DRAM floor (bytes in "
            "+ out over the copy bandwidth of this run) over ms ours; `sym/fixed` ms at symbolic sizes (`te.var`, one "
            "module for every shape) over ms at sizes fixed at build time; `L2`: `cold` when the rotated working "
            "set exceeds twice the L2 (inputs/outputs rotated over copies), `L2` when it still fits (tiny rows: "
            "latency-bound anyway). Medians of CUDA events (CPU: perf_counter) after warm-up.", ""]
    out += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += [table_row(r) for r in rows]
    out += ["", f"{len(rows)} rows, {len(failures(rows))} failing.", ""]
    out += goals_section(rows) + [""] + worst_section(rows)
    return "\n".join(out) + "\n"


# issue 11's "done when": (goal, applies to the row, the row's number, met by that number)
GOALS: list[tuple[str, Callable[[Row], bool], Callable[[Row], float | None], Callable[[float], bool]]] = [
    ("GPU memory-bound: ours <= 1.05x torch.compile",
     lambda r: r.get("part") == "gpu-mem", lambda r: r.get("ours_compile"), lambda v: v <= 1.05),
    ("GPU symbolic sizes within 5% of fixed (sym/fixed <= 1.05)",
     lambda r: r.get("part") != "cpu" and r["mode"] == "sym", lambda r: r.get("sym_fixed"), lambda v: v <= 1.05),
    ("GPU GEMM float32 squares >= 1024: >= 0.8x cuBLAS (ours/cuBLAS <= 1.25)",
     lambda r: r.get("part") == "gpu-gemm" and r["dtype"] == "float32" and _dims(r)[0] >= 1024,
     lambda r: r.get("ours_other"), lambda v: v <= 1.25),
    ("GPU skinny GEMM (M <= 64): >= 80% of its bandwidth floor",
     lambda r: r.get("part") == "gpu-gemm" and _dims(r)[0] <= 64, lambda r: r.get("pct_floor"), lambda v: v >= 80),
    ("CPU GEMM 1024^3: >= 0.8x PyTorch CPU (ours/eager <= 1.25)",
     lambda r: r.get("part") == "cpu" and r["workload"] == "matmul_bias_relu",
     lambda r: r.get("ours_eager"), lambda v: v <= 1.25),
    ("CPU GEMM 1024^3: symbolic within 10% of fixed",
     lambda r: r.get("part") == "cpu" and r["workload"] == "matmul_bias_relu" and r["mode"] == "sym",
     lambda r: r.get("sym_fixed"), lambda v: v <= 1.1),
]


def goals_section(rows: list[Row]) -> list[str]:
    """Issue 11's goals: the rows each applies to, how many meet it, how many miss it (a failing row misses), and
    how many have no number for it (a baseline not run, e.g. no PyTorch)."""
    out = ["## Goals (issue 11, done when)", "", "| goal | rows | met | missed | no data | missed (up to 3) |",
           "|---|---|---|---|---|---|"]
    for name, applies, metric, ok in GOALS:
        rs = [r for r in rows if _safe(applies, r)]
        if not rs:
            continue
        nodata = [r for r in rs if r.get("status") == "ok" and metric(r) is None]
        miss = [r for r in rs if r.get("status") != "ok" or (metric(r) is not None and not ok(metric(r)))]
        miss.sort(key=lambda r: -(metric(r) or 99))
        shown = ", ".join(f"{r['workload']} {r['shape']} {_short(r['dtype'])} {r['mode']}" for r in miss[:3])
        out.append(f"| {name} | {len(rs)} | {len(rs) - len(miss) - len(nodata)} | {len(miss)} | {len(nodata)} | "
                   f"{shown} |")
    return out


def _safe(pred: Callable[[Row], bool], r: Row) -> bool:
    try:
        return bool(pred(r))
    except (KeyError, IndexError, TypeError):
        return False


def worst_section(rows: list[Row], k: int = 5) -> list[str]:
    out = [f"## The worst {k} rows (by ours / torch.compile; ours / other where there is no compile)", "",
           "| workload | shape | dtype | sizes | ms ours | ratio | sym/fixed | why |", "|" + "---|" * 8]
    for r in worst(rows, k):
        out.append(f"| {r['workload']} | {r['shape']} | {r['dtype']} | {r['mode']} | {_ms(r.get('ms_ours'))} | "
                   f"{_x(headline(r))} | {_x(r.get('sym_fixed'))} | {why(r)} |")
    bad = failures(rows)
    if bad:
        out += ["", "## Failing rows", "", "| workload | shape | dtype | sizes | status | why |", "|" + "---|" * 6]
        for r in bad:
            err = str(r.get("error", ""))[:160].replace("|", "/").replace("\n", " ")
            out.append(f"| {r['workload']} | {r['shape']} | {r['dtype']} | {r['mode']} | {r['status']}: {err} | "
                       f"{why(r)} |")
    return out


# ----------------------------------------------------------------------------- PNG

# 3x5 glyphs, rows top to bottom, "#" set
_FONT_SRC = {
    "0": "###,#.#,#.#,#.#,###", "1": ".#.,##.,.#.,.#.,###", "2": "##.,..#,.#.,#..,###", "3": "##.,..#,.#.,..#,##.",
    "4": "#.#,#.#,###,..#,..#", "5": "###,#..,##.,..#,##.", "6": ".##,#..,###,#.#,###", "7": "###,..#,.#.,.#.,.#.",
    "8": "###,#.#,###,#.#,###", "9": "###,#.#,###,..#,##.", "a": ".#.,#.#,###,#.#,#.#", "b": "##.,#.#,##.,#.#,##.",
    "c": ".##,#..,#..,#..,.##", "d": "##.,#.#,#.#,#.#,##.", "e": "###,#..,##.,#..,###", "f": "###,#..,##.,#..,#..",
    "g": ".##,#..,#.#,#.#,.##", "h": "#.#,#.#,###,#.#,#.#", "i": "###,.#.,.#.,.#.,###", "j": "..#,..#,..#,#.#,.#.",
    "k": "#.#,#.#,##.,#.#,#.#", "l": "#..,#..,#..,#..,###", "m": "#.#,###,###,#.#,#.#", "n": "##.,#.#,#.#,#.#,#.#",
    "o": ".#.,#.#,#.#,#.#,.#.", "p": "##.,#.#,##.,#..,#..", "q": ".#.,#.#,#.#,##.,.##", "r": "##.,#.#,##.,#.#,#.#",
    "s": ".##,#..,.#.,..#,##.", "t": "###,.#.,.#.,.#.,.#.", "u": "#.#,#.#,#.#,#.#,###", "v": "#.#,#.#,#.#,#.#,.#.",
    "w": "#.#,#.#,###,###,#.#", "x": "#.#,#.#,.#.,#.#,#.#", "y": "#.#,#.#,.#.,.#.,.#.", "z": "###,..#,.#.,#..,###",
    ".": "...,...,...,...,.#.", "/": "..#,..#,.#.,#..,#..", "-": "...,...,###,...,...", "+": "...,.#.,###,.#.,...",
    "_": "...,...,...,...,###", "=": "...,###,...,###,...", ":": "...,.#.,...,.#.,...", "%": "#.#,..#,.#.,#..,#.#",
    "(": ".#.,#..,#..,#..,.#.", ")": ".#.,..#,..#,..#,.#.", "^": ".#.,#.#,...,...,...", " ": "...,...,...,...,...",
    "?": "##.,..#,.#.,...,.#.", ",": "...,...,...,.#.,#..", "!": ".#.,.#.,.#.,...,.#.", ">": "#..,.#.,..#,.#.,#..",
    "<": "..#,.#.,#..,.#.,..#", ";": "...,.#.,...,.#.,#..",
}
FONT = {c: np.array([[ch == "#" for ch in line] for line in g.split(",")], dtype=bool) for c, g in _FONT_SRC.items()}


def draw_text(img: np.ndarray, x: int, y: int, text: str, color: tuple[int, int, int] = (0, 0, 0),
              scale: int = 2) -> None:
    """Draw `text` with its top-left corner at (x, y), 4 * scale pixels per character, clipped to the image."""
    h, w = img.shape[:2]
    for c in text.lower():
        g = FONT.get(c, FONT["?"])
        big = np.kron(g, np.ones((scale, scale), dtype=bool))
        ys, xs = np.nonzero(big)
        ys, xs = ys + y, xs + x
        keep = (ys >= 0) & (ys < h) & (xs >= 0) & (xs < w)
        img[ys[keep], xs[keep]] = color
        x += 4 * scale


def encode_png(img: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of an (h, w, 3) uint8 array: signature, IHDR, one zlib IDAT (filter 0 rows), IEND."""
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
        raise ArgumentError(f"encode_png takes an (h, w, 3) uint8 image, got {img.shape} {img.dtype}")
    h, w = img.shape[:2]

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    raw = np.concatenate([np.zeros((h, 1), np.uint8), img.reshape(h, w * 3)], axis=1).tobytes()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def color(ratio: float | None, status: str) -> tuple[int, int, int]:
    """Green at <= 0.8x, white at 1x, yellow at ~1.4x, red at >= 2x (log scale); black for a failing row,
    light grey when there is no ratio."""
    if status != "ok":
        return (40, 40, 40)
    if not ratio:
        return (215, 215, 215)
    t = max(-1.0, min(1.0, math.log2(ratio)))  # -1 .. 1
    if t <= 0:
        s = min(1.0, -t / math.log2(1 / 0.8))
        return (int(255 - 155 * s), int(255 - 55 * s), int(255 - 155 * s))
    if t < 0.5:
        s = t / 0.5
        return (255, 255, int(255 - 200 * s))
    s = (t - 0.5) / 0.5
    return (255, int(255 - 200 * s), int(55 - 55 * s))


CELL_W, CELL_H, LABEL_W, SCALE = 120, 34, 216, 2


def heat_rows(rows: list[Row]) -> list[tuple[str, list[Row]]]:
    """One strip per part / workload / dtype / sizes mode, its rows in shape order."""
    strips: dict[str, list[Row]] = {}
    for r in rows:
        label = f"{SHORT.get(r['workload'], r['workload'])[:12]} {_short(r['dtype'])} {r['mode']}"
        if r.get("part") == "cpu":
            label = "cpu " + label
        strips.setdefault(label, []).append(r)
    return list(strips.items())


SHORT = {"matmul_bias_relu": "gemm", "horizontal": "horiz"}


def _short(dtype: str) -> str:
    return {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64"}.get(dtype, dtype)


def heatmap_png(rows: list[Row], title: str = "") -> bytes:
    """The heat map as PNG bytes: one strip per workload x dtype x sizes mode, one cell per shape, each cell
    holding its shape and its ratio (ours / torch.compile; see `headline`), coloured by the ratio."""
    strips = heat_rows(rows)
    ncols = max((len(rs) for _, rs in strips), default=1)
    top = 44
    caption = "cell: shape, ours/torch.compile (cpu: ours/torch or numpy); black: failed"
    width = max(LABEL_W + CELL_W * ncols + 4, 4 * SCALE * len(caption) + 8)
    img = np.full((top + CELL_H * max(1, len(strips)) + 24, width, 3), 255, np.uint8)
    draw_text(img, 4, 4, title[:(width - 8) // (4 * SCALE)], scale=SCALE)
    draw_text(img, 4, 20, caption, scale=SCALE)
    for i, (label, rs) in enumerate(strips):
        y = top + i * CELL_H
        draw_text(img, 4, y + CELL_H // 2 - 5, label, scale=SCALE)
        for j, r in enumerate(rs):
            x = LABEL_W + j * CELL_W
            ratio = headline(r)
            img[y + 1:y + CELL_H - 1, x + 1:x + CELL_W - 1] = color(ratio, r["status"])
            ink = (255, 255, 255) if r["status"] != "ok" else (0, 0, 0)
            draw_text(img, x + 4, y + 4, r["shape"][:14], ink, scale=SCALE)
            val = r["status"].lower() if r["status"] != "ok" else (f"{ratio:.2f}x" if ratio else "n/a")
            draw_text(img, x + 4, y + 18, val, ink, scale=SCALE)
    return encode_png(img)


def write_png(path: str, rows: list[Row], title: str = "", use_matplotlib: bool = True) -> str:
    """Write the heat map; with matplotlib (when importable and allowed), else with `heatmap_png`."""
    if use_matplotlib:
        try:
            _matplotlib_png(path, rows, title)
            return "matplotlib"
        except ImportError:
            pass
    with open(path, "wb") as f:
        f.write(heatmap_png(rows, title))
    return "numpy+zlib"


def _matplotlib_png(path: str, rows: list[Row], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strips = heat_rows(rows)
    ncols = max((len(rs) for _, rs in strips), default=1)
    fig, ax = plt.subplots(figsize=(2 + 1.1 * ncols, 1 + 0.32 * len(strips)))
    grid = np.full((len(strips), ncols, 3), 1.0)
    for i, (_, rs) in enumerate(strips):
        for j, r in enumerate(rs):
            grid[i, j] = np.array(color(headline(r), r["status"])) / 255.0
            ratio = headline(r)
            txt = r["status"] if r["status"] != "ok" else (f"{ratio:.2f}x" if ratio else "n/a")
            ax.text(j, i, f"{r['shape']}\n{txt}", ha="center", va="center", fontsize=5,
                    color="white" if r["status"] != "ok" else "black")
    ax.imshow(grid, aspect="auto")
    ax.set_yticks(range(len(strips)), [s for s, _ in strips], fontsize=6)
    ax.set_xticks([])
    ax.set_title(f"{title}\nours / torch.compile per shape (green faster, red slower, black failed)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# ----------------------------------------------------------------------------- files and merging


def write_all(data: dict[str, Any], out_dir: str, tag: str, use_matplotlib: bool = True) -> dict[str, str]:
    """Write <out_dir>/shapes_<tag>.json, .md and .png; return their paths."""
    os.makedirs(out_dir, exist_ok=True)
    derive(data["rows"])
    base = os.path.join(out_dir, f"shapes_{tag}")
    paths = {"json": base + ".json", "md": base + ".md", "png": base + ".png"}
    with open(paths["json"], "w") as f:
        json.dump(data, f, indent=1, default=str)
    with open(paths["md"], "w") as f:
        f.write(markdown(data))
    data["png_writer"] = write_png(paths["png"], data["rows"], data.get("title", ""), use_matplotlib)
    return paths


def record(data: dict[str, Any], bench_dir: str, use_matplotlib: bool = True) -> dict[str, str]:
    """Write the recorded results, benchmarks/RESULTS_shapes.md and RESULTS_shapes.png."""
    derive(data["rows"])
    paths = {"md": os.path.join(bench_dir, "RESULTS_shapes.md"), "png": os.path.join(bench_dir, "RESULTS_shapes.png")}
    with open(paths["md"], "w") as f:
        f.write(markdown(data))
    write_png(paths["png"], data["rows"], data.get("title", ""), use_matplotlib)
    return paths


def merge(datas: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One result from several parts' JSON: the rows of all (a later file's row replaces an earlier one with the
    same part / workload / shape / dtype / sizes mode), their metadata side by side."""
    rows: dict[tuple[str, ...], Row] = {}
    meta: list[dict[str, Any]] = []
    for d in datas:
        meta += d.get("meta", [])
        for r in d["rows"]:
            rows[_key(r)] = r
    return {"title": "merged", "meta": meta, "rows": derive(list(rows.values()))}


def load(paths: Iterable[str]) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        with open(p) as f:
            out.append(json.load(f))
    return out
