"""Re-encode the figures already written under a results folder as palette PNGs (optbench.report.png).

New figures are written that way; this brings older ones (and the figures embedded in report.html pages) to the
same encoding without re-running anything: the pixels are the same chart, quantized to 256 colours. It only
re-encodes, so the records and every number drawn from them stay as they are. Idempotent: a palette PNG is left
alone. Prints the bytes before and after.

Usage: python scripts/shrink_figures.py [FOLDER ...]      (default: results/)
"""

from __future__ import annotations

import base64
import re
import sys
from pathlib import Path

from optbench.records.record import MIB
from optbench.report.png import shrink_png

EMBEDDED_PNG = re.compile(r'data:image/png;base64,([A-Za-z0-9+/=]+)')


def shrink_html(text: str) -> str:
    """The page with every embedded PNG re-encoded."""
    def reencode(match: re.Match[str]) -> str:
        data = shrink_png(base64.b64decode(match.group(1)))
        return "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    return EMBEDDED_PNG.sub(reencode, text)


def shrink_file(path: Path) -> tuple[int, int]:
    """Re-encode one .png or .html file in place; (bytes before, bytes after)."""
    before = path.read_bytes()
    after = shrink_png(before) if path.suffix == ".png" else shrink_html(before.decode("utf-8")).encode("utf-8")
    if after != before:
        path.write_bytes(after)
    return len(before), len(after)


def main(argv: list[str]) -> int:
    folders = [Path(a) for a in argv] or [Path("results")]
    missing = [f for f in folders if not f.is_dir()]
    if missing:
        print(f"shrink_figures: no such folder: {missing[0]}", file=sys.stderr)
        return 2
    files = sorted(p for f in folders for pattern in ("*.png", "*.html") for p in f.rglob(pattern))
    total_before = total_after = 0
    for path in files:
        before, after = shrink_file(path)
        total_before, total_after = total_before + before, total_after + after
    print(f"shrink_figures: {len(files)} files, {total_before / MIB:.1f} MiB -> {total_after / MIB:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
