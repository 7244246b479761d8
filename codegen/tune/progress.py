"""What a tuning run shows: a one-line progress bar and, at the end, a PNG of the best time against trials.

    bar = Progress(total=200, resumed=12)   # [tune]  57/200 |#####.....| best 0.4512 ms (1.31x) 2.4 trials/s ETA 1:00
    bar.add(trial); bar.close()
    plot_png("tune.png", medians)           # matplotlib when installed (`pip install loopir[plot]`), else a plain
                                            # raster (no labels) written with zlib
"""

from __future__ import annotations

import math
import struct
import sys
import time
import zlib
from collections.abc import Sequence
from typing import Any, TextIO

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:  # the plot extra is not installed: the plain raster below
    plt = None

__all__ = ["Progress", "plot_png", "best_so_far"]


def best_so_far(medians: Sequence[float]) -> list[float]:
    out, best = [], math.inf
    for m in medians:
        best = min(best, m)
        out.append(best)
    return out


class Progress:
    """Trials done / total, the best time so far and its speedup over the first trial (the untuned rules),
    trials per second of this run and the time left at that rate. Written to `stream` (stderr) with a carriage
    return when it is a terminal, else one line per 10% (logs stay short)."""

    def __init__(self, total: int, resumed: int = 0, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.total, self.resumed, self.enabled = total, resumed, enabled
        self.stream = stream or sys.stderr
        self.done = 0
        self.best = math.inf
        self.first: float | None = None
        self.t0 = time.perf_counter()
        self.new = 0
        self._last_decile = -1

    def add(self, trial: Any) -> None:
        self.done += 1
        if trial.run and self.done > self.resumed:
            self.new += 1
        m = trial.median
        if self.first is None and trial.ok:
            self.first = m
        self.best = min(self.best, m)
        self._show()

    def line(self) -> str:
        n = min(self.done, self.total)
        width = 20
        fill = int(width * n / max(self.total, 1))
        el = time.perf_counter() - self.t0
        rate = self.new / el if el > 0 else 0.0
        left = (self.total - n) / rate if rate > 0 else math.inf
        eta = "--:--" if math.isinf(left) else f"{int(left // 60)}:{int(left % 60):02d}"
        best = "--" if math.isinf(self.best) else f"{self.best * 1e3:.4f} ms"
        gain = f" ({self.first / self.best:.2f}x)" if self.first and not math.isinf(self.best) else ""
        return (f"[tune] {n:4d}/{self.total} |{'#' * fill}{'.' * (width - fill)}| best {best}{gain} "
                f"{rate:.2f} trials/s ETA {eta}")

    def _show(self) -> None:
        if not self.enabled:
            return
        if getattr(self.stream, "isatty", lambda: False)():
            self.stream.write("\r" + self.line())
            self.stream.flush()
            return
        decile = 10 * self.done // max(self.total, 1)
        if decile != self._last_decile:
            self._last_decile = decile
            self.stream.write(self.line() + "\n")

    def close(self) -> None:
        if self.enabled and getattr(self.stream, "isatty", lambda: False)():
            self.stream.write("\n")


def plot_png(path: str, medians: Sequence[float], title: str = "") -> str:
    """Best time so far (ms) against trials, and each trial's time, as a PNG at `path`; returns the path."""
    ms = [m * 1e3 for m in medians]
    best = best_so_far(ms)
    if plt is not None:
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = range(1, len(ms) + 1)
        ax.scatter([x for x, m in zip(xs, ms) if math.isfinite(m)], [m for m in ms if math.isfinite(m)], s=6,
                   color="0.6", label="trial")
        ax.step(list(xs), best, where="post", color="C0", label="best so far")
        ax.set_xlabel("trials")
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path
    _raster(path, ms, best)
    return path


def _raster(path: str, ms: Sequence[float], best: Sequence[float], w: int = 640, h: int = 400) -> None:
    """The same plot without matplotlib: grey dots per trial, a blue step line for the best, black axes."""
    img = [[(255, 255, 255)] * w for _ in range(h)]
    fin = [m for m in ms if math.isfinite(m)]
    lo, hi = (min(fin), max(fin)) if fin else (0.0, 1.0)
    hi = hi if hi > lo else lo + 1.0
    x0, y0, x1, y1 = 40, h - 30, w - 10, 10

    def px(i: int, v: float) -> tuple[int, int]:
        x = x0 + (x1 - x0) * i // max(len(ms) - 1, 1)
        y = y0 - int((y0 - y1) * (v - lo) / (hi - lo))
        return x, y

    for x in range(x0, x1 + 1):
        img[y0][x] = (0, 0, 0)
    for y in range(y1, y0 + 1):
        img[y][x0] = (0, 0, 0)
    for i, m in enumerate(ms):
        if math.isfinite(m):
            x, y = px(i, m)
            for dx in (-1, 0, 1):
                for dy in (-1, 0, 1):
                    if 0 <= y + dy < h and 0 <= x + dx < w:
                        img[y + dy][x + dx] = (150, 150, 150)
    prev = None
    for i, b in enumerate(best):
        if not math.isfinite(b):
            continue
        x, y = px(i, b)
        if prev is not None:
            (px0, py0) = prev
            for xx in range(px0, x + 1):
                img[py0][xx] = (31, 119, 180)
            for yy in range(min(py0, y), max(py0, y) + 1):
                img[yy][x] = (31, 119, 180)
        prev = (x, y)
    raw = b"".join(b"\0" + bytes(c for p in row for c in p) for row in img)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(png)
