"""The compile cache's command line (the store itself is `codegen.diskcache`; nothing in the package imports
this module, so `python -m codegen.cache` runs it without importing it twice).

    python -m codegen.cache info      # where the cache is, how many entries, how many bytes
    python -m codegen.cache clear     # delete every entry (LOOPIR_CACHE_DIR, else ~/.cache/loopir)
"""

from __future__ import annotations

import sys

from .diskcache import KINDS, cache_dir, clear, entries, max_bytes


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "info"
    if cmd == "clear":
        print(f"removed {clear()} entries from {cache_dir()}")
        return 0
    if cmd == "info":
        es = entries()
        by = {k: sum(1 for p, _, _ in es if p.endswith(k)) for k in KINDS}
        print(f"{cache_dir()}: {len(es)} entries ({', '.join(f'{n} {k}' for k, n in by.items())}), "
              f"{sum(s for _, s, _ in es) / 2**20:.1f} MB of {max_bytes() / 2**20:.0f} MB")
        return 0
    print("usage: python -m codegen.cache [info|clear]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
