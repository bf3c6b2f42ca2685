"""Figures written as 256-colour palette PNGs.

matplotlib's Agg canvas writes 32-bit RGBA. A chart of flat fills, text and anti-aliased lines needs far fewer
colours than that, so quantizing to a 256-colour palette (Pillow, which matplotlib already depends on) keeps it
looking the same at about a third of the bytes. Bytes matter here: the committed results travel to the GPU
machine with the working tree, and a device command carries 64 MiB in all (docs/benchmarks.md, the GPU run).
Every figure the report, the scaling table and `fit` write goes through `save_figure`; `shrink_png` re-encodes
one already written (scripts/shrink_figures.py uses it on committed figures).
"""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

PALETTE_COLOURS = 256


def shrink_png(data: bytes) -> bytes:
    """The PNG in `data` as a palette PNG; one already in palette mode comes back unchanged (idempotent).

    An opaque image (every figure here: white face colour) is quantized by median cut on RGB, which keeps the
    few saturated series colours exact; one with transparency keeps its alpha through Pillow's octree method."""
    with Image.open(io.BytesIO(data)) as image:
        if image.mode == "P":
            return data
        rgba = image.convert("RGBA")
    if rgba.getextrema()[3][0] == 255:
        palette = rgba.convert("RGB").quantize(colors=PALETTE_COLOURS, method=Image.Quantize.MEDIANCUT)
    else:
        palette = rgba.quantize(colors=PALETTE_COLOURS, method=Image.Quantize.FASTOCTREE)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue()


def save_figure(figure, path: str | Path, dpi: float | None = None) -> Path:
    """Write a matplotlib figure to `path` as a palette PNG (at `dpi`, else the figure's own); a str path too, as
    the plotting functions' callers in code pass one."""
    path = Path(path)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi if dpi is not None else "figure")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(shrink_png(buffer.getvalue()))
    return path
